"""The "numba" backend: a small draft's layers compiled with Numba, one call per drafted level.

Where it applies: where the NumPy layers do (a draft in float32 on the CPU, numpy_host.py), Numba is installed and
its code compiled (jit.py), and every layer has the same query heads; a target never (its rows must not depend on the
row count); otherwise the NumPy layers.

numpy_host.py computes a draft's fused layers in NumPy. For a small draft the arithmetic of a level is nearly all
five products, while the ~40 NumPy calls around them (norms, the rotary, the cache's writes, the attention's softmax,
SiLU) each cost more in NumPy's own overhead on a few rows than in arithmetic, and the softmax and top-k that the
drafter reads after each level cost as much again through torch. Here one compiled
function computes a whole forward (`_forward`): the products through BLAS (Numba calls SciPy's BLAS for `@`), every
step between them as plain loops; and `top_candidates` gives each row's softmax top-k in one more call.

`CompiledDecoder` is a HostDecoder (same folded weights, same call contract, same keys and values buffer scheme:
the cache's layers view one preallocated buffer) whose `run` is that one call. The runner offers it where it offers
the NumPy layers, checks it against forward() and times it like every candidate (choose.py). Numba compiles the
functions on their first call on a machine (with draft_compiled.py's), caches them on disk (jit.py: a folder per
version of the compiled modules' sources), and later processes load them in under a second; the
engine makes those first calls when it is built (the layer check, and `warm` for the top-k), not in a run. Without
Numba the NumPy layers are used. draft_compiled.py drafts a whole step in one call on top of these functions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..core import jit as jit_mod
from ..core.jit import jit, numba  # no Numba (an unsupported platform): the NumPy layers (numpy_host.py) instead
from ..core.rules import largest as _largest
from .numpy_host import HostDecoder, blas_one_thread

# Numba's fast-math flags minus "nnan" and "ninf": masked attention scores are -inf, and the loops must keep them
_FAST = {"contract", "reassoc", "nsz", "arcp", "afn"}


def _jit(fn, inline: bool = False):
    if numba is None:
        return None
    # error_model "numpy": a division by zero gives inf or nan instead of raising, which keeps divisions in
    # vectorised loops (Python's check is a branch per element); nogil: another thread (the demo's other lane) runs
    # meanwhile
    return jit(fn, fastmath=_FAST, error_model="numpy", inline="always" if inline else "never")


_POW2 = np.array([2.0**k for k in range(-126, 128)], dtype=np.float32)  # 2^k of every normal float32 exponent


def _exp(x):
    """exp(x) in float32 to ~2e-7 relative, in operations a loop can vectorize (libm's exp is one call per number,
    ~5 ns): x = k ln 2 + f with |f| <= ln 2 / 2 (ln 2 in two parts, Cody and Waite), exp(f) by its Taylor series to
    f^6, 2^k from a table. x is clamped to [-87, 88], so exp(-inf) is ~1.6e-38, not 0."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    k = math.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    f = (x - k * np.float32(0.693359375)) + k * np.float32(2.12194440e-4)
    p = np.float32(1.0) + f * (np.float32(1.0) + f * (np.float32(0.5) + f * (np.float32(1 / 6) + f * (
        np.float32(1 / 24) + f * (np.float32(1 / 120) + f * np.float32(1 / 720))))))
    return p * _POW2[int(k) + 126]


def _rms(h, floor_sq, out):
    """A folded RMSNorm (fused.Norm) of each row of h into out: h / sqrt(||h||^2 + D eps)."""
    for i in range(h.shape[0]):
        s = 0.0
        for d in range(h.shape[1]):
            s += h[i, d] * h[i, d]
        r = 1.0 / math.sqrt(s + floor_sq)
        for d in range(h.shape[1]):
            out[i, d] = h[i, d] * r


def _attend(qr, keys, values, tot, blocked, scaling, out):
    """Softmax attention of the rotated queries qr [H, q, hd] over the first `tot` keys and values [KV, cap, hd]
    (key head g serves the H / KV query heads from g H / KV on); `blocked` [q, r] masks the newest r columns (r = 0:
    none). Writes out [q, H hd]."""
    H, q, hd = qr.shape
    KV, r = keys.shape[0], blocked.shape[1]
    G = H // KV
    for g in range(KV):
        s = qr[g * G : (g + 1) * G].reshape(G * q, hd) @ keys[g, :tot].T  # [G q, tot]: the group's heads stacked
        for j in range(G * q):
            row, i = s[j], j % q
            for c in range(r):
                if blocked[i, c]:
                    row[tot - r + c] = -np.inf
            m = row[0]
            for t in range(tot):
                m = max(m, row[t])
            for t in range(tot):  # branch-free, so that it vectorises: a masked column's exp is ~1.6e-38, then 0
                row[t] = _exp((row[t] - m) * scaling)
            for c in range(r):
                if blocked[i, c]:
                    row[tot - r + c] = 0.0
            z = np.float32(0.0)
            for t in range(tot):
                z += row[t]
            row *= np.float32(1.0) / z
        a = s @ values[g, :tot]  # [G q, hd]
        for j in range(G * q):
            hh, i = g * G + j // q, j % q
            out[i, hh * hd : (hh + 1) * hd] = a[j]


def _swiglu(gu):
    """SiLU(gate) * up of the gate and up halves of gu [q, 2 I].  # -> [q, I]"""
    q, inner = gu.shape[0], gu.shape[1] // 2
    act = np.empty((q, inner), np.float32)
    for i in range(q):
        for j in range(inner):
            gate = gu[i, j]
            act[i, j] = gate / (np.float32(1.0) + _exp(-gate)) * gu[i, inner + j]
    return act


def _forward(tokens, positions, blocked, n, embed, cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b,
             floor2, gate_up, down, down_b, floor, head, head_b, keys, values):
    """The draft's forward over q tokens at rotary `positions` after n cached ones; appends their keys and values at
    columns n .. n + q - 1 of keys, values [L, KV, cap, hd]. Weights stacked per layer: qkv [L, D, (H + 2 KV) hd],
    out_w [L, H hd, D], gate_up [L, D, 2 I], down [L, I, D]; floor1, floor2 [L].  # -> logits [q, V]"""
    q = tokens.shape[0]
    L, KV, _, hd = keys.shape
    D, half, tot = embed.shape[1], hd // 2, n + q
    h = np.empty((q, D), np.float32)
    for i in range(q):
        h[i] = embed[tokens[i]]
    x = np.empty((q, D), np.float32)
    qr = np.empty((heads, q, hd), np.float32)  # heads first: a key head's query heads are one block
    a = np.empty((q, heads * hd), np.float32)
    for layer in range(L):
        _rms(h, floor1[layer], x)
        y = x @ qkv[layer] + qkv_b[layer]  # [q, (H + 2 KV) hd]: q, k, v
        for i in range(q):
            p = positions[i]
            for hh in range(heads + KV):  # rotary: x cos + rotate_half(x) sin, the sign already in the sin table
                base = hh * hd
                for d in range(hd):
                    v = y[i, base + d] * cos[p, d] + y[i, base + (d + half) % hd] * sin[p, d]
                    if hh < heads:
                        qr[hh, i, d] = v
                    else:
                        keys[layer, hh - heads, n + i, d] = v
            for g in range(KV):
                for d in range(hd):
                    values[layer, g, n + i, d] = y[i, (heads + KV + g) * hd + d]
        _attend(qr, keys[layer], values[layer], tot, blocked, scaling, a)
        h += a @ out_w[layer] + out_b[layer]
        _rms(h, floor2[layer], x)
        h += _swiglu(x @ gate_up[layer]) @ down[layer] + down_b[layer]
    _rms(h, floor, x)
    return x @ head + head_b


def _top_candidates(logits, k):
    """Each row's softmax and its k most probable tokens, best first (ties: the lower token first).
    # logits [F, V] -> probs [F, k], tokens [F, k]"""
    F, V = logits.shape
    probs = np.empty((F, k), np.float32)
    tokens = np.zeros((F, k), np.int64)
    best = np.empty(k, np.float32)  # a row's k largest logits (their tokens in `tokens`)
    for i in range(F):
        m = logits[i, 0]
        for j in range(V):
            m = max(m, logits[i, j])
        z = np.float32(0.0)
        for j in range(V):
            z += _exp(logits[i, j] - m)
        best[:] = -np.inf
        _largest(logits[i], best, tokens[i])
        for s in range(k):
            probs[i, s] = _exp(best[s] - m) / z
    return probs, tokens


def _read(vocab, k, *forward_args):
    """`_forward`, then its last row's softmax top-k over the first `vocab` tokens, in the same call (a draft's read:
    the root's candidates without a second call from Python).  # -> logits [q, V], probs [1, k], tokens [1, k]"""
    logits = _forward_jit(*forward_args)
    probs, tokens = _top_jit(np.ascontiguousarray(logits[logits.shape[0] - 1 :, :vocab]), k)
    return logits, probs, tokens


_exp = _jit(_exp, inline=True) or _exp
_rms, _attend, _swiglu = (_jit(f) or f for f in (_rms, _attend, _swiglu))
_forward_jit, _top_jit, _read_jit = _jit(_forward), _jit(_top_candidates), _jit(_read)


def top_candidates(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]] | None:
    """The rows' softmax top-k (probabilities, tokens) as lists, through the compiled function; None where it does
    not apply (no Numba, or logits that are not float32 on the CPU).  # [F, V] -> [F][k], [F][k]"""
    if (_top_jit is None or not jit_mod.ACTIVE or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or k > logits.shape[-1]):
        return None
    probs, tokens = _top_jit(np.ascontiguousarray(logits.detach().numpy()), k)
    return probs.tolist(), tokens.tolist()


def toy_weights() -> tuple:
    """`_forward`'s arguments from `embed` on (after tokens, positions, the mask and n) for a one-layer toy decoder
    (hidden 4, head size 2, one head of each kind, 3 tokens, 4 positions), of the real argument types: warm-up
    calls load each compiled function's real specialisation."""
    f32 = functools.partial(np.zeros, dtype=np.float32)
    D, hd, V = 4, 2, 3
    return (f32((V, D)), f32((4, hd)), f32((4, hd)), np.ones(1), f32((1, D, 3 * hd)), f32((1, 3 * hd)), 1, 1.0,
            f32((1, hd, D)), f32((1, D)), np.ones(1), f32((1, D, 4)), f32((1, 2, D)), f32((1, D)), 1.0, f32((D, V)),
            f32(V), f32((1, 1, 4, hd)), f32((1, 1, 4, hd)))


def warm() -> None:
    """Load the compiled top-k and read now (compiled on the first call in a process, else read from Numba's cache:
    ~0.4 s even then), so that they do not land in a run's first drafted step, where the cost meter would take them
    for the price of drafting."""
    if _top_jit is not None and jit_mod.ACTIVE:
        _top_jit(np.zeros((1, 2), np.float32), 1)
        one = np.zeros(1, np.int64)
        _read_jit(3, 1, one, one, np.zeros((1, 0), dtype=bool), 0, *toy_weights())


def _stack(arrays: list[np.ndarray | None], size: int) -> np.ndarray:
    """Per-layer arrays stacked into one [L, ...] (a missing bias: zeros of `size`)."""
    return np.ascontiguousarray(np.stack([np.zeros(size, np.float32) if a is None else a for a in arrays]))


class CompiledDecoder(HostDecoder):
    """The "numba" backend (see backends/__init__.py): HostDecoder's computation, each forward one call of the
    compiled `_forward` (see the module's note); a drafted step can run in one compiled call on it
    (draft_compiled.py)."""

    name = "fused+numba"
    compiled = True

    def __init__(self, host: HostDecoder):
        super().__init__(host.fused, host.layers)
        # the BLAS that the compiled products call is SciPy's, loaded only by its first use: load it now, so that
        # blas_one_thread holds it to one thread (NumPy's was, by HostDecoder) before any run
        import scipy.linalg.cython_blas  # noqa: F401
        blas_one_thread()
        ls = self.layers
        H, KV, hd = ls[0].heads, ls[0].kv_heads, ls[0].head_dim
        width, D = (H + 2 * KV) * hd, self.embed.shape[1]
        # `_forward`'s weight arguments after cos and sin, in its order (draft_compiled.py passes them on too)
        self.weights = (
            np.array([f.floor1 for f in ls]), _stack([f.qkv[:, :width] for f in ls], 0),
            _stack([None if f.qkv_bias is None else f.qkv_bias[:width] for f in ls], width), H, ls[0].scaling,
            _stack([f.out for f in ls], 0), _stack([f.out_bias for f in ls], D), np.array([f.floor2 for f in ls]),
            _stack([f.gate_up for f in ls], 0), _stack([f.down for f in ls], 0), _stack([f.down_bias for f in ls], D),
            self.floor, self.head,
            np.zeros(self.head.shape[1], np.float32) if self.head_bias is None else self.head_bias,
        )
        self._no_mask = np.zeros((1, 0), dtype=bool)

    def run(self, tokens: list[int], positions: list[int], blocked: np.ndarray | None, cache, top_k: int = 0,
            vocab: int | None = None) -> torch.Tensor:
        """HostDecoder.run in one compiled call; with `top_k`, the last row's softmax top-k over the first `vocab`
        tokens in the same call (`top`).  # -> logits [q, V]"""
        cos, sin = self._rope(max(positions))
        layers = [cache.layers[f.index] for f in self.layers]
        n = self.buffers.reserve(layers, len(tokens))
        keys, values = self.buffers.arrays
        mask = self._no_mask if blocked is None else np.ascontiguousarray(blocked, dtype=bool)
        args = (np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64), mask, n, self.embed, cos, sin,
                *self.weights, keys, values)
        vocab = min(vocab or self.head.shape[1], self.head.shape[1])
        if 0 < top_k <= vocab:  # more candidates than tokens: left to the caller's own ranking (as top_candidates does)
            logits, probs, top = _read_jit(vocab, top_k, *args)
            self.top = probs.tolist(), top.tolist()
        else:
            logits, self.top = _forward_jit(*args), None
        self.buffers.publish(layers, n + len(tokens))
        return torch.from_numpy(logits)


def compiled_decoder(host: HostDecoder | None) -> CompiledDecoder | None:
    """`host`'s layers compiled, where Numba is there and every layer has the same query heads and scaling (one
    stacked set of weights; the key heads and head size are already one, `cache.KVBuffers`)."""
    if host is None or _forward_jit is None or not jit_mod.ACTIVE:
        return None
    if len({(f.heads, f.scaling) for f in host.layers}) != 1:
        return None
    return CompiledDecoder(host)
