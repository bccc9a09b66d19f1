"""Fine-tune a trained tinyworld pair (the shipped one by default) on the shapes world plus pictures and clips from
outside it (picture_data.py): `python -m sage_engine.tinyworld finetune --out DIR`.

1. a training cache: a fresh seeded stream of world scenes and clips (data.build_cache, with its confusable flags
   and retrieval targets) and the training split's pictures and clips appended (picture_data.add_pictures), all
   tokenised with the pair's own tokenizer (its vocabulary, and so its embeddings, stay);
2. the target trained on from its weights: the answers' cross-entropy and the retrieval loss (train.train_target;
   a world example's targets come from its objects, a picture's from its pixel facts: picture_data.picture_spans),
   no vision-only stage and no auxiliary or PlaceAux heads (they need per-object labels a photo does not have);
   with pixel_weight > 0 also pixel_aux.PixelAux on both towers (each cell's colours and lightness from the
   pixels, which every picture has);
3. the draft distilled on from its weights, from the new target (train.distil_draft);
4. both saved with the processor and summary.json; `ship` stores them in bf16.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from .config import TrainConfig

SUMMARY = "summary.json"


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    seed: int = 0
    world_images: int = 12_000      # world scenes (3 questions each), a fresh stream of the seed
    world_videos: int = 4_000       # world clips (2 questions each)
    pictures: int = 9_000           # pictures of the training split (3 questions each)
    picture_clips: int = 3_000      # clips of the training split (2 questions each)
    target_steps: int = 4_000
    target_lr: float = 5e-4
    draft_steps: int = 4_000
    draft_lr: float = 5e-4
    warmup: int = 100
    picture_weight: float = 2.5     # drawing weight of each picture kind
    # drawing weight of the world's descriptions, images and clips (None: TrainConfig's, like the world's other kinds)
    describe_weight: float | None = None
    pixel_weight: float = 0.0       # TrainConfig.pixel_weight: the towers' loss on each cell's colours and lightness


def recipe(ft: FinetuneConfig) -> TrainConfig:
    """TrainConfig of the fine-tune: the shipped recipe's draw and retrieval loss, no vision stage, no aux heads."""
    from ..picture_talk import CLIP_KINDS, PICTURE_KINDS
    base = TrainConfig(seed=ft.seed)
    kinds = base.kind_weights
    if ft.describe_weight is not None:
        described = ("describe", "describe_video")
        kinds = tuple(kw for kw in kinds if kw[0] not in described) + tuple((k, ft.describe_weight) for k in described)
    kinds += tuple((k, ft.picture_weight) for k in PICTURE_KINDS + CLIP_KINDS)
    return dataclasses.replace(
        base, n_images=ft.world_images, n_videos=ft.world_videos, target_steps=ft.target_steps,
        target_lr=ft.target_lr, draft_steps=ft.draft_steps, draft_lr=ft.draft_lr, warmup=ft.warmup, eval_every=0,
        aux_weight=0.0, place_weight=0.0, draft_place_weight=0.0, vision_steps=0, draft_vision_steps=0,
        whiten_eps=0.0, kind_weights=kinds, pixel_weight=ft.pixel_weight)


def build(cache: Path, tok, ft: FinetuneConfig, cfg: TrainConfig, log=print) -> None:
    from .data import build_cache, build_hard_flags, build_prompt_targets
    from .picture_data import add_pictures
    stream = {"seed": cfg.seed, "n_images": cfg.n_images, "n_videos": cfg.n_videos, "occlusion": cfg.occlusion}
    build_cache(cache, tok, log=log, **stream)
    build_hard_flags(cache, **stream)
    build_prompt_targets(cache, tok, **stream)
    add_pictures(cache, tok, ft.seed, ft.pictures, ft.picture_clips, log)
    tok.save_pretrained(cache / "tokenizer")


def run(src: Path, out: Path, cache: Path, ft: FinetuneConfig, log=print, only_draft: bool = False) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from .train import distil_draft, save, train_target
    from .trainset import TrainSet
    t_all = time.time()
    cfg = recipe(ft)
    log(f"[finetune] from {src}: {json.dumps(dataclasses.asdict(ft))}")
    processor = AutoProcessor.from_pretrained(src / "tinyworld-target")
    tok = processor.tokenizer
    seconds = {}
    if not (cache / "pictures.txt").exists():
        t0 = time.time()
        build(cache, tok, ft, cfg, log)
        seconds["cache"] = time.time() - t0
        log(f"[data] cache built in {seconds['cache']:.0f}s")
    else:
        log(f"[data] reusing cache {cache}")
    data = TrainSet.load(cache, tok, cfg.prompt_targets, pixel_labels=cfg.pixel_weight > 0)
    log(f"[data] {len(data)} training examples")
    load = lambda p: AutoModelForImageTextToText.from_pretrained(p, dtype=torch.float32)  # noqa: E731
    summary = {"finetune": dataclasses.asdict(ft), "from": str(src), "threads": torch.get_num_threads()}
    if only_draft:
        target = load(out / "tinyworld-target")
    else:
        target = load(src / "tinyworld-target")
        t0 = time.time()
        summary["target"] = train_target(target, data, processor, cfg, log)
        seconds["target"] = time.time() - t0
        save(target, processor, out / "tinyworld-target")
        log(f"[target] fine-tuned in {seconds['target'] / 60:.1f} min")
    draft = load(src / "tinyworld-draft")
    t0 = time.time()
    summary["draft"] = distil_draft(draft, target.eval(), data, processor, cfg, log)
    seconds["draft"] = time.time() - t0
    save(draft, processor, out / "tinyworld-draft")
    log(f"[draft] distilled in {seconds['draft'] / 60:.1f} min")
    seconds["total"] = time.time() - t_all
    summary["seconds"] = seconds
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    log(f"[finetune] done in {seconds['total'] / 60:.1f} min -> {out}")
    return summary
