"""The training set, rendered and tokenized once into a cache directory (trainset.TrainSet reads it and
builds batches with tensor ops only).

Layout of a cache directory:
  images.npy   uint8 (N_img, S, S, 3)              rendered scenes
  videos.npy   uint8 (N_vid, MODEL_FRAMES, S, S, 3) frames as the models see them (after an MP4 round trip)
  examples.pt  dict of tensors: tokens (flat), offsets, prompt_len, media (0 image / 1 video), index, kind
  tokenizer/   the tokenizer the tokens were made with
  image_labels.npy uint8 (N_img, IMAGE_TOKENS, vision_aux.N_LABELS): per-visual-token multi-hot labels
  vision_targets.npz  image_dom int8 (N_img, IMAGE_TOKENS), video_labels uint8 (N_vid, VIDEO_TOKENS, N_LABELS),
               video_dom int8 (N_vid, VIDEO_TOKENS): vision_aux.token_targets for images and videos
  retrieval_v3_both.pt  int64 per cached token: retrieval.answer_targets (retrieval.TARGETS_FILE)
  retrieval_prompt_v2.pt  int64 per cached token: retrieval.prompt_targets (retrieval.PROMPT_TARGETS_FILE)
  hard_v2.pt   bool per example: retrieval.confusable (a partial match of the named object answers it wrongly;
               a description or yes/no question that involves an occluding pair)
Every file after tokenizer/ can be rebuilt from the seeded scene stream (scene_stream) without rendering
again, so train.prepare adds to a reused cache whatever it lacks.

`patchify` reproduces the Qwen2-VL image/video processor (rescale, normalise,
2 x 14 x 14 patches in 2 x 2 merge order) so batches never go through the
processor; `check_against_processor` asserts that it matches.
"""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..language import IMAGE_KINDS, VIDEO_KINDS, image_example, video_example
from ..picture_talk import CLIP_KINDS, PICTURE_KINDS
from ..tokenizer import user_turn
from ..world import (
    MODEL_FRAMES,
    OCCLUSION,
    SIZE,
    read_video,
    render_clip,
    render_image,
    sample_clip,
    sample_scene,
    write_mp4,
)
from .retrieval import PROMPT_TARGETS_FILE, TARGETS_FILE, answer_targets, confusable, prompt_targets
from .vision_aux import N_LABELS, clip_targets, image_targets

MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])
PATCH, TEMPORAL, MERGE = 14, 2, 2
IMAGE_TOKENS = (SIZE // PATCH) ** 2 // MERGE ** 2                       # 9: one per cell
VIDEO_TOKENS = IMAGE_TOKENS * MODEL_FRAMES // TEMPORAL                  # 18

# the world's kinds, then those about any other picture or clip (picture_data.add_pictures); appended, so a cache's
# kind indices stay valid
KINDS = IMAGE_KINDS + tuple(k for k in VIDEO_KINDS if k not in IMAGE_KINDS) + PICTURE_KINDS + CLIP_KINDS
IMAGE_WEIGHTS = {"describe": 0.25, "count": 0.08, "colour": 0.2, "shape": 0.15, "size": 0.1, "position": 0.12,
                 "yesno": 0.1}
VIDEO_WEIGHTS = {"describe_video": 0.45, "motion": 0.4, "count": 0.15}


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


def scene_stream(seed: int, n_images: int, n_videos: int, per_image: int = 3, per_video: int = 2,
                 occlusion: float = OCCLUSION):
    """The seeded stream build_cache draws, without rendering: ("image", i, scene, noise, examples) for
    each image, then ("video", i, clip, noise, examples) for each clip. Replaying it gives every cached
    example its scene (for targets added to a cache after it was built). occlusion: sample_scene's share of
    3- and 4-object scenes with an occluding pair (TrainConfig.occlusion; a replay must pass the cache's)."""
    rng = random.Random(seed)
    for i in range(n_images):
        scene = sample_scene(rng, occlusion=occlusion)
        noise = rng.randrange(1 << 30)
        kinds = sample_kind(rng, IMAGE_WEIGHTS, min(per_image, len(IMAGE_WEIGHTS)))
        yield "image", i, scene, noise, [image_example(scene, rng, k) for k in kinds]
    for i in range(n_videos):
        clip = sample_clip(rng)
        noise = rng.randrange(1 << 30)
        yield "video", i, clip, noise, [video_example(clip, rng, k) for k in sample_kind(rng, VIDEO_WEIGHTS, per_video)]


class ExampleRows:
    """The examples of a cache as its builders collect them (media, index of the picture or clip, prompt, answer,
    kind), and their tokens in examples.pt's layout."""

    def __init__(self):
        self.prompts: list[str] = []
        self.answers: list[str] = []
        self.media: list[int] = []
        self.index: list[int] = []
        self.kinds: list[int] = []

    def add(self, m: str, i: int, examples) -> None:
        """The examples of picture or clip `i` (m: "image" or "video")."""
        for ex in examples:
            self.prompts.append(user_turn(m, ex.prompt))
            self.answers.append(ex.answer)
            self.media.append(int(m == "video"))
            self.index.append(i)
            self.kinds.append(KINDS.index(ex.kind))

    def tokenized(self, tok) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(examples.pt's dict for these examples alone, each example's length in tokens)."""
        p_ids = tok([expand_pads(p) for p in self.prompts], add_special_tokens=False)["input_ids"]
        a_ids = tok([a + "<|im_end|>" for a in self.answers], add_special_tokens=False)["input_ids"]
        seqs = [p + a for p, a in zip(p_ids, a_ids)]
        lens = torch.tensor([len(s) for s in seqs])
        return {
            "tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
            "prompt_len": torch.tensor([len(p) for p in p_ids]),
            "media": torch.tensor(self.media), "index": torch.tensor(self.index), "kind": torch.tensor(self.kinds),
        }, lens


def build_cache(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3, per_video: int = 2,
                log=print, occlusion: float = OCCLUSION) -> None:
    out.mkdir(parents=True, exist_ok=True)
    images = np.lib.format.open_memmap(out / "images.npy", "w+", np.uint8, (n_images, SIZE, SIZE, 3))
    videos = np.lib.format.open_memmap(out / "videos.npy", "w+", np.uint8, (n_videos, MODEL_FRAMES, SIZE, SIZE, 3))
    labels = np.zeros((n_images, IMAGE_TOKENS, N_LABELS), np.uint8)
    image_dom = np.zeros((n_images, IMAGE_TOKENS), np.int8)
    video_labels = np.zeros((n_videos, VIDEO_TOKENS, N_LABELS), np.uint8)
    video_dom = np.zeros((n_videos, VIDEO_TOKENS), np.int8)
    rows = ExampleRows()
    with tempfile.TemporaryDirectory() as tmp:
        for m, i, sc, noise, exs in scene_stream(seed, n_images, n_videos, per_image, per_video, occlusion):
            if m == "image":
                images[i] = render_image(sc, noise_seed=noise)
                labels[i], image_dom[i] = image_targets(sc)
            else:
                path = Path(tmp) / "clip.mp4"
                write_mp4(render_clip(sc, noise_seed=noise), path)
                videos[i] = np.stack(read_video(path)[0])
                video_labels[i], video_dom[i] = clip_targets(sc)
            rows.add(m, i, exs)
            if (i + 1) % (5000 if m == "image" else 2000) == 0:
                log(f"  rendered {i + 1}/{n_images if m == 'image' else n_videos} {m}s")
    images.flush()
    videos.flush()
    np.save(out / "image_labels.npy", labels)
    np.savez(out / "vision_targets.npz", image_dom=image_dom, video_labels=video_labels, video_dom=video_dom)
    examples, lens = rows.tokenized(tok)
    torch.save(examples, out / "examples.pt")
    log(f"  cache: {len(lens)} examples, mean length {lens.float().mean():.1f} tokens, max {lens.max()}")
    build_retrieval_targets(out, tok, seed, n_images, n_videos, per_image, per_video, occlusion)


def _replay_token_targets(out: Path, seed: int, n_images: int, n_videos: int, per_image: int, per_video: int,
                          targets, occlusion: float = OCCLUSION) -> torch.Tensor:
    """int64 per cached token: targets(media, scene, example, prompt_ids, answer_ids) -> one bit mask per token of
    the example, replayed from the scene stream."""
    ex = torch.load(out / "examples.pt")
    tokens, offsets, plen = ex["tokens"], ex["offsets"], ex["prompt_len"]
    bits = torch.zeros(len(tokens), dtype=torch.long)
    k = 0
    for m, _, sc, _, exs in scene_stream(seed, n_images, n_videos, per_image, per_video, occlusion):
        for e in exs:
            a, p, b = int(offsets[k]), int(offsets[k]) + int(plen[k]), int(offsets[k + 1])
            bits[a:b] = torch.tensor(targets(m, sc, e, tokens[a:p].tolist(), tokens[p:b].tolist()), dtype=torch.long)
            k += 1
    assert k == len(plen), (k, len(plen))
    return bits


def build_retrieval_targets(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3,
                            per_video: int = 2, occlusion: float = OCCLUSION) -> None:
    """retrieval.TARGETS_FILE: int64 per cached token, the visual-token bit mask retrieval.answer_targets
    gives (0 on prompt tokens and on answer tokens without a target)."""
    bits = _replay_token_targets(out, seed, n_images, n_videos, per_image, per_video, lambda m, sc, e, p_ids, a_ids:
                                 [0] * len(p_ids) + answer_targets(e, sc, tok, a_ids), occlusion)
    torch.save(bits, out / TARGETS_FILE)


def build_prompt_targets(out: Path, tok, seed: int, n_images: int, n_videos: int, per_image: int = 3,
                         per_video: int = 2, occlusion: float = OCCLUSION) -> None:
    """retrieval.PROMPT_TARGETS_FILE: int64 per cached token, retrieval.prompt_targets on the prompt tokens
    (0 on answer tokens)."""
    bits = _replay_token_targets(out, seed, n_images, n_videos, per_image, per_video, lambda m, sc, e, p_ids, a_ids:
                                 prompt_targets(e, sc, tok, expand_pads(user_turn(m, e.prompt)), p_ids)
                                 + [0] * len(a_ids), occlusion)
    torch.save(bits, out / PROMPT_TARGETS_FILE)


HARD_FILE = "hard_v2.pt"


def build_hard_flags(out: Path, seed: int, n_images: int, n_videos: int, per_image: int = 3,
                     per_video: int = 2, occlusion: float = OCCLUSION) -> None:
    """HARD_FILE: for each cached example, whether it is retrieval.confusable in its scene (replayed from the
    scene stream, like build_retrieval_targets)."""
    stream = scene_stream(seed, n_images, n_videos, per_image, per_video, occlusion)
    flags = [confusable(e, (sc.start if m == "video" else sc).objects) for m, _, sc, _, exs in stream for e in exs]
    n = len(torch.load(out / "examples.pt")["kind"])
    assert len(flags) == n, (len(flags), n)
    torch.save(torch.tensor(flags), out / HARD_FILE)


def replay_image_labels(out: Path, seed: int, n_images: int, n_videos: int | None = None, per_image: int = 3,
                        per_video: int = 2, check: int = 16, occlusion: float = OCCLUSION) -> None:
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
    for m, i, sc, noise, _ in scene_stream(seed, n_images, n_videos, per_image, per_video, occlusion):
        n = n_images if m == "image" else n_videos
        checked = i % max(1, n // check) == 0 or i == n - 1
        if m == "image":
            same = not checked or np.array_equal(render_image(sc, noise_seed=noise), images[i])
            assert same, f"cache {out} is not seed {seed}"
            labels[i], image_dom[i] = image_targets(sc)
        else:
            if checked:   # MP4 round trip: close, not equal
                frames = np.stack(render_clip(sc, noise_seed=noise))[[0, 2, 4, 6]].astype(np.int16)
                assert np.abs(frames - videos[i]).mean() < 8, f"cache {out} is not seed {seed} (video {i})"
            video_labels[i], video_dom[i] = clip_targets(sc)
    np.save(out / "image_labels.npy", labels)
    np.savez(out / "vision_targets.npz", image_dom=image_dom, video_labels=video_labels, video_dom=video_dom)


def check_against_processor(processor, seed: int = 0) -> None:
    """Assert that patchify and the pad expansion reproduce the processor exactly."""
    from ..world import clip_metadata
    rng = random.Random(seed)
    img = render_image(sample_scene(rng))
    text = user_turn("image", "Describe.")
    ref = processor(text=[text], images=[img], return_tensors="pt")
    ours = patchify(torch.from_numpy(img).unsqueeze(0).expand(2, -1, -1, -1))
    assert torch.allclose(ref["pixel_values"], ours, atol=1e-5)
    ids = processor.tokenizer(expand_pads(text), add_special_tokens=False)["input_ids"]
    assert ref["input_ids"][0].tolist() == ids
    frames = render_clip(sample_clip(rng))[:MODEL_FRAMES]
    ref = processor(text=[user_turn("video", "What happens?")], videos=[frames],
                    videos_kwargs={"do_sample_frames": False, "video_metadata": [clip_metadata()]}, return_tensors="pt")
    assert torch.allclose(ref["pixel_values_videos"], patchify(torch.from_numpy(np.stack(frames))), atol=1e-5)
    assert float(ref["second_per_grid_ts"][0]) == 1.0
    assert ref["input_ids"].shape[1] == len(processor.tokenizer(expand_pads(user_turn("video", "What happens?")),
                                                                 add_special_tokens=False)["input_ids"])
