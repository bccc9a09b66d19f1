"""Prompts and answers about pictures and clips from outside the shapes world, and the scorers that read the
answers back against their pixel facts (pixels.py).

The answers say only what the pair can see at its resolution: that the picture is not a scene of shapes, how
light or dark it is, its main colours, each cell's colour (row by row), where its brightest and darkest parts
are, and for a clip what changes between its first and second half. Kinds:
- pic_describe: the whole description; pic_colour: the colour at a place; pic_light: light or dark;
  pic_main: the main colour; pic_bright: the brightest or darkest part; pic_noshape: a question about shapes;
  pic_other: a question the pair cannot answer (objects, people, what happens), answered with what it can see;
- clip_describe: the description of the first half and what changes; clip_change: what changes.
"""
from __future__ import annotations

import random
import re

from . import language
from .language import Example
from .pixels import PALETTE, ClipFacts, PictureFacts
from .world import POSITIONS, SHAPES

PICTURE_KINDS = ("pic_describe", "pic_colour", "pic_light", "pic_main", "pic_bright", "pic_noshape", "pic_other")
CLIP_KINDS = ("clip_describe", "clip_change")
PICTURE_WEIGHTS = {"pic_describe": 0.3, "pic_colour": 0.15, "pic_light": 0.1, "pic_main": 0.1, "pic_bright": 0.1,
                   "pic_noshape": 0.07, "pic_other": 0.18}
CLIP_WEIGHTS = {"clip_describe": 0.6, "clip_change": 0.4}

NOT_SHAPES = "This is not a picture of shapes."
BRIGHTNESS = {"dark": "It is mostly dark.", "light": "It is mostly light.",
              "medium": "It is neither very light nor very dark."}
ROW_WORDS = ("top", "middle", "bottom")
PICTURE_TEXT_VERSION = 2   # bumped whenever a picture answer's wording changes: names the fine-tune's cache

# the world's prompts (so that a prompt never tells a picture from a scene), and two more for photos
DESCRIBE_PROMPTS = language.DESCRIBE_PROMPTS + ("What is in this picture?", "Describe the photo.")
CLIP_DESCRIBE_PROMPTS = language.DESCRIBE_VIDEO_PROMPTS
CHANGE_PROMPTS = language.MOTION_PROMPTS
OTHER_PROMPTS = (
    "What animal is this?", "What is happening in this photo?", "How many coins are there?", "Who is this?",
    "Is this photo in colour?", "What is this object?", "What is the person doing?", "Where was this taken?",
    "What time of day is it?", "Is there a cat?", "What is written here?", "How many people are there?",
    "What is this?", "Is this a photo or a drawing?", "What season is it?", "Is this food?",
)
NOSHAPE_PROMPTS = ("How many shapes are there?", "How many shapes are in the image?", "Count the shapes.",
                   "What shape is in the centre?", "Is there a red circle?", "Where is the blue square?",
                   "Which shape is on the left?", "Is there a green triangle?")


def cap(s: str) -> str:
    return s[0].upper() + s[1:]


def where(cell: int) -> str:
    """The fixed place phrase of a cell: 'in the top left', 'at the top', 'on the left', 'in the centre'."""
    p = POSITIONS[cell]
    if p == "centre":
        return "in the centre"
    if p in ("top", "bottom"):
        return f"at the {p}"
    if p in ("left", "right"):
        return f"on the {p}"
    return f"in the {p}"


SIDES = ("left", "middle", "right")


def row_sentence(f: PictureFacts, r: int) -> str:
    """A row's colours cell by cell, each after its place: 'In the top row, the left is blue, the middle is blue and
    the right is white.' Every cell gets its own word right after the word that names it, as in the answer to
    the colour at a place, and no colour is said twice back to back (a listing such as 'blue, blue and white'
    would read as a stutter)."""
    row = f.row(r)
    said = [f"the {SIDES[k]} is {row[k]}" for k in range(3)]
    return f"In the {ROW_WORDS[r]} row, {said[0]}, {said[1]} and {said[2]}."


def main_sentence(f: PictureFacts) -> str:
    if len(f.main) == 1:
        return f"The main colour is {f.main[0]}."
    return f"The main colours are {f.main[0]} and {f.main[1]}."


def bright_sentence(f: PictureFacts) -> str:
    return f"The brightest part is {where(f.brightest)}, and the darkest part is {where(f.darkest)}."


def describe_picture(f: PictureFacts) -> str:
    return " ".join([NOT_SHAPES, BRIGHTNESS[f.brightness], main_sentence(f), *(row_sentence(f, r) for r in range(3)),
                     bright_sentence(f)])


def _cells_phrase(cells: tuple[int, ...]) -> str:
    """One or two cells by name ('the top and the top right'), more as a share of the picture."""
    if len(cells) >= 5:
        return "most of the picture"
    if len(cells) >= 3:
        return "much of the picture"
    return " and ".join(f"the {POSITIONS[c]}" for c in cells)


def change_sentences(c: ClipFacts) -> list[str]:
    """What changes from the clip's first half to its second, in a fixed order: motion, lighter, darker, colour."""
    out = []
    if c.motion:
        out.append(f"The picture moves to the {c.motion}.")
    for cells, word in ((c.lighter, "lighter"), (c.darker, "darker")):
        if cells:
            ph = _cells_phrase(cells)
            verb = "get" if len(cells) == 2 else "gets"
            out.append(f"{cap(ph)} {verb} {word}.")
    if c.recoloured and len(c.recoloured) < 5:
        for cell, a, b in c.recoloured[:3]:
            out.append(f"The {POSITIONS[cell]} turns from {a} to {b}.")
    elif c.recoloured:
        out.append("Most of the picture changes colour.")
    return out or ["Nothing much changes."]


def describe_clip_facts(c: ClipFacts) -> str:
    f = c.start
    light = BRIGHTNESS[f.brightness]
    change = " ".join(change_sentences(c))
    return " ".join(["This is a video, not a scene of shapes.", "At the start, " + light[0].lower() + light[1:],
                     main_sentence(f), *(row_sentence(f, r) for r in range(3)),
                     "Then " + change[0].lower() + change[1:]])


def picture_example(f: PictureFacts, rng: random.Random, kind: str) -> Example:
    facts = {"picture": f}
    if kind == "pic_describe":
        return Example(kind, rng.choice(DESCRIBE_PROMPTS), describe_picture(f), facts)
    if kind == "pic_colour":
        cell = rng.randrange(9)
        q = rng.choice((f"What colour is the picture {where(cell)}?", f"What colour is it {where(cell)}?",
                        f"What is the colour {where(cell)}?"))
        return Example(kind, q, f"{cap(where(cell))}, it is {f.cells[cell]}.", facts | {"cell": cell})
    if kind == "pic_light":
        q = rng.choice(("Is the picture light or dark?", "How bright is the image?", "Is this image dark?",
                        "Is the picture bright?"))
        return Example(kind, q, BRIGHTNESS[f.brightness], facts)
    if kind == "pic_main":
        q = rng.choice(("What is the main colour?", "What colours are in this picture?",
                        "Which colour is most common?", "What colour is the image?"))
        return Example(kind, q, main_sentence(f), facts)
    if kind == "pic_bright":
        if rng.random() < 0.5:
            return Example(kind, rng.choice(("Where is the brightest part?", "Which part is the lightest?")),
                           f"The brightest part is {where(f.brightest)}.", facts | {"asked": "brightest"})
        return Example(kind, rng.choice(("Where is the darkest part?", "Which part is the darkest?")),
                       f"The darkest part is {where(f.darkest)}.", facts | {"asked": "darkest"})
    if kind == "pic_noshape":
        return Example(kind, rng.choice(NOSHAPE_PROMPTS), f"There are no shapes. {NOT_SHAPES}", facts)
    if kind == "pic_other":
        return Example(kind, rng.choice(OTHER_PROMPTS),
                       "I cannot tell that at this resolution. " + describe_picture(f), facts)
    raise ValueError(kind)


def clip_example(c: ClipFacts, rng: random.Random, kind: str) -> Example:
    facts = {"clip": c, "picture": c.start}
    if kind == "clip_describe":
        return Example(kind, rng.choice(CLIP_DESCRIBE_PROMPTS), describe_clip_facts(c), facts)
    if kind == "clip_change":
        return Example(kind, rng.choice(CHANGE_PROMPTS), " ".join(change_sentences(c)), facts)
    raise ValueError(kind)


# ---------------------------------------------------------------- scoring

# a row sentence of row_sentence (in lower case: the scorers read answers lowered) and each cell's part of it
ROW_RE = re.compile(r"in the (top|middle|bottom) row, ([a-z ,]+?)\.")
CELL_RE = re.compile(r"the (left|middle|right) is ([a-z]+)")
_PLACE_RE = re.compile(r"(top left|top right|bottom left|bottom right|top|bottom|left|right|centre)")
_SHAPE_RE = re.compile(r"\b(" + "|".join(SHAPES) + r")s?\b")


def _place(text: str) -> int | None:
    m = _PLACE_RE.search(text)
    return POSITIONS.index(m.group(1)) if m else None


def read_rows(text: str) -> dict[int, list[str]]:
    """{row: its three colours left to right} from the row sentences of row_sentence; a row missing a cell or
    naming one twice is left out (all its cells count as wrong)."""
    out = {}
    for word, said in ROW_RE.findall(text.lower()):
        parts = CELL_RE.findall(said)
        cells = dict(parts)
        if len(parts) == len(cells) == 3:
            out[ROW_WORDS.index(word)] = [cells[side] for side in SIDES]
    return out


def score_picture(ex: Example, text: str) -> dict[str, bool]:
    """Per fact, whether the answer states it truly: kind (says it is not shapes, names no shape), brightness,
    main (the first main colour is one of the picture's two largest), region (each cell's colour is one the cell
    shows: one entry per cell, 'region_0'..), bright / dark, and for clips changes and motion."""
    t = text.lower()
    f: PictureFacts = ex.facts["picture"]
    out = {"kind": ("not a picture of shapes" in t or "not a scene of shapes" in t or "no shapes" in t)
           and not _SHAPE_RE.search(t.replace("no shapes", "").replace("of shapes", ""))}
    if ex.kind == "pic_colour":
        said = [w for w in re.findall(r"[a-z]+", t.split(",")[-1]) if w in PALETTE]
        out["colour"] = bool(said) and said[-1] in f.shows[ex.facts["cell"]]
        del out["kind"]
    if ex.kind in ("pic_describe", "pic_other", "pic_light", "clip_describe"):
        out["brightness"] = BRIGHTNESS[f.brightness][3:].lower() in t and all(
            BRIGHTNESS[b][3:].lower() not in t for b in BRIGHTNESS if b != f.brightness)
        if ex.kind == "pic_light":
            del out["kind"]
    if ex.kind in ("pic_describe", "pic_other", "pic_main", "clip_describe"):
        m = re.search(r"main colours? (?:is|are) ([a-z]+)", t)
        top = sorted(f.shares.values(), reverse=True)[:2]
        out["main"] = bool(m) and f.shares.get(m.group(1), 0) >= min(top)
        if ex.kind == "pic_main":
            del out["kind"]
    if ex.kind in ("pic_describe", "pic_other", "clip_describe"):
        rows = read_rows(t)
        for cell in range(9):
            r, k = divmod(cell, 3)
            said = rows.get(r, [])
            out[f"region_{cell}"] = len(said) == 3 and said[k] in f.shows[cell]
    if ex.kind in ("pic_describe", "pic_other", "pic_bright"):
        for word, near in (("brightest", f.near_brightest), ("darkest", f.near_darkest)):
            if ex.kind != "pic_bright" or ex.facts["asked"] == word:
                m = re.search(word + r" part is ([a-z ]+?)[.,]", t)
                cell = _place(m.group(1)) if m else None
                out[word] = cell is not None and near(cell)
        if ex.kind == "pic_bright":
            del out["kind"]
    if ex.kind in ("clip_describe", "clip_change"):
        c: ClipFacts = ex.facts["clip"]
        moves = re.search(r"moves to the (left|right)", t)
        out["motion"] = (moves.group(1) if moves else None) == c.motion
        out["change"] = ("nothing much changes" in t) == (not c.changes)
        if ex.kind == "clip_change":
            del out["kind"]
    return out



# ---------------------------------------------------------------- clean text

_WORD_RE = re.compile(r"[A-Za-z]+")


def _vocabulary() -> frozenset[str]:
    """Every word the pair's answers and prompts are made of (the world's and this module's), lower case."""
    import random as _random

    from .language import IMAGE_KINDS, VIDEO_KINDS, image_example, video_example
    from .pixels import PALETTE as _P
    from .world import sample_clip, sample_scene
    rng = _random.Random(0)
    texts = [" ".join(DESCRIBE_PROMPTS + CLIP_DESCRIBE_PROMPTS + CHANGE_PROMPTS + OTHER_PROMPTS + NOSHAPE_PROMPTS),
             " ".join(_P), " ".join(POSITIONS), NOT_SHAPES, " ".join(BRIGHTNESS.values()),
             "This is a video, not a scene of shapes. At the start, Then The picture moves to the left right "
             "gets get lighter darker turns from to Most of the picture changes colour. Nothing much changes. "
             "I cannot tell that at this resolution. There are no shapes. The brightest darkest part is in at on "
             "the and Which part is the lightest main colours are row middle"]
    for _ in range(300):
        sc, cl = sample_scene(rng), sample_clip(rng)
        texts += [image_example(sc, rng, k).answer for k in IMAGE_KINDS]
        texts += [video_example(cl, rng, k).answer for k in VIDEO_KINDS]
    return frozenset(w.lower() for t in texts for w in _WORD_RE.findall(t))


_VOCAB: frozenset[str] | None = None


def text_defects(text: str) -> list[str]:
    """What makes an answer unclean, as short notes (empty: clean): a word or a phrase of two or three words
    repeated back to back, words glued together or broken (a word the answers never use, a capital inside a
    word), a run of four or more of one character."""
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _vocabulary()
    out = []
    low = text.lower()
    for n in (1, 2, 3):
        m = re.search(r"\b(" + r"\s+".join([r"[a-z]+"] * n) + r")[\s,]+\1\b", low)
        if m:
            out.append(f"repeated: {m.group(0)!r}")
    for w in _WORD_RE.findall(text):
        if re.search(r"[a-z][A-Z]", w):
            out.append(f"glued: {w!r}")
        elif w.lower() not in _VOCAB:
            out.append(f"unknown word: {w!r}")
    m = re.search(r"(.)\1{3,}", text)
    if m:
        out.append(f"character run: {m.group(0)!r}")
    return out
