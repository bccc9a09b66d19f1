"""Loaded model pairs, one engine per preset, created on first use and kept for the process.

The pool belongs to one `build_demo()` call (no module-level state), and so does its device thread
(device.py): pairs are loaded and engines built there, like every other piece of model work, and the
runs queue there (one run per device), so the pool only guards its own dict.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sage_engine import ModelError

from .device import DeviceThread
from .served import Preset, unavailable

if TYPE_CHECKING:  # these import torch: the app imports them after its page is served (app/__init__.py)
    from sage_engine import ModelPair, SpecEngine
    from sage_engine.models.pruning import VisualPruning

PairFactory = Callable[[Preset], "ModelPair"]
log = logging.getLogger("sage.app")


def load_preset(preset: Preset) -> ModelPair:
    """The default pair factory: `sage_engine.load_pair` with the preset's pair, dtype and device."""
    from sage_engine.models.loading import load_pair

    reason = unavailable(preset)
    if reason:
        raise ModelError(f"model pair {preset.name!r} is not available: {reason}")
    return load_pair(target=preset.target, draft=preset.draft, dtype=preset.dtype, device=preset.device)


def _timed(factory: PairFactory, preset: Preset) -> tuple[ModelPair, float]:
    """The factory's pair and its seconds, timed on the device thread: not the wait behind the work queued there
    before it (app.py's `setup`, another visitor's run)."""
    t0 = time.perf_counter()
    pair = factory(preset)
    return pair, time.perf_counter() - t0


def _log_failure(done) -> None:
    """A failed `setup` (a future's callback): its traceback goes to the log; a load after it says what else fails."""
    if done.exception() is not None:
        log.error("engine setup failed", exc_info=done.exception())


def _target_runs_alike(a: SpecEngine, b: SpecEngine) -> bool:
    """Do the two engines' targets run their cached passes and their prompts on the same backends?"""
    ta, tb = a.backends()["target"], b.backends()["target"]
    return (ta["cached"], ta["prompt"]) == (tb["cached"], tb["prompt"])


AR_LANE = "ar-lane"  # Loaded.engines' key of the race's autoregressive engine


@dataclass
class Loaded:
    """A ready pair and its engines (one per draft-pruning setting; they share the models)."""

    preset: Preset
    pair: ModelPair
    load_seconds: float
    device: DeviceThread  # the thread that built and uses these models
    engines: dict = field(default_factory=dict)  # VisualPruning | None -> SpecEngine
    _building: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one build per engine

    def engine(self, draft_pruning: VisualPruning | None = None) -> SpecEngine:
        """The engine for `draft_pruning`, built on the device thread the first time (its runners time and check
        their layers there); a second caller meanwhile (the background preload and a run) waits for that build."""
        from sage_engine import SpecEngine
        from sage_engine.core import jit

        with self._building:
            engine = self.engines.get(draft_pruning)
            if engine is None or (engine.compiled is False and jit.activate()):  # built before the compile finished
                engine = self.engines[draft_pruning] = self.device.call(SpecEngine, self.pair,
                                                                        draft_pruning=draft_pruning)
            return engine

    def ar_engine(self, like: SpecEngine) -> SpecEngine | None:
        """A second engine on the same models, for the autoregressive lane of a race: the two lanes decode in turns
        (app/race.py), and each engine holds one decode's caches. It is `like`'s twin (SpecEngine.twin: each model on
        the backend `like`'s checks kept, not timed again), built once and kept. None where its target's check turned
        that backend or its prompt path down: the race then runs its lanes one after the other, and says so."""
        with self._building:
            engine = self.engines.get(AR_LANE)
            if engine is None or not _target_runs_alike(engine, like):
                engine = self.engines[AR_LANE] = self.device.call(like.twin)
            return engine if _target_runs_alike(engine, like) else None

    @property
    def text_only(self) -> bool:
        """A text-only pair (its processor is a bare tokenizer): it reads no image or video."""
        from sage_engine.models.families import is_tokenizer

        return is_tokenizer(self.pair.processor)

    def describe(self) -> str:
        d = self.pair.describe()

        def size(n):
            return "none" if n is None else f"{n / 1e6:.1f}M params"

        return (f"**{self.preset.name}**: target {size(d['target_params'])}, draft {size(d['draft_params'])}, "
                f"{d['dtype']} on {self.preset.device}")


class PairPool:
    """Preset name -> Loaded, at most `capacity` pairs in memory (the oldest is dropped first).

    `setup`, if given, is queued on the device thread at once, so that every pair load and engine build (all queued
    there after it) comes after it: app.py passes the process-wide engine settings (torch's thread count, Numba's
    background compile), which import torch and Numba, so that they load behind the page and not before it."""

    def __init__(self, presets: Mapping[str, Preset], factory: PairFactory = load_preset, capacity: int = 1,
                 device: DeviceThread | None = None, setup: Callable[[], None] | None = None):
        self.presets = presets
        self.factory = factory
        self.capacity = max(1, capacity)
        self.device = device or DeviceThread()  # where every pair is loaded and used
        self._loaded: dict[str, Loaded] = {}
        self._lock = threading.Lock()
        self._loading: dict[str, float] = {}  # preset -> when its background load started (perf_counter)
        self.failed: dict[str, str] = {}  # preset -> why its background load failed (one line)
        self._setup = None if setup is None else self.device.submit(setup)
        if self._setup is not None:
            self._setup.add_done_callback(_log_failure)

    def get(self, name: str) -> Loaded:
        """The loaded pair for preset `name`; loads it if needed. Raises ModelError (one line)."""
        if name not in self.presets:
            raise ModelError(f"unknown model preset {name!r}; this app serves: {', '.join(self.presets)}")
        with self._lock:
            if name not in self._loaded:
                while len(self._loaded) >= self.capacity:
                    self._loaded.pop(next(iter(self._loaded)))
                    gc.unfreeze()  # load_pair froze the heap (models.settle_heap): let its next collect free the pair
                pair, seconds = self.device.call(_timed, self.factory, self.presets[name])
                self._loaded[name] = Loaded(self.presets[name], pair, seconds, self.device)
            return self._loaded[name]

    def wait_setup(self) -> None:
        """Return once `setup` has run (at once without one). A handler calls it before importing the engine's heavy
        modules itself, so that two threads never import them at once: two imports entering one package at different
        modules can deadlock on Python's module locks."""
        if self._setup is not None:
            self._setup.exception()  # waits; a failure was logged by _log_failure

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def preload(self, name: str) -> None:
        """Load `name` and build its engine now, before any visitor's run (its runners check and time their layers
        here); a failure is logged and kept in `failed` (the model line says it), never raised: the page serves on."""
        try:
            loaded = self.get(name)
            t0 = time.perf_counter()
            loaded.engine()
            log.info("loaded %s in %.1f s, its engine built in %.1f s", name, loaded.load_seconds,
                     time.perf_counter() - t0)
        except ModelError as e:  # the model line and a run say why
            self.failed[name] = str(e)
            log.warning("%s", e)
        except Exception as e:  # a bug: keep the traceback in the log
            self.failed[name] = f"internal error while loading ({type(e).__name__}); see the server log"
            log.exception("loading %s failed", name)

    def load_in_background(self, name: str) -> threading.Thread:
        """`preload` in a daemon thread, so the page is served meanwhile; a run that needs the pair waits for it in
        `get` (the pool's lock), and `loading_for` tells the page how long it has taken."""
        self._loading[name] = time.perf_counter()

        def work():
            try:
                self.preload(name)
            finally:
                self._loading.pop(name, None)

        thread = threading.Thread(target=work, name=f"sage-load-{name}", daemon=True)
        thread.start()
        return thread

    def loading_for(self, name: str) -> float | None:
        """Seconds since the background load of `name` started, or None when none is under way."""
        started = self._loading.get(name)
        return None if started is None else time.perf_counter() - started
