"""The page first: the pair loads behind the page, and a run pressed meanwhile says it waits, then runs exactly."""

from __future__ import annotations

import time

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
    _, timer = handlers.model_tick(preset.name)
    assert timer.active  # the page's model line keeps counting while it loads

    image = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(image)
    rows = list(handlers.compare(str(image), None, "What is in the picture?", 12, "sage"))
    assert rows[0][0].startswith("Waiting: the model pair"), rows[0][0]  # said before anything decodes
    summary = rows[-1][-1]
    assert summary["identical"] and summary["speculative"]["token_ids"] == summary["ar"]["token_ids"]
    thread.join(30)
    assert pool.loading_for(preset.name) is None and "loading" not in handlers.describe_model(preset.name)
    assert not handlers.model_tick(preset.name)[1].active  # loaded: the timer stops


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
