"""Score a model's greedy answers on fresh tinyworld scenes against the ground truth.

For a seed S and N, N images get one question of every image kind and N clips
(written to MP4 and read back the way the engine reads them) one question of
every video kind. Accuracy is reported per kind: colour, shape, size, position,
count, yesno, motion (the attributes), describe and describe_video (every
(size, colour, shape) triple named, none invented).
"""
from __future__ import annotations

import dataclasses
import random
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from .language import (
    DESCRIPTION_KINDS,
    IMAGE_KINDS,
    VIDEO_KINDS,
    Example,
    clip_objects,
    image_example,
    score,
    video_example,
)
from .tokenizer import user_turn
from .world import Obj, has_occluding_pair, read_video, render_clip, render_image, sample_clip, sample_scene, write_mp4


@dataclasses.dataclass
class Item:
    media: str                 # "image" or "video"
    pixels: object             # image array, or list of frames
    meta: dict | None          # video metadata (as read_video returns it)
    example: Example
    objects: list[Obj]         # objects a description must name (clip: the start scene)


def make_items(seed: int, n: int, image_kinds=IMAGE_KINDS, video_kinds=VIDEO_KINDS) -> list[Item]:
    # eval seeds are offset so that `--seed 0` never coincides with a training seed stream
    rng = random.Random(10_000_019 + seed)
    items: list[Item] = []
    for _ in range(n):
        scene = sample_scene(rng)
        img = render_image(scene, noise_seed=rng.randrange(1 << 30))
        items += [Item("image", img, None, image_example(scene, rng, k), list(scene.objects)) for k in image_kinds]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n if video_kinds else 0):
            clip = sample_clip(rng)
            path = Path(tmp) / f"clip_{i}.mp4"
            write_mp4(render_clip(clip, noise_seed=rng.randrange(1 << 30)), path)
            frames, meta = read_video(path)
            items += [Item("video", frames, meta, video_example(clip, rng, k), clip_objects(clip)) for k in video_kinds]
    return items


@torch.no_grad()
def generate(model, processor, items: list[Item], max_new_tokens: int = 160, batch_size: int = 16) -> list[str]:
    """Greedy answers, batched by media type (left padding)."""
    out: dict[int, str] = {}
    for media in ("image", "video"):
        idx = [i for i, it in enumerate(items) if it.media == media]
        # sort by expected answer length so batches stop early together
        idx.sort(key=lambda i: items[i].example.kind in DESCRIPTION_KINDS)
        for k in range(0, len(idx), batch_size):
            chunk = [items[i] for i in idx[k:k + batch_size]]
            texts = [user_turn(media, it.example.prompt) for it in chunk]
            if media == "image":
                enc = processor(text=texts, images=[it.pixels for it in chunk], padding=True, return_tensors="pt")
            else:
                enc = processor(text=texts, videos=[it.pixels for it in chunk], padding=True, return_tensors="pt",
                                videos_kwargs={"do_sample_frames": False, "video_metadata": [it.meta for it in chunk]})
            limit = max_new_tokens if any(it.example.kind in DESCRIPTION_KINDS for it in chunk) else 24
            gen = model.generate(**enc, do_sample=False, max_new_tokens=limit)
            texts_out = processor.tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for i, t in zip(idx[k:k + batch_size], texts_out):
                out[i] = t.strip()
    return [out[i] for i in range(len(items))]


def score_all(items: list[Item], answers: list[str]) -> dict:
    """-> {"accuracy", "by_kind", "occluded": by kind over the images with an occluding pair only, "n_occluded":
    how many such images}: the world draws few such scenes, and they are where the pair fails most."""
    hits: dict[str, list[bool]] = defaultdict(list)
    occluded: dict[str, list[bool]] = defaultdict(list)
    for it, a in zip(items, answers):
        ok = score(it.example, a, it.objects)
        hits[it.example.kind].append(ok)
        if it.media == "image" and has_occluding_pair(it.objects):
            occluded[it.example.kind].append(ok)
    flat = [h for v in hits.values() for h in v]
    return {"accuracy": float(np.mean(flat)), "by_kind": {k: float(np.mean(v)) for k, v in sorted(hits.items())},
            "occluded": {k: float(np.mean(v)) for k, v in sorted(occluded.items())},
            "n_occluded": max(map(len, occluded.values()), default=0)}


def evaluate(model, processor, seed: int, n: int, items: list[Item] | None = None, **kw) -> tuple[dict, list[str]]:
    items = items if items is not None else make_items(seed, n, **kw)
    answers = generate(model.eval(), processor, items)
    return score_all(items, answers), answers
