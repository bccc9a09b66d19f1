"""Optional Hugging Face ZeroGPU support.

On a ZeroGPU Space (the platform sets SPACES_ZERO_GPU and provides the `spaces` package) a GPU is
attached only while a function decorated with `spaces.GPU` runs, in a forked worker process: its
arguments and everything it yields are pickled across that boundary. `on_gpu(duration)` is that
decorator there and a no-op everywhere else (CPU Spaces, local runs, tests), so the app has one code path.

What ZeroGPU requires of the app, and where it is done:
- `import spaces` before torch: `app.py` does it first thing when SPACES_ZERO_GPU is set;
- the models placed on `cuda` at start-up, in the main process: `app.py` preloads the pair under ZeroGPU
  (a pair loaded lazily inside the worker would be loaded again on every run);
- picklable arguments and results: `Handlers.compare` passes the GPU call plain values only (the Stop
  switch, a threading.Event, stays behind: on ZeroGPU a run ends at its token budget);
- a torch that ZeroGPU accepts (its documentation lists 2.8-2.11; this repo pins 2.14.1, so a ZeroGPU
  Space needs its own requirements, see docs/MODELS.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

DEFAULT_DURATION = 120  # seconds of GPU a run may hold (ZeroGPU's default is 60)


def zero_gpu() -> bool:
    """True on a ZeroGPU Space."""
    return bool(os.environ.get("SPACES_ZERO_GPU"))


def on_gpu(duration: int = DEFAULT_DURATION) -> Callable[[F], F]:
    """`spaces.GPU(duration=...)` on a ZeroGPU Space, else the identity decorator."""
    if not zero_gpu():
        return lambda fn: fn
    import spaces

    return spaces.GPU(duration=duration)
