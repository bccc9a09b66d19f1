"""Does a trained tinyworld model LOOK at the object a question asks about? An attention probe.

For each fresh-scene question of one kind (the colour, shape or size of one object), teacher-forced on the
gold answer, at the position that predicts the fact word: each head's share of its visual attention (over the
image's 9 visual tokens) that lands on the asked object's cell, next to the mean share on the cells of the
scene's other objects (single-object scenes are left out: there any head that finds an object finds the right
one). A head that retrieves the asked object has a high first number and a low second. Also printed: how often
the fact word is the model's top choice among the words of its kind, and each wrong choice with the scene's
objects (is the wrong word another object's attribute?).

  python -m tools.attention_probe MODEL_DIR [--kind colour|shape|size] [--seed 3] [--n 40] [--threads 2]

Run from the repository root. What it showed on the pairs trained so far is in sage_engine/tinyworld/RUNS.md.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from sage_engine.tinyworld.evaluate import Item, make_items
from sage_engine.tinyworld.tokenizer import user_turn
from sage_engine.tinyworld.training.retrieval import prompt_objects
from sage_engine.tinyworld.world import COLOURS, SHAPES, SIZES

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
    p = argparse.ArgumentParser(prog="python -m tools.attention_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--kind", default="colour", choices=list(WORDS))
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = AutoModelForImageTextToText.from_pretrained(a.model, dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    print(probe(model, AutoProcessor.from_pretrained(a.model), a.kind, a.seed, a.n).table())


if __name__ == "__main__":
    main()
