"""The one thread that does the app's model work: loading pairs, building engines, preparing inputs, decoding.

Why one thread: torch on CPU runs its parallel regions with OpenMP (libgomp). Every thread that starts parallel
work gets a team of helper threads of its own, kept for as long as that thread lives. Once the process holds
more such threads than there are cores, libgomp stops letting idle helpers spin between regions: each of the
hundreds of small regions in a decode step then wakes its helper through the kernel. A web app would otherwise
touch torch from the main thread (preloading), from the server's worker threads (input preparation) and from a
fresh thread per run. Measured on the tinyworld pair with 2 threads on 2 cores: decoding in a fresh thread per
run was 0.8x as fast as in the thread that had done all the work, and a long-lived second thread that had once
multiplied two matrices was enough to slow the first. One long-lived thread for all of it keeps one team.

Runs queue on it, so two visitors' runs never overlap on the device (a parallel run would slow both and
make the speed comparison meaningless); a run whose visitor left while it waited is cancelled unstarted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def usable_cpus() -> int:
    """The CPUs this process may use: the machine's, less what its affinity mask and its container's CPU quota
    (cgroup) withhold (joblib's count). os.cpu_count() gives the host's: on a Hugging Face CPU Space it has reported 16
    where the quota allows 2, and threads sized from it would oversubscribe the Space eightfold."""
    import joblib

    return joblib.cpu_count()


def default_threads() -> int:
    """The app's decoding threads: the usable CPUs less one for the web server. Beside as many math threads as cores,
    the server's work would take a core from an OpenMP team in the middle of its parallel regions and stall them
    (measured on 2 cores: the race's autoregressive lane at 0.60x the CLI's with two threads, 0.68x with one)."""
    return max(1, usable_cpus() - 1)


class DeviceThread:
    """`submit(fn, ...)` -> Future, `call(fn, ...)` -> its result: `fn` runs on the one device thread, in order.

    A call made on the device thread itself runs inline (it would otherwise wait for itself). After a fork
    (ZeroGPU runs the app's GPU work in a forked worker) the child gets a thread of its own."""

    def __init__(self, name: str = "sage-device"):
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pid: int | None = None
        self._ident: int | None = None  # the device thread's, once it has started
        self._lock = threading.Lock()

    def _mark(self) -> None:
        self._ident = threading.get_ident()

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> Future:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: the parent's thread does not exist here
                self._executor = ThreadPoolExecutor(1, thread_name_prefix=self.name, initializer=self._mark)
                self._pid, self._ident = os.getpid(), None
            return self._executor.submit(fn, *args, **kwargs)

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        if self.on_device():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def on_device(self) -> bool:
        """Is the caller the device thread?"""
        return self._pid == os.getpid() and self._ident == threading.get_ident()
