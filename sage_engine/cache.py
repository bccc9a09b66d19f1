"""KV-cache compaction after a verified step: keep the accepted path, drop the rejected branches.

The tree region of a cache starts at `start`; `keep` lists the region columns to keep, in
order. The kept entries move to the front of the region and the rest is cropped.
Works on transformers' `DynamicCache` (`cache.layers[i].keys / .values`: [B, H, S, D]).
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache


def compact(cache: DynamicCache, start: int, keep: list[int]) -> None:
    """Keep region columns `keep` (relative to `start`) and drop everything else after `start`."""
    layers = [layer for layer in cache.layers if layer.is_initialized]
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise NotImplementedError("tree decoding with sliding-window cache layers is not supported")
    m = len(keep)
    moved = keep != list(range(m))
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


def copy_cache(cache: DynamicCache) -> DynamicCache:
    """An independent copy of `cache`: its layers' key and value tensors cloned, the rest shallow-copied (a
    deepcopy would also copy the config and every attribute, several times slower for a small cache)."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        if layer.is_initialized:
            twin.keys, twin.values = layer.keys.clone(), layer.values.clone()
        new.layers.append(twin)
    return new
