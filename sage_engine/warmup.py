"""`python -m sage_engine.warmup`: compile (or load from the disk cache) every compiled function of the engine with the
argument types it is called with, then mark the cache complete (jit.py). What `jit.defer_compile` runs in the
background on a server's first start; run it by hand to compile ahead of a first start."""

from __future__ import annotations

from . import cache, draft_compiled, jit, tree
from .backends import numba_layers


def warm_all() -> None:
    jit.ACTIVE = True
    for module in (numba_layers, draft_compiled, cache, tree):  # draft_compiled warms rules.py's functions too
        module.warm()
    jit.mark_ready()


if __name__ == "__main__":
    if jit.numba is not None:
        warm_all()
