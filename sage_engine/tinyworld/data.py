"""The training set, rendered and tokenized once, and batches built from it with tensor ops only.

Layout of a cache directory:
  images.npy   uint8 (N_img, S, S, 3)              rendered scenes
  videos.npy   uint8 (N_vid, MODEL_FRAMES, S, S, 3) frames as the models see them (after an MP4 round trip)
  examples.pt  dict of tensors: tokens (flat), offsets, prompt_len, media (0 image / 1 video), index, kind
  image_labels.npy uint8 (N_img, IMAGE_TOKENS, vision_aux.N_LABELS) per-visual-token ground truth (training-only
               auxiliary loss); added to an older cache by replaying its seeded scene stream
  hard_v1.pt   bool per example: retrieval.confusable (a partial match of the named object answers it wrongly);
               replayed from the scene stream when missing (build_hard_flags)
  vision_targets.npz  image_dom int8 (N_img, IMAGE_TOKENS), video_labels uint8 (N_vid, VIDEO_TOKENS, N_LABELS),
               video_dom int8 (N_vid, VIDEO_TOKENS): vision_aux.token_targets for images and videos (replayed
               the same way when missing)

`patchify` reproduces the Qwen2-VL image/video processor (rescale, normalise,
2 x 14 x 14 patches in 2 x 2 merge order) so batches never go through the
processor; `check_against_processor` asserts that it matches.
"""
from __future__ import annotations

import dataclasses
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from .language import IMAGE_KINDS, VIDEO_KINDS, image_example, video_example
from .retrieval import PROMPT_TARGETS_FILE, answer_targets, confusable, prompt_targets, targets_file
from .tokenizer import user_turn
from .vision_aux import N_LABELS, clip_targets, image_targets
from .world import (MODEL_FRAMES, SIZE, mirror_cell, read_video, render_clip, render_image, sample_clip, sample_scene,
                    write_mp4)

MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])
PATCH, TEMPORAL, MERGE = 14, 2, 2
IMAGE_TOKENS = (SIZE // PATCH) ** 2 // MERGE ** 2                       # 9: one per cell
VIDEO_TOKENS = IMAGE_TOKENS * MODEL_FRAMES // TEMPORAL                  # 18

KINDS = IMAGE_KINDS + tuple(k for k in VIDEO_KINDS if k not in IMAGE_KINDS)
IMAGE_WEIGHTS = {"describe": 0.25, "count": 0.08, "colour": 0.2, "shape": 0.15, "size": 0.1, "position": 0.12, "yesno": 0.1}
VIDEO_WEIGHTS = {"describe_video": 0.45, "motion": 0.4, "count": 0.15}


# left-right mirroring of a cached example (TrainSet.batches(mirror=p)): the picture flips, the words "left"
# and "right" swap, and every per-visual-token target follows its token to the mirrored cell
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


def expand_pads(text: str) -> str:
    return (text.replace("<|image_pad|>", "<|image_pad|>" * IMAGE_TOKENS)
                .replace("<|video_pad|>", "<|video_pad|>" * VIDEO_TOKENS))


def patchify(frames: torch.Tensor) -> torch.Tensor:
    """frames: uint8 (T, H, W, 3) with T even (an image is repeated to T = 2)
    -> pixel values (T/2 * H/14 * W/14, 3 * 2 * 14 * 14) exactly as Qwen2VL processors give."""
    t, h, w, _ = frames.shape
    x = (frames.float() / 255 - MEAN) / STD                               # (T, H, W, C)
    x = x.permute(0, 3, 1, 2)                                             # (T, C, H, W)
    gt, gh, gw = t // TEMPORAL, h // PATCH, w // PATCH
    x = x.reshape(gt, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, 3 * TEMPORAL * PATCH * PATCH)


def sample_kind(rng: random.Random, weights: dict[str, float], k: int) -> list[str]:
    kinds, w = list(weights), list(weights.values())
    out: list[str] = []
    while len(out) < k:
        c = rng.choices(kinds, w)[0]
        if c not in out:
            out.append(c)
    return out


def scene_stream(seed: int, n_images: int, n_videos: int, per_image: int = 3, per_video: int = 2):
    """The seeded stream build_cache draws, without rendering: ("image", i, scene, noise, examples) for
    each image, then ("video", i, clip, noise, examples) for each clip. Replaying it gives every cached
    example its scene (for targets added to a cache after it was built)."""
    rng = random.Random(seed)
    for i in range(n_images):
        scene = sample_scene(rng)
        noise = rng.randrange(1 << 30)
        kinds = sample_kind(rng, IMAGE_WEIGHTS, min(per_image, len(IMAGE_WEIGHTS)))
        yield "image", i, scene, noise, [image_example(scene, rng, k) for k in kinds]
    for i in range(n_videos):
        clip = sample_clip(rng)
        noise = rng.randrange(1 << 30)
        yield "video", i, clip, noise, [video_example(clip, rng, k) for k in sample_kind(rng, VIDEO_WEIGHTS, per_video)]


def build_cache(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3, per_video: int = 2,
                log=print, event_groups: str = "evidence") -> None:
    out.mkdir(parents=True, exist_ok=True)
    images = np.lib.format.open_memmap(out / "images.npy", "w+", np.uint8, (n_images, SIZE, SIZE, 3))
    videos = np.lib.format.open_memmap(out / "videos.npy", "w+", np.uint8, (n_videos, MODEL_FRAMES, SIZE, SIZE, 3))
    labels = np.zeros((n_images, IMAGE_TOKENS, N_LABELS), np.uint8)
    image_dom = np.zeros((n_images, IMAGE_TOKENS), np.int8)
    video_labels = np.zeros((n_videos, VIDEO_TOKENS, N_LABELS), np.uint8)
    video_dom = np.zeros((n_videos, VIDEO_TOKENS), np.int8)
    prompts, answers, media, index, kinds = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for m, i, sc, noise, exs in scene_stream(seed, n_images, n_videos, per_image, per_video):
            if m == "image":
                images[i] = render_image(sc, noise_seed=noise)
                labels[i], image_dom[i] = image_targets(sc)
            else:
                path = Path(tmp) / "clip.mp4"
                write_mp4(render_clip(sc, noise_seed=noise), path)
                videos[i] = np.stack(read_video(path)[0])
                video_labels[i], video_dom[i] = clip_targets(sc)
            for ex in exs:
                prompts.append(user_turn(m, ex.prompt)); answers.append(ex.answer)
                media.append(int(m == "video")); index.append(i); kinds.append(KINDS.index(ex.kind))
            if (i + 1) % (5000 if m == "image" else 2000) == 0:
                log(f"  rendered {i + 1}/{n_images if m == 'image' else n_videos} {m}s")
    images.flush(); videos.flush()
    np.save(out / "image_labels.npy", labels)
    np.savez(out / "vision_targets.npz", image_dom=image_dom, video_labels=video_labels, video_dom=video_dom)
    p_ids = tok([expand_pads(p) for p in prompts], add_special_tokens=False)["input_ids"]
    a_ids = tok([a + "<|im_end|>" for a in answers], add_special_tokens=False)["input_ids"]
    seqs = [p + a for p, a in zip(p_ids, a_ids)]
    lens = torch.tensor([len(s) for s in seqs])
    torch.save({
        "tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
        "prompt_len": torch.tensor([len(p) for p in p_ids]),
        "media": torch.tensor(media), "index": torch.tensor(index), "kind": torch.tensor(kinds),
    }, out / "examples.pt")
    log(f"  cache: {len(seqs)} examples, mean length {lens.float().mean():.1f} tokens, max {lens.max()}")
    build_retrieval_targets(out, tok, seed, n_images, n_videos, per_image, per_video, event_groups)


def _replay_token_targets(out: Path, seed: int, n_images: int, n_videos: int, per_image: int, per_video: int,
                          targets) -> torch.Tensor:
    """int64 per cached token: targets(media, scene, example, prompt_ids, answer_ids) -> one bit mask per token of
    the example, replayed from the scene stream."""
    ex = torch.load(out / "examples.pt")
    tokens, offsets, plen = ex["tokens"], ex["offsets"], ex["prompt_len"]
    bits = torch.zeros(len(tokens), dtype=torch.long)
    k = 0
    for m, _, sc, _, exs in scene_stream(seed, n_images, n_videos, per_image, per_video):
        for e in exs:
            a, p, b = int(offsets[k]), int(offsets[k]) + int(plen[k]), int(offsets[k + 1])
            bits[a:b] = torch.tensor(targets(m, sc, e, tokens[a:p].tolist(), tokens[p:b].tolist()), dtype=torch.long)
            k += 1
    assert k == len(plen), (k, len(plen))
    return bits


def build_retrieval_targets(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3,
                            per_video: int = 2, event_groups: str = "evidence") -> None:
    """retrieval.targets_file(event_groups): int64 per cached token, the visual-token bit mask
    retrieval.answer_targets gives (0 on prompt tokens and on answer tokens without a target)."""
    bits = _replay_token_targets(out, seed, n_images, n_videos, per_image, per_video, lambda m, sc, e, p_ids, a_ids:
                                 [0] * len(p_ids) + answer_targets(e, sc, tok, a_ids, event_groups))
    torch.save(bits, out / targets_file(event_groups))


def build_prompt_targets(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3,
                         per_video: int = 2, event_groups: str = "evidence") -> None:
    """retrieval.PROMPT_TARGETS_FILE: int64 per cached token, retrieval.prompt_targets on the prompt tokens
    (0 on answer tokens)."""
    bits = _replay_token_targets(out, seed, n_images, n_videos, per_image, per_video, lambda m, sc, e, p_ids, a_ids:
                                 prompt_targets(e, sc, tok, expand_pads(user_turn(m, e.prompt)), p_ids, event_groups)
                                 + [0] * len(a_ids))
    torch.save(bits, out / PROMPT_TARGETS_FILE)


HARD_FILE = "hard_v1.pt"


def build_hard_flags(out: Path, seed: int, n_images: int, n_videos: int, per_image: int = 3, per_video: int = 2) -> None:
    """HARD_FILE: for each cached example, whether it is retrieval.confusable in its scene (replayed from the
    scene stream, like build_retrieval_targets)."""
    flags = [confusable(e, (sc.start if m == "video" else sc).objects)
             for m, _, sc, _, exs in scene_stream(seed, n_images, n_videos, per_image, per_video) for e in exs]
    n = len(torch.load(out / "examples.pt")["kind"])
    assert len(flags) == n, (len(flags), n)
    torch.save(torch.tensor(flags), out / HARD_FILE)


def replay_image_labels(out: Path, seed: int, n_images: int, n_videos: int | None = None, per_image: int = 3,
                        per_video: int = 2, check: int = 16) -> None:
    """Write image_labels.npy and vision_targets.npz for a cache built before they existed: replay
    build_cache's seeded scene and clip stream (same rng calls, no rendering except a few checks
    against images.npy / videos.npy)."""
    images = np.load(out / "images.npy", mmap_mode="r")
    videos = np.load(out / "videos.npy", mmap_mode="r")
    n_videos = len(videos) if n_videos is None else n_videos
    assert len(images) == n_images and len(videos) == n_videos, (len(images), n_images, len(videos), n_videos)
    labels = np.zeros((n_images, IMAGE_TOKENS, N_LABELS), np.uint8)
    image_dom = np.zeros((n_images, IMAGE_TOKENS), np.int8)
    video_labels = np.zeros((n_videos, VIDEO_TOKENS, N_LABELS), np.uint8)
    video_dom = np.zeros((n_videos, VIDEO_TOKENS), np.int8)
    for m, i, sc, noise, _ in scene_stream(seed, n_images, n_videos, per_image, per_video):
        n = n_images if m == "image" else n_videos
        checked = i % max(1, n // check) == 0 or i == n - 1
        if m == "image":
            assert not checked or np.array_equal(render_image(sc, noise_seed=noise), images[i]), f"cache {out} is not seed {seed}"
            labels[i], image_dom[i] = image_targets(sc)
        else:
            if checked:   # MP4 round trip: close, not equal
                frames = np.stack(render_clip(sc, noise_seed=noise))[[0, 2, 4, 6]].astype(np.int16)
                assert np.abs(frames - videos[i]).mean() < 8, f"cache {out} is not seed {seed} (video {i})"
            video_labels[i], video_dom[i] = clip_targets(sc)
    np.save(out / "image_labels.npy", labels)
    np.savez(out / "vision_targets.npz", image_dom=image_dom, video_labels=video_labels, video_dom=video_dom)


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
    retrieval: torch.Tensor | None = None   # retrieval.targets_file(): per cached token, a visual-token bit mask (retrieval.py)
    swap: torch.Tensor | None = None        # mirror_vocab(tok): the left / right swap of a mirrored example
    hard: torch.Tensor | None = None        # HARD_FILE: bool per example (retrieval.confusable)

    @classmethod
    def load(cls, path: Path, tok, event_groups: str = "evidence", prompt_kinds: tuple[str, ...] = ()) -> "TrainSet":
        """prompt_kinds: for the examples of these kinds the retrieval targets also cover the question
        (retrieval.prompt_targets; needs PROMPT_TARGETS_FILE, build_prompt_targets)."""
        lab = np.load(path / "image_labels.npy") if (path / "image_labels.npy").exists() else None
        tg = dict(np.load(path / "vision_targets.npz")) if (path / "vision_targets.npz").exists() else None
        ret_file = path / targets_file(event_groups)
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
                   tok.convert_tokens_to_ids("<|video_pad|>"), tok.pad_token_id, lab, tg, ret, swap, hard)

    def vision_targets(self, img_ids: list[int], vid_ids: list[int]) -> dict:
        """Aux targets of a batch: {"image": (labels, dom) or None, "video": (labels, dom) or None}."""
        tg = self.targets
        out = {"image": None, "video": None}
        if img_ids and self.labels is not None:
            out["image"] = (torch.from_numpy(self.labels[img_ids]),
                            torch.from_numpy(tg["image_dom"][img_ids]) if tg is not None else None)
        if vid_ids and tg is not None:
            out["video"] = (torch.from_numpy(tg["video_labels"][vid_ids]), torch.from_numpy(tg["video_dom"][vid_ids]))
        return out

    @staticmethod
    def _mirrored(targets: dict, flips: list[list[bool]]) -> dict:
        """vision_targets with the rows of flipped items permuted to the mirrored tokens; flips = [image flags, video flags]."""
        out = dict(targets)
        for key, f in zip(("image", "video"), flips):
            if targets[key] is None or not any(f):
                continue
            f = torch.tensor(f)
            out[key] = tuple(None if t is None else torch.where(
                f.view(-1, *[1] * (t.dim() - 1)), t[:, MIRROR_TOKENS[:t.shape[1]]], t) for t in targets[key])
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
        probability (collate)."""
        lens = (self.ex["offsets"][1:] - self.ex["offsets"][:-1]).tolist()
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
                yield self.collate(c, [rng.random() < mirror for _ in c] if mirror > 0 else None)

    def collate(self, ids: list[int], flips: list[bool] | None = None) -> dict[str, torch.Tensor]:
        """Right-padded batch with labels on the answer only (-100 elsewhere). flips[b]: example b is the
        mirror image of the cached one (picture flipped left-right, "left" and "right" swapped in the text,
        the per-token targets moved with their tokens): the same facts with the other column, so that a
        question about one column cannot be answered from the other."""
        ex = self.ex
        flips = flips or [False] * len(ids)
        if any(flips) and self.swap is None:
            raise ValueError("this tokenizer cannot mirror examples (data.mirror_vocab)")
        seqs = [ex["tokens"][ex["offsets"][i]:ex["offsets"][i + 1]].long() for i in ids]
        seqs = [self.swap[s] if f else s for s, f in zip(seqs, flips)]
        L = max(len(s) for s in seqs)
        input_ids = torch.full((len(ids), L), self.pad, dtype=torch.long)
        attn = torch.zeros((len(ids), L), dtype=torch.long)
        labels = torch.full((len(ids), L), -100, dtype=torch.long)
        retrieval = torch.zeros((len(ids), L), dtype=torch.long)
        img_pix, vid_pix, n_img, n_vid, img_ids, vid_ids = [], [], 0, 0, [], []
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
                img_pix.append(patchify(img.unsqueeze(0).expand(TEMPORAL, -1, -1, -1))); n_img += 1
                img_ids.append(j)
            else:
                vid = torch.from_numpy(np.array(self.videos[j]))
                vid_pix.append(patchify(vid.flip(2) if flips[b] else vid)); n_vid += 1
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
        if self.retrieval is not None:   # not a model input either: retrieval.RetrievalAux's targets
            batch["retrieval_targets"] = retrieval
        return batch


def check_against_processor(processor, seed: int = 0) -> None:
    """Assert that patchify and the pad expansion reproduce the processor exactly."""
    from .world import clip_metadata
    rng = random.Random(seed)
    img = render_image(sample_scene(rng))
    text = user_turn("image", "Describe.")
    ref = processor(text=[text], images=[img], return_tensors="pt")
    assert torch.allclose(ref["pixel_values"], patchify(torch.from_numpy(img).unsqueeze(0).expand(2, -1, -1, -1)), atol=1e-5)
    ids = processor.tokenizer(expand_pads(text), add_special_tokens=False)["input_ids"]
    assert ref["input_ids"][0].tolist() == ids
    frames = render_clip(sample_clip(rng))[:MODEL_FRAMES]
    ref = processor(text=[user_turn("video", "What happens?")], videos=[frames],
                    videos_kwargs={"do_sample_frames": False, "video_metadata": [clip_metadata()]}, return_tensors="pt")
    assert torch.allclose(ref["pixel_values_videos"], patchify(torch.from_numpy(np.stack(frames))), atol=1e-5)
    assert float(ref["second_per_grid_ts"][0]) == 1.0
    assert ref["input_ids"].shape[1] == len(processor.tokenizer(expand_pads(user_turn("video", "What happens?")),
                                                                 add_special_tokens=False)["input_ids"])
