"""Supervision of the visual tokens from the pixels (training only; nothing here is saved with the model).

Each merged visual token covers one cell of the 3 x 3 canvas. `pixel_targets` gives, for every token, the cell's
colour shares (the share of its pixels each palette colour names) and its mean lightness, exactly as
`pixels.cell_stats` computes them for the answers' facts; a clip's token of temporal group g gets the stats of the
mean of the frames the group covers (the halves `pixels.clip_facts` compares). These targets exist for every
picture, a shapes scene or a photo, so the loss needs no object labels.

Why: trained on answers alone, the towers learn the few colour contrasts the shapes world needs and pass on
little about how light a cell is; an answer about a photo's regions, its brightest part or a clip's change then
has nothing to read. `PixelAux` asks the tower's merged output for the shares (binary cross-entropy against the
shares as soft targets, summed over the palette) and the lightness (L* / 100, squared error x L_WEIGHT).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..pixels import PALETTE, cell_stats
from .vision_aux import TowerHead

N_OUT = len(PALETTE) + 1     # the palette's shares, then L* / 100
L_WEIGHT = 10.0              # weight of the lightness error (a share's BCE is about 0.3 at the start, L*'s error 0.05)


def pixel_targets(img: np.ndarray) -> np.ndarray:
    """A picture on the canvas (SIZE, SIZE, 3) uint8 -> (9, N_OUT)."""
    shares, light = cell_stats(img)
    return np.concatenate([shares, light[:, None] / 100.0], 1).astype(np.float32)


def clip_pixel_targets(frames: np.ndarray, temporal: int = 2) -> np.ndarray:
    """The frames the models see (T, SIZE, SIZE, 3) uint8 -> (T // temporal * 9, N_OUT), group-major like the
    tower's video tokens."""
    groups = [frames[g:g + temporal].astype(np.float32).mean(0).round().astype(np.uint8)
              for g in range(0, len(frames), temporal)]
    return np.concatenate([pixel_targets(g) for g in groups])


class PixelAux(TowerHead):
    """`loss(image, video)` (TowerHead's) after a forward pass: image = (n_images, 9, N_OUT) targets in the batch's
    image order, video = (n_clips, 18, N_OUT)."""

    def __init__(self, model):
        super().__init__(model, N_OUT)

    def _one(self, feats: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = self.head(feats).view(target.shape)
        colour = F.binary_cross_entropy_with_logits(out[..., :-1], target[..., :-1], reduction="none").sum(-1).mean()
        return colour + L_WEIGHT * F.mse_loss(out[..., -1], target[..., -1])
