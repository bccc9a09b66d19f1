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


PICTURE_SEED_OFFSET = 20_000_003   # held-out pictures' stream: apart from training's (picture_data.STREAM_OFFSET)


def make_picture_items(seed: int, n: int, real: bool = True) -> list[Item]:
    """n held-out pictures with one question of every picture kind and n held-out clips with one of every clip
    kind (pictures.py's held-out split: generated pictures of another stream and photos training never saw);
    real: also every packaged held-out photo (described) and video (described and asked what changes), whole."""
    from .picture_talk import CLIP_KINDS, PICTURE_KINDS, clip_example, picture_example
    from .pictures import PHOTOS_HELD_OUT, VIDEOS_HELD_OUT, packaged, photos, sample_clip_frames, sample_picture
    from .pixels import canvas, clip_facts, picture_facts
    rng = random.Random(PICTURE_SEED_OFFSET + seed)
    items: list[Item] = []
    for _ in range(n):
        img = sample_picture(rng, "held_out")
        f = picture_facts(img)
        items += [Item("image", img, None, picture_example(f, rng, k), []) for k in PICTURE_KINDS]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clip.mp4"
        for _ in range(n):
            write_mp4(sample_clip_frames(rng, "held_out"), path)
            frames, meta = read_video(path)
            c = clip_facts(frames)
            items += [Item("video", frames, meta, clip_example(c, rng, k), []) for k in CLIP_KINDS]
    if real and len(photos("held_out")) == len(PHOTOS_HELD_OUT):
        for img in photos("held_out"):
            f = picture_facts(img)
            items.append(Item("image", canvas(img), None, picture_example(f, rng, "pic_describe"), []))
        for pkg, name in VIDEOS_HELD_OUT:
            p = packaged(pkg, name)
            if p is None:
                continue
            frames, meta = read_video(p)
            frames = [canvas(fr) for fr in frames]
            c = clip_facts(frames)
            items += [Item("video", frames, meta, clip_example(c, rng, k), []) for k in CLIP_KINDS]
    return items


def score_pictures(items: list[Item], answers: list[str]) -> dict:
    """Per-fact accuracy of answers about pictures and clips (picture_talk.score_picture: 'region' pools the nine
    cells), the share of answers whose every fact is right and the share of clean answers (text_defects)."""
    from .picture_talk import score_picture, text_defects
    facts: dict[str, list[bool]] = defaultdict(list)
    whole: dict[str, list[bool]] = defaultdict(list)
    clean = []
    for it, a in zip(items, answers):
        got = score_picture(it.example, a)
        for k, v in got.items():
            facts["region" if k.startswith("region_") else k].append(v)
        whole[it.example.kind].append(all(got.values()))
        clean.append(not text_defects(a))
    return {"by_fact": {k: float(np.mean(v)) for k, v in sorted(facts.items())},
            "by_kind": {k: float(np.mean(v)) for k, v in sorted(whole.items())},
            "clean": float(np.mean(clean)) if clean else float("nan"), "n": len(items)}


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
def generate(model, processor, items: list[Item], max_new_tokens: int = 200, batch_size: int = 16) -> list[str]:
    """Greedy answers, batched by media type (left padding)."""
    out: dict[int, str] = {}
    for media in ("image", "video"):
        idx = [i for i, it in enumerate(items) if it.media == media]
        # sort by expected answer length so batches stop early together
        idx.sort(key=lambda i: len(items[i].example.answer))
        for k in range(0, len(idx), batch_size):
            chunk = [items[i] for i in idx[k:k + batch_size]]
            texts = [user_turn(media, it.example.prompt) for it in chunk]
            if media == "image":
                enc = processor(text=texts, images=[it.pixels for it in chunk], padding=True, return_tensors="pt")
            else:
                enc = processor(text=texts, videos=[it.pixels for it in chunk], padding=True, return_tensors="pt",
                                videos_kwargs={"do_sample_frames": False, "video_metadata": [it.meta for it in chunk]})
            long = DESCRIPTION_KINDS + ("pic_describe", "pic_other", "clip_describe", "clip_change")
            limit = max_new_tokens if any(it.example.kind in long for it in chunk) else 32
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
