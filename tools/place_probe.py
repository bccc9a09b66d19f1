"""Does each layer of a trained tinyworld model know WHERE each visual token is?

A linear classifier of row and one of column are fitted on the hidden state of each visual token, per layer
(layer 0 = the vision tower's output), on fresh scenes, and scored on held-out ones (chance 1/3). An answer
that attends to a token can only say where the token is if its state carries the place.

  python -m tools.place_probe MODEL_DIR

Run from the repository root. What it showed on the pairs trained so far is in sage_engine/tinyworld/RUNS.md.
"""
from __future__ import annotations

import argparse
import random

import torch

from sage_engine.tinyworld import world as W
from sage_engine.tinyworld.tokenizer import user_turn


def place_probe(model_dir: str, n_fit: int = 800, n_held: int = 200, seed: int = 7) -> list[tuple[float, float]]:
    """Per layer, the held-out (row, column) accuracy of linear probes fitted on n_fit fresh scenes and
    scored on n_held more; each layer's line is printed as it is done."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(model_dir)
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    rng = random.Random(seed)
    feats = []
    with torch.no_grad():
        for _ in range(0, n_fit + n_held, 50):
            imgs = [W.render_image(W.sample_scene(rng), noise_seed=rng.randrange(1 << 30)) for _ in range(50)]
            enc = proc(text=[user_turn("image", "Describe the image.")] * len(imgs), images=imgs, return_tensors="pt")
            hs = model(**enc, output_hidden_states=True).hidden_states
            sel = enc["input_ids"] == pad
            feats.append(torch.stack([h[sel] for h in hs]))          # (layers + 1, images * 9, hidden)
    x_all = torch.cat(feats, 1)
    per = x_all.shape[1] // (n_fit + n_held)                          # visual tokens per image (9)
    side = int(round(per ** 0.5))
    j = torch.arange(per).repeat(n_fit + n_held)
    targets, cut = {"row": j // side, "column": j % side}, n_fit * per
    out = []
    for layer, x in enumerate(x_all):
        x = (x - x[:cut].mean(0)) / (x[:cut].std(0) + 1e-5)
        acc = []
        for y in targets.values():
            torch.manual_seed(0)
            clf = torch.nn.Linear(x.shape[1], side)
            opt = torch.optim.Adam(clf.parameters(), 1e-2)
            for _ in range(300):
                loss = torch.nn.functional.cross_entropy(clf(x[:cut]), y[:cut])
                opt.zero_grad()
                loss.backward()
                opt.step()
            acc.append(float((clf(x[cut:]).argmax(-1) == y[cut:]).float().mean()))
        print(f"layer {layer}: row {acc[0]:.3f} column {acc[1]:.3f}", flush=True)
        out.append(tuple(acc))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.place_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a model directory, e.g. assets/models/tinyworld-target")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    place_probe(a.model)


if __name__ == "__main__":
    main()
