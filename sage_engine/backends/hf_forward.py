"""The "forward" backend: the model's own forward(), what every model gets where nothing faster applies.

Any device, dtype, size and architecture transformers loads, accelerate device maps included (the GPU path): a tree
pass is one forward() call with the engine's 4D additive mask (or one per layer type, where the layers see different
pasts), explicit positions and the model's cache.

A model whose prompt came with a cross-attention mask (Mllama: which image tiles each token sees) carries its last
row on every later pass, one row a token, as transformers' generate() does.

A model whose outer forward builds one mask from the one it is given (PaliGemma over Gemma 2's sliding and full
layers: `Family.masks_by_type` False) gets the full-attention mask there, and its language model the masks by layer
type, put in its call's arguments by a hook: every module that runs is the model's own.
"""

from __future__ import annotations

import contextlib

import torch


class ModelForward:
    """Cached forwards through `model(...)`; the reference every other backend is checked against."""

    name = "forward"
    takes_lists = compiled = False
    buffers = prompt_layers = None

    def __init__(self, model: torch.nn.Module, language_model: torch.nn.Module | None = None):
        """language_model: where a mapping of masks by layer type must go past the outer forward (None: the outer
        forward takes it)."""
        self.model = model
        self.language_model = language_model
        # the prompt's inputs every later pass carries, one row a token (Family.carry: Mllama's cross-attention mask)
        self.carry: dict[str, torch.Tensor] = {}

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | dict | None, cache,
                 top: int | None = None) -> torch.Tensor:
        """ids, positions [1, q] (shifted), mask [1, 1, q, kv] additive (or {layer type: such a mask}) or None; appends
        to `cache`.  # -> [1, q, V]"""
        outer = mask
        hooked = contextlib.nullcontext()
        if isinstance(mask, dict) and self.language_model is not None:
            outer = mask.get("full_attention", next(iter(mask.values())))
            hooked = self._masks_to_language_model(mask)
        q = ids.shape[1]
        carried = {k: v.expand(-1, q, *v.shape[2:]) for k, v in self.carry.items()}
        with hooked:
            return self.model(input_ids=ids, position_ids=positions, attention_mask=outer, past_key_values=cache,
                              use_cache=True, **carried).logits

    @contextlib.contextmanager
    def _masks_to_language_model(self, masks: dict):
        def put(module, args, kwargs):
            return args, {**kwargs, "attention_mask": masks}

        handle = self.language_model.register_forward_pre_hook(put, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
