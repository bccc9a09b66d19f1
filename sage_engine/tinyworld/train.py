"""Train the tinyworld pair from scratch: 1. tokenizer, 2. rendered + tokenized cache,
3. target (cross-entropy on answers), 4. draft distilled from the target
(teacher-forced KL(p_target || q_draft) on the same answers), 5. save both with the processor.

Seeded end to end; on 2 CPU cores the default budget takes about 75 minutes.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import models as M
from .data import TrainSet, build_cache, check_against_processor
from .evaluate import evaluate, make_items
from .tokenizer import build_tokenizer, world_corpus


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0                 # seeds the corpus, the cache, the init and the batch order
    n_images: int = 24_000        # rendered image scenes (3 questions each)
    n_videos: int = 8_000         # rendered clips (2 questions each)
    batch_size: int = 16
    target_steps: int = 5_000
    target_lr: float = 1.5e-3
    draft_steps: int = 2_500
    draft_lr: float = 3e-3
    warmup: int = 200
    eval_every: int = 1_000       # quick QA eval (fresh scenes) every so many steps; 0 = never
    target: M.PairMember = M.TARGET
    draft: M.PairMember = M.DRAFT


def cosine(step: int, total: int, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def prepare(cache: Path, cfg: TrainConfig, log=print):
    """Tokenizer + processor + cached training set (built once, reused when present)."""
    from transformers import PreTrainedTokenizerFast
    if (cache / "examples.pt").exists() and (cache / "tokenizer").exists():
        log(f"[data] reusing cache {cache}")
        tok = PreTrainedTokenizerFast.from_pretrained(cache / "tokenizer")
    else:
        t0 = time.time()
        tok = build_tokenizer(world_corpus(2000, cfg.seed))
        log(f"[data] tokenizer: {len(tok)} tokens")
        build_cache(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos, log=log)
        tok.save_pretrained(cache / "tokenizer")
        log(f"[data] cache built in {time.time() - t0:.0f}s")
    processor = M.build_processor(tok)
    check_against_processor(processor)
    return tok, processor, TrainSet.load(cache, tok)


def _quick_eval(model, processor, items, tag: str, log) -> None:
    res, _ = evaluate(model, processor, 0, 0, items=items)
    model.train()
    log(f"[{tag}] quick eval: acc {res['accuracy']:.3f} " + " ".join(f"{k}={v:.2f}" for k, v in res["by_kind"].items()))


def train_target(model, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None, ckpt: Path | None = None):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.target_lr, betas=(0.9, 0.98), weight_decay=0.05)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 1))
    model.train()
    t0, run = time.time(), 0.0
    for step in range(cfg.target_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.target_lr * cosine(step, cfg.target_steps, cfg.warmup)
        loss = model(**next(batches)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run = 0.98 * run + 0.02 * loss.item() if step else loss.item()
        if (step + 1) % 50 == 0 or step == 0:
            el = time.time() - t0
            log(f"[target] step {step + 1}/{cfg.target_steps} loss {run:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{el / (step + 1):.3f}s/step elapsed {el / 60:.1f}m")
        if items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            _quick_eval(model, processor, items, "target", log)
            if ckpt is not None:   # resumable: `train --only-draft` can start from here
                save(model, processor, ckpt)
    return model


def distil_draft(draft, target, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None):
    """Teacher-forced distillation on the answers: KL(p_target || q_draft) at every answer position."""
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.draft_lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 2))
    target.eval(); draft.train()
    t0, run, agree_run = time.time(), 0.0, 0.0
    for step in range(cfg.draft_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.draft_lr * cosine(step, cfg.draft_steps, cfg.warmup)
        batch = next(batches)
        labels = batch.pop("labels")
        mask = labels[:, 1:] != -100                                           # (B, L-1): positions predicting an answer token
        with torch.no_grad():
            p_logits = target(**batch).logits[:, :-1][mask]                     # (N, V)
        q_logits = draft(**batch).logits[:, :-1][mask]                          # (N, V)
        loss = F.kl_div(F.log_softmax(q_logits, -1), F.log_softmax(p_logits, -1), log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        agree = (q_logits.argmax(-1) == p_logits.argmax(-1)).float().mean().item()
        run = 0.98 * run + 0.02 * loss.item() if step else loss.item()
        agree_run = 0.98 * agree_run + 0.02 * agree if step else agree
        if (step + 1) % 50 == 0 or step == 0:
            el = time.time() - t0
            log(f"[draft] step {step + 1}/{cfg.draft_steps} kl {run:.4f} top1-agree {agree_run:.3f} "
                f"{el / (step + 1):.3f}s/step elapsed {el / 60:.1f}m")
        if items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            _quick_eval(draft, processor, items, "draft", log)
    return draft


def save(model, processor, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(path)
    processor.save_pretrained(path)


def run(out: Path, cache: Path, cfg: TrainConfig, log=print, only_draft: bool = False) -> None:
    t_all = time.time()
    log(f"[train] config {json.dumps(dataclasses.asdict(cfg))}")
    tok, processor, data = prepare(cache, cfg, log)
    log(f"[data] {len(data)} training examples")
    items = [it for it in make_items(seed=-1, n=6) if not it.example.kind.startswith("describe")] if cfg.eval_every else None

    draft = M.build_model(cfg.draft, tok, seed=cfg.seed + 1)
    if only_draft:   # resume: the target in `out` is already trained
        from transformers import AutoModelForImageTextToText
        target = AutoModelForImageTextToText.from_pretrained(out / "tinyworld-target", dtype=torch.float32)
    else:
        target = M.build_model(cfg.target, tok, seed=cfg.seed)
    log(f"[train] target {M.n_params(target):,} params, draft {M.n_params(draft):,} params")
    if not only_draft:
        t0 = time.time()
        train_target(target, data, processor, cfg, log, items, ckpt=out / "tinyworld-target")
        log(f"[target] trained in {(time.time() - t0) / 60:.1f} min")
        save(target, processor, out / "tinyworld-target")
    t0 = time.time()
    distil_draft(draft, target, data, processor, cfg, log, items)
    log(f"[draft] distilled in {(time.time() - t0) / 60:.1f} min")
    save(draft, processor, out / "tinyworld-draft")
    log(f"[train] done in {(time.time() - t_all) / 60:.1f} min -> {out}")
