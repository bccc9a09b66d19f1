"""The `train`, `ship` and `card` commands of `python -m sage_engine.tinyworld` (the CLI lives in ../__main__.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path


def cmd_train(a) -> None:
    import torch

    from .. import architecture as M
    from ..language import TEXT_VERSION
    from ..world import OCCLUSION
    from .config import TrainConfig
    from .train import run
    from .vision_aux import LABELS_VERSION
    torch.set_num_threads(a.threads)
    options = {"place_weight": a.place_weight, "content_weight": a.content_weight, "prompt_targets": a.prompt_targets,
               "retrieval_weight": a.retrieval_weight, "interleaved_rope": a.interleaved_rope, "mirror": a.mirror,
               "occlusion": a.occlusion,
               "kind_weights": tuple(a.kind_weight) or None, "draft_kind_weights": tuple(a.draft_kind_weight) or None,
               "hard_weights": tuple(a.hard_weight) or None, "draft_lr": a.draft_lr,
               "draft_retrieval_weight": a.draft_retrieval_weight, "draft_place_weight": a.draft_place_weight}
    cfg = TrainConfig(seed=a.seed, **{k: v for k, v in options.items() if v is not None})   # unset: TrainConfig's
    if a.tiny:   # smoke test: a few steps of the real script on a tiny config
        cfg = dataclasses.replace(cfg, n_images=32, n_videos=8, batch_size=4, target_steps=a.steps or 3,
                                  draft_steps=a.steps or 3, warmup=1, eval_every=0,
                                  vision_steps=a.steps or 3, draft_vision_steps=a.steps or 3, vision_batch=4,
                                  vision_video_batch=2, target=M.TINY)
    elif a.steps:
        cfg = dataclasses.replace(cfg, target_steps=a.steps, draft_steps=a.steps // 2)
    if a.draft_steps:
        cfg = dataclasses.replace(cfg, draft_steps=a.draft_steps)
    shape = M.TINY if a.tiny else cfg.draft   # the draft's widths; its layer count is the recipe's unless asked
    cfg = dataclasses.replace(cfg, draft=dataclasses.replace(shape, layers=a.draft_layers or cfg.draft.layers,
                                                             ffn=a.draft_ffn or shape.ffn))
    cache = Path(a.cache) if a.cache else Path(tempfile.gettempdir()) / (
        f"tinyworld-cache-s{cfg.seed}-{cfg.n_images}-{cfg.n_videos}-text{TEXT_VERSION}-labels{LABELS_VERSION}"
        + ("" if cfg.occlusion == OCCLUSION else f"-occ{cfg.occlusion:g}"))
    run(Path(a.out), cache, cfg, log=lambda *x: print(*x, flush=True), only_draft=a.only_draft)


def cmd_finetune(a) -> None:
    import torch

    from ..language import TEXT_VERSION
    from ..picture_talk import PICTURE_TEXT_VERSION
    from .finetune import FinetuneConfig, run
    torch.set_num_threads(a.threads)
    ft = FinetuneConfig(seed=a.seed)
    sizes = {"world_images": a.world_images, "world_videos": a.world_videos, "pictures": a.pictures,
             "picture_clips": a.picture_clips, "target_steps": a.steps, "draft_steps": a.draft_steps}
    sizes |= {"target_lr": a.lr, "draft_lr": a.lr, "pixel_weight": a.pixel_weight, "describe_weight": a.describe_weight}
    ft = dataclasses.replace(ft, **{k: v for k, v in sizes.items() if v is not None})
    cache = Path(a.cache) if a.cache else Path(tempfile.gettempdir()) / (
        f"tinyworld-finetune-s{ft.seed}-{ft.world_images}-{ft.world_videos}-{ft.pictures}-{ft.picture_clips}"
        f"-text{TEXT_VERSION}-pictures{PICTURE_TEXT_VERSION}")
    run(Path(a.src), Path(a.out), cache, ft, log=lambda *x: print(*x, flush=True), only_draft=a.only_draft)


def cmd_ship(a) -> None:
    """Copy a trained pair (train --out) to the models folder with bfloat16 weights: what assets/models holds."""
    from .card import store_bf16
    for role in ("target", "draft"):
        store_bf16(Path(a.src) / f"tinyworld-{role}", Path(a.to) / f"tinyworld-{role}")
        print(f"stored tinyworld-{role} in bfloat16 in {a.to}")


def cmd_card(a) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    from .card import finetune_card, write_cards
    from .timing import measure
    torch.set_num_threads(a.threads)
    models = Path(a.models)
    summary = json.loads(Path(a.train_summary).read_text())
    if "finetune" in summary:  # a fine-tune's summary: its section joins the cards, the rest of them stays
        if not a.train_cmd:
            raise SystemExit("error: a fine-tune's card needs --train-cmd (the finetune command line it ran)")
        finetune_card(models, json.loads(Path(a.eval_json).read_text()), summary, a.eval_cmd, a.train_cmd,
                      a.train_title)
        return
    pair = [AutoModelForImageTextToText.from_pretrained(models / f"tinyworld-{r}", dtype=torch.float32).eval()
            for r in ("target", "draft")]
    timing = measure(*pair)
    print(json.dumps(timing))
    bench = None
    if a.bench_json:
        bench = {"cmd": a.bench_cmd, "float32": json.loads(Path(a.bench_json).read_text())}
        if a.bench_bf16_json:
            bench["bfloat16"] = json.loads(Path(a.bench_bf16_json).read_text())
    write_cards(models, json.loads(Path(a.eval_json).read_text()), summary, timing, a.eval_cmd, bench,
                a.train_threads, a.train_note, a.eval_note)


def _kind_weight(value: str) -> tuple[str, float]:
    """KIND=W for `train --kind-weight`, checked before any work starts."""
    from .data import KINDS
    kind, _, w = value.partition("=")
    try:
        weight = float(w)
    except ValueError:
        weight = -1.0
    if kind not in KINDS or weight < 0:
        raise argparse.ArgumentTypeError(f"use KIND=W with W >= 0 and KIND one of {', '.join(KINDS)}")
    return kind, weight


def _prompt_kinds(value: str) -> tuple[str, ...]:
    """KIND,KIND (or none) for `train --prompt-targets`, checked before any work starts."""
    from .retrieval import PROMPT_KINDS
    kinds = tuple(k for k in value.split(",") if k and k != "none")
    if any(k not in PROMPT_KINDS for k in kinds):
        raise argparse.ArgumentTypeError(f"use none or a comma-separated list of {', '.join(PROMPT_KINDS)}")
    return kinds


def _train_parser(t: argparse.ArgumentParser, assets: Path) -> None:
    """`train`'s options: each recipe option defaults to None, which leaves TrainConfig's default."""
    t.add_argument("--out", default=str(assets))
    t.add_argument("--cache", default=None, help="where the rendered training set is cached")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=0, help="override the number of target steps (draft: half)")
    t.add_argument("--draft-steps", type=int, default=0, help="override the number of draft distillation steps")
    t.add_argument("--only-draft", action="store_true", help="distil the draft from the target already in --out")
    t.add_argument("--draft-layers", type=int, default=0, help="the draft's text layers (default: TrainConfig's)")
    t.add_argument("--draft-ffn", type=int, default=0, help="the draft's MLP width (default: TrainConfig's)")
    t.add_argument("--draft-lr", type=float, default=None, help="the draft's learning rate (default: TrainConfig's)")
    t.add_argument("--draft-retrieval-weight", type=float, default=None,
                   help="weight of the retrieval loss on the draft's attention while it is distilled (its heads: "
                        "TrainConfig.draft_retrieval_heads; default: TrainConfig's)")
    t.add_argument("--draft-place-weight", type=float, default=None,
                   help="weight of PlaceAux on the draft's layer TrainConfig.draft_place_layer while it is distilled "
                        "(default: TrainConfig's; 0 = off)")
    t.add_argument("--tiny", action="store_true", help="tiny models and data: a smoke test of the script")
    t.add_argument("--place-weight", type=float, default=None,
                   help="weight of the target's PlaceAux loss (default: TrainConfig's; 0 = off)")
    t.add_argument("--kind-weight", action="append", default=[], metavar="KIND=W", type=_kind_weight,
                   help="drawing weight of the training examples of a question kind (repeatable; given at all, they "
                        "replace TrainConfig's weights and unnamed kinds weigh 1)")
    t.add_argument("--draft-kind-weight", action="append", default=[], metavar="KIND=W", type=_kind_weight,
                   help="the same for the draft's distillation (default: the natural draw)")
    t.add_argument("--prompt-targets", default=None, metavar="KIND,KIND|none", type=_prompt_kinds,
                   help="kinds whose questions' tokens the retrieval loss also supervises once the question has "
                        "named its object (retrieval.prompt_targets; default: TrainConfig's)")
    t.add_argument("--hard-weight", action="append", default=[], metavar="KIND=F", type=_kind_weight,
                   help="within a kind, draw confusable examples (retrieval.confusable) F x as often, the kind's "
                        "total unchanged (repeatable; given at all, they replace TrainConfig's)")
    t.add_argument("--interleaved-rope", action=argparse.BooleanOptionalAction, default=None,
                   help="interleave the M-RoPE t/h/w frequencies (default: TrainConfig's, on)")
    t.add_argument("--content-weight", type=float, default=None,
                   help="loss weight of answer tokens that name a fact (default: TrainConfig's, 1 = plain)")
    t.add_argument("--retrieval-weight", type=float, default=None,
                   help="weight of the retrieval loss on the target's attention (retrieval.py; default: TrainConfig's)")
    t.add_argument("--occlusion", type=float, default=None,
                   help="share of the 3- and 4-object training scenes that have an occluding pair (default: "
                        "TrainConfig's; the world, and so the evaluation, draws world.OCCLUSION)")
    t.add_argument("--mirror", type=float, default=None,
                   help="share of training examples shown left-right mirrored, 'left' and 'right' swapped "
                        "(default: TrainConfig's)")
    t.set_defaults(fn=cmd_train)


def add_train_command(sub, assets: Path) -> None:
    """Add `train` to the subparsers `sub`; `assets` is the default --out (where the shipped pair lives)."""
    _train_parser(sub.add_parser("train", help="train the target/draft pair from scratch"), assets)


def add_finetune_command(sub, assets: Path) -> None:
    """Add `finetune` (a trained pair trained on with pictures from outside the world: finetune.py)."""
    f = sub.add_parser("finetune", help="train a pair on (default: the shipped one) with the world and other pictures")
    f.add_argument("--from", dest="src", default=str(assets), help="the pair to start from")
    f.add_argument("--out", required=True)
    f.add_argument("--cache", default=None, help="where the training set is cached")
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--seed", type=int, default=0)
    for name in ("world-images", "world-videos", "pictures", "picture-clips", "steps", "draft-steps"):
        f.add_argument(f"--{name}", type=int, default=None, help="default: finetune.FinetuneConfig's")
    for name in ("lr", "pixel-weight", "describe-weight"):
        f.add_argument(f"--{name}", type=float, default=None,
                       help="default: finetune.FinetuneConfig's" + (" (target and draft)" if name == "lr" else ""))
    f.add_argument("--only-draft", action="store_true", help="distil the draft from the target already in --out")
    f.set_defaults(fn=cmd_finetune)


def add_ship_and_card_commands(sub, assets: Path) -> None:
    """Add `ship` and `card` to the subparsers `sub`."""
    s = sub.add_parser("ship", help="store a trained pair in bfloat16 (assets/models by default); then write its cards")
    s.add_argument("src", help="the --out folder of a training run")
    s.add_argument("--to", default=str(assets))
    s.set_defaults(fn=cmd_ship)
    c = sub.add_parser("card",
                       help="write the model cards from an eval --json file and the training run's summary.json")
    c.add_argument("--models", default=str(assets))
    c.add_argument("--eval-json", required=True)
    c.add_argument("--eval-cmd", required=True, help="the eval command line that produced --eval-json")
    c.add_argument("--train-summary", required=True, metavar="SUMMARY_JSON",
                   help="the summary.json a training run writes beside the models (train --out or finetune --out)")
    c.add_argument("--train-cmd", default="",
                   help="a fine-tune's command line (its section of the cards; `train` runs' cards name their own)")
    c.add_argument("--train-title", default="", help="a fine-tune section's heading (default: by its place)")
    c.add_argument("--bench-json", default=None, help="a float32 `python -m sage_engine bench --out` report")
    c.add_argument("--bench-bf16-json", default=None, help="the same benchmark in bfloat16")
    c.add_argument("--bench-cmd", default="", help="the bench command line that produced --bench-json")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--train-threads", type=int, default=None, help="override the training threads summary.json records")
    c.add_argument("--train-note", default="shared with other work", help="how busy the machine was during training")
    c.add_argument("--eval-note", default="",
                   help="appended to the status line (e.g. single seeds vs the pooled table)")
    c.set_defaults(fn=cmd_card)
