"""python -m sage_engine.tinyworld {render, examples, train, finetune, eval, ship, card} ..."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..models.presets import ASSETS as _ASSETS
from .training.commands import add_finetune_command, add_ship_and_card_commands, add_train_command

ASSETS = _ASSETS / "models"  # the embedded pair (a checkout's assets/, or the installed copy)


def cmd_render(a) -> None:
    from .render import render_dir
    render_dir(Path(a.out), a.seed, a.n)
    print(f"wrote {a.n} images and {a.n} videos to {a.out}")


def cmd_examples(a) -> None:
    from .render import write_examples
    rows = write_examples(Path(a.out))
    print(f"wrote {len(rows)} examples to {a.out}")


def cmd_eval(a) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from .evaluate import generate, make_items, make_picture_items, score_all, score_pictures
    torch.set_num_threads(a.threads)
    runs = a.seeds or [(a.seed, a.n)]
    items = {seed: make_items(seed, n) for seed, n in runs} if a.n > 0 or a.seeds else {}
    runs = runs if items else []
    pictures = make_picture_items(a.seed, a.pictures) if a.pictures else []
    flat = [it for seed, _ in runs for it in items[seed]]
    out = {"n": sum(n for _, n in runs), "seed": [seed for seed, _ in runs] if a.seeds else a.seed}
    per_seed = {str(seed): {"n": n} for seed, n in runs}
    for role in ("target", "draft"):
        path = Path(a.models) / f"tinyworld-{role}"
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        processor = AutoProcessor.from_pretrained(path)
        by_seed = {seed: generate(model, processor, items[seed]) for seed, _ in runs}   # as a one-seed eval would
        answers = [ans for seed, _ in runs for ans in by_seed[seed]]
        out[role] = score_all(flat, answers) if flat else {"by_kind": {}, "occluded": {}, "n_occluded": 0,
                                                            "accuracy": float("nan")}
        if pictures:
            pic_answers = generate(model, processor, pictures)
            out[role]["pictures"] = score_pictures(pictures, pic_answers)
            if a.answers:
                Path(a.answers).mkdir(parents=True, exist_ok=True)
                rows = [{"kind": it.example.kind, "prompt": it.example.prompt, "answer": ans,
                         "truth": it.example.answer} for it, ans in zip(pictures, pic_answers)]
                (Path(a.answers) / f"{role}.json").write_text(json.dumps(rows, indent=1))
        for seed, _ in runs:
            per_seed[str(seed)][role] = score_all(items[seed], by_seed[seed])
        if not a.json:
            print(f"{role}: accuracy {out[role]['accuracy']:.3f}")
            for k, v in out[role]["by_kind"].items():
                seeds = "  ".join(f"s{s} {r[role]['by_kind'][k]:.3f}" for s, r in per_seed.items()) if a.seeds else ""
                print(f"  {k:15s} {v:.3f}  {seeds}")
            occ = out[role]["occluded"]
            if flat:
                print(f"  images with an occluding pair ({out[role]['n_occluded']}): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in occ.items()))
            if pictures:
                pics = out[role]["pictures"]
                print(f"  other pictures and clips ({pics['n']} questions, held out): clean text {pics['clean']:.3f}")
                for k, v in pics["by_fact"].items():
                    print(f"    fact {k:12s} {v:.3f}")
                for k, v in pics["by_kind"].items():
                    print(f"    all facts right, {k:13s} {v:.3f}")
            for it, ans in zip(flat[:a.show], answers):
                print(f"    [{it.example.kind}] {it.example.prompt} -> {ans!r}  (truth: {it.example.answer!r})")
    if a.seeds:
        out["per_seed"] = per_seed
    if a.json:
        print(json.dumps(out))


def _seed_runs(value: str) -> list[tuple[int, int]]:
    """S:N,S:N for `eval --seeds`: one pooled evaluation over several fresh seeds, N scenes of each."""
    try:
        runs = [tuple(int(x) for x in part.split(":")) for part in value.split(",") if part]
    except ValueError:
        runs = []
    if not runs or any(len(r) != 2 or r[1] < 1 for r in runs) or len({r[0] for r in runs}) != len(runs):
        raise argparse.ArgumentTypeError("use S:N,S:N,... (distinct seeds, N >= 1), e.g. 1:20,2:40")
    return runs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sage_engine.tinyworld", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="write N images + N MP4 videos with truth.jsonl and prompts.jsonl")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--n", type=int, default=10)
    r.add_argument("--out", required=True)
    r.set_defaults(fn=cmd_render)
    x = sub.add_parser("examples", help="write the demo inputs (assets/examples)")
    x.add_argument("--out", default=str(ASSETS.parent / "examples"))
    x.set_defaults(fn=cmd_examples)
    add_train_command(sub, ASSETS)
    add_finetune_command(sub, ASSETS)
    e = sub.add_parser("eval", help="score target and draft on fresh scenes")
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--n", type=int, default=30)
    e.add_argument("--models", default=str(ASSETS))
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--json", action="store_true")
    e.add_argument("--show", type=int, default=0, help="print the first SHOW answers")
    e.add_argument("--pictures", type=int, default=0,
                   help="also score answers about N held-out pictures and N held-out clips from outside the world "
                        "(every picture and clip kind each) and the packaged held-out photos and videos, fact by fact")
    e.add_argument("--answers", default=None, help="write the picture questions' answers to DIR/{target,draft}.json")
    e.add_argument("--seeds", type=_seed_runs, default=None,
                   help="S:N,S:N,...: pool several fresh seeds (N scenes each) into one table, with each seed's "
                        "own in the JSON's per_seed (overrides --seed / --n)")
    e.set_defaults(fn=cmd_eval)
    add_ship_and_card_commands(sub, ASSETS)
    return p


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    a.fn(a)


if __name__ == "__main__":
    main(sys.argv[1:])
