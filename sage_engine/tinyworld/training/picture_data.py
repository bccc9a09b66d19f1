"""Pictures and clips from outside the shapes world (pictures.py), with their answers (picture_talk.py), added to
a tinyworld training cache (data.py's layout), and the seeded stream that makes them.

A picture or clip has no objects, so its per-token vision labels are empty, its shape target is -1 (none) and it
has no retrieval targets; its examples are never confusable. Clips go through the same MP4 round trip as the
world's clips, and their facts are computed from the frames the models see after it.
"""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..picture_talk import CLIP_WEIGHTS, PICTURE_WEIGHTS, clip_example, picture_example
from ..pictures import sample_clip_frames, sample_picture
from ..pixels import clip_facts, picture_facts
from ..world import read_video, write_mp4
from .data import HARD_FILE, ExampleRows, sample_kind
from .retrieval import PROMPT_TARGETS_FILE, TARGETS_FILE

STREAM_OFFSET = 7_777_777   # picture seeds never coincide with the world's scene stream of the same seed


def picture_stream(seed: int, n_pictures: int, n_clips: int, split: str = "train", per_picture: int = 3,
                   per_clip: int = 2):
    """("image", i, picture (SIZE, SIZE, 3), examples) for each picture, then ("video", i, frames (MODEL_FRAMES,
    SIZE, SIZE, 3) as the models see them, examples) for each clip."""
    rng = random.Random(STREAM_OFFSET + seed)
    for i in range(n_pictures):
        img = sample_picture(rng, split)
        f = picture_facts(img)
        yield "image", i, img, [picture_example(f, rng, k) for k in sample_kind(rng, PICTURE_WEIGHTS, per_picture)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clip.mp4"
        for i in range(n_clips):
            write_mp4(sample_clip_frames(rng, split), path)
            frames = read_video(path)[0]
            c = clip_facts(frames)
            yield "video", i, np.stack(frames), [clip_example(c, rng, k)
                                                 for k in sample_kind(rng, CLIP_WEIGHTS, per_clip)]


def _append_npy(path: Path, rows: np.ndarray) -> int:
    """Append rows to an .npy file (rewritten whole); -> the number of rows it had."""
    old = np.load(path)
    np.save(path, np.concatenate([old, rows.astype(old.dtype)]))
    return len(old)


def add_pictures(cache: Path, tok, seed: int, n_pictures: int, n_clips: int, log=print) -> None:
    """Append n_pictures pictures (3 questions each) and n_clips clips (2 each) of the training split to the
    cache built by data.build_cache (with its hard flags and retrieval targets)."""
    images, videos, rows = [], [], ExampleRows()
    for m, i, pix, exs in picture_stream(seed, n_pictures, n_clips):
        (images if m == "image" else videos).append(pix)
        rows.add(m, i, exs)
        if (i + 1) % 2000 == 0:
            log(f"  made {i + 1}/{n_pictures if m == 'image' else n_clips} picture {m}s")
    n_img = _append_npy(cache / "images.npy", np.stack(images))
    n_vid = _append_npy(cache / "videos.npy", np.stack(videos))
    labels_old = np.load(cache / "image_labels.npy")
    np.save(cache / "image_labels.npy", np.concatenate([labels_old, np.zeros((len(images), *labels_old.shape[1:]),
                                                                               labels_old.dtype)]))
    tg = dict(np.load(cache / "vision_targets.npz"))
    tg["image_dom"] = np.concatenate([tg["image_dom"], np.full((len(images), tg["image_dom"].shape[1]), -1, np.int8)])
    tg["video_labels"] = np.concatenate([tg["video_labels"],
                                         np.zeros((len(videos), *tg["video_labels"].shape[1:]), np.uint8)])
    tg["video_dom"] = np.concatenate([tg["video_dom"], np.full((len(videos), tg["video_dom"].shape[1]), -1, np.int8)])
    np.savez(cache / "vision_targets.npz", **tg)

    ex = torch.load(cache / "examples.pt")
    new, lens = rows.tokenized(tok)
    new["index"] = new["index"] + torch.where(new["media"] == 1, n_vid, n_img)   # after the cache's own
    new["offsets"] = ex["offsets"][-1] + new["offsets"][1:]
    torch.save({k: torch.cat([ex[k], new[k]]) for k in ex}, cache / "examples.pt")
    new_tokens = new["tokens"]
    for name in (TARGETS_FILE, PROMPT_TARGETS_FILE):   # no object to look at
        if (cache / name).exists():
            torch.save(torch.cat([torch.load(cache / name), torch.zeros(len(new_tokens), dtype=torch.long)]),
                       cache / name)
    if (cache / HARD_FILE).exists():
        torch.save(torch.cat([torch.load(cache / HARD_FILE), torch.zeros(len(lens), dtype=torch.bool)]),
                   cache / HARD_FILE)
    (cache / "pictures.txt").write_text(f"seed {seed} pictures {n_pictures} clips {n_clips}\n")
    log(f"  added {len(lens)} picture examples (mean length {lens.float().mean():.1f} tokens)")
