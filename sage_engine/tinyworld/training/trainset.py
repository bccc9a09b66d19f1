"""Batches from a tinyworld cache directory (data.py writes it): the cached pictures and tokens, their per-token
targets, drawn with kind and confusable-example weights, and shown left-right mirrored on request.

A mirrored example (TrainSet.collate(flips)) is the same scene seen in a mirror: the picture flips, the words
"left" and "right" swap, and every per-visual-token target moves with its token to the mirrored cell.
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch

from ..language import DESCRIPTION_KINDS
from ..picture_talk import CLIP_KINDS, PICTURE_KINDS
from ..world import mirror_cell
from .data import HARD_FILE, IMAGE_TOKENS, KINDS, MODEL_FRAMES, PATCH, SIZE, TEMPORAL, VIDEO_TOKENS, patchify
from .pixel_aux import clip_pixel_targets, pixel_targets
from .retrieval import PROMPT_TARGETS_FILE, TARGETS_FILE

MIRROR_WORDS = ("left", "right")
MIRROR_TOKENS = torch.tensor([g * IMAGE_TOKENS + mirror_cell(c)
                              for g in range(VIDEO_TOKENS // IMAGE_TOKENS) for c in range(IMAGE_TOKENS)])


def mirror_vocab(tok) -> torch.Tensor:
    """(vocab,) token id -> the id that spells the mirrored word (identity except " left" <-> " right").
    Raises if the tokenizer spells either word in any other token: the swap would then miss it."""
    a, b = (tok(" " + w, add_special_tokens=False)["input_ids"] for w in MIRROR_WORDS)
    if len(a) != 1 or len(b) != 1:
        raise ValueError(f"mirroring needs ' left' and ' right' to be single tokens, got {a} {b}")
    others = [t for t, i in tok.get_vocab().items() if i not in (a[0], b[0])
              and any(w in tok.convert_tokens_to_string([t]).lower() for w in MIRROR_WORDS)]
    if others:
        raise ValueError(f"tokens {others} also spell 'left' / 'right': mirroring would not swap them")
    swap = torch.arange(len(tok))
    swap[a[0]], swap[b[0]] = b[0], a[0]
    return swap


def mirror_bits(bits: torch.Tensor) -> torch.Tensor:
    """Visual-token bit masks (retrieval targets, any shape, int64) with each bit moved to its mirrored token."""
    out = torch.zeros_like(bits)
    for j, m in enumerate(MIRROR_TOKENS.tolist()):
        out |= ((bits >> j) & 1) << m
    return out


@dataclasses.dataclass
class TrainSet:
    images: np.ndarray
    videos: np.ndarray
    ex: dict
    image_token: int
    video_token: int
    pad: int
    labels: np.ndarray | None = None   # (N_img, IMAGE_TOKENS, N_LABELS) per-token vision targets
    targets: dict | None = None        # vision_targets.npz: image_dom, video_labels, video_dom
    retrieval: torch.Tensor | None = None   # retrieval.TARGETS_FILE: per cached token, a visual-token bit mask
    swap: torch.Tensor | None = None        # mirror_vocab(tok): the left / right swap of a mirrored example
    hard: torch.Tensor | None = None        # HARD_FILE: bool per example (retrieval.confusable)
    pixel_labels: bool = False              # collate adds each item's pixel_aux targets (batch["pixel_targets"])

    @classmethod
    def load(cls, path: Path, tok, prompt_kinds: tuple[str, ...] = (), pixel_labels: bool = False) -> TrainSet:
        """prompt_kinds: for the examples of these kinds the retrieval targets also cover the question
        (retrieval.prompt_targets; needs PROMPT_TARGETS_FILE, build_prompt_targets); pixel_labels: batches carry
        pixel_aux targets."""
        lab, tg = None, None
        if (path / "image_labels.npy").exists() and (path / "vision_targets.npz").exists():
            lab, tg = np.load(path / "image_labels.npy"), dict(np.load(path / "vision_targets.npz"))
        ret_file = path / TARGETS_FILE
        ret = torch.load(ret_file) if ret_file.exists() else None
        if ret is not None and prompt_kinds:
            ex = torch.load(path / "examples.pt")
            lens = ex["offsets"][1:] - ex["offsets"][:-1]
            chosen = torch.isin(ex["kind"], torch.tensor([KINDS.index(k) for k in prompt_kinds]))
            ret = ret | torch.load(path / PROMPT_TARGETS_FILE) * chosen.repeat_interleave(lens)
        try:
            swap = mirror_vocab(tok)
        except ValueError:   # a tokenizer that cannot mirror (tests' small corpora): collate refuses flips
            swap = None
        hard = torch.load(path / HARD_FILE) if (path / HARD_FILE).exists() else None
        return cls(np.load(path / "images.npy", mmap_mode="r"), np.load(path / "videos.npy", mmap_mode="r"),
                   torch.load(path / "examples.pt"), tok.convert_tokens_to_ids("<|image_pad|>"),
                   tok.convert_tokens_to_ids("<|video_pad|>"), tok.pad_token_id, lab, tg, ret, swap, hard,
                   pixel_labels)

    def vision_targets(self, img_ids: list[int], vid_ids: list[int]) -> dict:
        """Aux targets of a batch: {"image": (labels, dom) or None, "video": (labels, dom) or None}."""
        tg = self.targets
        out = {"image": None, "video": None}
        if img_ids and tg is not None:
            out["image"] = (torch.from_numpy(self.labels[img_ids]), torch.from_numpy(tg["image_dom"][img_ids]))
        if vid_ids and tg is not None:
            out["video"] = (torch.from_numpy(tg["video_labels"][vid_ids]), torch.from_numpy(tg["video_dom"][vid_ids]))
        return out

    @staticmethod
    def _mirrored(targets: dict, flips: list[list[bool]]) -> dict:
        """vision_targets with the rows of flipped items permuted to the mirrored tokens;
        flips = [image flags, video flags]."""
        out = dict(targets)
        for key, f in zip(("image", "video"), flips):
            if targets[key] is None or not any(f):
                continue
            f = torch.tensor(f)
            out[key] = tuple(torch.where(f.view(-1, *[1] * (t.dim() - 1)), t[:, MIRROR_TOKENS[:t.shape[1]]], t)
                             for t in targets[key])
        return out

    def image_pixels(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixel values and grid_thw of cached images (each repeated to TEMPORAL frames), as the processor gives."""
        g = SIZE // PATCH
        pix = [patchify(torch.from_numpy(np.array(self.images[j])).unsqueeze(0).expand(TEMPORAL, -1, -1, -1))
               for j in ids]
        return torch.cat(pix), torch.tensor([[1, g, g]] * len(ids))

    def video_pixels(self, ids: list[int]) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Pixel values (None for no ids) and grid_thw of cached clips."""
        g = SIZE // PATCH
        pix = torch.cat([patchify(torch.from_numpy(np.array(self.videos[j]))) for j in ids]) if ids else None
        return pix, torch.tensor([[MODEL_FRAMES // TEMPORAL, g, g]] * len(ids))

    def patch_sample(self, n_images: int, n_videos: int) -> torch.Tensor:
        """Patch rows of the first n_images images and n_videos videos (for whiten_patch_embed)."""
        rows = [self.image_pixels(list(range(min(n_images, len(self.images)))))[0]]
        vpix = self.video_pixels(list(range(min(n_videos, len(self.videos)))))[0]
        return torch.cat(rows + ([vpix] if vpix is not None else []))

    def image_batches(self, batch_size: int, rng: random.Random, video_batch: int = 0):
        """Endless vision pre-training batches: batch_size images (and video_batch videos): pixel
        values, grid (and video pixel values, grid), aux targets."""
        while True:
            ids = rng.sample(range(len(self.images)), batch_size)
            vids = rng.sample(range(len(self.videos)), video_batch) if video_batch and self.targets is not None else []
            yield (*self.image_pixels(ids), *self.video_pixels(vids), self.vision_targets(ids, vids))

    def __len__(self) -> int:
        return len(self.ex["media"])

    def draw_weights(self, kind_weights: dict[str, float] | None = None,
                     hard_weights: dict[str, float] | None = None) -> torch.Tensor | None:
        """Per-example drawing weights (None: uniform). kind_weights: relative weight of the examples of a kind
        (KINDS; missing kinds weigh 1), e.g. {"describe": 0.4}: fewer descriptions per step. hard_weights:
        within a kind, a confusable example (self.hard) is drawn this many times as often as another one of
        its kind, the kind's total weight unchanged (so no other kind loses draws to it)."""
        if not kind_weights and not hard_weights:
            return None
        unknown = (set(kind_weights or {}) | set(hard_weights or {})) - set(KINDS)
        assert not unknown, f"unknown kinds {unknown}"
        kinds = self.ex["kind"].long()
        per_kind = torch.tensor([float((kind_weights or {}).get(k, 1.0)) for k in KINDS], dtype=torch.float64)
        w = per_kind[kinds]
        for k, f in (hard_weights or {}).items():
            if self.hard is None:
                raise ValueError(f"hard_weights need the cache's {HARD_FILE} (data.build_hard_flags)")
            of_kind = kinds == KINDS.index(k)
            hard = of_kind & self.hard
            if not bool(hard.any()):
                continue
            share = float(hard.sum()) / float(of_kind.sum())
            w = torch.where(of_kind, w * torch.where(hard, f, 1.0) / (share * f + 1 - share), w)
        return w

    def batches(self, batch_size: int, rng: random.Random, pool: int = 64, kind_weights: dict[str, float] | None = None,
                mirror: float = 0.0, hard_weights: dict[str, float] | None = None):
        """Endless length-bucketed batches: draw pool * batch_size examples (draw_weights), sort by length,
        cut into batches, shuffle those. mirror: each example is shown left-right mirrored with this
        probability (collate), except descriptions: they name their objects in reading order
        (language.describe_objects), which a mirror would turn into right to left; and answers about other
        pictures (picture_talk), whose rows are read left to right too."""
        lens = (self.ex["offsets"][1:] - self.ex["offsets"][:-1]).tolist()
        kinds = self.ex["kind"].tolist()
        # descriptions read in reading order; picture answers are made from the unmirrored pixels' facts
        unmirrored = {KINDS.index(k) for k in DESCRIPTION_KINDS + PICTURE_KINDS + CLIP_KINDS}
        n = len(self)
        w = self.draw_weights(kind_weights, hard_weights)
        if w is not None:
            gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
        while True:
            if w is None:
                idx = rng.sample(range(n), min(n, pool * batch_size))
            else:
                k = min(int((w > 0).sum()), pool * batch_size)   # weight 0: never drawn
                idx = torch.multinomial(w, k, replacement=False, generator=gen).tolist()
            idx.sort(key=lambda i: lens[i])
            chunks = [idx[k:k + batch_size] for k in range(0, len(idx), batch_size)]
            rng.shuffle(chunks)
            for c in chunks:
                yield self.collate(c, [rng.random() < mirror and kinds[i] not in unmirrored for i in c]
                                   if mirror > 0 else None)

    def collate(self, ids: list[int], flips: list[bool] | None = None) -> dict[str, torch.Tensor]:
        """Right-padded batch with labels on the answer only (-100 elsewhere). flips[b]: example b is the
        mirror image of the cached one (picture flipped left-right, "left" and "right" swapped in the text,
        the per-token targets moved with their tokens): the same facts with the other column, so that a
        question about one column cannot be answered from the other."""
        ex = self.ex
        flips = flips or [False] * len(ids)
        if any(flips) and self.swap is None:
            raise ValueError("this tokenizer cannot mirror examples (mirror_vocab)")
        seqs = [ex["tokens"][ex["offsets"][i]:ex["offsets"][i + 1]].long() for i in ids]
        seqs = [self.swap[s] if f else s for s, f in zip(seqs, flips)]
        L = max(len(s) for s in seqs)
        input_ids = torch.full((len(ids), L), self.pad, dtype=torch.long)
        attn = torch.zeros((len(ids), L), dtype=torch.long)
        labels = torch.full((len(ids), L), -100, dtype=torch.long)
        retrieval = torch.zeros((len(ids), L), dtype=torch.long)
        img_pix, vid_pix, n_img, n_vid, img_ids, vid_ids = [], [], 0, 0, [], []
        img_px, vid_px = [], []   # pixel_aux targets of the pictures as shown (mirrored or not)
        for b, (i, s) in enumerate(zip(ids, seqs)):
            input_ids[b, :len(s)] = s
            attn[b, :len(s)] = 1
            p = int(ex["prompt_len"][i])
            labels[b, p:len(s)] = s[p:]
            if self.retrieval is not None:
                bits = self.retrieval[ex["offsets"][i]:ex["offsets"][i + 1]]
                retrieval[b, :len(s)] = mirror_bits(bits) if flips[b] else bits
            j = int(ex["index"][i])
            if int(ex["media"][i]) == 0:
                img = torch.from_numpy(np.array(self.images[j]))
                img = img.flip(1) if flips[b] else img
                img_pix.append(patchify(img.unsqueeze(0).expand(TEMPORAL, -1, -1, -1)))
                if self.pixel_labels:
                    img_px.append(torch.from_numpy(pixel_targets(img.numpy())))
                n_img += 1
                img_ids.append(j)
            else:
                vid = torch.from_numpy(np.array(self.videos[j]))
                vid = vid.flip(2) if flips[b] else vid
                vid_pix.append(patchify(vid))
                if self.pixel_labels:
                    vid_px.append(torch.from_numpy(clip_pixel_targets(vid.numpy(), TEMPORAL)))
                n_vid += 1
                vid_ids.append(j)
        mm = torch.zeros_like(input_ids)
        mm[input_ids == self.image_token] = 1
        mm[input_ids == self.video_token] = 2
        g = SIZE // PATCH
        batch = {"input_ids": input_ids, "attention_mask": attn, "labels": labels, "mm_token_type_ids": mm}
        if n_img:
            batch["pixel_values"] = torch.cat(img_pix)
            batch["image_grid_thw"] = torch.tensor([[1, g, g]] * n_img)
        if n_vid:
            batch["pixel_values_videos"] = torch.cat(vid_pix)
            batch["video_grid_thw"] = torch.tensor([[MODEL_FRAMES // TEMPORAL, g, g]] * n_vid)
            batch["second_per_grid_ts"] = torch.ones(n_vid)   # TEMPORAL / sampled fps (2 fps): see world.clip_metadata
        if self.labels is not None:   # not a model input: train.py pops it for the auxiliary loss
            batch["vision_targets"] = self._mirrored(self.vision_targets(img_ids, vid_ids), [
                [f for f, i in zip(flips, ids) if int(ex["media"][i]) == m] for m in (0, 1)])
        if self.pixel_labels:   # not a model input: pixel_aux.PixelAux's targets
            batch["pixel_targets"] = {"image": torch.stack(img_px) if img_px else None,
                                      "video": torch.stack(vid_px) if vid_px else None}
        if self.retrieval is not None:   # not a model input either: retrieval.RetrievalAux's targets
            batch["retrieval_targets"] = retrieval
        return batch
