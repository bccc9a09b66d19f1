"""Dense auxiliary supervision of the vision tokens (training only; nothing here is saved).

The 16 merged visual tokens of an image each cover a 28 x 28 pixel block (4 x 4 grid on a
112 px image). `token_labels` says, from the scene's ground truth, which colours, shapes and
sizes have at least MIN_PIXELS visible pixels in each block, and whether the block is empty.
`VisionAux` hooks the vision tower's merged output (what the language model receives in
place of the <|image_pad|> tokens), puts a linear head on it, and returns a multi-label
BCE loss that is added to the language-model loss. The head is thrown away after training:
the shipped model stays a plain Qwen2_5_VLForConditionalGeneration.
"""
from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .world import COLOURS, SHAPES, SIZE, SIZES, Obj, Scene, _centre, draw_object

GRID = 4                       # merged tokens per side
BLOCK = SIZE // GRID           # 28 px
MIN_PIXELS = 12                # visible pixels of an object for it to count as present in a block
N_LABELS = len(COLOURS) + len(SHAPES) + len(SIZES) + 1   # colours, shapes, sizes, empty
_COLOURS = list(COLOURS)


def _anchor(o: Obj) -> int:
    """The merged token holding the object's centre."""
    cx, cy = _centre(o.cell)
    return min(int((cy + o.dy) // BLOCK), GRID - 1) * GRID + min(int((cx + o.dx) // BLOCK), GRID - 1)


def token_labels(objects: tuple[Obj, ...] | list[Obj], anchor: bool = False) -> np.ndarray:
    """uint8 (16, N_LABELS): per merged token (row-major) multi-hot colour / shape / size / empty.
    anchor=True: shape and size only on the token holding the object's centre (colour and
    empty stay per pixel coverage)."""
    owner = np.full((SIZE, SIZE), -1, np.int16)          # which object each pixel shows (last drawn wins)
    for i, o in enumerate(objects):
        mask = np.zeros((SIZE, SIZE, 3), np.uint8)
        draw_object(mask, o, colour=(255, 255, 255))
        owner[mask[..., 0] > 127] = i
    out = np.zeros((GRID * GRID, N_LABELS), np.uint8)
    for t in range(GRID * GRID):
        r, c = divmod(t, GRID)
        block = owner[r * BLOCK:(r + 1) * BLOCK, c * BLOCK:(c + 1) * BLOCK]
        for i, o in enumerate(objects):
            if (block == i).sum() >= MIN_PIXELS:
                out[t, _COLOURS.index(o.colour)] = 1
                if not anchor or _anchor(o) == t:
                    out[t, len(COLOURS) + SHAPES.index(o.shape)] = 1
                    out[t, len(COLOURS) + len(SHAPES) + SIZES.index(o.size)] = 1
        if not out[t, :-1].any():
            out[t, -1] = 1
    return out


def scene_labels(scene: Scene) -> np.ndarray:
    return token_labels(scene.objects)


class VisionAux(torch.nn.Module):
    """Linear head on the merged image tokens of `model`; `loss(labels)` after a forward pass.

    Only IMAGE calls of the vision tower are captured (grid t == 1); videos pass untouched."""

    def __init__(self, model):
        super().__init__()
        hidden = model.config.text_config.hidden_size
        self.head = torch.nn.Linear(hidden, N_LABELS)
        self._feats: list[torch.Tensor] = []
        self._hook = model.model.visual.register_forward_hook(self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs, output):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if grid is not None and bool((grid[:, 0] == 1).all()):
            self._feats.append(output.pooler_output)

    def loss(self, labels: torch.Tensor) -> torch.Tensor:
        """labels: (n_images, 16, N_LABELS) in the batch's image order."""
        feats = torch.cat(self._feats) if self._feats else None
        self._feats = []
        if feats is None or labels.numel() == 0:
            return torch.zeros(())
        logits = self.head(feats).view(labels.shape)
        return F.binary_cross_entropy_with_logits(logits, labels.float())

    def clear(self) -> None:
        self._feats = []

    def remove(self) -> None:
        self._hook.remove()


def token_accuracy(aux: VisionAux, labels: torch.Tensor) -> float:
    """Exact-match rate of the thresholded head over all (token, label) pairs of the last forward."""
    feats = torch.cat(aux._feats)
    aux._feats = []
    with torch.no_grad():
        pred = aux.head(feats).view(labels.shape) > 0
    return float((pred == labels.bool()).all(-1).float().mean())
