"""Issue 81, "a page that teaches": the defects a visitor meets that need no browser to see (the API's page, the
status while the pair loads, the words of a lost race), and the race timed so that both lanes see the same noise.
The browser's side is in test_browser.py (test_defect_*)."""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.request

import app_server
import pytest
from app_server import run
from gradio_client import handle_file
from gradio_client.exceptions import AppError

pytestmark = pytest.mark.timeout(300)


def endpoint_info(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/gradio_api/info") as r:
        return json.loads(r.read())["named_endpoints"]["/compare"]


def test_defect_4_and_12_the_api_page_marks_image_and_video_optional_and_shows_no_internal_notes(server):
    info = endpoint_info(server)
    params = {p["parameter_name"]: p for p in info["parameters"]}
    assert params["image"]["parameter_has_default"] and params["video"]["parameter_has_default"]
    assert params["image"]["parameter_default"] is None and params["video"]["parameter_default"] is None
    said = info.get("description") or ""
    assert "image" in said and "video" in said  # it still says what the endpoint does
    for internal in ("self.", "_on_device", "spaces.GPU", "ZeroGPU", "_compare", "RunControl"):
        assert internal not in said, said


@pytest.mark.parametrize("which", ["neither", "both"])
def test_defect_3_and_4_no_media_or_both_are_refused_in_one_line(client, media, which):
    """No image and no video: no made-up answer; an image and a video: not both read silently."""
    kwargs = dict(image=None, video=None) if which == "neither" else dict(image=handle_file(media.image),
                                                                             video=handle_file(media.video))
    job = client.submit(api_name="/compare", prompt="What is in the picture?", max_new_tokens=8, policy="sage",
                        **kwargs)
    with pytest.raises(AppError) as error:
        job.result()
    said = str(error.value)
    assert "\n" not in said and ("image or a video" in said if which == "neither" else "both" in said), said


def load_events(demo) -> list:
    """The functions the page runs by itself once loaded and on its timer (no click), with their inputs/outputs."""
    return [fn for fn in demo.fns.values() if fn.fn is not None and not fn.js
            and any(t[1] in ("load", "tick") for t in fn.targets)]


def test_defect_7_the_status_box_says_the_pair_is_loading_not_ready():
    """While the pair loads behind the page, what the page's own load and timer events write into the status box
    (above the fold, beside Run) says so; 'Ready.' only once it is loaded."""
    from app import build_demo

    gate = threading.Event()

    def slow(preset):
        gate.wait(60)
        return app_server.pair_factory(preset)

    preset = app_server.TINY
    demo = build_demo(presets={preset.name: preset}, pair_factory=slow, preload="background", examples=[])
    try:
        status = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "status")
        assert "Ready" not in (status.value or "")

        def written() -> list[str]:
            out = []
            for fn in load_events(demo):
                outputs = list(fn.outputs)
                if status not in outputs:
                    continue
                values = fn.fn(*[getattr(c, "value", None) for c in fn.inputs])
                value = values[outputs.index(status)] if isinstance(values, tuple) else values
                out.append(str(getattr(value, "value", value)))
            return out

        during = written()
        assert during and all("loading" in w.lower() and "Ready" not in w for w in during), during
    finally:
        gate.set()
    handlers_pool = next(fn for fn in load_events(demo)).fn.__self__.pool
    for _ in range(600):
        if handlers_pool.loading_for(preset.name) is None:
            break
        threading.Event().wait(0.1)
    assert any("Ready" in w for w in written())


def test_defect_17_a_race_slower_than_ar_says_it_was_slower_and_why(client, server, media):
    """A real run's record, its autoregressive lane made twice as fast: the status and the scoreboard say the
    speculative lane was slower, and why."""
    from app import text
    from app.record import RunRecord

    _, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                   max_new_tokens=24, policy="sage")
    with urllib.request.urlopen(f"{server.url}/gradio_api/file={final['export']['value']}") as r:
        record = RunRecord.from_export(json.loads(r.read()))
    record.ar.seconds = record.spec.seconds / 2  # the target alone, twice as fast: this race was lost
    if record.ar.cpu_seconds:  # the lanes took turns: the page leads with the CPU-time speedup
        record.ar.cpu_seconds = record.spec.cpu_seconds / 2
    lost_by = record.headline_speedup()
    assert lost_by is not None and lost_by < 1
    status, board = text.status_done(record), text.scoreboard(record)
    for said in (status, board):
        assert "slower" in said and "because" in said, said


def test_point_4_the_lanes_take_turns_in_lockstep_and_each_is_timed_by_its_own_steps():
    """Given an engine per lane, the race alternates the lanes in lockstep by tokens (a lane steps only while it has
    no more tokens than the other, so neither runs on alone while the other waits), each lane's time is the sum of
    its own steps (together at most the race's wall time), and the outputs stay identical."""
    import time

    from app.device import DeviceThread
    from app.race import Race, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import SpecEngine, make_policy, prepare_input
    from sage_testing.tiny_pairs import image, qwen25_pair

    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    t0 = time.perf_counter()
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 200, DeviceThread(), ar_engine=SpecEngine(pair))
    race.start()
    record, transcriber, order = RunRecord("p", "q", 200, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber(), []
    started = time.perf_counter()
    tokens, ahead = {"ar": 0, "spec": 0}, []
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
        for a in batch:
            if getattr(a, "event", None) is not None:  # not a lane's end, nor a round of timing (Retiming)
                other = "spec" if a.lane == "ar" else "ar"
                if not (record.ar if other == "ar" else record.spec).done:
                    ahead.append(tokens[a.lane] - tokens[other])  # before this step
                tokens[a.lane] += len(a.event.new_token_ids)
                order.append(a.lane)
    wall = time.perf_counter() - started
    switches = sum(1 for a, b in zip(order, order[1:]) if a != b)
    assert switches >= 3, order  # not one lane and then the other
    assert max(ahead) <= 0, ahead  # a lane steps only while it is not ahead of the other
    assert record.ar.done and record.spec.done and record.ar.token_ids == record.spec.token_ids
    timed = sum(t for lane in (record.ar, record.spec) for t, _ in lane.rounds)  # every round's own steps
    assert timed <= wall, (record.ar.rounds, record.spec.rounds, wall, t0)
    for lane in (record.ar, record.spec):  # each lane's time: the mean of its rounds
        assert lane.seconds == pytest.approx(sum(t for t, _ in lane.rounds) / len(lane.rounds))


def test_the_run_note_does_not_read_a_correlation_into_an_alpha_that_hardly_moved():
    """Issue 81 (symbols a student cannot read): on the shapes examples α is near 1 at every step, and a correlation
    of the accepted length with it (one run measured -0.94) is noise that reads as "α predicts badly". Where α spans
    less than ALPHA_SPREAD_MIN the note gives α's range instead; where it varies, the correlation."""
    from dataclasses import replace

    from app import text
    from app.record import Lane
    from sage_engine import StepEvent

    def step(i: int, alpha: float, accepted: int) -> StepEvent:
        fields = {f.name: None for f in dataclasses.fields(StepEvent)}
        return replace(StepEvent(**fields), kind="decode", step=i, depth=4, root_alpha=alpha,
                       accepted_tokens=[1] * accepted)

    sure = Lane("spec", "sage", steps=[step(i, a, n) for i, (a, n) in
                                       enumerate([(0.99, 12), (1.0, 3), (0.98, 14), (0.995, 2), (0.97, 11)])])
    note = text.run_note(sure)
    assert "α stayed between 0.97 and 1.00" in note and "correlation over it would be noise" in note, note
    assert "+" not in note.split("α stayed")[1]  # no correlation figure
    same = Lane("spec", "sage", steps=[step(i, 0.999, n) for i, n in enumerate([12, 3, 14])])
    assert "α was 1.00 at every drafted step" in text.run_note(same)
    mixed = Lane("spec", "sage", steps=[step(i, a, n) for i, (a, n) in
                                        enumerate([(0.4, 1), (0.9, 10), (0.5, 2), (0.95, 12), (0.6, 4)])])
    note = text.run_note(mixed)
    assert "How well α predicted the accepted length over the 5 drafted steps: +0.9" in note, note
