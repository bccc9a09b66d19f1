"""Event handlers. They read inputs, call the engine through `Race`, and yield Views; no tensors here.

`compare` is also the public API (`api_name="compare"`, described by `API_DESCRIPTION`): parameters image or
video (one of them), prompt, max_new_tokens, policy (then optional preset and SAGE knobs); its last output is the
JSON summary.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gradio as gr
from gradio.components.plot import PlotData

from sage_engine import InputError, SageConfig, SageError, StepEvent
from sage_engine.models.media import DEFAULT_NUM_FRAMES, sample_video, video_frames_for

from . import plots, replay, text
from .arguments import new_tokens, sage_config, sampling_of, speculative_policy
from .gpu import on_gpu, zero_gpu
from .layout import DEFAULT_NEW_TOKENS, POLICIES
from .media import BOTH_MEDIA, Previews, RunFiles, check_media, frame_strip, frames_label
from .pacing import Pacer
from .policy_compare import PolicyComparison
from .pool import Loaded, PairPool
from .race import Race, RunControl, Transcriber, consume
from .record import Lane, RunRecord
from .served import NOTES, unavailable
from .step_story import step_story
from .theme import lane_title
from .tree_plot import empty_tree, tree_figure
from .view import View

if TYPE_CHECKING:  # these import torch: the app imports them after its page is served (app/__init__.py)
    from sage_engine import PreparedInput
    from sage_engine.core.sampling import Sampling
    from sage_engine.models.pruning import VisualPruning
    from sage_engine.policies import Policy

FIGURES = ("fig_alpha", "fig_accepted", "fig_tree", "fig_mapping", "fig_time")

log = logging.getLogger("sage.app")

POLL = 0.03  # seconds between looks at the decoding thread's queue until the first token shows

API_DESCRIPTION = (
    "Race the target model alone (autoregressive) against speculative decoding with `policy` on one image OR one "
    "video (give one of them, not both) and a prompt; streams both texts and the charts. The last output is the "
    "JSON summary: {ar, speculative, identical, divergence, speedup, preset}.")



def serialized(fig) -> PlotData:
    """A Plotly figure as gr.Plot sends it, so a resend costs nothing (gr.Plot passes PlotData through)."""
    return PlotData(type="plotly", plot=fig.to_json())


@dataclass
class Setup:
    """A validated request, ready to race."""

    loaded: Loaded
    prepared: PreparedInput
    policy: Policy  # the speculative lane's
    sampling: Sampling  # both lanes'
    cfg: SageConfig  # the knobs panel's (the SAGE lane's own), drawn by the alpha -> (D, W) figure
    pruning: VisualPruning | None
    record: RunRecord


class Handlers:
    """The app's behaviour; one instance per demo (owns the model pool and the export directory)."""

    def __init__(self, pool: PairPool, files: RunFiles, default_preset: str, text_every: float = 0.25,
                 plot_every: float = 1.0, previews: Previews | None = None, policies: tuple[str, ...] = POLICIES):
        self.pool, self.files, self.default_preset = pool, files, default_preset
        self.policies = policies  # the speculative lane's names: the dropdown's (layout.policy_choices)
        self.previews = previews or Previews()  # browser-playable stand-ins for uploaded videos
        self.text_every = text_every  # seconds between streamed text updates
        self.plot_every = plot_every  # seconds between streamed figure updates (a final full update follows)
        self._on_device = on_gpu()(self._compare)  # spaces.GPU on a ZeroGPU Space, else _compare itself
        self.comparison = PolicyComparison(self, new_tokens)  # the "Compare policies" mode (/compare_policies)

    # ------------------------------------------------------------------ compare (the API)
    def compare(self, image=None, video=None, prompt="", max_new_tokens=DEFAULT_NEW_TOKENS, policy="sage",
                preset=None, control: RunControl | None = None, **knobs) -> Iterator[tuple]:
        # Race autoregressive then speculative decoding on one input, streaming both (the API page shows
        # API_DESCRIPTION, not this). image and video default to None so that the API marks neither required.
        # The work runs in `self._on_device`: `_compare` behind ZeroGPU's `spaces.GPU` on a ZeroGPU Space (a forked
        # worker: only plain, picklable values cross, so the Stop switch stays here), `_compare` itself elsewhere.
        if zero_gpu():
            control = None
        video = self.previews.original(video)  # the page may show a re-encoded preview: decode the upload itself
        yield from self._on_device(image, video, prompt, max_new_tokens, policy, preset, control, **knobs)

    def _compare(self, image, video, prompt, max_new_tokens, policy, preset=None, control: RunControl | None = None,
                 **knobs) -> Iterator[tuple]:
        preset = preset or self.default_preset
        waited = self.pool.loading_for(preset)
        if waited is not None:  # the pair is loading behind the page: say why nothing moves yet (get() waits)
            yield View(status=text.status_waiting(preset, waited)).row()
        try:
            setup = self._setup(image, video, prompt, max_new_tokens, policy, preset, knobs)
            yield from self._race(setup, (control or RunControl()).switch)
        except SageError as e:  # the user's to fix: say what is wrong, in one line
            yield View(status=text.status_error(str(e))).row()
            raise gr.Error(str(e), print_exception=False) from None
        except Exception as e:  # a bug: keep the traceback in the log, tell the user, keep serving
            log.exception("run failed")
            yield View(status=text.status_error(f"internal error ({type(e).__name__}); see the server log")).row()
            raise gr.Error(f"internal error ({type(e).__name__}): {e}", print_exception=False) from None

    def _setup(self, image, video, prompt, max_new_tokens, policy, preset, knobs) -> Setup:
        self.pool.wait_setup()  # the engine's imports are the device thread's until then
        from sage_engine.models.pruning import VisualPruning
        from sage_engine.policies import make_policy

        if not (prompt or "").strip():
            raise InputError("the prompt is empty: type a question about the image or video")
        name, cfg = speculative_policy(policy, knobs, self.policies)
        n = new_tokens(max_new_tokens)
        pruning = VisualPruning() if knobs.pop("draft_prune", False) else None
        sampling = sampling_of(knobs)
        if image and video:
            raise InputError(BOTH_MEDIA)
        loaded = self.pool.get(preset)
        if not loaded.text_only:
            check_media(image, video)
        clip, prepared = self.pool.device.call(self._prepare, loaded.pair, prompt, image, video)
        media = {"image": os.path.basename(image) if image else None,
                 "video": os.path.basename(video) if video else None, "frames": len(clip.frames) if clip else 0}
        settings = {**(vars(cfg) if cfg is not None else {}),
                    "draft_pruning": None if pruning is None else vars(pruning), "sampling": vars(sampling)}
        record = RunRecord(preset, prepared.prompt, n, policy, settings, media, spec=Lane("spec", policy))
        sage_cfg = record.sage_cfg = cfg if name == "sage" else sage_config(knobs)
        return Setup(loaded, prepared, make_policy(name, cfg), sampling, sage_cfg, pruning, record)

    @staticmethod
    def _prepare(pair, prompt: str, image: str | None, video: str | None) -> tuple:
        """The video's frames (None for an image) and the models' inputs (run on the device thread: the processor
        computes with torch)."""
        from sage_engine.models.inputs import prepare_input

        clip = sample_video(video, video_frames_for(pair.processor)) if video else None
        return clip, prepare_input(pair, prompt, images=[image] if image else [], video=clip)

    def _race(self, s: Setup, stop: threading.Event) -> Iterator[tuple]:
        record = s.record
        engine = s.loaded.engine(s.pruning)
        engine.check_trees(s.policy)  # a pair that cannot verify trees: one line before either lane decodes
        record.backends = engine.backends()
        ar_engine = s.loaded.ar_engine(engine)  # the autoregressive lane's: the lanes decode in turns (race.py)
        record.alternated = ar_engine is not None
        race = Race(engine, s.prepared, s.policy, record.max_new_tokens, self.pool.device, stop, s.sampling,
                    ar_engine=ar_engine)
        transcriber = Transcriber()
        view = self._reset_view(record)
        yield view.row()
        figures = {f: serialized(getattr(view, f)) for f in FIGURES}  # what the plots show (resent unchanged)
        race.start()
        pace = Pacer(text_every=self.text_every, plot_every=self.plot_every)  # updates: <= 4% of each lane's time
        spec_started = False
        try:
            # poll fast until the first token shows, then only as often as the text is redrawn
            for batch in race.batches(every=lambda: POLL if not record.ar.steps else self.text_every):
                changed = consume(record, transcriber, batch)
                if not changed or record.done or not record.ar.text:
                    continue  # nothing new, or nothing to show yet (the first token may be half a character)
                if changed == {"timing"}:  # the texts are done: say that the race is timed again, at once (the
                    yield self._live_view(record, figures).row()  # figures as they are: no drawing while it is timed)
                    continue
                now = time.perf_counter()
                if record.spec.steps and not spec_started:
                    spec_started = True
                    pace.new_lane(now)
                if not pace.text_due(now):
                    continue
                if record.spec.decode_steps and pace.plot_due(now):
                    figures = self._figures(record, s.cfg)
                    pace.plotted(time.perf_counter() - now, now)
                t0 = time.perf_counter()
                yield self._live_view(record, figures).row()
                # the cost of an update: building it, then Gradio serialising and sending it (it resumes us after)
                done = time.perf_counter()
                pace.sent_update(done - t0, done)
            record.stopped = race.stopped
        finally:
            race.stop()  # also when Gradio closes this generator (client gone)
        yield self._final_view(record, s.cfg).row()

    # ------------------------------------------------------------------ views
    def _reset_view(self, record: RunRecord) -> View:
        waiting = plots.placeholder("", "decoding…")
        label = f"{lane_title('spec', record.policy)}: coloured by who wrote each token"
        return View(status=text.status_running(record), ar_text="", spec_text=gr.HighlightedText(value=[], label=label),
                    scoreboard=text.scoreboard(record), replay=replay.replay_html(None), fig_alpha=waiting,
                    fig_accepted=waiting, fig_tree=empty_tree("decoding…"), fig_mapping=waiting, fig_time=waiting,
                    step=gr.Slider(value=1, interactive=False), export=gr.DownloadButton(value=None, interactive=False),
                    run_state=record, summary={})

    @staticmethod
    def _figures(record: RunRecord, cfg: SageConfig) -> dict:
        """The streamed figures, serialised once (they are resent with every text update until redrawn)."""
        lane = record.spec
        last = lane.decode_steps[-1]
        figs = dict(fig_alpha=plots.alpha_figure(lane), fig_accepted=plots.accepted_figure(lane),
                    fig_tree=tree_figure(last, last.bonus_text or ""),
                    fig_mapping=plots.mapping_figure(lane, cfg), fig_time=plots.time_figure(record))
        return {name: serialized(fig) for name, fig in figs.items()}

    @staticmethod
    def _live_view(record: RunRecord, figures: dict) -> View:
        """Plain values for every output (see view.py: an update or a skip costs Gradio more than a resend)."""
        return View(status=text.status_running(record), ar_text=record.ar.text, spec_text=list(record.spec.segments),
                    scoreboard=text.scoreboard(record), replay=replay.replay_html(None), step=1, export=None,
                    run_state=record, summary={}, **figures)

    def _final_view(self, record: RunRecord, cfg: SageConfig) -> View:
        lane, token_text = record.spec, self._token_text(record.preset)
        best = self.best_step(record)
        return View(
            status=text.status_done(record), ar_text=record.ar.text, spec_text=list(lane.segments),
            scoreboard=text.scoreboard(record, token_text), replay=replay.replay_html(record),
            fig_alpha=plots.alpha_figure(lane), fig_accepted=plots.accepted_figure(lane),
            fig_tree=self.show_step(record, best.step) if best else empty_tree("this run drafted no tree"),
            fig_mapping=plots.mapping_figure(lane, cfg), fig_time=plots.time_figure(record),
            step=gr.Slider(**self.step_slider(record)),
            export=gr.DownloadButton(value=self.files.write(record.export()), interactive=True),
            run_state=record, summary=record.summary(),
        )

    @staticmethod
    def best_step(record: RunRecord) -> StepEvent | None:
        """The step shown first: the longest accepted path (ties: the bigger tree)."""
        return max(record.spec.decode_steps, default=None,
                   key=lambda st: (len(st.accepted_nodes), len(st.tree.tokens) if st.tree else 0))

    @classmethod
    def step_slider(cls, record: RunRecord) -> dict:
        """The step slider's settings after a run (a Slider's keyword arguments)."""
        steps, best = record.spec.decode_steps, cls.best_step(record)
        return dict(minimum=1, maximum=max(2, len(steps)), value=best.step if best else 1, interactive=len(steps) > 1)

    def _token_text(self, preset: str):
        tok = self.pool.get(preset).pair.tokenizer
        return lambda t: tok.decode([t])

    # ------------------------------------------------------------------ other events
    @staticmethod
    def arm(control: RunControl) -> tuple:
        """Run was pressed: a fresh Stop switch, before the run waits in the queue (so Stop works there too), and
        both Run buttons greyed out until it ends (`release`)."""
        control.arm()
        return gr.Button(interactive=False), gr.Button(interactive=False)

    @staticmethod
    def release() -> tuple:
        """The run ended (done, stopped or refused): both Run buttons work again."""
        return gr.Button(interactive=True), gr.Button(interactive=True)

    @staticmethod
    def stop(control: RunControl) -> None:
        """The Stop button: the running decoder ends after its current step, then the run reports what it has
        (the run writes the status itself: a reply from here could land after the run's last update)."""
        control.stop()

    def scrub(self, record: RunRecord | None, step) -> tuple:
        """The step box / slider: the tree of the step asked for, the box set to the step shown (a number past
        the last step shows the last; StepSlider lets such a number through instead of refusing it), and the step
        told in words."""
        steps = record.spec.decode_steps if record is not None else []
        if not steps:
            return empty_tree("run something first"), gr.skip(), step_story(None, "sage", None)
        want = min(max(int(step or 1), steps[0].step), steps[-1].step)
        return self.show_step(record, want), (gr.skip() if want == step else want), self.story(record, want)

    @staticmethod
    def story(record: RunRecord | None, step) -> str:
        """Speculative step `step` of the user's last run, opened (app/step_story.py)."""
        steps = record.spec.decode_steps if record is not None else []
        if not steps:
            return step_story(None, "sage", None)
        want = int(step or 1)
        ev = next((s for s in steps if s.step == want), steps[-1])
        return step_story(ev, record.spec.policy, record.sage_cfg or SageConfig())

    @classmethod
    def previous_step(cls, record: RunRecord | None, step):
        return cls.nudge(record, step, -1)

    @classmethod
    def next_step(cls, record: RunRecord | None, step):
        return cls.nudge(record, step, 1)

    @staticmethod
    def nudge(record: RunRecord | None, step, by: int):
        """The step slider moved by `by` steps (the previous / next buttons), kept within the run's steps."""
        steps = record.spec.decode_steps if record is not None else []
        if not steps:
            return gr.skip()
        return min(max(int(step or 1) + by, steps[0].step), steps[-1].step)

    @staticmethod
    def redraw(record: RunRecord | None, expert: bool) -> tuple:
        """The four run charts again from the user's last run, plain (three series per axis) or `expert`."""
        if record is None or not record.spec.decode_steps:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        cfg, lane, e = record.sage_cfg or SageConfig(), record.spec, bool(expert)
        return (plots.alpha_figure(lane, e), plots.accepted_figure(lane, e), plots.mapping_figure(lane, cfg, e),
                plots.time_figure(record, e))

    @classmethod
    def redraw_expert(cls, record: RunRecord | None, expert: bool) -> tuple:
        """After a run: the expert charts if the box is ticked (the run draws the plain ones)."""
        return cls.redraw(record, True) if expert else (gr.skip(),) * 4

    def show_step(self, record: RunRecord | None, step) -> object:
        """The draft tree of speculative step `step` of the user's last run."""
        if record is None or not record.spec.decode_steps:
            return empty_tree("run something first")
        want = int(step or 1)
        ev = next((s for s in record.spec.decode_steps if s.step == want), record.spec.decode_steps[-1])
        return tree_figure(ev, ev.bonus_text or "")

    def preview_frames(self, video: str | None, preset: str | None) -> tuple:
        """(the video shown, the frame strip, the status box) when a video is chosen: a video the browser cannot play
        is shown through a re-encoded preview (media.Previews), and the strip holds the frames the model will see (a
        run samples them the same way, from the upload itself). A video the model cannot read (empty, broken, too
        long) is taken out of the input at once and the status box says why, in one line (no toast besides)."""
        if not video:
            return gr.skip(), gr.Gallery(value=[], visible=False), gr.skip()
        if self.previews.is_preview(video):  # our own preview coming back through the change event
            return gr.skip(), gr.skip(), gr.skip()
        name = preset or self.default_preset
        n = video_frames_for(self.pool.get(name).pair.processor) if self.pool.is_loaded(name) else DEFAULT_NUM_FRAMES
        try:
            clip = sample_video(video, n)
        except SageError as e:
            return (gr.Video(value=None), gr.Gallery(value=[], visible=False),
                    text.status_error(f"{e} (the video was taken out; choose another)"))
        try:
            preview = self.previews.make(video)
        except Exception:  # noqa: BLE001 - a preview is a courtesy: without one the run still works
            log.exception("video preview failed")
            preview = None
        if preview:
            gr.Info("Your browser cannot play this video's codec: the page shows a re-encoded preview (VP8); "
                    "the model reads your file.")
        strip = gr.Gallery(value=frame_strip(clip), visible=True, label=frames_label(clip), columns=len(clip.frames))
        return (gr.Video(value=preview) if preview else gr.skip()), strip, gr.skip()

    def describe_model(self, preset: str | None) -> str:
        """The model info line: the pair's size (or why it is not loaded) and what it knows (presets.NOTES)."""
        name = preset or self.default_preset
        note = f"  \n{NOTES[name]}" if name in NOTES else ""
        if self.pool.is_loaded(name):
            return self.pool.get(name).describe() + note
        waited = self.pool.loading_for(name)
        if waited is not None:
            return f"**{name}**: loading in the background ({waited:.0f} s so far); a run waits for it" + note
        if name in self.pool.failed:
            return f"**{name}**: failed to load ({self.pool.failed[name]})" + note
        missing = unavailable(self.pool.presets[name]) if name in self.pool.presets else "not configured"
        return f"**{name}**: " + (f"not available ({missing})" if missing else "loads on the first run") + note

    def page_status(self, preset: str | None) -> str:
        """The status box beside Run before any run: whether the pair is loading, failed, or ready."""
        name = preset or self.default_preset
        waited = self.pool.loading_for(name)
        if waited is not None:
            return text.status_loading(name, waited)
        if name in self.pool.failed:
            return text.status_error(f"the model pair {name} failed to load ({self.pool.failed[name]})")
        return text.READY

    def on_load(self, preset: str | None) -> tuple:
        """The page has loaded: (the model line, the status box)."""
        return self.describe_model(preset), self.page_status(preset)

    def model_tick(self, preset: str | None, status: str | None = None) -> tuple:
        """The page's timer: the model line and the status box again (the status only while it speaks of the
        loading: a run's own status is left alone), and the timer stays on only while the pair is loading."""
        name = preset or self.default_preset
        loading = self.pool.loading_for(name) is not None
        mine = loading or text.is_loading_status(status)
        return (self.describe_model(name), self.page_status(name) if mine else gr.skip(), gr.Timer(active=loading))
