"""Train the tinyworld pair from scratch (config.TrainConfig is the recipe): 1. tokenizer, 2. rendered and
tokenized cache (data.py), 3. target: vision-only stage, then cross-entropy on the answers with the auxiliary,
PlaceAux and retrieval losses, 4. draft: vision-only stage, then teacher-forced distillation from the target,
KL(p_target || q_draft) on the same answers, 5. both saved with the processor, and summary.json beside them:
the config, the steps, the seconds each stage took and the final smoothed losses (card.py reads it).

The training-only heads (vision_aux.VisionAux and PlaceAux) are removed before saving, so each saved model is
a plain Qwen2_5_VLForConditionalGeneration.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import architecture as M
from ..evaluate import evaluate, make_items
from ..language import DESCRIPTION_KINDS
from ..tokenizer import build_tokenizer, world_corpus
from .config import TrainConfig
from .data import (
    HARD_FILE,
    build_cache,
    build_hard_flags,
    build_prompt_targets,
    build_retrieval_targets,
    check_against_processor,
    replay_image_labels,
)
from .losses import Smoothed, aux_loss, content_tokens, cosine, weighted_lm_loss
from .pixel_aux import PixelAux
from .retrieval import PROMPT_TARGETS_FILE, TARGETS_FILE, RetrievalAux
from .trainset import TrainSet
from .vision_aux import LABELS_VERSION, PlaceAux, VisionAux, whiten_patch_embed

SUMMARY = "summary.json"


def prepare(cache: Path, cfg: TrainConfig, log=print):
    """Tokenizer, processor, the cached training set (built once, reused when present; files a reused cache
    lacks are replayed from its seeded scene stream) and the seconds the build took (None: reused)."""
    from transformers import PreTrainedTokenizerFast
    built = None
    # the seeded scene stream the cache holds: every builder and replay must draw the same one
    stream = {"seed": cfg.seed, "n_images": cfg.n_images, "n_videos": cfg.n_videos, "occlusion": cfg.occlusion}
    if (cache / "examples.pt").exists() and (cache / "tokenizer").exists():
        log(f"[data] reusing cache {cache}")
        tok = PreTrainedTokenizerFast.from_pretrained(cache / "tokenizer")
        vision_files = (cache / "image_labels.npy").exists() and (cache / "vision_targets.npz").exists()
        if cfg.aux_weight > 0 and not vision_files:
            t0 = time.time()
            replay_image_labels(cache, **stream)
            log(f"[data] per-token vision labels replayed in {time.time() - t0:.0f}s")
        if cfg.hard_weights and not (cache / HARD_FILE).exists():
            build_hard_flags(cache, **stream)
            log("[data] confusable-example flags replayed")
        if cfg.retrieval_weight > 0 and cfg.prompt_targets and not (cache / PROMPT_TARGETS_FILE).exists():
            build_prompt_targets(cache, tok, **stream)
            log("[data] prompt retrieval targets replayed")
        if max(cfg.retrieval_weight, cfg.draft_retrieval_weight) > 0 and not (cache / TARGETS_FILE).exists():
            t0 = time.time()
            build_retrieval_targets(cache, tok, **stream)
            log(f"[data] retrieval targets replayed in {time.time() - t0:.0f}s")
    else:
        t0 = time.time()
        tok = build_tokenizer(world_corpus(2000, cfg.seed))
        log(f"[data] tokenizer: {len(tok)} tokens")
        build_cache(cache, tok, log=log, **stream)
        build_hard_flags(cache, **stream)
        build_prompt_targets(cache, tok, **stream)
        tok.save_pretrained(cache / "tokenizer")
        built = time.time() - t0
        log(f"[data] cache built in {built:.0f}s")
    processor = M.build_processor(tok)
    check_against_processor(processor)
    return tok, processor, TrainSet.load(cache, tok, cfg.prompt_targets if cfg.retrieval_weight > 0 else (),
                                         pixel_labels=cfg.pixel_weight > 0), built



def _quick_eval(model, processor, items, tag: str, log) -> None:
    res, _ = evaluate(model, processor, 0, 0, items=items)
    model.train()
    log(f"[{tag}] quick eval: acc {res['accuracy']:.3f} " + " ".join(f"{k}={v:.2f}" for k, v in res["by_kind"].items()))


def make_aux(model, data: TrainSet, cfg: TrainConfig) -> VisionAux | None:
    return VisionAux(model) if cfg.aux_weight > 0 and data.labels is not None else None


def init_patch_embed(model, data: TrainSet, cfg: TrainConfig, seed: int) -> None:
    if cfg.whiten_eps > 0 and cfg.aux_weight > 0:
        whiten_patch_embed(model, data.patch_sample(1000, 0), cfg.whiten_eps, seed)


def pretrain_vision(model, aux: VisionAux | None, data: TrainSet, cfg: TrainConfig, tag: str, log=print,
                    steps: int | None = None) -> dict:
    """Vision tower + auxiliary head alone, on the per-token targets (the language model is untouched).
    -> {"steps", "aux": the final smoothed loss, "colour" / "size" / "shape": the head's last scores on a fixed
    set of training images, "seconds"} ({"steps": 0} when there is no stage)."""
    steps = cfg.vision_steps if steps is None else steps
    if aux is None or steps <= 0:
        return {"steps": 0}
    params = list(model.model.visual.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.vision_lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = data.image_batches(cfg.vision_batch, random.Random(cfg.seed + 3), cfg.vision_video_batch)
    model.train()
    probe = list(range(min(256, len(data.images))))   # progress on a fixed set of (training) images
    probe_targets = data.vision_targets(probe, [])["image"]
    probe_pix = data.image_pixels(probe)
    t0, smooth, out = time.time(), Smoothed(0.95), {"steps": steps}
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cfg.vision_lr * cosine(step, steps, min(cfg.warmup, steps // 4 + 1))
        pix, grid, vpix, vgrid, targets = next(batches)
        aux.clear()
        model.model.visual(pix, grid_thw=grid)
        if vpix is not None:
            model.model.visual(vpix, grid_thw=vgrid)
        loss = aux_loss(aux, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        smooth.add(aux=loss.item())
        if (step + 1) % 50 == 0 or step == 0:
            log(f"[{tag}-vision] step {step + 1}/{steps} {smooth.text()} elapsed {(time.time() - t0) / 60:.1f}m")
        if (step + 1) % 250 == 0 or step + 1 == steps:
            aux.clear()
            with torch.no_grad():
                model.model.visual(probe_pix[0], grid_thw=probe_pix[1])
            out.update(zip(("colour", "size", "shape", "triples"), aux.scores(*probe_targets)))
            log(f"[{tag}-vision] step {step + 1} on {len(probe)} training images: colour {out['colour']:.2f} "
                f"size {out['size']:.2f} shape {out['shape']:.2f} triples {out['triples']:.2f}")
    aux.clear()
    return out | {"aux": smooth.values["aux"], "seconds": time.time() - t0}


def _language_heads(model, data: TrainSet, cfg: TrainConfig):
    """The target's PlaceAux and RetrievalAux (None when their weight is 0 or the cache has no targets)."""
    place = _place_head(model, data, cfg.place_layer) if cfg.place_weight > 0 else None
    retrieval = None
    if cfg.retrieval_weight > 0 and data.retrieval is not None:
        retrieval = _retrieval_heads(model, cfg.retrieval_heads, data)
    return place, retrieval


def _place_head(model, data: TrainSet, layer: int) -> PlaceAux:
    """PlaceAux on the output of `model`'s decoder layer `layer` (a smaller model: its last)."""
    layer = min(layer, model.config.text_config.num_hidden_layers - 1)
    return PlaceAux(model, layer, data.image_token, data.video_token)


def _retrieval_heads(model, heads: tuple[tuple[int, int], ...], data: TrainSet) -> RetrievalAux:
    """RetrievalAux on `heads` of `model` (switched to eager attention: the loss reads attention weights)."""
    tc = model.config.text_config   # a smaller config (tests) gets the nearest layer / head
    heads = tuple(sorted({(min(layer, tc.num_hidden_layers - 1), h % tc.num_attention_heads) for layer, h in heads}))
    model.set_attn_implementation("eager")
    return RetrievalAux(heads, data.image_token, data.video_token)


def _place_loss(place: PlaceAux | None, vis_labels: dict | None):
    """PlaceAux's loss on the last forward (a clip's former-cell labels from the batch's vision targets); 0.0 without
    the head."""
    if not place:
        return 0.0
    return place.loss(vis_labels["video"][0] if vis_labels and vis_labels["video"] else None)


def _drop_heads(model, heads: tuple, retrieval: RetrievalAux | None) -> None:
    """After training: remove the training-only heads' hooks (they are not part of the model) and give `model` back
    its SDPA attention where the retrieval loss had switched it to eager."""
    for head in heads:
        if head:
            head.remove()
    if retrieval:
        model.set_attn_implementation("sdpa")


def make_pixel_aux(model, cfg: TrainConfig) -> PixelAux | None:
    return PixelAux(model) if cfg.pixel_weight > 0 else None


def _pixel_loss(pixel: PixelAux | None, targets: dict | None) -> torch.Tensor:
    """PixelAux's loss of the forward just run (0 without the head or its targets)."""
    if pixel is None or targets is None:
        return torch.zeros(())
    return pixel.loss(targets["image"], targets["video"])


def _target_step(model, batch: dict, aux, place, retrieval, content, cfg: TrainConfig, pixel=None) -> dict:
    """One forward of the target on `batch` -> its losses: lm, aux, place, retrieval, pixel (tensors or 0.0) and
    the retrieval heads' share of visual attention on the targets (nan when no position was supervised)."""
    for head in (aux, pixel):
        if head:
            head.clear()
    vis_labels = batch.pop("vision_targets", None)
    px_targets = batch.pop("pixel_targets", None)
    ret_targets = batch.pop("retrieval_targets", None)
    if place:
        place.input_ids = batch["input_ids"]
    out = model(**batch, output_attentions=retrieval is not None)
    lm = out.loss if content is None else weighted_lm_loss(out.logits, batch["labels"], content, cfg.content_weight)
    a_loss = aux_loss(aux, vis_labels)
    p_loss = _place_loss(place, vis_labels)
    r_loss, share = retrieval.loss(out.attentions, batch["input_ids"], ret_targets) if retrieval else (0.0, 0.0)
    return {"lm": lm, "aux": a_loss, "place": p_loss, "retrieval": r_loss, "share": share,
            "pixel": _pixel_loss(pixel, px_targets)}


def train_target(model, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None,
                 ckpt: Path | None = None) -> dict:
    """Train the target in place -> {"vision": pretrain_vision's report, "steps", "final": smoothed losses}."""
    aux = make_aux(model, data, cfg)
    content = content_tokens(processor.tokenizer) if cfg.content_weight != 1.0 else None
    vision = pretrain_vision(model, aux, data, cfg, "target", log)
    place, retrieval = _language_heads(model, data, cfg)
    pixel = make_pixel_aux(model, cfg)
    tower = list(model.model.visual.parameters())
    rest = [p for p in model.parameters() if all(p is not t for t in tower)]
    rest += [p for m in (aux, place, pixel) if m for p in m.parameters()]
    params = rest + tower
    opt = torch.optim.AdamW([{"params": rest, "scale": 1.0}, {"params": tower, "scale": cfg.tower_lr_scale}],
                            lr=cfg.target_lr, betas=(0.9, 0.98), weight_decay=0.05)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 1), kind_weights=dict(cfg.kind_weights),
                           mirror=cfg.mirror, hard_weights=dict(cfg.hard_weights))
    model.train()
    t0, smooth = time.time(), Smoothed(0.98)
    for step in range(cfg.target_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.target_lr * g["scale"] * cosine(step, cfg.target_steps, cfg.warmup)
        ls = _target_step(model, next(batches), aux, place, retrieval, content, cfg, pixel)
        opt.zero_grad(set_to_none=True)
        (ls["lm"] + cfg.aux_weight * ls["aux"] + cfg.place_weight * ls["place"]
         + cfg.retrieval_weight * ls["retrieval"] + cfg.pixel_weight * ls["pixel"]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        measured = retrieval is not None and ls["share"] == ls["share"]   # nan: no supervised position in this batch
        smooth.add(loss=ls["lm"].item(), aux=ls["aux"].item(), place=ls["place"].item() if place else None,
                   retrieval=ls["retrieval"].item() if measured else None, share=ls["share"] if measured else None,
                   pixel=ls["pixel"].item() if pixel else None)
        _progress(log, "target", step, cfg.target_steps, smooth, t0, f"lr {opt.param_groups[0]['lr']:.2e} ")
        if items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            _quick_eval(model, processor, items, "target", log)
            if ckpt is not None:   # resumable: `train --only-draft` can start from here
                save(model, processor, ckpt)
    _drop_heads(model, (aux, place, pixel), retrieval)
    return {"vision": vision, "steps": cfg.target_steps, "final": smooth.values}


def _progress(log, role: str, step: int, total: int, smooth, t0: float, extra: str = "") -> None:
    """The training log's progress line, on the first step and every 50th."""
    if (step + 1) % 50 == 0 or step == 0:
        el = time.time() - t0
        log(f"[{role}] step {step + 1}/{total} {smooth.text()} {extra}{el / (step + 1):.3f}s/step "
            f"elapsed {el / 60:.1f}m")


def distil_draft(draft, target, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None) -> dict:
    """Teacher-forced distillation on the answers: KL(p_target || q_draft) at every answer position.
    -> {"vision": pretrain_vision's report, "steps", "final": smoothed kl, top-1 agreement and aux loss}."""
    aux = make_aux(draft, data, cfg)
    vision = pretrain_vision(draft, aux, data, cfg, "draft", log, steps=cfg.draft_vision_steps)
    retrieval = None
    if cfg.draft_retrieval_weight > 0 and data.retrieval is not None:
        retrieval = _retrieval_heads(draft, cfg.draft_retrieval_heads, data)
    place = _place_head(draft, data, cfg.draft_place_layer) if cfg.draft_place_weight > 0 else None
    pixel = make_pixel_aux(draft, cfg)
    params = [p for m in (draft, aux, place, pixel) if m for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.draft_lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 2), kind_weights=dict(cfg.draft_kind_weights),
                           mirror=cfg.mirror)
    target.eval()
    draft.train()
    t0, smooth = time.time(), Smoothed(0.98)
    for step in range(cfg.draft_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.draft_lr * cosine(step, cfg.draft_steps, cfg.warmup)
        batch = next(batches)
        labels = batch.pop("labels")
        vis_labels = batch.pop("vision_targets", None)
        ret_targets = batch.pop("retrieval_targets", None)
        px_targets = batch.pop("pixel_targets", None)
        mask = labels[:, 1:] != -100                                    # (B, L-1): positions predicting an answer token
        with torch.no_grad():
            p_logits = target(**batch).logits[:, :-1][mask]                     # (N, V)
        for head in (aux, pixel):
            if head:
                head.clear()
        if place:
            place.input_ids = batch["input_ids"]
        out = draft(**batch, output_attentions=retrieval is not None)
        q_logits = out.logits[:, :-1][mask]                                     # (N, V)
        loss = F.kl_div(F.log_softmax(q_logits, -1), F.log_softmax(p_logits, -1), log_target=True,
                        reduction="batchmean")
        a_loss = aux_loss(aux, vis_labels)
        r_loss, _ = retrieval.loss(out.attentions, batch["input_ids"], ret_targets) if retrieval else (0.0, 0.0)
        p_loss = _place_loss(place, vis_labels)
        x_loss = _pixel_loss(pixel, px_targets)
        opt.zero_grad(set_to_none=True)
        total = (loss + cfg.aux_weight * a_loss + cfg.draft_retrieval_weight * r_loss + cfg.draft_place_weight * p_loss
                 + cfg.pixel_weight * x_loss)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        smooth.add(kl=loss.item(), top1_agree=(q_logits.argmax(-1) == p_logits.argmax(-1)).float().mean().item(),
                   aux=a_loss.item(), **({"retrieval": r_loss.item()} if retrieval else {}),
                   **({"place": p_loss.item()} if place else {}), **({"pixel": x_loss.item()} if pixel else {}))
        _progress(log, "draft", step, cfg.draft_steps, smooth, t0)
        if items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            _quick_eval(draft, processor, items, "draft", log)
    _drop_heads(draft, (aux, place, pixel), retrieval)
    return {"vision": vision, "steps": cfg.draft_steps, "final": smooth.values}


def save(model, processor, path: Path) -> None:
    """The model and its processor; its config says that it reads every picture on the world's square canvas
    (media.square_canvas), as it was trained to."""
    from ..world import SIZE
    path.mkdir(parents=True, exist_ok=True)
    model.config.square_canvas = SIZE
    model.eval().save_pretrained(path)
    processor.save_pretrained(path)


def run(out: Path, cache: Path, cfg: TrainConfig, log=print, only_draft: bool = False) -> dict:
    """Train (or, with only_draft, re-distil the draft of the target already in `out`), save the pair in
    `out` and write out/summary.json; returns the summary. A re-distillation keeps the target's entries of
    the summary already in `out`."""
    t_all = time.time()
    log(f"[train] config {json.dumps(dataclasses.asdict(cfg))}")
    tok, processor, data, cache_seconds = prepare(cache, cfg, log)
    log(f"[data] {len(data)} training examples")
    items = None   # the quick evaluation's questions: fresh short ones
    if cfg.eval_every:
        items = [it for it in make_items(seed=-1, n=6) if it.example.kind not in DESCRIPTION_KINDS]
    earlier = json.loads((out / SUMMARY).read_text()) if only_draft and (out / SUMMARY).exists() else {}
    summary = {"config": dataclasses.asdict(cfg), "labels_version": LABELS_VERSION, "threads": torch.get_num_threads(),
               "only_draft": only_draft, "examples": len(data), "seconds": {"cache": cache_seconds},
               "target": earlier.get("target")}
    summary["seconds"]["target"] = earlier.get("seconds", {}).get("target")

    draft = M.build_model(cfg.draft, tok, seed=cfg.seed + 1, interleaved_rope=cfg.interleaved_rope)
    if only_draft:   # resume: the target in `out` is already trained
        from transformers import AutoModelForImageTextToText
        target = AutoModelForImageTextToText.from_pretrained(out / "tinyworld-target", dtype=torch.float32)
    else:
        target = M.build_model(cfg.target, tok, seed=cfg.seed, interleaved_rope=cfg.interleaved_rope)
    log(f"[train] target {M.n_params(target):,} params, draft {M.n_params(draft):,} params")
    init_patch_embed(draft, data, cfg, cfg.seed + 1)
    if not only_draft:
        init_patch_embed(target, data, cfg, cfg.seed)
        t0 = time.time()
        summary["target"] = train_target(target, data, processor, cfg, log, items, ckpt=out / "tinyworld-target")
        summary["seconds"]["target"] = time.time() - t0
        log(f"[target] trained in {summary['seconds']['target'] / 60:.1f} min")
        save(target, processor, out / "tinyworld-target")
    t0 = time.time()
    summary["draft"] = distil_draft(draft, target, data, processor, cfg, log, items)
    summary["seconds"]["draft"] = time.time() - t0
    log(f"[draft] distilled in {summary['seconds']['draft'] / 60:.1f} min")
    save(draft, processor, out / "tinyworld-draft")
    summary["seconds"]["total"] = time.time() - t_all
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    log(f"[train] done in {summary['seconds']['total'] / 60:.1f} min -> {out} (summary: {out / SUMMARY})")
    return summary
