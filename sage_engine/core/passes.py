"""What one model forward returns (`Pass`), shared by the runner, verification and sampling; and the inference-mode
guard the runner's verbs share."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch


class Pass(NamedTuple):
    """One model forward: its logits and what it took."""

    logits: torch.Tensor  # prefill: [V] after the prompt's last token; forward: [q, V]
    ms: float  # wall time of the model call
    # forward(top=k) on the compiled layers: the last row's softmax top-k over the shared vocabulary, same call
    top: tuple[list[list[float]], list[list[int]]] | None = None  # ([1][k] probs, [1][k] tokens); else None
    # forward(argmax=True) through the kept layers: each row's argmax, taken in the pass while its logits are in the
    # cores' caches (the same op after the pass reads them back from memory)
    argmax: np.ndarray | None = None  # [q] int64, on the host


def rows_argmax(logits: torch.Tensor, on_cpu: bool) -> np.ndarray:
    """Each row's argmax (the first of equal maxima, as torch's), on the host: NumPy's on the CPU, whose array's
    tolist() is a shorter path than a tensor's right after a forward; elsewhere torch's on the device, copied to the
    host in the same call: a verify pass's one read, which also waits for the pass (on a GPU the runner then needs no
    synchronize of its own to time it).  # [q, V] -> [q]"""
    return logits.numpy().argmax(-1) if on_cpu else logits.argmax(-1).cpu().numpy()


def inference(fn):
    """`torch.inference_mode` around `fn`, entered only where the caller is not in it already: entering costs a few
    Python frames, and the engine runs each decode step, a dozen runner calls, inside one (engine.py)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run
