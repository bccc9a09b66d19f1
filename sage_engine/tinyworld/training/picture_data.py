"""Pictures and clips from outside the shapes world (pictures.py), with their answers (picture_talk.py), added to
a tinyworld training cache (data.py's layout), and the seeded stream that makes them.

A picture or clip has no objects, so its per-token vision labels are empty, its shape target is -1 (none) and its
examples are never confusable. Its answers' retrieval targets (retrieval.py) come from its pixel facts instead of
objects (`picture_spans`): a sentence about a row, a place or a changed cell asks the supervised heads to look
at those cells, so that the language model finds WHICH cell holds a colour or the most light. Clips go through the
same MP4 round trip as the world's clips, and their facts are computed from the frames the models see after it.
"""
from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..language import Example
from ..picture_talk import CELL_RE, CLIP_WEIGHTS, PICTURE_WEIGHTS, ROW_RE, ROW_WORDS, clip_example, picture_example
from ..pictures import sample_clip_frames, sample_picture
from ..pixels import ClipFacts, PictureFacts, clip_facts, picture_facts
from ..world import POSITIONS, read_video, write_mp4
from .data import HARD_FILE, ExampleRows, sample_kind
from .retrieval import N_CELLS, PROMPT_TARGETS_FILE, TARGETS_FILE, span_targets

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


_PART = re.compile(r"(brightest|darkest) part is ([a-z ]+?)(?=[.,])")
_TURNS = re.compile(r"The ([a-z ]+?) turns from [a-z]+ to [a-z]+\.", re.I)
_GETS = re.compile(r"[^.]* gets? (lighter|darker)\.")


def _bits(cells, groups=(0,)) -> int:
    return sum(1 << (g * N_CELLS + c) for c in set(cells) for g in groups)


def picture_spans(ex: Example) -> list[tuple[int, int, int]]:
    """[(start, end, bits)]: character spans of a picture's or clip's answer and the visual tokens (retrieval.py's
    bit layout) each is about, from the example's pixel facts:
    - a row sentence ("In the top row, the left is blue, the middle is ...") -> its opening -> its three cells,
      each "the left is blue" -> its cell (the first group of a clip);
    - "the brightest part is in the top left" -> the place phrase -> the brightest (darkest) cell;
    - the colour at a place ("At the top, it is red.") -> the asked cell;
    - a clip's change: a cell that turns -> that cell, "... get(s) lighter" -> the cells that got lighter (darker),
      in both groups (only a second-group token can see that its cell changed);
    - anything else (light or dark, the main colours, no shapes, motion) -> no target."""
    t = ex.answer
    f: PictureFacts = ex.facts["picture"]
    out: list[tuple[int, int, int]] = []
    for m in ROW_RE.finditer(t.lower()):  # lower case keeps every character where it was
        cells = [3 * ROW_WORDS.index(m.group(1)) + k for k in range(3)]
        out.append((m.start(), m.start(2), _bits(cells)))
        base = m.start(2)
        parts = list(CELL_RE.finditer(m.group(2)))
        edges = [base + w.start() for w in parts] + [m.end()]
        out += [(edges[k], edges[k + 1], _bits([cells[k]])) for k in range(len(parts))]
    for m in _PART.finditer(t):
        out.append((m.start(2), m.end(2) + 1, _bits([f.brightest if m.group(1) == "brightest" else f.darkest])))
    if ex.kind == "pic_colour":
        out.append((0, len(t), _bits([ex.facts["cell"]])))
    c: ClipFacts | None = ex.facts.get("clip")
    if c is not None:
        for m in _TURNS.finditer(t):
            place = m.group(1)
            if place in POSITIONS:
                out.append((m.start(), m.end(), _bits([POSITIONS.index(place)], (0, 1))))
        for m in _GETS.finditer(t):
            cells = c.lighter if m.group(1) == "lighter" else c.darker
            out.append((m.start(), m.end(), _bits(cells, (0, 1))))
    return sorted(out)


def picture_targets(examples: list[Example], rows: dict[str, torch.Tensor], tok) -> torch.Tensor:
    """retrieval.TARGETS_FILE's rows for tokenised picture examples (ExampleRows.tokenized's dict): 0 on the
    prompts, `picture_spans` on the answers."""
    tokens, offsets, plen = rows["tokens"], rows["offsets"], rows["prompt_len"]
    bits = torch.zeros(len(tokens), dtype=torch.long)
    for k, ex in enumerate(examples):
        p, b = int(offsets[k]) + int(plen[k]), int(offsets[k + 1])
        bits[p:b] = torch.tensor(span_targets(ex.answer, picture_spans(ex), tok, tokens[p:b].tolist()))
    return bits


def _append_npy(path: Path, rows: np.ndarray) -> int:
    """Append rows to an .npy file (rewritten whole); -> the number of rows it had."""
    old = np.load(path)
    np.save(path, np.concatenate([old, rows.astype(old.dtype)]))
    return len(old)


def add_pictures(cache: Path, tok, seed: int, n_pictures: int, n_clips: int, log=print) -> None:
    """Append n_pictures pictures (3 questions each) and n_clips clips (2 each) of the training split to the
    cache built by data.build_cache (with its hard flags and retrieval targets)."""
    images, videos, rows, examples = [], [], ExampleRows(), []
    for m, i, pix, exs in picture_stream(seed, n_pictures, n_clips):
        (images if m == "image" else videos).append(pix)
        rows.add(m, i, exs)
        examples += exs
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
    answer_bits = picture_targets(examples, new, tok)
    new["index"] = new["index"] + torch.where(new["media"] == 1, n_vid, n_img)   # after the cache's own
    new["offsets"] = ex["offsets"][-1] + new["offsets"][1:]
    torch.save({k: torch.cat([ex[k], new[k]]) for k in ex}, cache / "examples.pt")
    new_tokens = new["tokens"]
    if (cache / TARGETS_FILE).exists():
        torch.save(torch.cat([torch.load(cache / TARGETS_FILE), answer_bits]),
                   cache / TARGETS_FILE)
    if (cache / PROMPT_TARGETS_FILE).exists():   # no question target: the answers' spans carry the places
        torch.save(torch.cat([torch.load(cache / PROMPT_TARGETS_FILE), torch.zeros(len(new_tokens), dtype=torch.long)]),
                   cache / PROMPT_TARGETS_FILE)
    if (cache / HARD_FILE).exists():
        torch.save(torch.cat([torch.load(cache / HARD_FILE), torch.zeros(len(lens), dtype=torch.bool)]),
                   cache / HARD_FILE)
    (cache / "pictures.txt").write_text(f"seed {seed} pictures {n_pictures} clips {n_clips}\n")
    log(f"  added {len(lens)} picture examples (mean length {lens.float().mean():.1f} tokens)")
