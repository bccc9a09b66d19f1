"""The page first: `python app.py` reaches `launch()` without importing torch, transformers or Numba (they load
behind the page, on the device thread), the pair loads behind the page, and a run pressed meanwhile says it waits,
then runs exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import app_server
from PIL import Image

from app.handlers import Handlers
from app.media import RunFiles
from app.pool import PairPool


def test_a_run_pressed_while_the_pair_loads_says_it_waits_then_decodes_exactly(tmp_path):
    def slow_factory(preset):
        time.sleep(1.5)  # a pair that takes a while, as a cold start's does
        return app_server.pair_factory(preset)

    preset = app_server.TINY
    pool = PairPool({preset.name: preset}, slow_factory)
    handlers = Handlers(pool, RunFiles(), preset.name)
    thread = pool.load_in_background(preset.name)
    assert "loading in the background" in handlers.describe_model(preset.name)
    timer = handlers.model_tick(preset.name)[-1]
    assert timer.active  # the page's model line keeps counting while it loads

    image = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(image)
    rows = list(handlers.compare(str(image), None, "What is in the picture?", 12, "sage"))
    assert rows[0][0].startswith("Waiting: the model pair"), rows[0][0]  # said before anything decodes
    summary = rows[-1][-1]
    assert summary["identical"] and summary["speculative"]["token_ids"] == summary["ar"]["token_ids"]
    thread.join(30)
    assert pool.loading_for(preset.name) is None and "loading" not in handlers.describe_model(preset.name)
    assert not handlers.model_tick(preset.name)[-1].active  # loaded: the timer stops


def test_a_pair_that_fails_to_load_in_the_background_is_named_on_the_page():
    from sage_engine import ModelError

    def broken(preset):
        raise ModelError("model 'x' is not a local directory and the hub is unreachable")

    preset = app_server.TINY
    pool = PairPool({preset.name: preset}, broken)
    handlers = Handlers(pool, RunFiles(), preset.name)
    pool.load_in_background(preset.name).join(10)
    line = handlers.describe_model(preset.name)
    assert "failed to load" in line and "unreachable" in line and "\n" not in line.split("  \n")[0]


ROOT = Path(__file__).resolve().parent.parent

# Runs app.py's main() with Blocks.launch and Blocks.block_thread stubbed. `Seen` (a finder that finds nothing) notes
# the thread that loads each heavy module. `gated` notes a background thread's `import` of one before launch and holds
# it until launch, outside Python's import locks, so that the main thread, were it to need the module meanwhile, loads
# it itself and is noted too, rather than finding it loaded by the background thread.
APP_UNTIL_LAUNCH = r"""
import builtins, json, logging, os, runpy, sys, threading, time

HEAVY = ("torch", "transformers", "numba")
launched = threading.Event()
before, after = {}, {}  # heavy module -> the thread that loaded it, before and after launch()


class Seen:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY:
            (after if launched.is_set() else before).setdefault(name, threading.current_thread().name)
        return None


def gated(name, *args, _import=builtins.__import__, **kwargs):
    thread, top = threading.current_thread(), name.split(".")[0]
    if top in HEAVY and thread is not threading.main_thread() and not launched.is_set():
        before.setdefault(top, thread.name + ", held until launch")
        launched.wait(30)
    return _import(name, *args, **kwargs)


sys.meta_path.insert(0, Seen())
builtins.__import__ = gated
import gradio as gr

lines = []
logging.getLogger("sage.app").addHandler(type("Lines", (logging.Handler,), {"emit": lambda h, r: lines.append(
    r.getMessage())})())


def launch(demo, **kwargs):
    print(json.dumps(before), flush=True)
    launched.set()


def block_thread(demo):  # app.py serves here, once launch() has returned and the engine's setup may start
    t_end = time.monotonic() + 60
    while not any(line.startswith("imported torch") for line in lines) and time.monotonic() < t_end:
        time.sleep(0.05)
    print(json.dumps(after), flush=True)
    os._exit(0)  # the pair's load, begun behind the page, is not this test's


gr.Blocks.launch, gr.Blocks.block_thread = launch, block_thread
runpy.run_path("app.py")["main"](["--port", "0"])
"""


def test_app_py_reaches_launch_without_torch_transformers_or_numba(tmp_path, monkeypatch):
    from sage_engine.core import jit

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    jit.cache_dir().mkdir(parents=True)
    (jit.cache_dir() / "ready").touch()  # a complete cache: app.py's setup starts no background compile
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_EXAMPLES_CACHE": str(tmp_path / "examples"),
           "PYTHONPATH": str(ROOT)}
    env.pop("SPACES_ZERO_GPU", None)  # ZeroGPU loads the pair before launch, on purpose
    done = subprocess.run([sys.executable, "-c", APP_UNTIL_LAUNCH], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert before == {}, f"imported before launch(): {before}"
    assert after.get("torch", "").startswith("sage-device"), after  # app.py's setup, on the device thread


def test_the_light_config_lists_the_policies_that_draft_as_the_policies_do():
    from sage_engine import config, policies

    assert config.SPECULATIVE_POLICIES == policies.SPECULATIVE_POLICIES


def test_the_engine_modules_the_page_needs_import_without_torch():
    code = ("import sys, sage_engine, sage_engine.config, sage_engine.errors, sage_engine.core.events, "
            "sage_engine.models.media, sage_engine.models.presets, sage_engine.evaluation.premise\n"
            "from sage_engine import SageConfig, SageError, StepEvent\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numba') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
    from sage_engine import SpecEngine, make_policy  # and the heavy names still import from the package
    from sage_engine.core import jit

    assert SpecEngine.__module__ == "sage_engine.core.engine" and callable(make_policy) and jit.__name__.endswith("jit")
