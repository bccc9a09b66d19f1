"""Numba, where it is installed: the one place that compiles the engine's array functions, and keeps their on-disk
cache honest.

Numba's disk cache notices an edit to a compiled function's own file, not to the functions it calls in other files:
a draft step cached before an edit of rules.py would go on running the old rule. So the cache lives in a folder named
after a hash of every module with compiled code (`SOURCES`): an edit to any of them starts a fresh cache. The folder
is under $NUMBA_CACHE_DIR if set, else the user's cache directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

try:
    import numba
except ImportError:  # the same functions run as Python
    numba = None

HERE = Path(__file__).resolve().parent
SOURCES = ("jit.py", "rules.py", "backends/numba_layers.py", "draft_compiled.py", "tree.py", "cache.py")  # @jit modules


def cache_dir() -> Path:
    """Where compiled functions are kept: one folder per version of the compiled modules' sources."""
    digest = hashlib.sha1(b"".join((HERE / name).read_bytes() for name in SOURCES)).hexdigest()[:16]
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "sage-engine")
    return Path(base) / f"numba-{digest}"


def _prune(keep: Path, days: float = 7.0) -> None:
    """Drop the caches of other source versions not used for `days` (a checkout's older commits leave them)."""
    import shutil
    import time

    for old in keep.parent.glob("numba-*"):
        if old != keep and time.time() - old.stat().st_mtime > days * 86400:
            shutil.rmtree(old, ignore_errors=True)


if numba is not None:
    _dir = cache_dir()
    if not _dir.exists() and _dir.parent.is_dir():
        _prune(_dir)
    numba.config.CACHE_DIR = str(_dir)  # read by every @jit below when it is applied


def jit(fn=None, **options):
    """`fn` compiled by Numba where it is installed (cached on disk, nogil: the demo's other lane runs meanwhile; no
    fast-math unless `options` ask for it), else `fn` itself; `.py_func` is always the plain function. Usable as
    `@jit` or `jit(fn, fastmath=...)`."""
    if fn is None:
        return lambda f: jit(f, **options)
    if numba is None:
        fn.py_func = fn
        return fn
    return numba.njit(cache=True, nogil=True, **options)(fn)
