"""The race behind a run, no server: the Stop switch, the untimed warm-up, the decoding threads, all model work on
one device thread, the pacer of streamed updates, and the ZeroGPU contract (pickled arguments and rows)."""

from __future__ import annotations

import os
from dataclasses import fields

import app_server
import pytest

from sage_engine import SpecEngine, make_policy

pytestmark = pytest.mark.timeout(300)


def test_stop_switch_ends_the_race_early():
    """The Stop switch, on the real engine: the decoding thread quits within a step or two."""
    from app.device import DeviceThread
    from app.race import Race, RunControl, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import SpecEngine, make_policy, prepare_input
    from sage_testing.tiny_pairs import image, qwen25_pair

    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    control = RunControl()
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 500, DeviceThread(), control.switch).start()
    record, transcriber = RunRecord("p", "q", 500, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber()
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
        if record.ar.steps:
            control.stop()
    assert race.stopped and not record.ar.done and not record.spec.steps
    assert 1 <= len(record.ar.token_ids) < 100
    control.arm()
    assert not control.switch.is_set()


def _streams(monkeypatch) -> list[tuple[str, int]]:
    """Every SpecEngine.stream() call from now on, as (policy name, max_new_tokens), in order."""
    calls = []
    real_stream = SpecEngine.stream

    def spy(self, prepared, policy, max_new_tokens, *args, **kwargs):
        calls.append((policy if isinstance(policy, str) else policy.name, max_new_tokens))
        return real_stream(self, prepared, policy, max_new_tokens, *args, **kwargs)

    monkeypatch.setattr(SpecEngine, "stream", spy)
    return calls


def test_race_warms_up_untimed_before_its_lanes(monkeypatch):
    """A race decodes WARM_TOKENS plain tokens of its input, then WARM_TOKENS with its speculative policy, before the
    two timed lanes, and none of their events reach the record: neither lane pays for a machine, a draft or a compiled
    step that sat idle."""
    from app import race as race_module
    from app.device import DeviceThread
    from app.race import Race, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import SpecEngine, make_policy, prepare_input
    from sage_testing.tiny_pairs import image, qwen25_pair

    calls = _streams(monkeypatch)
    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 12, DeviceThread()).start()
    record, transcriber = RunRecord("p", "q", 12, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber()
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
    warm = race_module.WARM_TOKENS
    assert calls == [("ar", warm), ("sage", warm), ("ar", 12), ("sage", 12)]
    assert record.ar.done and record.spec.done and len(record.ar.token_ids) == len(record.spec.token_ids) == 12
    assert record.ar.token_ids == record.spec.token_ids


def _raced(monkeypatch, spec_steps: int, max_rounds: int, stop_in_round: int | None = None):
    """A race in turns on the tiny pair with the timing budget set, its record, the Retiming rounds it announced, and
    how many times each lane decoded (warm-up included)."""
    from app import race as race_module
    from app.device import DeviceThread
    from app.race import Race, RunControl, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import prepare_input
    from sage_testing.tiny_pairs import image, qwen25_pair

    monkeypatch.setattr(race_module, "TIMED_SPEC_STEPS", spec_steps)
    monkeypatch.setattr(race_module, "MAX_ROUNDS", max_rounds)
    streams = _streams(monkeypatch)
    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    control = RunControl()
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 40, DeviceThread(), control.switch,
                ar_engine=SpecEngine(pair)).start()
    record, transcriber = RunRecord("p", "q", 40, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber()
    announced = []
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
        announced += [a.round for a in batch if isinstance(a, race_module.Retiming)]
        if stop_in_round is not None and record.retiming == stop_in_round:
            control.stop()
    return race, record, announced, [policy for policy, _ in streams]


def test_a_short_race_is_timed_over_rounds_each_lane_by_their_mean(monkeypatch):
    """A speculative lane of fewer than TIMED_SPEC_STEPS steps is decoded again, unseen, up to MAX_ROUNDS rounds: the
    page hears of each extra round (Retiming), the texts and step events are the first round's alone, each lane's
    seconds and CPU seconds are the means of its rounds, and the replay's arrival times are scaled to that mean."""
    race, record, announced, calls = _raced(monkeypatch, spec_steps=10**6, max_rounds=3)
    assert announced == [2, 3] and calls.count("ar") == 1 + 3 and calls.count("sage") == 1 + 3  # warm-up + rounds
    assert not race.stopped and record.ar.token_ids == record.spec.token_ids and len(record.ar.token_ids) == 40
    assert len(record.ar.steps) == 40  # one round's events: prefill + 39 plain steps
    for lane in (record.ar, record.spec):
        assert len(lane.rounds) == 3 and all(t > 0 and c > 0 for t, c in lane.rounds)
        assert lane.seconds == pytest.approx(sum(t for t, _ in lane.rounds) / 3)
        assert lane.cpu_seconds == pytest.approx(sum(c for _, c in lane.rounds) / 3)
        assert lane.arrivals[-1] <= lane.seconds + 1e-9 and lane.arrivals == sorted(lane.arrivals)
    assert record.export()["speculative"]["rounds"] == record.spec.rounds
    from app import text
    assert "timed over 3 rounds" in text.scoreboard(record)  # the speedup card says so
    record.retiming, record.ar.seconds = 2, None  # as the page sees it while round 2 runs
    assert text.status_running(record).startswith("Timing the race: round 2.")
    assert "timing: round 2 of at most" in text.scoreboard(record) and "done; timing" in text.scoreboard(record)
    # a speculative lane of enough steps: one round
    race, record, announced, calls = _raced(monkeypatch, spec_steps=1, max_rounds=5)
    assert announced == [] and len(record.spec.rounds) == 1 and calls.count("sage") == 2


def test_stop_while_a_race_is_timed_again_keeps_the_rounds_done(monkeypatch):
    """Stop after the texts are done ends the timing, not the race: the rounds finished so far are its figures."""
    race, record, announced, _ = _raced(monkeypatch, spec_steps=10**6, max_rounds=5, stop_in_round=2)
    assert not race.stopped and record.done and 1 <= len(record.spec.rounds) < 5
    assert record.speedup() is not None and record.cpu_speedup() is not None


def test_the_autoregressive_lane_runs_on_the_backends_the_speculative_engine_kept(monkeypatch):
    """The race's second engine (Loaded.ar_engine) is the first one's twin: its target runs the backend the first one's
    check and timing kept, even where timing again would pick another (as it may on a busy machine); a race whose
    lanes ran on different backends would compare backends, not decoders. Before, the pool rebuilt the engine up to
    three times hoping the timing agreed, then ran the lanes one after the other."""
    from app.device import DeviceThread
    from app.pool import Loaded
    from app.served import served
    from sage_engine.backends import choose
    from sage_engine.models.loading import load_pair

    preset = next(iter(served().values()))
    pair = load_pair(target=preset.target, draft=preset.draft)
    real_fastest = choose.fastest
    picked: set[str] = set()  # what the first engine's timing kept
    timed = []

    def fastest(candidates, *args, **kw):  # after the first build, timing picks what it did not
        timed.append([c.name for c in candidates])
        if not picked:
            return real_fastest(candidates, *args, **kw)
        return next((c for c in candidates if c.name not in picked), candidates[0])

    monkeypatch.setattr(choose, "fastest", fastest)
    like = SpecEngine(pair)
    picked.update((like.target.tree_forward, like.draft.tree_forward))
    assert len(like.target.offered.candidates) > 1, "the shipped target must offer several backends"
    assert SpecEngine(pair).target.tree_forward != like.target.tree_forward  # timing again would part the lanes
    timed.clear()
    loaded = Loaded(preset, pair, 0.0, DeviceThread())
    twin = loaded.ar_engine(like)
    assert twin is not None and twin is not like
    assert twin.backends()["target"]["cached"] == like.target.tree_forward
    assert twin.backends()["target"]["prompt"] == like.target.prompt_path
    assert twin.draft.tree_forward == like.draft.tree_forward
    assert all(len(names) == 1 for names in timed), timed  # one candidate each: nothing timed again
    assert loaded.ar_engine(like) is twin  # kept for the next race


def test_default_threads_follow_the_cpus_the_process_may_use(monkeypatch):
    """The app's decoding threads come from the CPUs a container lets it use, not from os.cpu_count(), which gives the
    host's (a CPU Space's count, 16, against its quota of 2): here a limit joblib's count honours as it does a cgroup
    quota."""
    from app import device

    monkeypatch.setattr(os, "cpu_count", lambda: 16)  # the host's cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "2")
    assert (device.usable_cpus(), device.default_threads()) == (2, 1)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "5")
    assert (device.usable_cpus(), device.default_threads()) == (5, 4)


def test_all_model_work_runs_on_one_device_thread(monkeypatch, media):
    """Loading, engine building, input preparation and both lanes of every run happen on the pool's one device
    thread, never on the calling (server) thread: each thread that starts torch's parallel work keeps an OpenMP
    team, and a second team slows decoding (app/device.py). A queued race whose visitor left never starts."""
    import threading

    import sage_engine.models.inputs as inputs_module
    from app.device import DeviceThread
    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool
    from app.race import Race, RunControl

    seen: dict[str, set] = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.get_ident())
            return fn(*args, **kwargs)
        return wrapped

    # app.handlers imports prepare_input when it runs (after the page is served): spied on where it is defined
    monkeypatch.setattr(inputs_module, "prepare_input", spy("prepare", inputs_module.prepare_input))
    monkeypatch.setattr(SpecEngine, "__init__", spy("engine", SpecEngine.__init__))
    monkeypatch.setattr(SpecEngine, "stream", spy("decode", SpecEngine.stream))
    table = app_server.presets()
    pool = PairPool({"tiny-random": table["tiny-random"]}, spy("load", app_server.pair_factory))
    h = Handlers(pool, RunFiles(), "tiny-random")
    for prune in (False, True):  # two engines (draft pruning on and off), two runs
        rows = list(h.compare(media.image, None, media.image_prompt, 8, "sage", "tiny-random", RunControl(),
                              draft_prune=prune))
        assert rows
    assert set(seen) == {"load", "engine", "prepare", "decode"}
    threads = set().union(*seen.values())
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert pool.device.call(threading.get_ident) in threads
    assert pool.device.call(pool.device.on_device) and not pool.device.on_device()

    device = DeviceThread()
    gate = threading.Event()
    device.submit(gate.wait, 10)  # the device is busy with another visitor's run
    loaded = pool.get("tiny-random")
    queued = Race(loaded.engine(), h._prepare(loaded.pair, "q", media.image, None)[1], make_policy("ar"), 4, device)
    queued.start().stop(wait=0.1)  # the visitor leaves while the race waits for the device
    gate.set()
    assert queued._job.cancelled() and device.call(lambda: 1) == 1


def test_pacer_keeps_updates_within_their_share():
    """Streamed updates are paid from a budget of `share` x wall time; the first token always shows."""
    from app.pacing import Pacer

    p = Pacer(share=0.04, text_every=0.25, plot_every=1.0, text_cost=0.005, plot_cost=0.05, start=0.0)
    assert p.text_due(0.01)  # the first token, whatever it costs
    p.sent_update(0.02, 0.03)
    assert not p.text_due(0.2)  # too soon (text_every)
    assert not p.text_due(0.3)  # spacing met, but 0.02 + 0.02 > 4% of 0.3 s
    assert p.text_due(1.0)  # 0.04 <= 0.04
    assert not p.plot_due(1.0)  # a 0.05 s figure on top would overspend: a short run keeps its figures for the end
    # a long run: spent 0.02 + 0.02 (the update at 1.0 s); the figure comes once 4% of the elapsed time covers it
    p.sent_update(0.02, 1.0)
    assert not p.plot_due(2.5) and p.plot_due(2.8)  # 0.04 + 0.02 + 0.05 <= 4% of 2.8 s
    p.plotted(0.05, 2.8)
    p.sent_update(0.02, 2.8)
    assert not p.plot_due(3.5)  # plot_every holds it back
    assert not p.plot_due(4.0)  # and so does the budget: 0.11 + 0.07 > 0.16
    assert p.plot_due(4.5)
    # the speculative lane starts: what the autoregressive lane left unspent is not its to spend
    assert p.text_due(5.0)
    p.new_lane(5.0)
    assert not p.text_due(5.3)  # 0.02 > 4% of its 0.3 s
    assert p.text_due(5.5)  # 0.02 <= 4% of its 0.5 s


def test_zero_gpu_contract(monkeypatch, media):
    """On a ZeroGPU Space, `spaces.GPU` runs the decorated call in a forked worker: arguments and every yielded
    row are pickled across. A stand-in `spaces` with that contract (pickle in, pickle out) runs a real race."""
    import pickle
    import sys
    import types

    from app.gpu import on_gpu
    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool

    fn = lambda: None  # noqa: E731
    assert on_gpu()(fn) is fn  # no ZeroGPU: the identity

    calls = []

    def GPU(duration):
        def decorate(task):
            def worker(*args, **kwargs):
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))  # fails on a threading.Event
                calls.append((duration, args, kwargs))
                for row in task(*args, **kwargs):
                    yield pickle.loads(pickle.dumps(row))
            return worker
        return decorate

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    table = app_server.presets()
    h = Handlers(PairPool({"tiny-random": table["tiny-random"]}, app_server.pair_factory), RunFiles(), "tiny-random")
    from app.race import RunControl

    rows = list(h.compare(media.image, None, media.image_prompt, 16, "sage", "tiny-random", RunControl()))
    assert len(calls) == 1 and calls[0][0] > 0
    assert calls[0][1][6] is None  # the Stop switch stays in the main process
    from app.view import View

    final = dict(zip([f.name for f in fields(View)], rows[-1]))
    assert final["summary"]["speculative"]["token_ids"] == final["summary"]["ar"]["token_ids"]
