"""The fused prompt path: a whole prompt through the model's own forward only up to its text model (the vision tower,
the merge of visual features, the positions: hf_layers.prompt_inputs), then the kept fused layers' prefill
(FusedDecoder.prefill), where a Qwen2.5-VL-style vision tower runs in fewer calls (vision_tower.py) unless the check
fails with it and passes without it.

Where it applies: a model whose cached forwards run on a fused backend (fused, numpy, numba: the torch layers they
were made from take the prompt), float32 or bf16 on one device, a forward whose call to its text model is plain;
kept once a first prompt's logits, keys and values came out near forward()'s (choose.prompt_close). Every other
prompt, and every model without a fused backend, runs through forward().
"""

from __future__ import annotations

import torch

from .choose import prompt_close
from .fused_torch import WARM_ROWS, FusedDecoder
from .hf_layers import DecoderStack, prompt_inputs
from .vision_tower import FusedVision


class FusedPrompt:
    """One model's fused prompt path and its check: `state` None until checked, then whether it is kept."""

    def __init__(self, model: torch.nn.Module, stack: DecoderStack | None, vision: FusedVision | None):
        self.model, self.stack, self.vision = model, stack, vision
        self.state: bool | None = None
        self.notes: list[str] = []

    @property
    def name(self) -> str:
        """"fused+vision" (the fused layers, the pictures through vision_tower.py), "fused", or "forward"."""
        if not self.state:
            return "forward"
        return "fused+vision" if self.vision is not None else "fused"

    def layers_for(self, cached, batch: dict) -> FusedDecoder | None:
        """The fused layers this prompt can go through, given the kept cached backend: its torch layers, not after the
        check turned the path down, and not packed ones over more rows than they were warmed for."""
        decoder = None if cached is None or self.state is False else cached.prompt_layers
        if decoder is None:
            return None
        ids = batch.get("input_ids")
        if decoder.packed and (ids is None or ids.shape[-1] > WARM_ROWS):
            return None
        return decoder

    def run(self, decoder: FusedDecoder, batch: dict, cache) -> torch.Tensor | None:
        """The prompt's logits after its last token [V], its keys and values in `cache` (empty); None where the
        forward's call to its text model is not plain."""
        if self.vision is not None:
            batch = self.vision.encoded(batch)
        found = prompt_inputs(self.model, self.stack, batch, cache)
        return None if found is None else decoder.prefill(*found, cache)

    def check(self, decoder: FusedDecoder, batch: dict, logits: torch.Tensor, cache) -> None:
        """Keep the path if, on this prompt, it gives forward()'s `logits` and the keys and values forward() wrote in
        `cache` (near, same argmax); else try it without the fused vision tower; else turn it down, with a note."""
        config = self.model.config
        self.state = prompt_close(lambda scratch: self.run(decoder, batch, scratch), logits, cache, config)
        if not self.state and self.vision is not None:  # the layers may be right where the vision tower is not
            self.vision = None
            self.state = prompt_close(lambda scratch: self.run(decoder, batch, scratch), logits, cache, config)
            if self.state:
                self.notes.append("the fused vision tower turned down: the prompt's logits, keys or values differed "
                                  "from forward()'s")
        if not self.state:
            self.notes.append("the fused prompt path turned down: its logits, keys or values differed from "
                              "forward()'s; prompts run through forward()")
