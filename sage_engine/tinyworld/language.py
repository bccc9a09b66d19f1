"""Prompts and answers about tinyworld scenes, and the scorers that read answers back.

Each `Example` is one (prompt, answer) pair of a given kind. Answers mix fixed
stretches (templates, connectives) with real choice points: several correct
phrasings and object orders, drawn at random per sample, so a model's entropy
rises and falls within one answer.

Kinds: describe, count, colour, shape, size, position, yesno (images);
describe_video, motion, count (videos). Scorers check the attribute an answer is
about (`score`), so eval reports per-attribute accuracy.
"""
from __future__ import annotations

import dataclasses
import random
import re

from .world import COLOURS, POSITIONS, SHAPES, Clip, Obj, Scene

NUMBERS = ("zero", "one", "two", "three", "four", "five")

DESCRIBE_PROMPTS = (
    "Describe the image in detail.", "Describe this image.", "What is in this image?",
    "Give a detailed description of the picture.", "What do you see?", "Tell me about this picture.",
    "Describe everything you can see.", "Caption this image in detail.", "Explain what the image shows.",
    "Can you describe the scene?", "Write a description of this image.", "What does this picture show?",
)
DESCRIBE_VIDEO_PROMPTS = (
    "Describe the video in detail.", "Describe this video.", "What is in this video?",
    "Give a detailed description of the clip.", "What do you see in the video?", "Tell me about this video.",
    "Describe everything that happens.", "Caption this video in detail.", "Explain what the video shows.",
)
MOTION_PROMPTS = ("What happens in the video?", "What changes in this video?", "What happens?",
                  "Describe the change in the video.")


@dataclasses.dataclass(frozen=True)
class Example:
    kind: str
    prompt: str
    answer: str
    facts: dict   # what the scorer needs: the asked-about attribute's true value


TEXT_VERSION = 2  # bumped whenever the answers' wording or order changes: names the training cache (commands.py)
DESCRIPTION_KINDS = ("describe", "describe_video")  # the long answers: every object named, in reading order


def cap(s: str) -> str:
    return s[0].upper() + s[1:]


def where(cell_or_pos: int | str, rng: random.Random) -> str:
    """A position phrase: 'in the top left', 'at the top', 'on the left', 'in the centre'."""
    p = POSITIONS[cell_or_pos] if isinstance(cell_or_pos, int) else cell_or_pos
    if p == "centre":
        return "in the centre" if rng.random() < 0.7 else "in the middle"
    if p in ("top", "bottom"):
        return rng.choice((f"at the {p}", f"at the {p}"))
    if p in ("left", "right"):
        return rng.choice((f"on the {p}", f"on the {p} side"))
    return rng.choice((f"in the {p}", f"in the {p} corner"))


def a_obj(o: Obj) -> str:
    return f"a {o.size} {o.colour} {o.shape}"


def plural(n: int) -> str:
    return "shape" if n == 1 else "shapes"


# ---------------------------------------------------------------- descriptions

def _object_sentence(o: Obj, rng: random.Random, first: bool) -> str:
    """The object's place first, then the object: the place is what the reader (and the model) scans by."""
    w = cap(where(o.cell, rng))
    forms = [f"{w}, there is {a_obj(o)}.", f"{w} we see {a_obj(o)}.", f"{w} is {a_obj(o)}."]
    if not first:
        forms += [f"{w}, there is also {a_obj(o)}."]
    return rng.choice(forms)


def _pair_sentence(back: Obj, front: Obj, rng: random.Random) -> str:
    w = cap(where(back.cell, rng))
    return rng.choice((
        f"{w}, {a_obj(front)} is in front of {a_obj(back)}.",
        f"{w}, {a_obj(back)} is partly hidden behind {a_obj(front)}.",
    ))


def describe_objects(scene: Scene, rng: random.Random) -> list[str]:
    """One sentence per object (or per occluding pair), in reading order of their cells: top row first, left to
    right. A fixed order makes the next object a matter of looking at the next occupied cell; in a random order
    a description has to remember which objects it has already named, and the models named some twice and
    left others out (RUNS.md)."""
    units: list[tuple[Obj, ...]] = []
    for i, o in enumerate(scene.objects):
        if scene.occluded and i == scene.occluded[1]:
            continue
        if scene.occluded and i == scene.occluded[0]:
            units.append((o, scene.objects[scene.occluded[1]]))
        else:
            units.append((o,))
    units.sort(key=lambda u: u[0].cell)
    return [_object_sentence(u[0], rng, k == 0) if len(u) == 1 else _pair_sentence(u[0], u[1], rng)
            for k, u in enumerate(units)]


def describe_scene(scene: Scene, rng: random.Random) -> str:
    n, bg = len(scene.objects), scene.background
    opening = rng.choice((
        f"The image shows {NUMBERS[n]} {plural(n)} on a {bg} background.",
        f"This picture has {NUMBERS[n]} {plural(n)} on a {bg} background.",
        f"There {'is' if n == 1 else 'are'} {NUMBERS[n]} {plural(n)} on a {bg} background.",
        f"On a {bg} background, there {'is' if n == 1 else 'are'} {NUMBERS[n]} {plural(n)}.",
    ))
    body = describe_objects(scene, rng)
    sizes = [o.size for o in scene.objects]
    closing = []
    if scene.occluded:
        closing.append(rng.choice(("One shape partly hides another.", "Two of the shapes overlap.")))
    elif n > 1:
        closing.append(rng.choice(("The shapes do not overlap.", "None of the shapes overlap.",
                                   "Each shape has its own place.")))
    if n > 1 and rng.random() < 0.6:
        s, big = sizes.count("small"), sizes.count("large")
        if s and big:
            closing.append(f"In total, {NUMBERS[s]} {plural(s)} {'is' if s == 1 else 'are'} small and "
                           f"{NUMBERS[big]} {'is' if big == 1 else 'are'} large.")
        else:
            closing.append(f"All of the shapes are {sizes[0]}.")
    return " ".join([opening, *body, *closing])


def _to(phrase: str) -> str:
    """A position phrase as a destination: 'in the top left' -> 'to the top left'."""
    return phrase.replace('in the', 'to the').replace('at the', 'to the').replace('on the', 'to the')


def event_sentence(clip: Clip, rng: random.Random) -> str:
    s, a = clip.subject, clip.after
    the = f"the {s.colour} {s.shape}"
    if clip.event == "move":
        return rng.choice((f"{cap(the)} moves from {where(s.cell, rng)[3:]} to {where(a.cell, rng)[3:]}.",
                           f"{cap(the)} moves {_to(where(a.cell, rng))}."))
    if clip.event == "appear":
        return rng.choice((f"{cap(a_obj(s))} appears {where(s.cell, rng)}.",
                           f"{cap(where(s.cell, rng))}, {a_obj(s)} appears."))
    if clip.event == "disappear":
        return rng.choice((f"{cap(the)} disappears.", f"{cap(the)} {where(s.cell, rng)} disappears.",
                           f"{cap(the)} vanishes."))
    if clip.event == "grow":
        return rng.choice((f"{cap(the)} grows larger.", f"{cap(the)} grows from small to large."))
    if clip.event == "shrink":
        return rng.choice((f"{cap(the)} shrinks.", f"{cap(the)} shrinks from large to small."))
    return rng.choice((f"{cap(the)} turns {a.colour}.", f"{cap(the)} changes colour from {s.colour} to {a.colour}."))


def clip_objects(clip: Clip) -> list[Obj]:
    """The objects a clip description names with size, colour and shape (start scene + any newcomer)."""
    return list(clip.start.objects) + ([clip.subject] if clip.event == "appear" else [])


def describe_clip(clip: Clip, rng: random.Random) -> str:
    sc = clip.start
    n = len(sc.objects)
    opening = rng.choice((
        f"The video shows {NUMBERS[n]} {plural(n)} on a {sc.background} background.",
        f"At the start of the video, there {'is' if n == 1 else 'are'} {NUMBERS[n]} {plural(n)} "
        f"on a {sc.background} background.",
        f"This clip begins with {NUMBERS[n]} {plural(n)} on a {sc.background} background.",
    ))
    body = describe_objects(sc, rng)
    change = rng.choice(("Then", "After a moment,", "Halfway through,", "Next,"))
    ev = event_sentence(clip, rng)
    ev = ev[0].lower() + ev[1:]
    m = len(clip.end.objects)
    closing = rng.choice((f"At the end, there {'is' if m == 1 else 'are'} {NUMBERS[m]} {plural(m)}.",
                          f"The video ends with {NUMBERS[m]} {plural(m)}."))
    return " ".join([opening, *body, f"{change} {ev}", closing])


# ---------------------------------------------------------------- questions

def _single(scene: Scene) -> list[Obj]:
    """Objects alone in their cell (so 'the shape in the <cell>' is unambiguous)."""
    cells = [o.cell for o in scene.objects]
    return [o for o in scene.objects if cells.count(o.cell) == 1]


def image_example(scene: Scene, rng: random.Random, kind: str) -> Example:
    n = len(scene.objects)
    if kind == "describe":
        return Example(kind, rng.choice(DESCRIBE_PROMPTS), describe_scene(scene, rng), {})
    if kind == "count":
        q = rng.choice(("How many shapes are there?", "How many shapes are in the image?", "Count the shapes."))
        a = rng.choice((f"There {'is' if n == 1 else 'are'} {NUMBERS[n]} {plural(n)}.",
                        f"I can see {NUMBERS[n]} {plural(n)}.", f"{cap(NUMBERS[n])}."))
        return Example(kind, q, a, {"count": n})
    if kind == "yesno":
        if rng.random() < 0.5:
            o = rng.choice(scene.objects)
            q = f"Is there a {o.colour} {o.shape}?"
            a = rng.choice((f"Yes, there is {a_obj(o)} {where(o.cell, rng)}.", "Yes."))
            return Example(kind, q, a, {"yes": True})
        present = {(o.colour, o.shape) for o in scene.objects}
        while True:
            c, s = rng.choice(list(COLOURS)), rng.choice(SHAPES)
            if (c, s) not in present:
                break
        a = rng.choice((f"No, there is no {c} {s}.", "No."))
        return Example(kind, f"Is there a {c} {s}?", a, {"yes": False})
    o = rng.choice(_single(scene) if kind != "position" else scene.objects)
    w = where(o.cell, rng)
    if kind == "colour":
        q = rng.choice((f"What colour is the shape {w}?", f"What is the colour of the {o.shape}?"
                        if sum(x.shape == o.shape for x in scene.objects) == 1 else f"What colour is the shape {w}?"))
        a = rng.choice((f"It is {o.colour}.", f"The {o.shape} {w} is {o.colour}.", f"{cap(o.colour)}."))
        return Example(kind, q, a, {"colour": o.colour})
    if kind == "shape":
        q = rng.choice((f"What shape is {w}?", f"Which shape is {w}?"))
        a = rng.choice((f"It is a {o.shape}.", f"There is a {o.colour} {o.shape} {w}.", f"A {o.shape}."))
        return Example(kind, q, a, {"shape": o.shape})
    if kind == "size":
        q = rng.choice((f"Is the {o.shape} {w} small or large?", f"How big is the {o.colour} {o.shape}?"))
        a = rng.choice((f"It is {o.size}.", f"The {o.colour} {o.shape} is {o.size}.", f"{cap(o.size)}."))
        return Example(kind, q, a, {"size": o.size})
    if kind == "position":
        q = rng.choice((f"Where is the {o.colour} {o.shape}?",
                        f"In which part of the image is the {o.colour} {o.shape}?"))
        a = rng.choice((f"It is {w}.", f"The {o.colour} {o.shape} is {w}.", f"{cap(w)}."))
        return Example(kind, q, a, {"position": o.position})
    raise ValueError(kind)


def video_example(clip: Clip, rng: random.Random, kind: str) -> Example:
    if kind == "describe_video":
        return Example(kind, rng.choice(DESCRIBE_VIDEO_PROMPTS), describe_clip(clip, rng), {})
    if kind == "motion":
        return Example(kind, rng.choice(MOTION_PROMPTS), event_sentence(clip, rng), {"clip": clip})
    if kind == "count":
        n = len(clip.start.objects)
        q = rng.choice(("How many shapes are there at the start?",
                        "How many shapes are there at the beginning of the video?"))
        a = rng.choice((f"At the start there {'is' if n == 1 else 'are'} {NUMBERS[n]} {plural(n)}.",
                        f"{cap(NUMBERS[n])}."))
        return Example(kind, q, a, {"count": n})
    raise ValueError(kind)


IMAGE_KINDS = ("describe", "count", "colour", "shape", "size", "position", "yesno")
VIDEO_KINDS = ("describe_video", "motion", "count")


# ---------------------------------------------------------------- scoring

POSITION_RE = re.compile(r"\b(top left|top right|bottom left|bottom right|top|bottom|left|right|centre|middle)\b")
_OBJ_RE = re.compile(r"\b(small|large) (" + "|".join(COLOURS) + r") (" + "|".join(SHAPES) + r")\b")


def _words(text: str, vocab) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w in vocab]


def parse_position(text: str) -> str | None:
    found = POSITION_RE.findall(text.lower())
    if not found:
        return None
    p = found[-1]
    return "centre" if p == "middle" else p


def score_motion(clip: Clip, text: str) -> bool:
    t = text.lower()
    s, a = clip.subject, clip.after
    verbs = {"move": "moves", "appear": "appears", "disappear": ("disappears", "vanishes"), "grow": "grows",
             "shrink": "shrinks", "recolour": ("turns", "changes colour")}
    v = verbs[clip.event]
    if not any(x in t for x in ((v,) if isinstance(v, str) else v)):
        return False
    if clip.event == "disappear" and "appears" in t.replace("disappears", ""):
        return False
    if f"{s.colour} {s.shape}" not in t:
        return False
    if clip.event == "move":
        return parse_position(t) == a.position
    if clip.event == "recolour":
        return _words(t, COLOURS)[-1:] == [a.colour]
    return True


def score_describe(truth_objects: list[Obj], text: str) -> bool:
    """A description is right when it names exactly the true (size, colour, shape) triples."""
    said = sorted(_OBJ_RE.findall(text.lower()))
    return said == sorted((o.size, o.colour, o.shape) for o in truth_objects)


def score(ex: Example, text: str, truth_objects: list[Obj] | None = None) -> bool:
    t = text.lower()
    f = ex.facts
    if ex.kind == "count":
        nums = _words(t, NUMBERS)
        return nums[:1] == [NUMBERS[f["count"]]]
    if ex.kind == "yesno":
        return t.strip().startswith("yes") == f["yes"] and t.strip()[:2] in ("ye", "no")
    if ex.kind == "colour":
        return _words(t, COLOURS)[-1:] == [f["colour"]]
    if ex.kind == "shape":
        return _words(t, SHAPES)[-1:] == [f["shape"]]
    if ex.kind == "size":
        return _words(t, ("small", "large"))[-1:] == [f["size"]]
    if ex.kind == "position":
        return parse_position(t) == f["position"]
    if ex.kind == "motion":
        return score_motion(f["clip"], t)
    if ex.kind in DESCRIPTION_KINDS:
        return score_describe(truth_objects or [], t)
    raise ValueError(ex.kind)
