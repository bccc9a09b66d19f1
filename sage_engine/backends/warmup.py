"""`python -m sage_engine.backends.warmup`: compile (or load from the disk cache) every compiled function of the
engine with the argument types it is called with, then mark the cache complete (core/jit.py). What `jit.defer_compile`
runs in the background on a server's first start; run it by hand to compile ahead of a first start.

One compile per cache at a time: a warmup holds an exclusive lock on the cache's `compiling` file while it runs, and
a second one started meanwhile (a server restarted before its first compile finished: the first goes on as an orphan)
exits at once instead of compiling the same functions again beside it. The lock is the kernel's (flock): it ends
with the process that holds it, however that process ends."""

from __future__ import annotations

import fcntl

from ..core import cache, jit, tree
from . import draft_compiled, numba_layers


def warm_all() -> None:
    jit.ACTIVE = True
    for module in (numba_layers, draft_compiled, cache, tree):  # draft_compiled warms rules.py's functions too
        module.warm()
    jit.mark_ready()


def warm_once() -> bool:
    """`warm_all()` unless another warmup holds this cache's lock; False if one did (nothing was done)."""
    folder = jit.cache_dir()  # hashes the compiled modules' sources: once
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "compiling", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        warm_all()
        return True


if __name__ == "__main__":
    if jit.numba is not None:
        warm_once()
