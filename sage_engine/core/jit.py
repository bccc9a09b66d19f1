"""Numba, where it is installed: the one place that compiles the engine's array functions, keeps their on-disk cache
honest, and can take the compilation off a server's start.

Numba's disk cache notices an edit to a compiled function's own file, not to the functions it calls in other files:
a draft step cached before an edit of rules.py would go on running the old rule. So the cache lives in a folder named
after a hash of every module with compiled code (`SOURCES`): an edit to any of them starts a fresh cache. The folder
is under $NUMBA_CACHE_DIR if set, else the user's cache directory.

Compiling everything takes ~20 s of one core on a machine's first start. A server that must answer at once (the demo,
a Space that restarts cold) calls `defer_compile()`: a background process compiles into the cache while this one
runs every function as plain Python (`Compiled.__call__`) and offers no compiled backend; once the cache is complete
(`ready()`), an engine built after `activate()` uses the compiled code. Everything else compiles on first use.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types
from pathlib import Path

try:
    import numba
    import scipy  # noqa: F401 - Numba's products (np.dot in the compiled layers) call SciPy's BLAS
except ImportError:  # the same functions run as Python (`missing()` says why)
    numba = None

HERE = Path(__file__).resolve().parent.parent  # sage_engine/: SOURCES are relative to it


def missing() -> str | None:
    """Why the functions run as Python: None where Numba compiles them."""
    if numba is not None:
        return None
    import importlib.util

    lacking = [m for m in ("numba", "scipy") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(lacking) or 'numba'} not importable: the compiled functions run as Python"

SOURCES = ("core/jit.py", "core/rules.py", "backends/numba_layers.py", "backends/draft_compiled.py", "core/tree.py",
           "core/cache.py")  # @jit modules
ACTIVE = numba is not None  # Python callers use the compiled functions (False: deferred, see the module's note)


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
    _DIR = cache_dir()
    if not _DIR.exists() and _DIR.parent.is_dir():
        _prune(_DIR)
    numba.config.CACHE_DIR = str(_DIR)  # read by every @jit below when it is applied
    _READY = _DIR / "ready"  # written once every compiled function is in the cache (warmup.py)


# per module with compiled functions, the globals its compiled twins see: the module's own, each `Compiled` in it
# replaced by its dispatcher, so that compiled code calls compiled code while Python code calls `Compiled` objects
_NAMESPACES: dict[str, dict] = {}
_FILLED: set[str] = set()


def _fill() -> None:
    """Give every imported module's compiled twins their globals (once per module)."""
    for name, ns in _NAMESPACES.items():
        module = sys.modules.get(name)
        if name not in _FILLED and module is not None:
            ns.update({k: v.jitted if isinstance(v, Compiled) else v for k, v in vars(module).items()})
            _FILLED.add(name)


class Compiled:
    """A function compiled by Numba (cached on disk, nogil: the demo's other lane runs meanwhile), callable from Python
    like the plain function it was made from: compiled where ACTIVE, else the plain function (compiling deferred, or
    Numba missing). `.jitted` is the dispatcher of its compiled twin, whose calls to other `Compiled` functions of its
    module's globals are compiled calls; `.py_func` the plain function."""

    def __init__(self, fn, options: dict):
        self.py_func, self.__doc__, self.__name__, self.__wrapped__ = fn, fn.__doc__, fn.__name__, fn
        self.jitted = None
        if numba is not None:
            twin = types.FunctionType(fn.__code__, _NAMESPACES.setdefault(fn.__module__, {}), fn.__name__,
                                      fn.__defaults__, fn.__closure__)
            twin.__module__, twin.__qualname__, twin.__doc__ = fn.__module__, fn.__qualname__, fn.__doc__
            self.jitted = numba.njit(cache=True, nogil=True, **options)(twin)

    def __call__(self, *args):
        if not ACTIVE:
            return self.py_func(*args)
        if len(_FILLED) < len(_NAMESPACES):
            _fill()
        return self.jitted(*args)


def jit(fn=None, **options) -> Compiled:
    """`fn` as a `Compiled` (no fast-math unless `options` ask for it). Usable as `@jit` or `jit(fn, fastmath=...)`."""
    if fn is None:
        return lambda f: jit(f, **options)
    return Compiled(fn, options)


def ready() -> bool:
    """Is every compiled function of this source version in the disk cache?"""
    return numba is not None and _READY.exists()


def defer_compile() -> bool:
    """Where the cache is not complete: run plain Python from now on and compile in a background process of low
    priority (`python -m sage_engine.backends.warmup`). True if deferred."""
    global ACTIVE
    if numba is None or ready():
        return False
    ACTIVE = False
    preexec = (lambda: os.nice(10)) if hasattr(os, "nice") else None
    subprocess.Popen([sys.executable, "-m", "sage_engine.backends.warmup"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec, cwd=str(HERE.parent))
    return True


def activate() -> bool:
    """Use the compiled functions from now on if the cache is complete (after `defer_compile`); whether they are."""
    global ACTIVE
    ACTIVE = ACTIVE or ready()
    return ACTIVE


def mark_ready() -> None:
    """Say the cache is complete (warmup.py, once it has compiled or loaded every compiled function)."""
    _READY.touch()
