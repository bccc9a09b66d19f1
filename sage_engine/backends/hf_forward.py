"""The "forward" backend: the model's own forward(), what every model gets where nothing faster applies.

Any device, dtype, size and architecture transformers loads, accelerate device maps included (the GPU path): a tree
pass is one forward() call with the engine's 4D additive mask, explicit positions and the model's cache.
"""

from __future__ import annotations

import torch


class ModelForward:
    """Cached forwards through `model(...)`; the reference every other backend is checked against."""

    name = "forward"
    takes_lists = compiled = False
    buffers = prompt_layers = None

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 top: int | None = None) -> torch.Tensor:
        """ids, positions [1, q] (shifted), mask [1, 1, q, kv] additive or None; appends to `cache`.  # -> [1, q, V]"""
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache,
                          use_cache=True).logits
