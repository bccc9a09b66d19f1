"""KV caches: preallocated key and value buffers for the fused layers, and the compaction after a verified step.

Compaction keeps the accepted path and drops the rejected branches: the tree region of a cache starts at `start`;
`keep` lists the region columns to keep, in order. The kept entries move to the front of the region and the rest is
cropped. Works on transformers' `DynamicCache` (`cache.layers[i].keys / .values`: [B, H, S, D]), and in one move of
the whole buffers where the cache's layers view a `KVBuffers`.
"""

from __future__ import annotations

import copy
from operator import attrgetter, is_

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..errors import ModelError
from .jit import jit, numba


def _move_columns(keys, values, start, keep):
    """Columns start + keep[j] of both buffers [L, KV, cap, hd] moved to start + j (gathered first: overlap-safe)."""
    for a in (keys, values):
        a[:, :, start : start + keep.shape[0]] = a[:, :, keep + start]


# one compiled call: right after a model forward each NumPy call's first touch of its own code and data comes back
# from L3, and the index arithmetic and fancy-indexed copy are several such calls
_move_jit = jit(_move_columns) if numba is not None else None  # without Numba: the compaction's NumPy gather


def warm() -> None:
    """Load the compiled move now (compiled on a machine's first call, else read from Numba's cache), so that it does
    not land in a run's first compaction."""
    if _move_jit is not None:
        _move_jit(np.zeros((1, 1, 2, 1), np.float32), np.zeros((1, 1, 2, 1), np.float32), 0, np.ones(1, np.int64))


_KEYS = attrgetter("keys")


class KVBuffers:
    """Keys and values of a decoder's layers in two preallocated buffers [L, 1, KV, cap, hd]: a forward writes its
    rows in place (`reserve`, then `publish`) and points each cache layer at the rows in use of its slice, so that the
    cache's own operations (length, compaction, copies) work on it unchanged, where growing it by concatenation would
    copy the whole cache every forward. A cache whose layers are not such views (after a prefill, or a copy) is copied
    in once. A compaction moves the kept columns of every layer in one operation per buffer (`move`), where the
    layer-by-layer one costs a handful of tensor operations per layer.
    A compaction does not re-point the layers: `length` says how many columns are in use, and the layers keep the
    longer views they had (their first `length` columns are the kept ones) until the next forward publishes its own,
    which it does anyway. Making views takes four tensor operations, and most decode steps compact both models'
    caches. Until then the runner reads the length from here (`length_of`);
    code that reads such a cache's layers otherwise sees a longer prefix-correct view (the compaction's generic path
    crops and gathers from it correctly)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.shape = (layers, 1, kv_heads, 0, head_dim)
        self.keys = self.values = torch.empty(self.shape, dtype=dtype, device=device)
        self.views: list[tuple[torch.Tensor, torch.Tensor]] = []  # each layer's slice of the buffers [1, KV, cap, hd]
        # the buffers as NumPy arrays [L, KV, cap, hd] (float32 on the CPU; else None), for the numpy and numba backends
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None
        # the keys the last publish gave the cache's layers: while every layer still holds exactly that tensor, nothing
        # else has touched the cache since
        self._keys_out: list[torch.Tensor] = []
        self.length = 0  # columns in use: what the last publish or move left (a move leaves the layers' views longer)

    def owns(self, layers: list) -> bool:
        """Do the cache's `layers` hold exactly what the last publish gave them?"""
        out = self._keys_out
        return len(out) == len(layers) and all(map(is_, map(_KEYS, layers), out))  # C loops: a check a pass

    def reserve(self, layers: list, q: int) -> int:
        """Room for q more columns in each of the cache's `layers` (`views`, `arrays`); the columns in use."""
        out = self._keys_out
        owned = bool(out) and self.owns(layers)
        if owned and self.length + q <= self.keys.shape[3]:
            return self.length  # the layers hold what the last forward published: nothing to check
        for layer, (k, v) in zip(layers, self.views or [(self.keys[0], self.values[0])] * len(layers)):
            if not layer.is_initialized:  # a layer no forward has written yet (DynamicLayer's own first step)
                layer.lazy_initialization(k, v)
        first = layers[0].keys
        n = self.length if owned else first.shape[2] if first.dim() == 4 else 0  # an initialised layer holds a 1D []
        if not all(layer.keys.data_ptr() == k.data_ptr() and layer.keys.stride() == k.stride()
                   for layer, (k, _) in zip(layers, self.views)) or len(self.views) != len(layers) \
                or self.keys.shape[3] < n + q:
            L, _, KV, _, hd = self.shape
            cap = max(512, 1 << (2 * (n + q) - 1).bit_length())
            like = {"dtype": self.keys.dtype, "device": self.keys.device}
            keys, values = torch.empty(L, 1, KV, cap, hd, **like), torch.empty(L, 1, KV, cap, hd, **like)
            for i, layer in enumerate(layers):
                if n:
                    keys[i, :, :, :n], values[i, :, :, :n] = layer.keys[:, :, :n], layer.values[:, :, :n]
            self.keys, self.values = keys, values
            self.views = [(keys[i], values[i]) for i in range(L)]
            numpy = keys.device.type == "cpu" and keys.dtype == torch.float32
            self.arrays = (keys[:, 0].numpy(), values[:, 0].numpy()) if numpy else None
        return n

    def at(self, n: int) -> zip:
        """Each layer's first n columns: (keys, values) views [1, KV, n, hd] of `views`, made by one narrow and one
        unbind per buffer (a narrow per layer and buffer is a dozen calls for a six-layer model)."""
        return zip(self.keys.narrow(3, 0, n).unbind(0), self.values.narrow(3, 0, n).unbind(0))

    def publish(self, layers: list, n: int) -> None:
        """Point each cache layer at its first n columns."""
        for layer, (k, v) in zip(layers, self.at(n)):
            layer.keys, layer.values = k, v
        self.published(layers)

    def published(self, layers: list) -> None:
        """The caller has pointed each of the cache's `layers` at the first columns of its `views` slice itself."""
        self._keys_out = [layer.keys for layer in layers]
        self.length = self._keys_out[0].shape[2]

    def length_of(self, keys: torch.Tensor | None) -> int | None:
        """The columns in use where `keys` (a cache's first layer's) is still the view the last publish gave it (a
        move may have left it longer than that); else None (the layers' own length is the cache's). A length read
        here asks torch nothing: the runner reads it a few times a step, right after model forwards."""
        out = self._keys_out
        return self.length if out and keys is out[0] else None

    def move(self, layers: list, start: int, keep: list[int], moved: bool = True) -> bool:
        """`compact` on every layer at once: region columns `keep` (relative to `start`) moved to the front of the
        region (`moved` False: they are there already, 0..m-1), the layers cropped after them. False, with nothing
        done, unless the layers hold what the last publish gave them."""
        if not self.owns(layers):
            return False
        m = len(keep)
        if moved:  # else a crop only (a tree accepted along its first nodes, as a chain's is): nothing to gather
            if self.arrays is not None:  # compiled, else NumPy's fancy index (torch's is ~4x that on a small buffer)
                (_move_jit or _move_columns)(*self.arrays, start, np.array(keep, dtype=np.int64))
            else:
                idx = torch.tensor(keep, dtype=torch.long, device=self.keys.device) + start
                for b in (self.keys, self.values):
                    b[:, :, :, start : start + m] = b.index_select(3, idx)
        self.length = start + m  # the layers keep their views until the next publish
        return True


def compact(cache: DynamicCache, start: int, keep: list[int], buffers: KVBuffers | None = None,
            whole: frozenset[int] = frozenset()) -> None:
    """Keep region columns `keep` (relative to `start`) and drop everything else after `start`; `buffers`: the ones
    the cache's layers may view (moved in one go where they do); `whole`: layers that hold no text columns (an
    image's keys for cross-attention), kept as they are."""
    m = len(keep)
    moved = keep != list(range(m))
    # buffers that hold every layer (the fused layers' caches, each step): one move, the checks below done when they
    # took the layers (a sliding-window layer is never one of them: its model's layers are not fused)
    if buffers is not None and buffers.move(cache.layers, start, keep, moved):  # False unless the layers view them
        return
    layers = cache.layers if not whole else [layer for i, layer in enumerate(cache.layers) if i not in whole]
    compact_layers(layers, start, keep, moved)


def compact_layers(layers: list, start: int, keep: list[int], moved: bool | None = None) -> None:
    """`compact` on the key/value layers `layers` (of one cache: a windowed group's `start` counts the columns they
    hold)."""
    m = len(keep)
    moved = keep != list(range(m)) if moved is None else moved
    layers = [layer for layer in layers if layer.is_initialized]
    if any(type(layer) is not DynamicLayer for layer in layers):  # a rolling window, a recurrent state: not columns
        raise ModelError("cannot compact this cache to the accepted path: its layers "
                         f"({', '.join(sorted({type(la).__name__ for la in layers} - {'DynamicLayer'}))}) keep more "
                         "than key and value columns (layer_kinds.py says which kinds trees support)")
    if not layers or (not moved and layers[0].keys.shape[2] == start + m):
        return  # every column of the region is kept where it is (a plain step, a fully accepted tree): nothing to do
    idx = None
    for layer in layers:
        if moved:
            if idx is None or idx.device != layer.keys.device:
                idx = torch.tensor(keep, device=layer.keys.device) + start
            layer.keys[:, :, start : start + m] = layer.keys[:, :, idx]  # gather copies first: overlap-safe
            layer.values[:, :, start : start + m] = layer.values[:, :, idx]
        layer.keys = layer.keys[:, :, : start + m]
        layer.values = layer.values[:, :, : start + m]


_STATES = ("conv_states", "recurrent_states")  # a recurrent layer's dicts of batch-first states, by state index


def map_cache(cache: DynamicCache, fn) -> DynamicCache:
    """A new cache whose every batch-first tensor (keys, values, a recurrent layer's convolution and recurrent states)
    is fn(tensor), each layer's other dicts (flags kept per state index) copied, the rest shallow-copied: the new
    cache's updates never touch `cache`'s. An empty tensor (a layer's placeholder) is shared: nothing writes into
    one."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        for name, value in vars(layer).items():
            if name in ("keys", "values") and isinstance(value, torch.Tensor) and value.numel():
                setattr(twin, name, fn(value))
            elif isinstance(value, dict):
                setattr(twin, name, {i: fn(t) if name in _STATES and isinstance(t, torch.Tensor) else t
                                     for i, t in value.items()})
        new.layers.append(twin)
    return new


def copy_cache(cache: DynamicCache) -> DynamicCache:
    """An independent copy of `cache`: its tensors cloned, the rest shallow-copied (a deepcopy would also copy the
    config and every attribute, several times slower for a small cache)."""
    return map_cache(cache, torch.Tensor.clone)


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of the batch-first tensors of `cache` (keys, values, convolution and recurrent states)."""
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values", *_STATES):
            value = getattr(layer, name, None)
            for t in value.values() if isinstance(value, dict) else (value,):
                total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
    return total
