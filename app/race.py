"""The race: autoregressive and speculative decoding of one prepared input, on the app's device thread (device.py).

The device thread only decodes and timestamps step events; the Gradio handler drains them and draws at its own pace,
so drawing never paces decoding. The two decoders NEVER run at the same time, and neither do two visitors' races
(they queue on the one device thread): on a shared device a parallel run would slow both.

Given an engine for each lane (two engines on the same models: each holds one decode's caches), the lanes take turns
in lockstep by tokens (`Race._alternate`: a speculative step, then the autoregressive lane catches up with it): a
shared CPU's neighbours, busy one moment and idle the next, then slow both lanes alike instead of whichever lane
happened to run at the time. Each lane's time is the sum of its own steps (the time spent inside its engine's
`stream()`), so it is what that lane cost, measured on the same machine as the other. Each lane's CPU time (the
process's, in its own steps) is kept too: a neighbour that takes the core mostly makes a lane wait, which CPU time
leaves out (not all: on a shared CPU a token's CPU time still moves ~2x with the neighbours; one decoding thread:
the device's; the page's drawing meanwhile adds a little to both). A short race is timed over several rounds (the
same input decoded again, unseen: `_alternate`). With one engine the lanes run one after the other, each timed like
`SpecEngine.generate()` (the CLI). Before the lanes, the worker decodes a few plain tokens of the same input untimed
(`WARM_TOKENS`), then a few speculative ones: after the machine sat idle or ran other work, a decode runs ~10% slower
for its first tens of milliseconds, and the speculative lane's first steps slower still.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sage_engine import StepEvent

from .device import DeviceThread
from .record import ACCEPTED, BONUS, FIRST, Lane, RunRecord

if TYPE_CHECKING:  # these import torch: the app imports them after its page is served (app/__init__.py)
    from sage_engine import PreparedInput, SpecEngine
    from sage_engine.core.sampling import Sampling
    from sage_engine.policies import Policy


@dataclass(frozen=True)
class Arrival:
    """One step event (or, with event None, the end of a lane) as the worker saw it."""

    lane: str  # "ar" | "spec"
    event: StepEvent | None
    at: float  # seconds the lane has decoded (in turns: the sum of its own steps; at its end, the mean of its rounds)
    cpu: float | None = None  # CPU seconds the process spent in the lane's own steps (in turns only)
    rounds: tuple[tuple[float, float], ...] = ()  # at a lane's end, in turns: (seconds, CPU seconds) of each round


@dataclass(frozen=True)
class Round:
    """One timed round of both lanes in lockstep (`Race._lockstep`)."""

    lanes: dict[str, tuple[float, float]]  # "ar" | "spec" -> (seconds, CPU seconds) of the lane's own steps
    spec_steps: int  # the speculative lane's decode steps

    @property
    def seconds(self) -> float:
        """Both lanes' own seconds: what another round of the same race will take."""
        return sum(t for t, _ in self.lanes.values())


@dataclass(frozen=True)
class Retiming:
    """The texts are done and the lanes decode the same input again, untimed on the page, to time it (`round`: 2...)."""

    round: int


@dataclass(frozen=True)
class Failure:
    """An exception raised in the worker, handed to the handler thread to re-raise."""

    error: Exception


_END = object()
RACING = "sage-race"  # the device thread's name while it decodes a race
WARM_TOKENS = 8  # the untimed decodes before the lanes (plain, then speculative: warms the caches)
# in turns, a race is timed over rounds until its speculative lane has taken TIMED_SPEC_STEPS steps in all, at most
# MAX_ROUNDS rounds, and no round starts that would take the extra rounds past MAX_RETIME_S (Race._alternate)
TIMED_SPEC_STEPS = 40
MAX_ROUNDS = 12
MAX_RETIME_S = 4.0


class RunControl:
    """A session's Stop switch. Kept in gr.State: Gradio deep-copies the initial value per session,
    and each copy is a fresh switch. The Stop button flips it; the decoding thread checks it per step."""

    def __init__(self):
        self.switch = threading.Event()  # set = stop the current run

    def __deepcopy__(self, memo) -> RunControl:
        return RunControl()

    def arm(self) -> None:
        """A new switch for the run just requested (a Stop pressed before it does not carry over)."""
        self.switch = threading.Event()

    def stop(self) -> None:
        self.switch.set()


class Race:
    """One Run's decoding. `start()` queues it on the device thread, then iterate `batches()`; `stop()` ends it."""

    def __init__(self, engine: SpecEngine, prepared: PreparedInput, spec_policy: Policy, max_new_tokens: int,
                 device: DeviceThread, stop: threading.Event | None = None, sampling: Sampling | None = None,
                 ar_engine: SpecEngine | None = None):
        """`engine` decodes the speculative lane; `ar_engine`, a second engine on the same pair, the autoregressive
        one, the two in turns (None: `engine` decodes both, one after the other)."""
        from sage_engine.policies import make_policy

        self.engine, self.prepared, self.max_new_tokens = engine, prepared, max_new_tokens
        self.ar_engine = ar_engine if ar_engine is not engine else None
        self.sampling = sampling  # both lanes sample with it (the same seed: the same text)
        self.lanes = (("ar", make_policy("ar")), ("spec", spec_policy))
        self.device = device  # decodes the lanes, after any run queued before this one
        self._queue: queue.Queue = queue.Queue()
        self._switch = stop or threading.Event()  # the user's Stop (shared with the session's RunControl)
        self._quit = threading.Event()  # the handler is gone (closed generator) or done
        self._job: Future | None = None
        self._texts_done = False  # both lanes decoded their whole text once

    def start(self) -> Race:
        self._job = self.device.submit(self._work)
        return self

    def stop(self, wait: float = 30.0) -> None:
        """End the decoding (after its current step; a race still queued never starts) and wait for it."""
        self._quit.set()
        if self._job is not None and not self._job.cancel():
            wait_for([self._job], wait)

    @property
    def stopped(self) -> bool:
        """The user pressed Stop before both texts were done (a Stop while the race is timed again only ends the
        timing: the rounds done so far are its figures)."""
        return self._switch.is_set() and not self._texts_done

    def _work(self) -> None:
        thread = threading.current_thread()
        idle_name, thread.name = thread.name, RACING  # while it decodes a race (a profiler, or a test, can tell)
        try:
            # untimed: a warm machine, and both lanes' models and code paths warm (the speculative lane's draft and
            # compiled step sit cold since the last run)
            (self.ar_engine or self.engine).generate(self.prepared, "ar", WARM_TOKENS)
            self.engine.generate(self.prepared, self.lanes[1][1], WARM_TOKENS)  # stream() resets the policy after
            if self.ar_engine is not None:
                self._alternate()
                return
            for lane, policy in self.lanes:
                if not self._run_lane(lane, policy):
                    return
        except Exception as e:  # noqa: BLE001 - not swallowed: re-raised in the handler thread
            self._queue.put(Failure(e))
        finally:
            thread.name = idle_name
            self._queue.put(_END)

    def _run_lane(self, lane: str, policy: Policy) -> bool:
        t0 = time.perf_counter()
        for ev in self.engine.stream(self.prepared, policy, self.max_new_tokens, sampling=self.sampling):
            self._queue.put(Arrival(lane, ev, time.perf_counter() - t0))
            if self._switch.is_set() or self._quit.is_set():
                return False
        self._queue.put(Arrival(lane, None, time.perf_counter() - t0))
        return True

    def _alternate(self) -> None:
        """Both lanes in lockstep by tokens (`_lockstep`), their events streamed to the page; then, where the
        speculative lane took fewer than TIMED_SPEC_STEPS steps, the same again, unseen on the page, until its steps
        add up to that (at most MAX_ROUNDS rounds, MAX_RETIME_S of extra rounds). Each lane's time is the mean of its
        rounds.

        Why rounds: on a shared CPU each speculative step, ~10 ms, is one draw of what the neighbours are doing, and
        a short answer is a few steps, so one round of it times the neighbours as much as the decoders (five
        one-round races of one example moved up to 20% in CPU time and 35% by the clock; docs/log/RACE_SPREAD.md).
        The budget is in steps, not seconds: a busy machine stretches the seconds of the very rounds it makes
        noisy. A long answer is one round."""
        first = self._lockstep(stream=True)
        if first is None:
            return
        self._texts_done = True
        rounds, extra = [first], 0.0
        while (len(rounds) < MAX_ROUNDS and len(rounds) * first.spec_steps < TIMED_SPEC_STEPS
               and extra + first.seconds <= MAX_RETIME_S):
            self._queue.put(Retiming(len(rounds) + 1))
            t0 = time.perf_counter()
            timed = self._lockstep(stream=False)
            extra += time.perf_counter() - t0
            if timed is None:  # Stop, or the page is gone: the rounds done so far
                break
            rounds.append(timed)
        for lane in ("ar", "spec"):
            own = tuple(r.lanes[lane] for r in rounds)
            self._queue.put(Arrival(lane, None, sum(t for t, _ in own) / len(own), sum(c for _, c in own) / len(own),
                                    own))

    def _lockstep(self, stream: bool) -> Round | None:
        """One round of both lanes in lockstep by tokens: the lane with fewer tokens so far decodes its next step (on
        a tie, the lane that did not just run), so the speculative lane takes one step and the autoregressive lane
        then catches up with it token by token. Each lane's clock runs only inside its own engine's steps.
        stream: its step events go to the page. None where Stop was pressed or the page is gone.

        Why by tokens and not by time: a lane that is done early would leave the other decoding alone, timed while
        the neighbours did whatever they did then. In lockstep both lanes cover the same stretch of the answer in
        the same tens of milliseconds, so a neighbour's burst weighs on each in proportion to its own work."""
        engines = {"ar": self.ar_engine, "spec": self.engine}
        turns = {lane: iter(engines[lane].stream(self.prepared, policy, self.max_new_tokens, sampling=self.sampling))
                 for lane, policy in self.lanes}
        tokens, seconds, cpu = dict.fromkeys(turns, 0), dict.fromkeys(turns, 0.0), dict.fromkeys(turns, 0.0)
        last, spec_steps = "ar", 0
        try:
            while turns:
                lane = min(turns, key=lambda k: (tokens[k], k == last))
                t0, c0 = time.perf_counter(), time.process_time()
                ev = next(turns[lane], None)
                t1, c1 = time.perf_counter(), time.process_time()
                seconds[lane] += t1 - t0
                cpu[lane] += c1 - c0
                if ev is None:
                    del turns[lane]
                    continue
                if stream:
                    self._queue.put(Arrival(lane, ev, seconds[lane], cpu[lane]))
                tokens[lane] += len(ev.new_token_ids)
                spec_steps += lane == "spec" and ev.kind == "decode"
                last = lane
                if self._switch.is_set() or self._quit.is_set():
                    return None
        finally:
            for unfinished in turns.values():
                unfinished.close()
        return Round({lane: (seconds[lane], cpu[lane]) for lane in seconds}, spec_steps)

    def batches(self, every: Callable[[], float]) -> Iterator[list[Arrival]]:
        """Everything that arrived since the last batch, polled every `every()` s (a batch may be []).

        Polling, not a blocking get(): a consumer woken on every event would compete with the decoding
        thread (for the GIL, and for the cores its math threads spin on) at each step and slow it down.
        """
        end = False
        while not end:
            time.sleep(every())
            items = []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            end = any(x is _END for x in items)
            items = [x for x in items if x is not _END]
            for x in items:
                if isinstance(x, Failure):
                    raise x.error
            yield items


class Transcriber:
    """Turns a lane's step events into its text, split by origin: the engine detokenises (each event carries
    its text, and the part of it the accepted draft tokens wrote), so the app never decodes again."""

    def add(self, lane: Lane, arrival: Arrival) -> None:
        """Record one arrival in `lane`: the event, its time, the text and its origin segments."""
        if arrival.event is None:
            if arrival.rounds and lane.arrivals and arrival.rounds[0][0] > 0:  # the replay runs at the rounds' mean
                scale = arrival.at / arrival.rounds[0][0]
                lane.arrivals = [t * scale for t in lane.arrivals]
            lane.seconds, lane.cpu_seconds, lane.rounds = arrival.at, arrival.cpu, list(arrival.rounds)
            return
        ev = arrival.event
        lane.steps.append(ev)
        lane.arrivals.append(arrival.at)
        lane.token_ids.extend(ev.new_token_ids)
        if ev.kind == "prefill":
            parts = [(ev.new_text, FIRST)]
        else:
            parts = [(ev.accepted_text, ACCEPTED), (ev.new_text[len(ev.accepted_text):], BONUS)]
        lane.segments.extend((part, label) for part, label in parts if part)
        lane.text += ev.new_text
        lane.text_ends.append(len(lane.text))


def consume(record: RunRecord, transcriber: Transcriber, batch: list[Arrival | Retiming]) -> set[str]:
    """Apply a batch to the record; returns the lanes that changed ("timing": the race is timed again)."""
    touched = set()
    for a in batch:
        if isinstance(a, Retiming):
            record.retiming = a.round
            touched.add("timing")
            continue
        transcriber.add(record.ar if a.lane == "ar" else record.spec, a)
        touched.add(a.lane)
    return touched
