"""The loss pieces and schedules the training loops share, and the running averages they log and report."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .vision_aux import VisionAux


def cosine(step: int, total: int, warmup: int, floor: float = 0.1) -> float:
    """Learning-rate factor: linear warmup to 1, then a cosine down to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def content_tokens(tok) -> torch.Tensor:
    """Bool (vocab,): the token ids that spell the world's facts (colours, shapes, sizes, numbers, places,
    events, yes / no), with and without a leading space or capital. Most of the answer loss sits on
    phrasing choices ("There", "The", "In", ...) that no picture decides; content_weight > 1 moves the
    gradient towards the words the picture does decide."""
    from ..language import NUMBERS
    from ..world import COLOURS, POSITIONS, SHAPES, SIZES
    words = set(COLOURS) | set(SHAPES) | set(SIZES) | set(NUMBERS) | {w for p in POSITIONS for w in p.split()}
    words |= {"middle", "side", "corner", "moves", "appears", "disappears", "vanishes", "grows", "shrinks", "turns",
              "changes", "larger", "smaller", "yes", "no"}
    mask = torch.zeros(len(tok), dtype=torch.bool)
    for w in words:
        for form in (w, " " + w, w.capitalize(), " " + w.capitalize()):
            ids = tok(form, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:   # forms BPE splits are left out: their pieces spell other words too
                mask[ids] = True
    return mask


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, content: torch.Tensor, weight: float) -> torch.Tensor:
    """Next-token cross-entropy on the labelled positions, content tokens weighted `weight` (mean over weights)."""
    lab = labels[:, 1:]
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), lab, reduction="none", ignore_index=-100)
    w = torch.where(content[lab.clamp(min=0)], weight, 1.0) * (lab != -100)
    return (ce * w).sum() / w.sum()


def aux_loss(aux: VisionAux | None, targets: dict | None) -> torch.Tensor:
    """The auxiliary loss of the forward just run (0 without visual targets or without aux)."""
    if aux is None:
        return torch.zeros(())
    if not targets or (targets["image"] is None and targets["video"] is None):
        aux.clear()
        return torch.zeros(())
    return aux.loss(targets["image"], targets["video"])


class Smoothed:
    """Exponential moving averages of named values (losses, shares), started at each name's first value:
    what the training log prints every 50 steps and what summary.json keeps as the final losses."""

    def __init__(self, decay: float):
        self.decay = decay
        self.values: dict[str, float] = {}

    def add(self, **values) -> None:
        """Fold in this step's values; None and nan (nothing measured this step) are skipped."""
        for name, v in values.items():
            v = float(v) if v is not None else math.nan
            if v == v:
                old = self.values.get(name)
                self.values[name] = v if old is None else self.decay * old + (1 - self.decay) * v

    def text(self, fmt: str = ".4f") -> str:
        return " ".join(f"{name} {v:{fmt}}" for name, v in self.values.items())
