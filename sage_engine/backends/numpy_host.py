"""The "numpy" backend: a small draft's fused layers computed in NumPy, cheaper per operation than torch's dispatcher.

Where it applies: a draft whose fused layers apply (fused_torch.py), in float32 on the CPU, every product on a
transposed copy, the same key heads and head size in every layer; never a target; otherwise the torch fused layers.

A drafted level of a one-layer draft of hidden size 128 is ~25 tensor operations on a few rows; each costs several
times more in torch's dispatch than in NumPy's, and more than its arithmetic. `HostDecoder` computes what
`FusedDecoder` (fused_torch.py) computes, from the same folded, transposed float32 weights (shared, not copied):
embedding, per layer norm -> q/k/v product -> rotary -> attention over the cache -> output product -> norm -> SwiGLU
MLP, then the final norm and the head. Two differences of form: the rotary's rotate-half is a permutation of the q/k
product's columns, so it is folded into the product (one wider product instead of a roll), and the keys and values
are written into a preallocated buffer, which the cache's layers view (`KVBuffers`), instead of growing the cache by
concatenation.

It is offered only for a draft (a model whose numbers only shape guesses: the emitted tokens are always the
target's) in float32 on the CPU, and the runner checks and times it like the other fused candidates
(`choose.check_cached`): it is used only where its logits are near forward()'s with the same argmax
on every row, and where it is the fastest on this machine. The BLAS that NumPy ships (OpenBLAS) is held to one thread
when a HostDecoder is built: its threads would otherwise busy-wait on the core that torch's threads use (measured: a
draft level nearly twice as slow with them). numba_layers.py computes the same layers in one Numba-compiled call per
forward (`CompiledDecoder`, a HostDecoder too), another candidate beside this one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

try:  # holds the host BLAS to one thread beside torch's; without it the NumPy layers are not offered (choose.offer)
    from threadpoolctl import ThreadpoolController
except ImportError:
    ThreadpoolController = None

from ..core.cache import KVBuffers
from .fused_torch import FusedDecoder, FusedLayer

_BLAS_LIMITED: dict = {}  # library path -> its threadpoolctl limit, held for the process


def blas_one_thread() -> None:
    """Hold the BLAS libraries that NumPy's and SciPy's wheels ship (numpy.libs/, scipy.libs/ and their package
    folders) to one thread; SciPy's is the one Numba's products call (numba_layers.py). Only those: a BLAS shared with
    torch (some conda builds) would take the target's threads with it, so it is left alone. A library loaded after a
    call is held by the next call."""
    roots = [Path(np.__file__).resolve().parent]
    try:
        import scipy
        roots.append(Path(scipy.__file__).resolve().parent)
    except ImportError:
        pass
    mine = tuple(str(d) + os.sep for r in roots for d in (r, r.parent / f"{r.name}.libs"))
    controller = ThreadpoolController()
    own = [lib["filepath"] for lib in controller.info() if lib["user_api"] == "blas"
           and lib["filepath"].startswith(mine) and lib["filepath"] not in _BLAS_LIMITED]
    for path in own:
        _BLAS_LIMITED[path] = controller.select(filepath=path).limit(limits=1)


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().numpy()


@dataclass(frozen=True)
class HostLayer:
    index: int  # the layer's index in the cache
    floor1: float  # the folded norms' sqrt(D eps), squared (fused.Norm)
    qkv: np.ndarray  # [D, (H + 2 KV) hd + (H + KV) hd]: q, k, v, then q and k with their head halves swapped
    qkv_bias: np.ndarray | None
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    out: np.ndarray  # [H hd, D]
    out_bias: np.ndarray | None
    floor2: float
    gate_up: np.ndarray  # [D, 2 I]
    down: np.ndarray  # [I, D]
    down_bias: np.ndarray | None


def _host_layer(f: FusedLayer) -> HostLayer:
    H, KV, hd = f.heads, f.kv_heads, f.head_dim
    rot = (H + KV) * hd
    # rotate_half swaps each head's halves (fused._rotate rolls by hd / 2, with the sign in the sin table): the
    # same permutation of the q/k columns, appended to the product
    swap = np.concatenate([h * hd + (np.arange(hd) + hd // 2) % hd for h in range(H + KV)])
    w = _np(f.qkv.transposed)
    b = _np(f.qkv.bias)
    return HostLayer(
        index=f.index, floor1=float(f.norm1.floor) ** 2,
        qkv=np.ascontiguousarray(np.concatenate([w, w[:, :rot][:, swap]], axis=1)),
        qkv_bias=None if b is None else np.concatenate([b, b[:rot][swap]]),
        heads=H, kv_heads=KV, head_dim=hd, scaling=f.scaling,
        out=_np(f.out.transposed), out_bias=_np(f.out.bias), floor2=float(f.norm2.floor) ** 2,
        gate_up=_np(f.gate_up.transposed), down=_np(f.down.transposed), down_bias=_np(f.down.bias),
    )


def _norm(h: np.ndarray, floor_sq: float) -> np.ndarray:
    """A folded RMSNorm (fused.Norm): h / sqrt(||h||^2 + D eps), its weight already in the next product."""
    return h / np.sqrt(np.vecdot(h, h)[:, None] + floor_sq)


class HostDecoder:
    """The "numpy" backend (see backends/__init__.py): FusedDecoder's computation in NumPy (see the module's note);
    same call contract as FusedDecoder, plus `run`, which takes the runner's lists and attention pattern directly (no
    tensors to build)."""

    name = "fused+numpy"
    takes_lists, compiled = True, False

    def __init__(self, fused: FusedDecoder, layers: tuple[HostLayer, ...] | None = None):
        """`layers`: the HostLayers of `fused` already built (another HostDecoder's, shared), else built here."""
        blas_one_thread()
        self.fused = fused
        self.layers = layers or tuple(_host_layer(f) for f in fused.layers)
        # the fused layers' own buffers (same layout): the runner can move between the two without copying the cache
        self.buffers = fused.buffers or KVBuffers(len(self.layers), self.layers[0].kv_heads, self.layers[0].head_dim)
        self.embed = _np(fused.embed_weight)
        self.floor = float(fused.norm.floor) ** 2
        self.head, self.head_bias = _np(fused.head.transposed), _np(fused.head.bias)
        self._cos = self._sin = np.zeros((0, 0), np.float32)
        self.top: tuple[list[list[float]], list[list[int]]] | None = None  # the last run's top-k (CompiledDecoder)

    @property
    def prompt_layers(self) -> FusedDecoder:
        """A whole prompt goes through the torch layers these were made from (FusedDecoder.prefill)."""
        return self.fused

    def _rope(self, top: int) -> tuple[np.ndarray, np.ndarray]:
        """(cos, signed sin) tables covering positions 0..top (fused.FusedDecoder.rotary's table).  # 2 x [n, hd]"""
        if self._cos.shape[0] <= top:
            probe = self.fused.embed_weight[:1].detach()[None]  # the model's dtype and device
            self.fused.rotary(probe, torch.tensor([[top]]), top)
            table = _np(self.fused.rope["table"])
            hd = table.shape[1] // 2
            self._cos, self._sin = np.ascontiguousarray(table[:, :hd]), np.ascontiguousarray(table[:, hd:])
        return self._cos, self._sin

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 top: int | None = None) -> torch.Tensor:
        """FusedDecoder's contract: ids, positions [1, q], an additive mask [1, 1, q, kv] or None.  # -> [1, q, V]"""
        blocked = None if mask is None else mask[0, 0].numpy() < 0  # masked: finfo.min (tree.additive_mask)
        return self.run(ids[0].tolist(), positions[0].tolist(), blocked, cache)[None]

    def run(self, tokens: list[int], positions: list[int], blocked: np.ndarray | None, cache, top_k: int = 0,
            vocab: int | None = None) -> torch.Tensor:
        """Append `tokens` at (shifted) rotary `positions`; `blocked` [q, r]: which of the newest r key columns each
        token may not see (None: it sees them all). `top_k`, `vocab`: the compiled layers' top-k (`top`); here none.
        # -> logits [q, V]"""
        q, self.top = len(tokens), None
        cos, sin = self._rope(max(positions))
        cos, sin = cos[positions][:, None], sin[positions][:, None]  # [q, 1, hd]
        h = self.embed.take(tokens, axis=0)  # [q, D]
        layers = [cache.layers[f.index] for f in self.layers]
        n = self.buffers.reserve(layers, q)
        keys, values = self.buffers.arrays  # [L, KV, cap, hd] each
        for i, f in enumerate(self.layers):
            H, KV, hd = f.heads, f.kv_heads, f.head_dim
            rot = (H + KV) * hd
            y = _norm(h, f.floor1) @ f.qkv
            if f.qkv_bias is not None:
                y += f.qkv_bias
            qk = y[:, :rot].reshape(q, H + KV, hd) * cos + y[:, rot + KV * hd :].reshape(q, H + KV, hd) * sin
            keys[i, :, n : n + q] = qk[:, H:].transpose(1, 0, 2)
            values[i, :, n : n + q] = y[:, rot : rot + KV * hd].reshape(q, KV, hd).transpose(1, 0, 2)
            a = _attend(qk[:, :H], keys[i, :, : n + q], values[i, :, : n + q], f.scaling, blocked)  # [q, H hd]
            h = h + _plus(a @ f.out, f.out_bias)
            gu = _norm(h, f.floor2) @ f.gate_up
            gate, up = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2 :]
            h = h + _plus((gate * (0.5 + 0.5 * np.tanh(0.5 * gate)) * up) @ f.down, f.down_bias)  # SiLU
        self.buffers.publish(layers, n + q)
        return torch.from_numpy(_plus(_norm(h, self.floor) @ self.head, self.head_bias))


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scaling: float,
            blocked: np.ndarray | None) -> np.ndarray:
    """Softmax attention of queries q [q, H, hd] over keys and values [KV, kv, hd] (each key head serves H / KV
    query heads), the newest `blocked.shape[1]` columns masked by `blocked` [q, r].  # -> [q, H hd]"""
    n, H, hd = q.shape
    KV, kv = keys.shape[:2]
    G = H // KV
    heads = []
    for g in range(KV):  # 2D products per key head: NumPy's stacked (3D) products cost more at these sizes
        rows = q[:, g * G : (g + 1) * G].transpose(1, 0, 2).reshape(G * n, hd)  # the group's heads stacked
        s = rows @ keys[g].T  # [G n, kv]
        s *= scaling
        if blocked is not None:
            s.reshape(G, n, kv)[:, :, kv - blocked.shape[1] :][:, blocked] = -np.inf
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        heads.append((s @ values[g]).reshape(G, n, hd).transpose(1, 0, 2))  # [n, G, hd]
    return (heads[0] if KV == 1 else np.concatenate(heads, axis=1)).reshape(n, H * hd)


def _plus(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if bias is not None:
        x += bias
    return x


def host_decoder(fused: FusedDecoder | None) -> HostDecoder | None:
    """`fused` computed in NumPy, where it can be: on the CPU, every product on a transposed copy (float32, not
    packed), the norms folded (fused_decoder folds all or none), a plain embedding and head, every layer with the same
    key heads and head size (one stacked buffer, `KVBuffers`)."""
    if ThreadpoolController is None:  # its BLAS would take threads from torch's: not offered (choose.offer says so)
        return None
    if fused is None or fused.embed_weight is None or fused.head is None or fused.norm.weight is not None:
        return None
    if fused.embed_weight.device.type != "cpu" or any(p.transposed is None for p in fused.products):
        return None
    if len({(f.kv_heads, f.head_dim) for f in fused.layers}) != 1:
        return None
    return HostDecoder(fused)


# When the runner keeps the fastest of a draft's candidate layers (choose.fastest), a NumPy one is counted at
# HOST_EDGE of its measured time: timed back to back when the engine is built, the embedded draft's torch layers came
# within 4-19% of its NumPy ones, while in a run, between target forwards, they took 1.5x as long a level (358 against
# 236 us on the fresh images, sage 13% slower in tokens/s); one build in about twenty kept the torch layers on that
# slim margin.
HOST_EDGE = 0.8


def pick(medians: list[float], candidates: list) -> int:
    """Index of the candidate to keep, from each one's median time (a HostDecoder's, NumPy or compiled, counted at
    HOST_EDGE)."""
    cost = [m * (HOST_EDGE if c.takes_lists else 1.0) for m, c in zip(medians, candidates)]
    return cost.index(min(cost))
