"""The demo under test: launched ONCE per test session (a second launch in one process hangs),
shared by the test_app_*.py files and test_browser.py, plus the media files they use and the helpers that call
/compare and check its answer (run, check_summary, ...; conftest.py has pytest rewrite their asserts).

Presets: "tiny-random" (random-init tiny Qwen2.5-VL built in code, always available) and the
embedded "tinyworld" pair when its directory exists; the latter is then the default.
Examples are cached lazily, as `python app.py` does, in a fresh directory per session (GRADIO_EXAMPLES_CACHE),
so an example's first click in a session races live and nothing lands in the repository.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from PIL import Image

from app import build_demo, launch_options
from app.media import load_examples
from app.pool import load_preset
from app.served import served, unavailable
from sage_engine import RunStats
from sage_engine.models.presets import Preset

TINYWORLD = served()["tinyworld"]
TINY = Preset("tiny-random", "qwen2_5_vl", "builtin://tiny_pairs.qwen25_pair", "builtin://noisy", None, None,
              None, None, True, "random-init tiny Qwen2.5-VL pair built in code (sage_testing/tiny_pairs.py)",
              dtype="float32", device="cpu")


def pair_factory(preset: Preset):
    if preset.name == TINY.name:
        from sage_testing.tiny_pairs import qwen25_pair

        return qwen25_pair("noisy")
    return load_preset(preset)


def presets() -> dict[str, Preset]:
    """tinyworld first (the default) when its models exist, then the tiny random pair."""
    chosen = ([TINYWORLD] if unavailable(TINYWORLD) is None else []) + [TINY]
    return {p.name: p for p in chosen}


@dataclass(frozen=True)
class Server:
    url: str
    demo: object
    default_preset: str
    presets: tuple[str, ...]


@functools.cache
def launch() -> Server:
    table = presets()
    cache = tempfile.mkdtemp(prefix="sage-examples-cache-")
    atexit.register(shutil.rmtree, cache, True)  # the examples' cache goes with the test process
    os.environ["GRADIO_EXAMPLES_CACHE"] = cache
    demo = build_demo(presets=table, pair_factory=pair_factory, preload="now", pool_capacity=len(table),
                      cache_examples="lazy")
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    return Server(url.rstrip("/"), demo, next(iter(table)), tuple(table))


@dataclass(frozen=True)
class Media:
    image: str
    image_prompt: str
    video: str
    video_prompt: str
    broken_image: str
    huge_image: str
    empty_video: str
    broken_video: str


def write_video(path: Path, frames: int = 8, size: int = 96) -> str:
    """A small VP8 WebM clip (browsers can play it; OpenCV reads it back)."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"VP80"), 4, (size, size))
    for i in range(frames):
        frame = np.full((size, size, 3), 40, np.uint8)
        x = 8 + i * (size - 24) // max(1, frames - 1)
        frame[size // 3: size // 3 + 16, x: x + 16] = (40, 40, 220)  # a red square (BGR) moving right
        writer.write(frame)
    writer.release()
    return str(path)


@functools.cache
def media(root: str) -> Media:
    """Inputs for the tests: the repository's examples when present, else generated ones."""
    d = Path(root)
    examples = load_examples()
    img = next((e for e in examples if e.media == "image"), None)
    vid = next((e for e in examples if e.media == "video"), None)
    if img is None:
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(d / "img.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    Image.new("1", (8000, 6000)).save(d / "huge.png")  # 48 megapixels, a few KB on disk
    (d / "empty.mp4").write_bytes(b"")
    (d / "broken.mp4").write_bytes(np.random.default_rng(1).bytes(4096))
    return Media(
        image=img.file if img else str(d / "img.png"),
        image_prompt=img.prompt if img else "Describe the image in detail.",
        video=vid.file if vid else write_video(d / "clip.webm"),
        video_prompt=vid.prompt if vid else "What happens in the video?",
        broken_image=str(d / "broken.png"), huge_image=str(d / "huge.png"),
        empty_video=str(d / "empty.mp4"), broken_video=str(d / "broken.mp4"),
    )


# ---------------------------------------------------------------- calling /compare and checking its answer

OUT = ["status", "ar_text", "spec_text", "scoreboard", "replay", "fig_alpha", "fig_accepted", "fig_tree",
       "fig_mapping", "fig_time", "step", "export", "summary"]  # the API's outputs (gr.State is not one)
STATS_KEYS = {f.name for f in fields(RunStats)}


def run(client, **kwargs) -> tuple[list[dict], dict]:
    """Submit /compare; every streamed update and the final one, as dicts keyed by output name."""
    job = client.submit(api_name="/compare", **kwargs)
    final = job.result()
    updates = [dict(zip(OUT, u)) for u in job.outputs()]
    return updates, dict(zip(OUT, final))


def is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def figure(value) -> go.Figure:
    """The served Plotly figure, validated by plotly.py (the app builds figures unvalidated)."""
    assert isinstance(value, dict) and value.get("type") == "plotly", value
    return go.Figure(json.loads(value["plot"]))


def check_summary(final: dict, policy: str = "sage") -> dict:
    s = final["summary"]
    assert set(s) >= {"ar", "speculative"}
    assert set(s["ar"]) >= {"text", "token_ids", "stats"} and set(s["speculative"]) >= {"policy", "text",
                                                                                          "token_ids", "stats"}
    assert set(s["ar"]["stats"]) == STATS_KEYS and set(s["speculative"]["stats"]) == STATS_KEYS
    assert s["speculative"]["policy"] == policy
    assert s["ar"]["token_ids"], "no tokens decoded"
    assert s["speculative"]["token_ids"] == s["ar"]["token_ids"]  # greedy speculative == target greedy (fp32)
    assert s["speculative"]["text"] == s["ar"]["text"] and s["identical"] is True
    assert s["ar"]["stats"]["mean_accepted"] == pytest.approx(1.0)  # AR: one token per target forward
    return s
