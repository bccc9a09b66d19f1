"""The demo's examples: cached lazily (raced live once, then replayed from the cache, also without its run file),
the cache modes, and the cache key that follows the weights."""

from __future__ import annotations

import json
import time
import urllib.request

import app_server
import pytest
from app_server import OUT, check_summary, figure

from app.layout import DEFAULT_NEW_TOKENS

pytestmark = pytest.mark.timeout(300)


def test_cached_example_races_once_then_replays(client, server, media):
    """An example cached lazily: the first call races it live (status "Done", raced just now) and stores it; the
    second returns the stored run at once, says it is cached, and carries the same tokens and the same timings."""
    from app.examples import EXAMPLE_API
    from app.media import load_examples
    from app.record import RunRecord

    n = sum(e.media == "image" for e in load_examples())
    if not n:
        pytest.skip("no image examples in assets/examples")
    index = n - 1  # the last image example (test_browser clicks the first: each test sees its own first click)
    calls = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = dict(zip(OUT, client.predict(index, api_name=EXAMPLE_API["image"])))
        calls.append((time.perf_counter() - t0, out))
    (t_live, live), (t_cached, cached) = calls
    print(f"\nimage example {index}: first call (live race) {t_live:.2f} s, second call (cache) {t_cached:.2f} s")
    assert "Done" in live["status"] and "Raced live just now" in live["status"]
    assert "Cached result" not in live["status"]
    assert cached["status"].startswith("**Cached result**") and "Done" not in cached["status"]
    assert "timings measured then" in cached["status"] and "press **Run** to race live" in cached["status"]
    s = check_summary(live)
    assert s["preset"] == server.default_preset and len(s["ar"]["token_ids"]) <= DEFAULT_NEW_TOKENS  # defaults
    assert cached["summary"]["speculative"]["token_ids"] == s["speculative"]["token_ids"]
    assert cached["summary"] == s  # the same run, timings included: shown, not raced again
    assert t_cached < 3.0
    steps = s["speculative"]["stats"]["target_forwards"]
    for out in (live, cached):
        assert out["step"]["interactive"] is (steps > 1) and out["step"]["maximum"] == max(2, steps)
        assert out["export"]["interactive"] is True and figure(out["fig_tree"]).data
    # the run behind the step slider is rebuilt from the cached run file
    path = cached["export"]["value"]
    with urllib.request.urlopen(f"{server.url}/gradio_api/file={path}") as r:
        rebuilt = RunRecord.from_export(json.loads(r.read()))
    assert rebuilt.summary() == s and len(rebuilt.spec.decode_steps) == steps
    for st in rebuilt.spec.decode_steps:   # a bonus token unless EOS / the budget cut the step inside its draft path
        has_bonus = len(st.new_token_ids) > min(len(st.accepted_tokens), len(st.new_token_ids))
        assert st.tree is not None and (st.bonus_text is not None) == has_bonus, st.step
    assert sum(st.bonus_text is None for st in rebuilt.spec.decode_steps) <= 1   # the last step only


def test_cached_example_without_its_run_file_degrades():
    """A stored example whose run file cannot be read (an old or damaged cache) is still shown, labelled as
    cached, with the step slider switched off and a status that says why."""
    from app.examples import NAMES, ExampleRuns

    stored = {n: None for n in NAMES}
    stored.update(status="**Cached result** of an earlier run of this example", spec_text=[], export=None)
    out = dict(zip(NAMES, ExampleRuns(None).present([stored[n] for n in NAMES], fresh=False)))
    assert out["status"].startswith("**Cached result**") and "step slider is off" in out["status"]
    assert out["step"] == {"__type__": "update", "interactive": False} and out["run_state"] is None


def test_cache_examples_modes(monkeypatch, tmp_path):
    """`off` builds plain example galleries (a click only fills the inputs); anything else is refused."""
    from gradio.helpers import Examples

    from app import build_demo
    from app.examples import LazyExamples

    made = []
    monkeypatch.setattr(Examples, "create", lambda self: made.append(self))
    monkeypatch.setenv("GRADIO_EXAMPLES_CACHE", str(tmp_path))
    table = {app_server.TINY.name: app_server.TINY}
    build_demo(table, pair_factory=app_server.pair_factory, cache_examples="off")
    assert made and not any(isinstance(x, LazyExamples) for x in made)
    assert all(x.cache_examples is False for x in made)
    made.clear()
    build_demo(table, pair_factory=app_server.pair_factory, cache_examples="lazy")
    assert made and all(isinstance(x, LazyExamples) and x.cache_examples == "lazy" for x in made)
    assert all(str(x.cached_folder).startswith(str(tmp_path)) for x in made)
    with pytest.raises(ValueError, match="lazy, off"):
        build_demo(table, pair_factory=app_server.pair_factory, cache_examples="eager")


def test_example_cache_key_follows_the_weights(tmp_path):
    """Retrained weights under the same preset paths must not show runs cached with the old ones."""
    import os

    from app.examples import fingerprint
    from sage_engine.models.presets import Preset

    target, draft = tmp_path / "t", tmp_path / "d"
    for d in (target, draft):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"old weights")
    image = tmp_path / "x.png"
    image.write_bytes(b"png")
    preset = Preset("local", "qwen2_5_vl", str(target), str(draft), None, None, None, None, True, "test")
    rows = [[str(image), "Describe."]]
    before = fingerprint(preset, rows)
    assert fingerprint(preset, rows) == before
    (draft / "model.safetensors").write_bytes(b"new weights!")
    os.utime(draft / "model.safetensors", ns=(1, 1))
    assert fingerprint(preset, rows) != before
