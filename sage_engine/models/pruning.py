"""Draft-only visual-token pruning (SpecVLM / SAGE): the draft reads a fraction of the visual tokens.

Only the draft's prompt changes, so the output stays the target's greedy output; what
changes is the draft's cost and how often it agrees. The paper prunes 80% of image tokens
and 90% of video tokens.

How it stays architecture-agnostic, through public APIs only:
  1. run the draft's normal forward up to its language model and capture what the language
     model would receive (merged text + visual embeddings, and M-RoPE positions when the
     family has them) with a forward pre-hook that then stops the forward; the family adapter
     (families.py) names the language model submodule, the visual token ids and the position rows;
  2. keep all text tokens and an evenly spaced subset of each modality's visual tokens;
  3. prefill the draft with those embeddings at their ORIGINAL positions, so the text that
     follows keeps the positions it would have had without pruning (the runner's rope_delta).
Which visual tokens survive is open in the papers; we keep evenly spaced ones (documented,
deterministic, cheap).
"""

from __future__ import annotations

import torch

from ..config import VisualPruning  # defined with the other settings, where no torch is imported
from ..errors import ModelError
from .families import Family, adapter_for


class _Captured(Exception):
    """Raised by the pre-hook to stop the forward once the language model's inputs are known."""


@torch.inference_mode()
def capture_lm_inputs(model: torch.nn.Module, inputs: dict,
                      family: Family | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs_embeds [1, S, H], position_ids or None) as the model's language model would receive them."""
    family = family or adapter_for(model)
    seen: dict = {}

    def hook(module, args, kwargs):
        seen["embeds"] = kwargs.get("inputs_embeds")
        seen["positions"] = kwargs.get("position_ids")
        raise _Captured

    handle = family.language_model(model).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(**inputs, use_cache=False)
    except _Captured:
        pass
    finally:
        handle.remove()
    if seen.get("embeds") is None:
        raise ModelError(f"draft pruning cannot run on {type(model).__name__}: its language model is not given the "
                         "picture as token embeddings (it reads images another way, e.g. by cross-attention)")
    return seen["embeds"], seen["positions"]


def keep_indices(input_ids: torch.Tensor, token_ratio: dict[int, float]) -> torch.Tensor:
    """Sequence indices to keep: every non-visual token, and an evenly spaced subset of each visual kind.

    input_ids: [S]; token_ratio maps a visual token id to the fraction of its tokens to DROP.
    """
    keep = torch.ones_like(input_ids, dtype=torch.bool)
    for tok, drop in token_ratio.items():
        where = (input_ids == tok).nonzero().flatten()
        n = where.numel()
        if n == 0 or drop <= 0:
            continue
        n_keep = max(1, round(n * (1.0 - drop)))
        chosen = torch.linspace(0, n - 1, n_keep).round().long()
        keep[where] = False
        keep[where[chosen]] = True
    return keep.nonzero().flatten()


def pruned_prefill_inputs(model, inputs: dict, pruning: VisualPruning, family: Family | None = None):
    """Inputs for a pruned draft prefill, and the text-position shift that follows it.

    Returns (kwargs for model(...), rope_delta): positions after the prompt are
    sequence index + rope_delta, exactly as without pruning. The family says which ids are
    visual tokens and how to read the captured positions (families.py).
    """
    family = family or adapter_for(model)
    drops = {"image": pruning.image, "video": pruning.video}
    ratio = {tok: drops[kind] for kind, tok in family.visual_token_ids(model.config).items()}
    embeds, captured = capture_lm_inputs(model, inputs, family)
    ids = inputs["input_ids"][0].to(embeds.device)
    positions = family.positions.prompt_positions(captured, ids.numel(), embeds.device)  # [rows..., 1, S]
    keep = keep_indices(ids, ratio)  # [S']
    kept_pos = positions[..., keep]
    next_pos = int(positions.max()) + 1
    kwargs = {"inputs_embeds": embeds[:, keep], "position_ids": kept_pos}
    return kwargs, next_pos - keep.numel()
