"""Train the tinyworld pair from scratch: 1. tokenizer, 2. rendered + tokenized cache,
3. target (cross-entropy on answers), 4. draft distilled from the target
(teacher-forced KL(p_target || q_draft) on the same answers), 5. save both with the processor.

Both models first get a vision pre-training stage and keep a dense auxiliary loss on their
merged visual tokens throughout (vision_aux.py: a training-only linear head predicts which
colour / shape / size, or nothing, occupies each 28 x 28 block; with shape_ce the shape of the
object covering most of it, a whitened-patch init and per-temporal-group video targets).
Without the auxiliary loss the language model learns the language prior and ignores the
image (RUNS.md has the numbers).

Each cell of the world is exactly one merged visual token (world.py), so the tower's targets are
exact per token. `--place-weight` adds PlaceAux to the target (vision_aux.py): a training-only head
that makes an early language-model layer write each visual token's row / column / temporal group / change into
its state, because nothing in the architecture puts WHERE into a value vector. The vision tower
learns at tower_lr_scale x the language model's rate once its pre-training is done. Half the examples are
shown left-right mirrored (`mirror`, trainset.TrainSet.collate): the same facts in the other column, so that a
question asked by place cannot be answered from the mirrored cell.

The retrieval loss also supervises each short question's tokens once the question has named its object
(`prompt_targets`), and within a kind the questions a partial match gets wrong are drawn more often
(`hard_weights`).

TrainConfig's defaults reproduce the shipped pair (run H3 in RUNS.md, which lists the recipes measured on
the way with their figures; the model cards carry the command, the measured minutes and the evaluation).
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

from .. import models as M
from .data import (HARD_FILE, build_cache, build_hard_flags, build_prompt_targets, build_retrieval_targets,
                   check_against_processor, replay_image_labels)
from ..evaluate import evaluate, make_items
from .retrieval import PROMPT_TARGETS_FILE, RetrievalAux, targets_file
from .vision_aux import PlaceAux, VisionAux, whiten_patch_embed
from ..tokenizer import build_tokenizer, world_corpus
from .trainset import TrainSet


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0                 # seeds the corpus, the cache, the init and the batch order
    n_images: int = 24_000        # rendered image scenes (3 questions each)
    n_videos: int = 8_000         # rendered clips (2 questions each)
    batch_size: int = 16
    target_steps: int = 11_000
    target_lr: float = 1.5e-3
    draft_steps: int = 4_000
    draft_lr: float = 3e-3
    warmup: int = 200
    eval_every: int = 1_000       # quick QA eval (fresh scenes) every so many steps; 0 = never
    aux_weight: float = 1.0       # weight of the per-visual-token auxiliary loss (0 = off)
    vision_steps: int = 800       # vision-only pre-training steps (auxiliary loss alone) before the target
    draft_vision_steps: int = 800 # the same before the draft
    vision_batch: int = 32        # images per vision pre-training step
    vision_video_batch: int = 8   # videos per vision pre-training step (needs shape_ce)
    vision_lr: float = 2e-3
    whiten_eps: float = 1e-3      # patch-embedding init: whitened patches (0 = the default random init)
    shape_ce: bool = True         # aux targets: dominant-shape cross-entropy + videos (False: one mean BCE, images)
    place_weight: float = 0.1     # weight of the target's PlaceAux loss (row / column / group / change of each visual token)
    place_layer: int = 1          # the target decoder layer whose output PlaceAux reads
    place_rowcol_only: bool = False  # PlaceAux asks for row and column only (no temporal group / change)
    place_before: bool = True     # PlaceAux also asks each second-group video token what its cell held before (U2; T1: off)
    interleaved_rope: bool = True   # M-RoPE frequencies shared t/h/w in turn (models.mrope_section)
    content_weight: float = 1.0   # loss weight of answer tokens that name a fact (content_tokens) vs phrasing tokens
    tower_lr_scale: float = 0.3   # learning rate of the vision tower while the language model trains, x target_lr
    kind_weights: tuple[tuple[str, float], ...] = (("motion", 2.0), ("colour", 2.0), ("yesno", 2.5), ("shape", 1.5), ("position", 1.5))   # (kind, weight) drawing weights of training examples (data.KINDS; 1 if absent)
    hard_weights: tuple[tuple[str, float], ...] = (("position", 3.0), ("yesno", 2.0), ("size", 2.0))   # (kind, factor):
                                  # within the kind, confusable examples (retrieval.confusable) drawn factor x as
                                  # often, the kind's total unchanged (H1; M1: none)
    draft_kind_weights: tuple[tuple[str, float], ...] = ()   # the same for the draft's distillation; none: the natural draw,
                                  # where descriptions carry most answer tokens (the long texts speculation pays on)
    retrieval_weight: float = 0.3  # weight of the retrieval loss (retrieval.py) on the target's retrieval_heads
    retrieval_heads: tuple[tuple[int, int], ...] = ((2, 0), (4, 0))   # (decoder layer, attention head) pairs it supervises
    prompt_targets: tuple[str, ...] = ("colour", "shape", "size", "position", "yesno", "count", "motion")   # kinds whose
                                  # questions' tokens the retrieval loss also supervises once the question has named
                                  # its object (retrieval.prompt_targets; H3: every short question; H2: all but
                                  # motion; M1: none)
    event_targets: str = "both"   # retrieval target of an event sentence (retrieval.EVENT_GROUPS; T1: "evidence")
    mirror: float = 0.5           # share of training examples shown left-right mirrored (trainset.TrainSet.collate; M1; U2: 0)
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
        if cfg.aux_weight > 0 and not ((cache / "image_labels.npy").exists() and (cache / "vision_targets.npz").exists()):
            t0 = time.time()
            replay_image_labels(cache, cfg.seed, cfg.n_images, cfg.n_videos)
            log(f"[data] per-token vision labels replayed in {time.time() - t0:.0f}s")
        if cfg.hard_weights and not (cache / HARD_FILE).exists():
            build_hard_flags(cache, cfg.seed, cfg.n_images, cfg.n_videos)
            log("[data] confusable-example flags replayed")
        if cfg.retrieval_weight > 0 and cfg.prompt_targets and not (cache / PROMPT_TARGETS_FILE).exists():
            build_prompt_targets(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos, event_groups=cfg.event_targets)
            log("[data] prompt retrieval targets replayed")
        if cfg.retrieval_weight > 0 and not (cache / targets_file(cfg.event_targets)).exists():
            t0 = time.time()
            build_retrieval_targets(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos, event_groups=cfg.event_targets)
            log(f"[data] retrieval targets replayed in {time.time() - t0:.0f}s")
    else:
        t0 = time.time()
        tok = build_tokenizer(world_corpus(2000, cfg.seed))
        log(f"[data] tokenizer: {len(tok)} tokens")
        build_cache(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos, log=log, event_groups=cfg.event_targets)
        build_hard_flags(cache, cfg.seed, cfg.n_images, cfg.n_videos)
        build_prompt_targets(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos, event_groups=cfg.event_targets)
        tok.save_pretrained(cache / "tokenizer")
        log(f"[data] cache built in {time.time() - t0:.0f}s")
    processor = M.build_processor(tok)
    check_against_processor(processor)
    return tok, processor, TrainSet.load(cache, tok, cfg.event_targets,
                                             cfg.prompt_targets if cfg.retrieval_weight > 0 else ())


def _quick_eval(model, processor, items, tag: str, log) -> None:
    res, _ = evaluate(model, processor, 0, 0, items=items)
    model.train()
    log(f"[{tag}] quick eval: acc {res['accuracy']:.3f} " + " ".join(f"{k}={v:.2f}" for k, v in res["by_kind"].items()))


def content_tokens(tok) -> torch.Tensor:
    """Bool (vocab,): the token ids that spell the world's facts (colours, shapes, sizes, numbers, places,
    events, yes / no), with and without a leading space or capital. Most of the answer loss sits on
    phrasing choices ("There", "The", "In", ...) that no picture decides; content_weight > 1 moves the
    gradient towards the words the picture does decide."""
    from ..language import NUMBERS
    from ..world import COLOURS, POSITIONS, SHAPES, SIZES
    words = set(COLOURS) | set(SHAPES) | set(SIZES) | set(NUMBERS) | {w for p in POSITIONS for w in p.split()}
    words |= {"middle", "side", "corner", "moves", "appears", "disappears", "vanishes", "grows", "shrinks", "turns",
              "changes", "larger", "smaller", "yes", "no"}
    mask = torch.zeros(len(tok), dtype=torch.bool)
    for w in words:
        for form in (w, " " + w, w.capitalize(), " " + w.capitalize()):
            ids = tok(form, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:   # forms BPE splits are left out: their pieces spell other words too
                mask[ids] = True
    return mask


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, content: torch.Tensor, weight: float) -> torch.Tensor:
    """Next-token cross-entropy on the labelled positions, content tokens weighted `weight` (mean over weights)."""
    lab = labels[:, 1:]
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), lab, reduction="none", ignore_index=-100)
    w = torch.where(content[lab.clamp(min=0)], weight, 1.0) * (lab != -100)
    return (ce * w).sum() / w.sum()


def make_aux(model, data: TrainSet, cfg: TrainConfig) -> VisionAux | None:
    return VisionAux(model) if cfg.aux_weight > 0 and data.labels is not None else None


def aux_loss(aux: VisionAux | None, targets: dict | None, shape_ce: bool = True) -> torch.Tensor:
    """The auxiliary loss of the forward just run (0 without visual targets or without aux).
    shape_ce=False: the first recipe (mean BCE over all labels, images only)."""
    if aux is None:
        return torch.zeros(())
    if not shape_ce:
        targets = targets and {"image": targets["image"] and (targets["image"][0], None), "video": None}
    if not targets or (targets["image"] is None and targets["video"] is None):
        aux.clear()
        return torch.zeros(())
    img = targets["image"] or (None, None)
    return aux.loss(img[0], img[1], targets["video"])


def init_patch_embed(model, data: TrainSet, cfg: TrainConfig, seed: int) -> None:
    if cfg.whiten_eps > 0 and cfg.aux_weight > 0:
        whiten_patch_embed(model, data.patch_sample(1000, 0), cfg.whiten_eps, seed)


def pretrain_vision(model, aux: VisionAux | None, data: TrainSet, cfg: TrainConfig, tag: str, log=print,
                    steps: int | None = None) -> None:
    """Vision tower + auxiliary head alone, on the per-token targets (the language model is untouched)."""
    steps = cfg.vision_steps if steps is None else steps
    if aux is None or steps <= 0:
        return
    params = list(model.model.visual.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.vision_lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = data.image_batches(cfg.vision_batch, random.Random(cfg.seed + 3), cfg.vision_video_batch)
    model.train()
    probe = list(range(min(256, len(data.images))))   # progress on a fixed set of (training) images
    probe_targets = data.vision_targets(probe, [])["image"] if cfg.shape_ce else None
    probe_pix = data.image_pixels(probe) if probe_targets and probe_targets[1] is not None else None
    t0, run = time.time(), 0.0
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cfg.vision_lr * cosine(step, steps, min(cfg.warmup, steps // 4 + 1))
        pix, grid, vpix, vgrid, targets = next(batches)
        aux.clear()
        model.model.visual(pix, grid_thw=grid)
        if vpix is not None:
            model.model.visual(vpix, grid_thw=vgrid)
        loss = aux_loss(aux, targets, cfg.shape_ce)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        run = 0.95 * run + 0.05 * loss.item() if step else loss.item()
        if (step + 1) % 50 == 0 or step == 0:
            log(f"[{tag}-vision] step {step + 1}/{steps} aux {run:.4f} elapsed {(time.time() - t0) / 60:.1f}m")
        if ((step + 1) % 250 == 0 or step + 1 == steps) and probe_pix is not None:
            aux.clear()
            with torch.no_grad():
                model.model.visual(probe_pix[0], grid_thw=probe_pix[1])
            c, z, sh = aux.scores(*probe_targets)
            log(f"[{tag}-vision] step {step + 1} on {len(probe)} training images: colour {c:.2f} size {z:.2f} shape {sh:.2f}")
    aux.clear()


def train_target(model, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None, ckpt: Path | None = None):
    aux = make_aux(model, data, cfg)
    content = content_tokens(processor.tokenizer) if cfg.content_weight != 1.0 else None
    pretrain_vision(model, aux, data, cfg, "target", log)
    layer = min(cfg.place_layer, model.config.text_config.num_hidden_layers - 1)
    place = (PlaceAux(model, layer, data.image_token, data.video_token, cfg.place_rowcol_only, cfg.place_before)
             if cfg.place_weight > 0 else None)
    retrieval = None
    if cfg.retrieval_weight > 0 and data.retrieval is not None:
        tc = model.config.text_config   # a smaller config (tests) gets the nearest layer / head
        heads = tuple(sorted({(min(l, tc.num_hidden_layers - 1), h % tc.num_attention_heads) for l, h in cfg.retrieval_heads}))
        retrieval = RetrievalAux(heads, data.image_token, data.video_token)
        model.set_attn_implementation("eager")   # the loss reads attention weights
    tower = list(model.model.visual.parameters())
    rest = [p for p in model.parameters() if all(p is not t for t in tower)]
    rest += (list(aux.parameters()) if aux else []) + (list(place.parameters()) if place else [])
    params = rest + tower
    opt = torch.optim.AdamW([{"params": rest, "scale": 1.0}, {"params": tower, "scale": cfg.tower_lr_scale}],
                            lr=cfg.target_lr, betas=(0.9, 0.98), weight_decay=0.05)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 1), kind_weights=dict(cfg.kind_weights),
                           mirror=cfg.mirror, hard_weights=dict(cfg.hard_weights))
    model.train()
    t0, run, run_aux, run_place, run_ret, run_share = time.time(), 0.0, 0.0, 0.0, 0.0, 0.0
    for step in range(cfg.target_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.target_lr * g["scale"] * cosine(step, cfg.target_steps, cfg.warmup)
        batch = next(batches)
        if aux:
            aux.clear()
        vis_labels = batch.pop("vision_targets", None)
        ret_targets = batch.pop("retrieval_targets", None)
        if place:
            place.input_ids = batch["input_ids"]
        out = model(**batch, output_attentions=retrieval is not None)
        if content is None:
            loss = out.loss
        else:
            loss = weighted_lm_loss(out.logits, batch["labels"], content, cfg.content_weight)
        a_loss = aux_loss(aux, vis_labels, cfg.shape_ce)
        p_loss = place.loss(vis_labels["video"][0] if vis_labels and vis_labels["video"] else None) if place else 0.0
        r_loss, share = retrieval.loss(out.attentions, batch["input_ids"], ret_targets) if retrieval else (0.0, 0.0)
        del out
        opt.zero_grad(set_to_none=True)
        (loss + cfg.aux_weight * a_loss + cfg.place_weight * p_loss + cfg.retrieval_weight * r_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        run = 0.98 * run + 0.02 * loss.item() if step else loss.item()
        run_aux = 0.98 * run_aux + 0.02 * a_loss.item() if step else a_loss.item()
        if place:
            run_place = 0.98 * run_place + 0.02 * p_loss.item() if step else p_loss.item()
        if retrieval and share == share:   # nan: no supervised position in this batch
            run_ret = 0.98 * run_ret + 0.02 * r_loss.item() if step else r_loss.item()
            run_share = 0.98 * run_share + 0.02 * share if step else share
        if (step + 1) % 50 == 0 or step == 0:
            el = time.time() - t0
            log(f"[target] step {step + 1}/{cfg.target_steps} loss {run:.4f} aux {run_aux:.4f} "
                + (f"place {run_place:.4f} " if place else "")
                + (f"retrieval {run_ret:.4f} share {run_share:.2f} " if retrieval else "") +
                f"lr {opt.param_groups[0]['lr']:.2e} {el / (step + 1):.3f}s/step elapsed {el / 60:.1f}m")
        if items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            _quick_eval(model, processor, items, "target", log)
            if ckpt is not None:   # resumable: `train --only-draft` can start from here
                save(model, processor, ckpt)
    for head in (aux, place):
        if head:
            head.remove()   # the heads are not part of the model
    if retrieval:
        model.set_attn_implementation("sdpa")
    return model


def distil_draft(draft, target, data: TrainSet, processor, cfg: TrainConfig, log=print, items=None):
    """Teacher-forced distillation on the answers: KL(p_target || q_draft) at every answer position."""
    aux = make_aux(draft, data, cfg)
    pretrain_vision(draft, aux, data, cfg, "draft", log, steps=cfg.draft_vision_steps)
    params = list(draft.parameters()) + (list(aux.parameters()) if aux else [])
    opt = torch.optim.AdamW(params, lr=cfg.draft_lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 2), kind_weights=dict(cfg.draft_kind_weights),
                           mirror=cfg.mirror)
    target.eval(); draft.train()
    t0, run, agree_run = time.time(), 0.0, 0.0
    for step in range(cfg.draft_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.draft_lr * cosine(step, cfg.draft_steps, cfg.warmup)
        batch = next(batches)
        labels = batch.pop("labels")
        vis_labels = batch.pop("vision_targets", None)
        batch.pop("retrieval_targets", None)
        mask = labels[:, 1:] != -100                                           # (B, L-1): positions predicting an answer token
        with torch.no_grad():
            p_logits = target(**batch).logits[:, :-1][mask]                     # (N, V)
        if aux:
            aux.clear()
        q_logits = draft(**batch).logits[:, :-1][mask]                          # (N, V)
        loss = F.kl_div(F.log_softmax(q_logits, -1), F.log_softmax(p_logits, -1), log_target=True, reduction="batchmean")
        a_loss = aux_loss(aux, vis_labels, cfg.shape_ce)
        opt.zero_grad(set_to_none=True)
        (loss + cfg.aux_weight * a_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
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
    if aux:
        aux.remove()
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
        train_target(target, data, processor, cfg, log, items, ckpt=out / "tinyworld-target")
        log(f"[target] trained in {(time.time() - t0) / 60:.1f} min")
        save(target, processor, out / "tinyworld-target")
    t0 = time.time()
    distil_draft(draft, target, data, processor, cfg, log, items)
    log(f"[draft] distilled in {(time.time() - t0) / 60:.1f} min")
    save(draft, processor, out / "tinyworld-draft")
    log(f"[train] done in {(time.time() - t_all) / 60:.1f} min -> {out}")
