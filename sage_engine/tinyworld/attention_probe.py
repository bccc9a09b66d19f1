"""Does the target LOOK at the object a question asks about? An attention probe of a trained model.

For each fresh-scene question of one kind (colour, shape or size of one object), teacher-forced on the
gold answer, at the position that predicts the fact word: each head's share of its visual attention
(over the 9 image tokens) that lands on the asked object's cell, next to the mean share on the cell of
another object of the same scene (scenes with one object left out: there any head that finds an object
finds the right one). A head that retrieves the asked object has a high first number and a low second.
Also printed: how often the fact word is the model's top choice among the words of its kind, and the
wrong choices (is the wrong word the attribute of another object in the scene?).

  python -m sage_engine.tinyworld.attention_probe MODEL_DIR [--kind colour|shape|size] [--seed 3] [--n 40]

Seen on the shipped target (Nov 2026, seed 3, n 40 scenes): the fact word is right 0.70 (colour), 0.62
(shape), 0.65 (size), and a wrong colour is nearly always the colour of ANOTHER object in the scene (11 of
12). No head selects the asked object: per head (layers 0-5, 4 heads) the share on the asked cell is at
most ~2x the share on another object's cell (colour: best 0.50 vs 0.31, layer 1; shape: 0.46 vs 0.23,
layer 2, 0.52 vs 0.22, layer 4), mostly about equal. The heads find objects, not THE object: retrieval,
not the tower's reading of the cells (its auxiliary head reads them almost perfectly), is what fails.
Run S of RUNS.md (interleaved M-RoPE + PlaceAux) looks the same (best colour head 0.55 vs 0.25).

Supervising one head directly does not fix it quickly: the shipped target trained on for 800 steps (lr 3e-4,
colour / shape / size questions drawn 3x) with a training-only loss -log(share of layer 2 head 0's visual
attention on the asked cell) at the answer positions of place-addressed questions (weight 1; the loss fell
from 3.7 to 0.5, single-object scenes included): on this probe that head gives the asked cell 0.46-0.48 vs
0.32-0.36 for another object's (before: 0.31 vs 0.33), fact word top-1 colour 0.72, shape 0.75, size 0.75;
the QA eval is unchanged (target 0.51 on `eval --seed 1 --n 20`, 0.48 on seed 2 n 40; shipped 0.54 / 0.48).

Supervising from the start does (retrieval.py; run R in RUNS.md: interleaved M-RoPE + PlaceAux + the retrieval
loss on layer 2 head 0 and layer 4 head 0 at every answer token, 6,000 steps): colour questions, asked cell vs
another object's cell, layer 2 head 0 0.87 vs 0.10, layer 4 heads 0.72-0.87 vs 0.10-0.19 (unsupervised heads
learned it too); shape 0.96 vs 0.03 (layer 2 head 0), 0.71-0.88 vs 0.06-0.14 on every head of layer 5. Fact word
top-1 colour 0.90, shape 1.00; QA eval 0.845 (seed 1 n 20).
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from .evaluate import Item, make_items
from .training.retrieval import prompt_objects
from .tokenizer import user_turn
from .world import COLOURS, SHAPES, SIZES

WORDS = {"colour": tuple(COLOURS), "shape": tuple(SHAPES), "size": tuple(SIZES)}


@dataclasses.dataclass
class Probe:
    kind: str
    right: list[bool]                              # the fact word was the top choice among its kind's words
    wrong: list[str]                               # "said X for Y (objects ...)" for the misses
    asked: list[torch.Tensor]                      # per multi-object question: (layers, heads) share on the asked cell
    other: list[torch.Tensor]                      # the same: mean share on the other objects' cells

    def table(self) -> str:
        a, o = torch.stack(self.asked).mean(0), torch.stack(self.other).mean(0)
        lines = [f"{self.kind}: {len(self.right)} questions, fact word top-1 {sum(self.right) / len(self.right):.2f}; "
                 f"{len(self.asked)} with other objects in the scene"]
        for layer in range(a.shape[0]):
            lines.append(f"  layer {layer}: asked cell " + " ".join(f"{x:.2f}" for x in a[layer])
                         + " | another object's cell " + " ".join(f"{x:.2f}" for x in o[layer]))
        return "\n".join(lines + [f"  {w}" for w in self.wrong])


def asked_object(item: Item):
    """The object a colour / shape / size question is about (by place, by shape, or by colour and shape)."""
    return prompt_objects(item.example.prompt, item.objects)[0]


@torch.no_grad()
def probe(model, processor, kind: str, seed: int, n: int) -> Probe:
    tok = processor.tokenizer
    image_token = tok.convert_tokens_to_ids("<|image_pad|>")
    out = Probe(kind, [], [], [], [])
    for item in (it for it in make_items(seed, n, video_kinds=()) if it.example.kind == kind):
        ex, obj = item.example, asked_object(item)
        prompt = user_turn("image", ex.prompt)
        enc = processor(text=[prompt + ex.answer + "<|im_end|>"], images=[item.pixels], return_tensors="pt")
        start = processor(text=[prompt], images=[item.pixels], return_tensors="pt")["input_ids"].shape[1]
        ids = enc["input_ids"][0]
        fact = ex.facts[kind]
        j = next(k for k in range(start, len(ids)) if tok.decode([int(ids[k])]).strip().lower() == fact)
        form = tok.decode([int(ids[j])])                  # " red", "Red" or "red": score the choices in that form
        choices = {w: tok(form.replace(form.strip(), w.capitalize() if form.strip()[0].isupper() else w),
                          add_special_tokens=False)["input_ids"][0] for w in WORDS[kind]}
        res = model(**enc, output_attentions=True)
        best = max(choices, key=lambda w: float(res.logits[0, j - 1, choices[w]]))
        out.right.append(best == fact)
        if best != fact:
            out.wrong.append(f"said {best} for {fact} ({ex.prompt!r}); objects "
                             + ", ".join(f"{o.colour} {o.shape} {o.size} @{o.cell}" for o in item.objects))
        others = [o.cell for o in item.objects if o.cell != obj.cell]
        if not others:
            continue
        vis = (ids == image_token).nonzero().flatten()
        att = torch.stack([a[0, :, j - 1, vis] for a in res.attentions])           # (layers, heads, 9)
        share = att / att.sum(-1, keepdim=True).clamp(min=1e-9)
        out.asked.append(share[..., obj.cell])
        out.other.append(share[..., others].mean(-1))
    return out


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor
    p = argparse.ArgumentParser(prog="python -m sage_engine.tinyworld.attention_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--kind", default="colour", choices=list(WORDS))
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = AutoModelForImageTextToText.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    print(probe(model, AutoProcessor.from_pretrained(a.model), a.kind, a.seed, a.n).table())


if __name__ == "__main__":
    main()
