"""The example galleries: one gr.Examples per media type, cached lazily or not at all.

`cache="lazy"` (the app's default, what a busy CPU Space needs): the first click on an example races it on
the server with the layout's defaults (DEFAULT_NEW_TOKENS new tokens, policy sage, the default preset,
SAGE's default knobs, no draft pruning) and stores the result; later clicks, by anyone, show the stored run at once.
Gradio runs a lazily cached example to its end before showing it, so that first click is not streamed, and
the Stop button does not reach it. Honesty: a run shown from the cache says so in the status line (raced
when, with which settings; timings measured then); only the click that raced it says "Done".

What Gradio stores (gradio/helpers.py `Examples.cache` / `load_from_cache`, CSVLogger): each output's
postprocessed value, files copied into the cache folder. A gr.State is not stored (Gradio drops state outputs
when caching), so the run behind the step slider is rebuilt from the cached run file (the Download button's
JSON, which carries every step event and tree). If that fails, the slider is switched off and the status
says so.

The cache lives in Gradio's cache dir (GRADIO_EXAMPLES_CACHE, default .gradio/cached_examples, git-ignored),
in a folder named after a fingerprint of what decides the result (the preset and the size and time of each
file in its local model directories, the defaults, example files and prompts): changing one of them starts a
new cache instead of showing a stale one (a hub model updated under the same id is not noticed).

`cache="off"`: a click only fills the inputs, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import gradio as gr
from gradio import utils as gr_utils
from gradio.helpers import Examples
from gradio_client import utils as client_utils

from sage_engine import SageConfig

from . import text
from .handlers import Handlers
from .layout import DEFAULT_NEW_TOKENS, Ui
from .media import Example
from .record import RunRecord
from .theme import lane_title
from .view import View

log = logging.getLogger("sage.app")

CACHE_MODES = ("lazy", "off")
POLICY = "sage"  # the layout's default policy: what a cached example runs
FORMAT = 1  # bump when what is stored changes
NAMES = [f.name for f in fields(View)]
EXAMPLE_API = {m: f"/{m}_example" for m in ("image", "video")}  # undocumented endpoints: example index -> outputs


class LazyExamples(Examples):
    """gr.Examples(cache_examples=True, cache_mode="lazy") that tells its `present` hook whether this click
    raced the example (fresh) or found it stored, and keeps its cache in `folder`.

    gr.Examples is a function that builds a gradio.helpers.Examples and calls its create(); so does this."""

    def __init__(self, *args, folder: Path, present: Callable[[list, bool], list], **kwargs):
        super().__init__(*args, cache_examples=True, cache_mode="lazy", _initiated_directly=False, **kwargs)
        self.present = present
        self.cached_folder = folder
        self.cached_file = folder / "log.csv"
        self.cached_indices_file = folder / "indices.csv"
        log.info("examples cached lazily in %s", folder)  # (Gradio's own message above names its default folder)
        self.create()

    def load_from_cache(self, example_id: int, request=None) -> list:
        # Gradio's own lazy path, split so that exactly the click that ran the example knows it did
        with self._cache_locks[example_id]:
            fresh = self._get_cached_index_if_cached(example_id) is None
            if fresh:
                client_utils.synchronize_async(self.cache, example_id, request)
        return self.present(super().load_from_cache(example_id, request), fresh)


class ExampleRuns:
    """The cached examples' function (a race with the defaults) and what a click shows from the cache."""

    def __init__(self, handlers: Handlers):
        self.h = handlers

    def runner(self, media: str) -> Callable[[str, str], tuple]:
        def run_example(file: str, prompt: str) -> tuple:
            image, video = (file, None) if media == "image" else (None, file)
            *_, final = self.h.compare(image, video, prompt, DEFAULT_NEW_TOKENS, POLICY, self.h.default_preset)
            v = dict(zip(NAMES, final))
            record: RunRecord = v["run_state"]
            raced_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            # plain values only (Gradio stores them; files are copied into the cache): a component update fails
            # in Gradio's caching call (AttributeError in Slider.get_config), so `present` adds the updates
            v.update(status=text.status_cached(record, raced_at), export=self.h.files.write(record.export()),
                     step=Handlers.step_slider(record)["value"], run_state=None)
            return tuple(v[n] for n in NAMES)

        run_example.__name__ = f"run_{media}_example"
        return run_example

    def present(self, values: list, fresh: bool) -> list:
        """The stored outputs as this click shows them: the status says live or cached, the step slider gets
        its run back (rebuilt from the cached run file), the Download button is enabled."""
        v = dict(zip(NAMES, values))
        export = v["export"]
        record = None
        try:
            path = export.path if hasattr(export, "path") else export["path"]
            record = RunRecord.from_export(json.loads(Path(path).read_text()))
        except Exception as e:  # noqa: BLE001 - an old or damaged cache: show it, without the slider
            log.warning("cached example: cannot rebuild its run (%s: %s); step slider off", type(e).__name__, e)
        status = v["status"] if isinstance(v["status"], str) else ""
        if record is None:
            status = text.no_step_slider(status)
            v["step"] = {"__type__": "update", "interactive": False}
        else:
            v["step"] = {"__type__": "update", **Handlers.step_slider(record)}
            if fresh:
                status = text.status_cached_fresh(record)
        spec = v["spec_text"]
        v.update(status=status, run_state=record,
                 spec_text={"__type__": "update", "value": _dump(spec),
                            "label": f"{lane_title('spec', POLICY)}: coloured by who wrote each token"})
        if export:
            v["export"] = {"__type__": "update", "value": _dump(export), "interactive": True}
        return [v[n] for n in NAMES]


def _dump(value):
    return value.model_dump() if hasattr(value, "model_dump") else value


def fingerprint(preset, rows: list[list[str]]) -> str:
    """What decides a cached example's result, hashed: change any of it and the cache starts afresh."""
    h = hashlib.sha256(json.dumps([FORMAT, repr(preset), DEFAULT_NEW_TOKENS, POLICY, repr(SageConfig())]).encode())
    for model_dir in (preset.target, preset.draft):  # local weights: retrained or updated ones start afresh
        if model_dir and Path(model_dir).is_dir():
            for f in sorted(Path(model_dir).iterdir()):
                if f.is_file():
                    st = f.stat()
                    h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    for file, prompt in rows:
        h.update(prompt.encode())
        h.update(Path(file).read_bytes())
    return h.hexdigest()[:12]


def add_examples(ui: Ui, examples: list[Example], handlers: Handlers, cache: str = "lazy") -> None:
    """The example galleries, in `ui.examples_row` (one gr.Examples per media type: a column empty in every
    row breaks the example click). `cache` is one of CACHE_MODES (build_demo checks it before loading anything)."""
    runs = ExampleRuns(handlers)
    preset = handlers.pool.presets[handlers.default_preset]
    with ui.examples_row:
        for media, component in (("image", ui.image), ("video", ui.video)):
            rows = [[e.file, e.prompt] for e in examples if e.media == media]
            if not rows:
                continue
            label = f"{media.capitalize()} examples"
            with gr.Column():
                if cache == "off":
                    gr.Examples(rows, inputs=[component, ui.prompt], label=label, cache_examples=False,
                                examples_per_page=6)
                    continue
                folder = gr_utils.get_cache_folder() / f"sage-{media}-{fingerprint(preset, rows)}"
                LazyExamples(rows, inputs=[component, ui.prompt], outputs=View.outputs(ui), fn=runs.runner(media),
                             label=label + " (cached after the first click)",
                             examples_per_page=6, folder=folder, present=runs.present, api_name=EXAMPLE_API[media][1:],
                             api_visibility="undocumented", elem_id=f"{media}-examples")
