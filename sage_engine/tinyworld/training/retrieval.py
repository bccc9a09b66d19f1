"""Retrieval supervision (training only): at each answer token, chosen attention heads of the
language model should look at the visual tokens of the object(s) the current sentence is about.

Without it the target's heads find objects but not THE object a question asks about, and a wrong answer
is mostly another object's attribute (RUNS.md; tools/attention_probe.py measures it). Nothing in the
language-model loss says which token holds the answer; this loss says it directly, from the scene's
ground truth.

`answer_targets` maps every answer token to a bit mask over the example's visual tokens (bit j =
visual token j: an image's 9 cells, a clip's 9 cells of the first temporal group then 9 of the
second), sentence by sentence:
- a sentence that names objects ("a small red star", "the red star") -> their cells (a clip: the
  first group);
- an event sentence -> the event's cells (the subject's, and a move's destination) in BOTH temporal
  groups. The language model is causal: a first-group token never sees the second group, so only a
  second-group token can know that its cell changed (PlaceAux asks layer 1 to write that, and what the
  cell held before, into it); a target on the first group alone would ask the head to find a vanished
  object by a token that cannot know it vanished;
- a sentence that names none but counts shapes ("There are three shapes.") -> every object's cell;
- a short answer that names nothing ("It is red.") -> the object the question names (by colour and
  shape, by shape alone, or by place);
- a "no" to "Is there a blue circle?" -> the near misses: the objects that share the asked colour or
  the asked shape (a purple circle, a blue star), the ones a shape-only or colour-only match would
  wrongly say "yes" to (none: no target);
- anything else (background, overlap remarks) -> no target.
`RetrievalAux` turns the masks into a loss on the attention weights of (layer, head) pairs: minus
the log of the share of the head's visual attention that lands on the target tokens. Nothing is
saved with the model.
"""
from __future__ import annotations

import re

import torch

from ..language import DESCRIPTION_KINDS, NUMBERS, POSITION_RE, Example, parse_position
from ..world import POSITIONS, SHAPES, Clip, Obj, Scene, has_occluding_pair, shares_a_cell

N_CELLS = len(POSITIONS)
TARGETS_FILE = "retrieval_v3_both.pt"   # the cache's per-token answer targets; renamed whenever the rules above change
_SENTENCE = re.compile(r"[^.]*(?:\.|$)")
_COUNTS = re.compile(r"\b(" + "|".join(NUMBERS[1:]) + r")\b[^.]*\bshapes?\b")
_EVENT = re.compile(r"\b(moves|appears|disappears|vanishes|grows|shrinks|turns|changes colour)\b")


def _bits(cells, group: int = 0) -> int:
    return sum(1 << (group * N_CELLS + c) for c in set(cells))


def _named(text: str, objects) -> list[Obj]:
    t = text.lower()
    return [o for o in objects if f"{o.colour} {o.shape}" in t]


def _event_bits(clip: Clip) -> int:
    cells = [clip.subject.cell] + ([clip.after.cell] if clip.after is not None else [])
    return _bits(cells, 0) | _bits(cells, 1)


def prompt_objects(prompt: str, objects) -> list[Obj]:
    """The object(s) a question is about: named by colour and shape, by shape alone (if unique), or by place."""
    named = _named(prompt, objects)
    if named:
        return named
    t = prompt.lower()
    by_shape = [o for o in objects if re.search(rf"\bthe {o.shape}\b", t)]
    if len(by_shape) == 1:
        return by_shape
    pos = parse_position(t)
    return [o for o in objects if pos is not None and o.position == pos]


def near_misses(prompt: str, objects) -> list[Obj]:
    """The objects that share the colour or the shape a yes/no question asks about."""
    t = prompt.lower()
    return [o for o in objects if re.search(rf"\b{o.colour}\b", t) or re.search(rf"\b{o.shape}\b", t)]


def confusable(ex: Example, objects) -> bool:
    """A question a partial match gets wrong: "Where is the blue square?" with a green square or a blue star
    beside it (another object shares the named object's colour or shape), or "Is there a blue circle?" with
    a near miss that is not the asked object itself or with the asked object in an occluding pair; a
    description of a scene with an occluding pair (two objects in one cell, so one visual token: naming the
    second one means reading past the first). Questions asked by place or by shape alone: False.
    data.build_hard_flags marks the cached examples; TrainConfig.hard_weights draws these more often."""
    if ex.kind in DESCRIPTION_KINDS:
        return has_occluding_pair(objects)
    if ex.kind == "yesno":
        return (len(near_misses(ex.prompt, objects)) > (1 if ex.facts.get("yes") else 0)
                or any(shares_a_cell(o, objects) for o in _named(ex.prompt, objects)))
    named = _named(ex.prompt, objects)
    return bool(named) and any(x is not named[0] and (x.colour == named[0].colour or x.shape == named[0].shape)
                               for x in objects)


def sentence_masks(ex: Example, media: Scene | Clip) -> list[tuple[int, int, int]]:
    """[(start, end, bits)]: character spans of the answer's sentences and their visual-token masks."""
    clip = media if isinstance(media, Clip) else None
    start_objs = list((clip.start if clip else media).objects)
    out = []
    for m in _SENTENCE.finditer(ex.answer):
        s = m.group(0)
        if not s.strip():
            continue
        low, bits = s.lower(), 0
        if clip is not None and _EVENT.search(low) and _named(low, [clip.subject]):
            bits = _event_bits(clip)
        elif clip is not None and ("at the end" in low or "ends with" in low):
            bits = _bits([o.cell for o in clip.end.objects], 1)
        else:
            named = _named(low, start_objs)
            if named:
                bits = _bits([o.cell for o in named])
            elif _COUNTS.search(low) or ex.kind == "count":
                bits = _bits([o.cell for o in start_objs])
            elif ex.kind in ("colour", "shape", "size", "position") or (ex.kind == "yesno" and ex.facts.get("yes")):
                bits = _bits([o.cell for o in prompt_objects(ex.prompt, start_objs)])
            elif ex.kind == "yesno":
                bits = _bits([o.cell for o in near_misses(ex.prompt, start_objs)])
        out.append((m.start(), m.end(), bits))
    return out


PROMPT_TARGETS_FILE = "retrieval_prompt_v2.pt"
PROMPT_KINDS = ("colour", "shape", "size", "position", "yesno", "count", "motion")   # the kinds with question targets
_SHAPE_WORDS = re.compile(r"\b(" + "|".join(SHAPES) + r")\b")


def addressed_at(question: str) -> int:
    """Where a question has said which object it asks about: the end of its last place phrase, colour-and-shape
    name or shape word ("Is the triangle in the bottom right small or large?" -> after "bottom right");
    the question's length when it names none ("How many shapes are there?")."""
    ends = [m.end() for rx in (POSITION_RE, _SHAPE_WORDS) for m in rx.finditer(question.lower())]
    return max(ends, default=len(question))


def prompt_targets(ex: Example, media: Scene | Clip, tok, prompt_text: str, prompt_ids: list[int]) -> list[int]:
    """One visual-token bit mask per prompt token (prompt_text: the whole user turn as cached, pads expanded):
    for a short question (PROMPT_KINDS), every token after the point where the question has said which object
    it asks about gets the first answer sentence's mask, so that the supervised heads find the object while the
    question is read (the token after "right" makes the position of "right" look at the right-hand object; a
    "What happens?" names none, so the tokens after it look at the event's cells); 0 elsewhere and for
    descriptions. TrainConfig.prompt_targets chooses the kinds that use them."""
    out = [0] * len(prompt_ids)
    if ex.kind not in PROMPT_KINDS:
        return out
    spans = sentence_masks(ex, media)
    bits = spans[0][2] if spans else 0
    q = prompt_text.rfind(ex.prompt)
    if not bits or q < 0:
        return out
    enc = tok(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == prompt_ids, "prompt tokens differ from the cache's"
    start = q + addressed_at(ex.prompt)
    return [bits if a >= start else 0 for a, _ in enc["offset_mapping"]]


def answer_targets(ex: Example, media: Scene | Clip, tok, answer_ids: list[int]) -> list[int]:
    """One visual-token bit mask per answer token (answer_ids: the cache's tokens of answer + <|im_end|>)."""
    return span_targets(ex.answer, sentence_masks(ex, media), tok, answer_ids)


def span_targets(answer: str, spans: list[tuple[int, int, int]], tok, answer_ids: list[int]) -> list[int]:
    """One bit mask per answer token: the mask of the character span [s, e) that holds the token's middle, 0 where
    none does and on <|im_end|>."""
    enc = tok(answer + "<|im_end|>", add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == answer_ids, "answer tokens differ from the cache's"
    out = []
    for a, b in enc["offset_mapping"]:
        mid = (a + b) / 2 if b > a else a
        out.append(next((bits for s, e, bits in spans if s <= mid < e), 0) if a < len(answer) else 0)
    return out


def shifted_targets(targets: torch.Tensor) -> torch.Tensor:
    """(B, L) masks of the tokens -> (B, L) masks of the positions that PREDICT them (p looks for token p + 1)."""
    return torch.cat([targets[:, 1:], torch.zeros_like(targets[:, :1])], 1)


class RetrievalAux:
    """The loss of the last forward run with output_attentions=True (eager attention)."""

    def __init__(self, heads: tuple[tuple[int, int], ...], image_token: int, video_token: int):
        self.heads = heads
        self.image_token, self.video_token = image_token, video_token

    def loss(self, attentions, input_ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
        """-> (mean over heads and supervised positions of -log(target share of the visual attention),
        mean target share)."""
        vis = (input_ids == self.image_token) | (input_ids == self.video_token)             # (B, L)
        vidx = vis.long().cumsum(1) - 1                                                       # j of each visual token
        want = shifted_targets(targets)                                                       # (B, L) bits per query
        rows = want != 0
        if not bool(rows.any()):
            return torch.zeros(()), float("nan")
        bits = want[rows]                                                                     # (N,)
        b_of = rows.nonzero()[:, 0]
        on = ((bits[:, None] >> vidx[b_of].clamp(min=0, max=62)) & 1).bool() & vis[b_of]     # (N, L) target keys
        total, share_sum = torch.zeros(()), 0.0
        for layer, head in self.heads:
            a = attentions[layer][:, head][rows]                                              # (N, L)
            hit = (a * on).sum(-1)
            seen = (a * vis[b_of]).sum(-1).clamp(min=1e-9)
            share = hit / seen
            total = total - torch.log(share + 1e-6).mean()
            share_sum += float(share.detach().mean())
        return total / len(self.heads), share_sum / len(self.heads)
