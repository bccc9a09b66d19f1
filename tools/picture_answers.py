"""The embedded pair's answers about held-out pictures, each beside its pixel facts, as a markdown table.

  python -m tools.picture_answers [--models assets/models] [--n 12] [--out docs/log/PICTURES.md]

Every packaged held-out photo and video (pictures.PHOTOS_HELD_OUT, VIDEOS_HELD_OUT: the benchmark's real suite
and a few more) and N generated held-out pictures and N / 2 clips (evaluate.make_picture_items' stream, seed 0)
are described by the target (greedy, float32); each row gives the facts pixels.py computes (brightness, main
colours, the three rows' colours, brightest and darkest cell; for a clip what changes), the answer, and which facts
it got wrong.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def facts_text(ex) -> str:
    from sage_engine.tinyworld.world import POSITIONS
    f = ex.facts["picture"]
    rows = " / ".join(", ".join(f.row(r)) for r in range(3))
    text = f"{f.brightness}; main {' and '.join(f.main)}; rows {rows}"
    if "clip" in ex.facts:
        c = ex.facts["clip"]
        changes = [f"moves {c.motion}"] if c.motion else []
        changes += [f"lighter {', '.join(POSITIONS[i] for i in c.lighter)}"] if c.lighter else []
        changes += [f"darker {', '.join(POSITIONS[i] for i in c.darker)}"] if c.darker else []
        changes += [f"{POSITIONS[i]} {a}->{b}" for i, a, b in c.recoloured]
        return text + "; changes: " + ("; ".join(changes) or "none")
    return text + f"; brightest {POSITIONS[f.brightest]}, darkest {POSITIONS[f.darkest]}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=str(ROOT / "assets" / "models"))
    p.add_argument("--n", type=int, default=6, help="generated pictures (and half as many clips)")
    p.add_argument("--out", default="-")
    a = p.parse_args(argv)

    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from sage_engine.tinyworld.evaluate import generate, make_picture_items
    from sage_engine.tinyworld.picture_talk import score_picture, text_defects

    describe = ("pic_describe", "clip_describe")
    real = [it for it in make_picture_items(0, 0, real=True) if it.example.kind in describe]
    made = [it for it in make_picture_items(0, a.n, real=False) if it.example.kind in describe]
    generated = [it for it in made if it.media == "image"] + [it for it in made if it.media == "video"][: a.n // 2]
    chosen = real + generated
    path = Path(a.models) / "tinyworld-target"
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    answers = generate(model, AutoProcessor.from_pretrained(path), chosen)
    lines = ["| # | input | pixel facts | the target's answer | wrong facts |", "|---|---|---|---|---|"]
    for i, (it, ans) in enumerate(zip(chosen, answers)):
        got = score_picture(it.example, ans)
        wrong = [k for k, v in got.items() if not v] + [f"text: {d}" for d in text_defects(ans)]
        kind = ("packaged " if i < len(real) else "generated ") + it.media
        lines.append(f"| {i + 1} | {kind} | {facts_text(it.example)} | {ans} | {', '.join(wrong) or 'none'} |")
    text = "\n".join(lines) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
