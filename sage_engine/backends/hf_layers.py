"""The "layers" backend: tree forwards through the model's own layers, without its wrapper (embed -> layers -> head).

Where it applies: a known family (families.py) whose text model is embed_tokens / rotary_emb / layers / norm, every
layer full attention without sinks (layer_kinds.py), the whole model on one device; bit-identical to forward() or not
kept; otherwise forward().

A cached tree forward of a small model spends much of its time outside its decoder layers: the VLM
wrapper, the text model's mask building and output bookkeeping (for a 1-layer draft, about half of
the call). A tree step needs none of it: the tokens are text, the engine brings its
own 4D mask and positions, the cache is already there. `DecoderStack` calls the model's own modules
(no modeling code is copied) in the order the text model's forward does.

It is used only where that order is all the forward does: a known family whose text model has
embed_tokens / rotary_emb / layers / norm, every layer full attention, everything on one device
(no accelerate map). And the runner checks it once per model: its first tree forward runs both
ways and keeps the stack only if the logits are bit-identical (`torch.equal`), so output can never
depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.families import TEXT, Family
from ..models.layer_kinds import FullAttention, plan_for


@dataclass(frozen=True)
class DecoderStack:
    """The "layers" backend (see backends/__init__.py): the model's own modules called in turn."""

    name = "layers"
    takes_lists = compiled = False
    buffers = prompt_layers = None  # appends to the cache by concatenation; prompts go through forward()

    embed: torch.nn.Module
    rotary: torch.nn.Module
    layers: tuple[torch.nn.Module, ...]
    norm: torch.nn.Module
    head: torch.nn.Module
    mrope: bool  # rotary positions as [3, 1, q] (M-RoPE: every axis the text position) instead of [1, q]
    static_rope: bool  # "default" rope type: each position's (cos, sin) depends on that position alone
    lm: torch.nn.Module  # the text model these parts make up (its inputs: `prompt_inputs`)
    tables: dict = field(default_factory=dict)  # "cos", "sin": the rotary's output for positions 0..n-1

    def _rows(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[None].expand(3, 1, -1) if self.mrope else positions

    def position_embeddings(self, h: torch.Tensor, positions: torch.Tensor,
                            top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's rotary (cos, sin) for `positions` [1, q]. A static rotary ("default" rope type)
        depends on each position alone, so its outputs for 0..n-1 are computed once, by the model's own
        rotary module, and indexed: the same numbers for a fraction of the cost (an M-RoPE rotary
        recomposes its three axes chunk by chunk, as long as a 1-layer draft's layer)."""
        if not self.static_rope:
            return self.rotary(h, self._rows(positions))
        need = (int(positions.max()) if top is None else top) + 1  # top: the largest position, when known
        cos = self.tables.get("cos")
        if cos is None or cos.shape[1] < need or cos.dtype != h.dtype or cos.device != h.device:
            n = 1 << max(need - 1, 255).bit_length()  # grow by powers of two
            every = torch.arange(n, device=h.device).view(1, n)
            cos, sin = self.rotary(h.new_zeros(1, n, h.shape[-1]), self._rows(every))
            self.tables.update(cos=cos, sin=sin)
        idx = positions[0]
        return cos[:, idx], self.tables["sin"][:, idx]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 top: int | None = None) -> torch.Tensor:
        """ids, positions [1, q] (positions already shifted; `top` their largest, if the caller knows it), mask
        [1, 1, q, kv] (None: a single token that sees every column); appends to `cache`.  # -> [1, q, V]"""
        h = self.embed(ids)
        pe = self.position_embeddings(h, positions, top)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=None if self.mrope else positions,
                      past_key_values=cache, use_cache=True)
        return self.head(self.norm(h))


def _devices(model: torch.nn.Module) -> set[str]:
    return {str(p.device) for p in model.parameters()}


def decoder_stack(model: torch.nn.Module, family: Family) -> DecoderStack | None:
    """The model's text decoder as a DecoderStack, or None where calling it layer by layer is not known to
    equal its forward (`stack_refusal` says why)."""
    return None if _placement_refusal(model, family) else _stack(model, family)


def stack_refusal(model: torch.nn.Module, family: Family) -> str | None:
    """Why the model's layers are not called in turn, in a few words; None where they are."""
    refusal = _placement_refusal(model, family)
    if refusal is None and _stack(model, family) is None:
        plan = plan_for(model)
        if any(not isinstance(kind, FullAttention) for kind in plan.kinds):
            return f"its layers are not all plain full attention ({plan.describe()})"
        return "its text model lacks a part"
    return refusal


def _placement_refusal(model: torch.nn.Module, family: Family) -> str | None:
    """Why the model's family or placement keeps its layers from being called in turn; None where neither does."""
    if not family.verified:
        return f"its family ({family.name}) is not one whose layers are checked to run in turn"
    # a model dispatched by accelerate (a device map over GPUs, CPU or disk) runs its layers through hooks that move
    # tensors and weights between devices: only its forward() calls them; so it is not called layer by layer, even
    # where every shard is on one device (the doctor's two shards on one device take the multi-GPU path that way)
    spread = len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1
    if spread or any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "it is spread by a device map, whose hooks run its layers"
    devices = _devices(model)
    if len(devices) != 1 or "meta" in devices:
        return f"its weights are on {', '.join(sorted(devices))}"
    return None


def _stack(model: torch.nn.Module, family: Family) -> DecoderStack | None:
    try:
        lm = getattr(model, "model", None) if family is TEXT else family.language_model(model)
    except NotImplementedError:
        return None
    parts = [getattr(lm, a, None) for a in ("embed_tokens", "rotary_emb", "layers", "norm")]
    head = model.get_output_embeddings()
    if any(p is None for p in parts) or head is None:
        return None
    if any(not isinstance(kind, FullAttention) for kind in plan_for(model).kinds):  # windows, chunks, sinks, states
        return None
    embed, rotary, layers, norm = parts
    return DecoderStack(embed, rotary, tuple(layers), norm, head, mrope=family.positions.name == "mrope",
                        static_rope=getattr(rotary, "rope_type", None) == "default", lm=lm)


class _Reached(Exception):
    """Raised by `prompt_inputs`' hook when the model's forward calls its text model: the rest is not needed."""


def prompt_inputs(model: torch.nn.Module, stack: DecoderStack, batch: dict,
                  cache) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What the model's forward on `batch` (a whole prompt, `cache` empty) hands its text model: the input embeddings
    [1, q, D], visual features merged in by the model's own code, and the rotary positions as the text model's rotary
    takes them ([3, 1, q] for M-RoPE, else [1, q]). The forward stops there (a hook on the text model raises). None
    where the call is not that plain: the text model not reached, positional arguments, a padded attention mask, a
    batch of several. The model's own state that its forward sets before the text model (e.g. Qwen2-VL's rope
    deltas) is set as by a whole forward."""
    seen: dict = {}

    def reached(module, args, kwargs):
        seen.update(kwargs, _args=args)
        raise _Reached

    handle = stack.lm.register_forward_pre_hook(reached, with_kwargs=True)
    try:
        model(**batch, past_key_values=cache, use_cache=True, logits_to_keep=1)
    except _Reached:
        pass
    finally:
        handle.remove()
    if not seen or seen["_args"]:
        return None
    embeds, ids, mask = seen.get("inputs_embeds"), seen.get("input_ids"), seen.get("attention_mask")
    if embeds is None:
        embeds = None if ids is None else stack.embed(ids)
    if embeds is None or embeds.shape[0] != 1 or cache.get_seq_length():
        return None
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all())):
        return None
    positions = seen.get("position_ids")
    if positions is None:
        positions = torch.arange(embeds.shape[1], device=embeds.device)[None]
    if stack.mrope and positions.dim() == 2:
        positions = positions[None].expand(3, 1, -1)
    elif stack.mrope and positions.shape[0] == 4:  # transformers' packed-sequence text row first, then t / h / w
        positions = positions[1:]
    return embeds, positions
