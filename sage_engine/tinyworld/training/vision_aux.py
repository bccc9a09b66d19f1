"""Dense auxiliary supervision of the visual tokens (training only; nothing here is saved with the model).

Each of an image's 9 merged visual tokens covers one 28 x 28 cell of the world. `token_targets` says, from
the scene's ground truth, which colours, shapes and sizes show at least MIN_PIXELS pixels in each cell
(multi-hot), which (size, colour, shape) triples do (the binding: a cell that holds a small green square in
front of a large red circle must say which colour and which size go with which shape), whether the cell is
empty, and which shape covers most of it (`dom`, if at least DOM_PIXELS pixels). A clip gets the same targets
per temporal patch group (sampled frames 0-1 and 2-3: before and after the event).

`VisionAux` hooks the vision tower's merged output (what the language model receives in place of the pad
tokens), puts a linear head on it and returns BCE_WEIGHT x the mean BCE of the colour, size and empty labels,
a softmax cross-entropy of the dominant shape, and TRIPLE_WEIGHT x the BCE of the shape and triple labels
summed over the labels. The shapes get losses of their own because a multi-hot shape label averaged
into one BCE with the other labels gets almost no gradient, and the tower then learns shapes long after
colours; the dominant shape alone says nothing about the second object of an occluding pair.

`whiten_patch_embed` initialises the patch embedding from ZCA-whitened patches: raw pixel patches are
dominated by their mean colour, and a random linear embedding passes on little of the fine structure that
tells shapes apart.

`PlaceAux` is a second training-only head, on an early language-model layer, that makes each visual token's
state say where the token is (see the class). Both heads are removed after training, so the shipped model
stays a plain Qwen2_5_VLForConditionalGeneration. The measurements behind these choices are in ../RUNS.md.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..world import (
    COLOURS,
    MODEL_FRAMES,
    RADIUS,
    SHAPES,
    SIZE,
    SIZES,
    Clip,
    Obj,
    Scene,
    clip_frame_objects,
    clip_metadata,
    draw_object,
)

GRID = SIZE // 28              # merged tokens per side (3: one per cell)
BLOCK = SIZE // GRID           # 28 px
MIN_PIXELS = 12                # visible pixels of an object for it to count as present in a block
DOM_PIXELS = 40                # pixels the largest object in a block needs for the block's shape target
# the labels of a visual token, in order: colours, shapes, sizes, (size, colour, shape) triples, empty
SHAPE = slice(len(COLOURS), len(COLOURS) + len(SHAPES))
SIZE_LABELS = slice(SHAPE.stop, SHAPE.stop + len(SIZES))
TRIPLES = slice(SIZE_LABELS.stop, SIZE_LABELS.stop + len(SIZES) * len(COLOURS) * len(SHAPES))   # see triple_index
N_LABELS = TRIPLES.stop + 1
LABELS_VERSION = 3             # bumped whenever the labels change: names the training cache (commands.py)
BCE_WEIGHT = 1.0               # weight of the mean BCE of the colour / size / empty labels
TRIPLE_WEIGHT = 0.1            # weight of the BCE of the shape and triple labels, summed over those labels
_COLOURS = list(COLOURS)


def drawn_size(o: Obj, radius: float | None) -> str:
    """The size word for an object drawn with `radius` (growing / shrinking objects pass through both)."""
    if radius is None:
        return o.size
    return "small" if radius < (RADIUS["small"] + RADIUS["large"]) / 2 else "large"


def triple_index(size: str, colour: str, shape: str) -> int:
    """The offset of a (size, colour, shape) triple's label within TRIPLES."""
    return (SIZES.index(size) * len(COLOURS) + _COLOURS.index(colour)) * len(SHAPES) + SHAPES.index(shape)


def _owner_counts(frame: list[tuple[Obj, float | None, tuple[float, float] | None]]) -> tuple[np.ndarray, np.ndarray]:
    """Per block: which objects of `frame` show (multi-hot labels) and the pixel count of each shape."""
    owner = np.full((SIZE, SIZE), -1, np.int16)
    for i, (o, r, pos) in enumerate(frame):
        mask = np.zeros((SIZE, SIZE, 3), np.uint8)
        draw_object(mask, o, radius=r, cell_pos=pos, colour=(255, 255, 255))
        owner[mask[..., 0] > 127] = i
    blocks = owner.reshape(GRID, BLOCK, GRID, BLOCK).transpose(0, 2, 1, 3).reshape(GRID * GRID, -1)
    labels = np.zeros((GRID * GRID, N_LABELS), np.uint8)
    shape_px = np.zeros((GRID * GRID, len(SHAPES)), np.int32)
    for i, (o, r, _) in enumerate(frame):
        n = (blocks == i).sum(1)
        on = n >= MIN_PIXELS
        labels[on, _COLOURS.index(o.colour)] = 1
        labels[on, len(COLOURS) + SHAPES.index(o.shape)] = 1
        labels[on, SIZE_LABELS.start + SIZES.index(drawn_size(o, r))] = 1
        labels[on, TRIPLES.start + triple_index(drawn_size(o, r), o.colour, o.shape)] = 1
        shape_px[:, SHAPES.index(o.shape)] += n
    return labels, shape_px


def token_targets(frames: list[list[tuple[Obj, float | None, tuple[float, float] | None]]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Targets for one group of frames that share visual tokens (an image: one frame; a video's
    temporal patch group: two). -> (labels uint8 (GRID^2, N_LABELS): the union over the frames of each
    frame's multi-hot labels; dom int8 (GRID^2,): index of the shape with the most pixels in the block, mean over
    the frames, if at least DOM_PIXELS, else -1)."""
    labels = np.zeros((GRID * GRID, N_LABELS), np.uint8)
    px = np.zeros((GRID * GRID, len(SHAPES)), np.float64)
    for fr in frames:
        lab, n = _owner_counts(fr)
        labels |= lab
        px += n / len(frames)
    labels[:, -1] = ~labels[:, :-1].any(1)
    dom = np.where(px.max(1) >= DOM_PIXELS, px.argmax(1), -1).astype(np.int8)
    return labels, dom


def image_targets(scene: Scene) -> tuple[np.ndarray, np.ndarray]:
    return token_targets([[(o, None, None) for o in scene.objects]])


def clip_targets(clip: Clip) -> tuple[np.ndarray, np.ndarray]:
    """(labels (2 GRID^2, N_LABELS), dom (2 GRID^2,)) for the video tokens of a clip: the MODEL_FRAMES frames
    the models see (clip_metadata's indices), two per temporal group, group-major like the tower."""
    idx = clip_metadata()["frames_indices"]
    out = [token_targets([clip_frame_objects(clip, f) for f in idx[g:g + 2]]) for g in range(0, MODEL_FRAMES, 2)]
    return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])


def whiten_patch_embed(model, pixels: torch.Tensor, eps: float = 1e-3, seed: int = 0) -> None:
    """Data-dependent init of the vision tower's patch embedding (a Conv3d = a linear map of each
    flattened 3 x 2 x 14 x 14 patch): a random projection of the ZCA-whitened single-frame patch
    (eigenvalues floored at eps * the largest), split equally over the two temporal slices (so a
    video patch starts as its two frames' mean), scaled to unit output std on `pixels`: IMAGE patch
    rows as the tower gets them (both temporal slices equal). Video statistics are left out on
    purpose: whitening the slices' difference would blow up MP4 noise."""
    w = model.model.visual.patch_embed.proj.weight            # (hidden, 3, 2, 14, 14)
    c, t, ph, pw = w.shape[1:]
    x = pixels.double().view(-1, c, t, ph, pw)[:, :, 0].reshape(len(pixels), -1)   # one frame: (N, 588)
    x = x - x.mean(0)
    lam, u = torch.linalg.eigh(x.T @ x / (len(x) - 1))
    lam = lam.clamp(min=0)
    zca = u @ torch.diag((lam + eps * lam.max()).rsqrt()) @ u.T
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(w.shape[0], x.shape[1], generator=g, dtype=torch.float64) @ zca
    proj /= (x @ proj.T).std()
    full = (proj.view(-1, c, 1, ph, pw) / t).expand(-1, c, t, ph, pw)
    with torch.no_grad():
        w.copy_(full.to(w.dtype))


class TowerHead(torch.nn.Module):
    """A training-only linear head (`n_out` outputs) on the merged visual tokens of `model`'s vision tower: a
    forward hook collects the tower's image calls (grid t == 1) in `_feats` and its video calls in `_vfeats`,
    until `clear()`."""

    def __init__(self, model, n_out: int):
        super().__init__()
        hidden = model.config.text_config.hidden_size
        self.head = torch.nn.Linear(hidden, n_out)
        self._feats: list[torch.Tensor] = []
        self._vfeats: list[torch.Tensor] = []
        self._hook = model.model.visual.register_forward_hook(self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs, output):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if grid is None:
            return
        if bool((grid[:, 0] == 1).all()):
            self._feats.append(output.pooler_output)
        else:
            self._vfeats.append(output.pooler_output)

    def loss(self, image, video) -> torch.Tensor:
        """The loss of the forwards since the last clear(): `_one(features, targets)` of the images (`image`: their
        targets in the batch's image order) plus that of the clips (`video`); a term is left out when its targets
        are missing (`_present`) or the tower saw no such input. Clears."""
        feats = torch.cat(self._feats) if self._feats else None
        vfeats = torch.cat(self._vfeats) if self._vfeats else None
        self.clear()
        total = torch.zeros(())
        for f, targets in ((feats, image), (vfeats, video)):
            if f is not None and self._present(targets):
                total = total + self._one(f, targets)
        return total

    @staticmethod
    def _present(targets) -> bool:
        return targets is not None

    def _one(self, feats: torch.Tensor, targets) -> torch.Tensor:
        raise NotImplementedError

    def clear(self) -> None:
        self._feats = []
        self._vfeats = []

    def remove(self) -> None:
        self._hook.remove()


class VisionAux(TowerHead):
    """The world's per-token labels (colours, shapes, sizes, triples, empty) from a head on the merged visual
    tokens; `loss(...)` after a forward pass."""

    def __init__(self, model):
        super().__init__(model, N_LABELS)

    def _one(self, feats: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """BCE_WEIGHT x mean BCE of the colour / size / empty labels + cross-entropy of the block's dominant shape
        + TRIPLE_WEIGHT x the shape and triple labels' BCE summed over labels, mean over tokens; targets = (labels,
        dom)."""
        labels, dom = targets
        logits = self.head(feats).view(labels.shape)
        y = labels.float()
        own = torch.zeros(N_LABELS, dtype=torch.bool)
        own[SHAPE], own[TRIPLES] = True, True
        bce = F.binary_cross_entropy_with_logits(logits[..., ~own], y[..., ~own])
        parts = F.binary_cross_entropy_with_logits(logits[..., own], y[..., own], reduction="none").sum(-1).mean()
        dom = dom.long().reshape(-1)
        ce = (F.cross_entropy(logits[..., SHAPE].reshape(-1, len(SHAPES)), dom, ignore_index=-1)
              if bool((dom >= 0).any()) else logits.sum() * 0)
        return BCE_WEIGHT * bce + ce + TRIPLE_WEIGHT * parts

    # loss(image, video) (TowerHead's): image = (labels (n_images, GRID^2, N_LABELS), dom (n_images, GRID^2)),
    # video = the same for the clips (2 GRID^2 tokens each)

    @staticmethod
    def _present(targets) -> bool:
        return targets is not None and targets[0].numel() > 0

    @torch.no_grad()
    def scores(self, labels: torch.Tensor, dom: torch.Tensor) -> tuple[float, float, float, float]:
        """(colour exact, size exact, shape argmax vs dominant, triples exact) of the last image forward; each
        exact-match share is over the cells that hold something."""
        feats = torch.cat(self._feats)
        self.clear()
        lg = self.head(feats).view(labels.shape)
        pred, lab = lg > 0, labels.bool()

        def exact(s: slice) -> float:  # share of the cells holding something in `s` whose labels there are all right
            has = lab[..., s].any(-1)
            return float((pred[has][:, s] == lab[has][:, s]).all(-1).float().mean())

        d = dom.long()
        shape = float((lg[..., SHAPE].argmax(-1)[d >= 0] == d[d >= 0]).float().mean())
        return exact(slice(0, len(COLOURS))), exact(SIZE_LABELS), shape, exact(TRIPLES)


# ---------------------------------------------------------------- where each visual token is, inside the LM

CHANGES = ("same", "appeared", "vanished", "changed")   # a video cell from the first temporal group to the second


def cell_changes(video_labels: torch.Tensor) -> torch.Tensor:
    """(n_videos, 2 GRID^2, N_LABELS) -> (n_videos, GRID^2) index into CHANGES, per cell."""
    n = GRID * GRID
    before, after = video_labels[:, :n].bool(), video_labels[:, n:].bool()
    empty0, empty1 = before[..., -1], after[..., -1]
    out = torch.where((before != after).any(-1), 3, 0)
    out = torch.where(empty0 & ~empty1, 1, out)
    return torch.where(~empty0 & empty1, 2, out)


class PlaceAux(torch.nn.Module):
    """A training-only linear head on the language model's hidden state at the visual tokens after
    decoder layer `layer`: it must tell each token's row and column, and in a clip its temporal group and,
    for a second-group token, whether its cell changed (CHANGES) and what the cell held before (the
    first group's colour / shape / size / empty labels of the same cell).

    Why: neither the vision tower (2D RoPE, no absolute position) nor RoPE in the language model puts
    WHERE a token is into its value vector, so an answer can pick a token by content ("the star")
    but cannot read where it is ("... in the top left"). Asking an early layer to write the place
    into the token's state makes the later layers' attention read it like any other attribute.
    The language model is causal, so a first-group token cannot know its cell changes later; the
    second-group token can, and an answer about a vanished or recoloured object must read the
    object's former look from there (retrieval.py points event sentences at both groups)."""

    def __init__(self, model, layer: int, image_token: int, video_token: int):
        super().__init__()
        hidden = model.config.text_config.hidden_size
        # outputs: row, column, temporal group, change, the cell's former labels
        self.head = torch.nn.Linear(hidden, 2 * GRID + 2 + len(CHANGES) + N_LABELS)
        self.image_token, self.video_token = image_token, video_token
        self.input_ids: torch.Tensor | None = None
        self._h: torch.Tensor | None = None
        self._hook = model.model.language_model.layers[layer].register_forward_hook(self._capture)

    def _capture(self, module, args, output):
        self._h = output[0] if isinstance(output, tuple) else output

    def loss(self, video_labels: torch.Tensor | None) -> torch.Tensor:
        """Cross-entropies of the last forward (set `input_ids` before it)."""
        h, ids = self._h, self.input_ids
        self._h = None
        if h is None or ids is None:
            return torch.zeros(())
        n, total = GRID * GRID, torch.zeros(())
        for tok, per in ((self.image_token, n), (self.video_token, 2 * n)):
            sel = ids == tok
            if not bool(sel.any()):
                continue
            logits = self.head(h[sel]).view(-1, per, self.head.out_features)      # (items, per, out)
            j = torch.arange(per)
            rows, cols, group = (j % n) // GRID, j % GRID, j // n
            m = logits.shape[0]
            total = total + F.cross_entropy(logits[..., :GRID].reshape(-1, GRID), rows.repeat(m))
            total = total + F.cross_entropy(logits[..., GRID:2 * GRID].reshape(-1, GRID), cols.repeat(m))
            if per == 2 * n:
                total = total + F.cross_entropy(logits[..., 2 * GRID:2 * GRID + 2].reshape(-1, 2), group.repeat(m))
                if video_labels is not None:
                    change = cell_changes(video_labels).long()                           # (items, n)
                    c0 = 2 * GRID + 2
                    total = total + 2 * F.cross_entropy(logits[:, n:, c0:c0 + len(CHANGES)].reshape(-1, len(CHANGES)),
                                                        change.reshape(-1))
                    was = video_labels[:, :n].float()                                    # (items, n, N_LABELS)
                    total = total + F.binary_cross_entropy_with_logits(
                        logits[:, n:, c0 + len(CHANGES):], was, reduction="sum") / was[..., 0].numel()
        return total

    def remove(self) -> None:
        self._hook.remove()
