"""Train the tinyworld pair from scratch: 1. tokenizer, 2. rendered + tokenized cache,
3. target (cross-entropy on answers), 4. draft distilled from the target
(teacher-forced KL(p_target || q_draft) on the same answers), 5. save both with the processor.

Both models first get a vision pre-training stage and keep a dense auxiliary loss on their
merged visual tokens throughout (vision_aux.py: a training-only linear head predicts which
colour / shape / size, or nothing, occupies each 28 x 28 block; with shape_ce the shape of the
object covering most of it, a whitened-patch init and per-temporal-group video targets).
Without the auxiliary loss the language model learns the language prior and ignores the
image (grounding_probe.py has the numbers).

Each cell of the world is exactly one merged visual token (world.py), so the tower's targets are
exact per token. `--place-weight` adds PlaceAux to the target (vision_aux.py): a training-only head
that makes an early language-model layer write each visual token's row / column / temporal group / change into
its state, because nothing in the architecture puts WHERE into a value vector. The vision tower
learns at tower_lr_scale x the language model's rate once its pre-training is done.

The defaults reproduce the shipped pair (the model cards carry the command, the measured minutes
and the evaluation): interleaved M-RoPE, PlaceAux 0.1 at layer 1, the retrieval loss (retrieval.py) 0.3 on
layer 2 head 0 and layer 4 head 0 (a "no" answer supervised on its near misses), questions drawn with kind
weights yes/no 2.5, colour 2, motion 2, shape 1.5, position 1.5, 11,000 target steps, 4,000 draft steps (run T1
below).
Before retrieval supervision (the pair shipped until Nov 2026: 5,000 steps, none of these options) the target
reached 0.54 (seed 1 n 20) / 0.48 (seed 2 n 40). Options measured on the way, in order:
- place_weight 0.1 with place_rowcol_only: the language-model loss keeps pace with the defaults (0.503 vs 0.513
  at 3,000 steps), unlike weight 0.3 with all targets (0.585).
- interleaved_rope (models.mrope_section) + the above, 6,000 steps: 0.50 / 0.48; position 0.60 / 0.40
  (old pair 0.35 / 0.20) but size 0.55 / 0.45 (0.80 / 0.75).
- content_weight: answer tokens that name a fact weigh more than phrasing (most of the loss is phrasing that
  no picture decides); measured by the mean loss per word class (colour, shape, size, place words).
- kind_weights: descriptions are 71% of the answer tokens and 40% of the tokens of the default draw (data.py
  IMAGE_WEIGHTS / VIDEO_WEIGHTS); drawing them less often puts more of each step on the attribute questions.
- Run S (Nov 2026): interleaved_rope + place_weight 0.1 rowcol + content_weight 2 + kind weights describe 0.4,
  describe_video 0.5, motion 1.5, size 1.5; 6,000 steps at 2 threads (43 min, 0.34-0.41 s/step). Target 0.445 on
  seed 1 n 20 (old pair 0.54): colour 0.75, count 0.65, size 0.80, shape 0.55, position 0.30, motion 0. Mean loss of
  the fact words on fresh scenes (teacher-forced, seed 5, 16 scenes + 16 clips; old pair in brackets): colour 0.74
  (0.84), place 0.59 (0.72), shape 0.62 (0.53), size 0.61 (0.36), count 0.67 (0.30). Like the interleaved run above,
  count and size get worse; colour and place better. Not shipped.
- Run D (Nov 2026): the old recipe (contiguous M-RoPE, no PlaceAux) + content_weight 2 + the kind weights of S,
  6,000 steps at 2 threads (41 min): target 0.44 on seed 1 n 20 (colour 0.65, count 0.70, size 0.70, shape 0.55,
  position 0.30); fact-word losses colour 0.78, place 0.87, shape 0.59, size 0.58, count 0.62. Worse than the
  old pair on count, size and place: fewer descriptions took away grounded signal (a description names every
  object's size, colour, shape and place; a question names one fact), more than the extra questions gave. Not shipped.
- More steps alone: the old target trained on for 1,500 steps at lr 3e-4 (no aux head, default draw; the same
  with descriptions drawn 2x): fact-word losses a little lower (colour 0.77, count 0.21-0.22, place 0.67-0.68, shape
  0.53-0.54, size 0.32-0.33), accuracy the same within noise (seed 1 n 20: 0.49 / 0.525; seed 2 n 40: 0.50 vs
  old pair 0.48). The recipe is near its plateau.
- Why (attention_probe.py): at the fact word no head selects the object the question asks about (its share of the
  visual attention is at most ~2x that of another object's cell), and a wrong colour is nearly always the colour of
  another object in the scene. The next lever is retrieval (e.g. a training-only loss on a head's attention to the
  asked object's token), not the tower or the amount of data.
- Retrieval supervision (retrieval.py, `--retrieval-weight`): a training-only loss on the attention of layer 2
  head 0 and layer 4 head 0: at every answer token, the share of the head's visual attention on the tokens of the
  object the sentence is about (from the scene's ground truth). Run R (Nov 2026): + interleaved_rope + place_weight
  0.1 (all PlaceAux targets, change included), weight 0.3, 6,000 steps at 2 threads (34.6 min, 0.31-0.33 s/step:
  eager attention costs no more than sdpa here). Target 0.845 on seed 1 n 20 (old pair 0.54): colour 0.70, count
  0.95, shape 0.90, size 1.00, position 0.95, yesno 0.95, motion 0.70, describe 0.60, describe_video 0.75; at 3,000
  steps already 0.75. The language-model loss fell faster too (0.25 at the end vs ~0.39 for the old recipe).
  The supervised heads select the asked object (attention_probe, seed 3 n 40: colour 0.87 on the asked cell vs
  0.10 on another object's; shape 0.96 vs 0.03), fact word top-1 colour 0.90, shape 1.00. What is left: colour
  asked by shape alone ("What is the colour of the diamond?" -> another object's colour) and motion events told
  apart wrongly (a recolour or an appearance read as a size change or a move).
- Run R2 (Nov 2026, the shipped pair, the defaults): R + colour and motion questions drawn 2x, 9,000 target steps
  (54.8 min), draft distilled 4,000 steps (15.5 min; with 1,500 its top-1 agreement with the target was 0.76 and
  sage 1.32x ar, with 4,000 0.82 and 1.55x). Target 0.865 on seed 1 n 20 (colour 0.95, count 1.00, size 1.00,
  position 0.95, motion 0.95, shape 0.85, yesno 0.75, describe 0.45, describe_video 0.75) and 0.8625 on seed 2
  n 40 (colour 0.975, count 0.975, size 0.975, shape 0.95, position 0.85, motion 0.875, yesno 0.725); draft
  0.44 / 0.41. Still below 0.95: yes/no (a false "yes" when one attribute matches: "Is there a blue circle?" with
  a purple circle; a "no" answer has no object to supervise), shape / position on one seed, motion on the other.
- Run T1 (Nov 2026, the shipped pair, the defaults): R2 + a retrieval target for "no" answers (the objects that
  share the asked colour or shape: retrieval.near_misses) + yes/no drawn 2.5x, shape and position 1.5x, 11,000
  target steps (69.0 min at 2 threads, 0.36 s/step). Target 0.915 on seed 1 n 20 (colour 1.00, count 1.00, size
  1.00, position 1.00, yesno 1.00, shape 0.95, motion 0.85, describe 0.55, describe_video 0.80) and 0.91 on seed 2
  n 40 (colour 0.95, count 0.99, size 1.00, position 1.00, yesno 0.975, shape 0.925, motion 0.85); on the bar
  test's scenes (seed 321 n 20) every attribute >= 0.95 except motion 0.85. Yes/no went from 0.73-0.75 to
  0.975-1.00 and position from 0.85-0.95 to 1.00; motion (drawn relatively less often than in R2) is what is left:
  most misses name the wrong object for a disappearance, or the wrong colour for a size change.
  Its first draft, distilled with the target's kind weights (15.9 min), gave sage 1.35x ar (tau 5.41) where
  R2's gave 1.55x on a slower day: fewer descriptions in the draw, and descriptions are the long answers
  speculation pays on. Re-distilled with `--only-draft` in the natural mix (draft_kind_weights, now the default,
  13.4 min, top-1 agreement 0.82): tau 5.44, sage 1.35x / 1.41x / 1.35x ar in three benchmark runs with R2's
  pair run between them at 1.39x / 1.47x / 1.34x (ar 131-165 tok/s that day vs 114 when R2 measured 1.55x).
  Draft 0.40 / 0.45.
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
from .data import TrainSet, build_cache, build_retrieval_targets, check_against_processor, replay_image_labels
from .evaluate import evaluate, make_items
from .retrieval import TARGETS_FILE, RetrievalAux
from .vision_aux import PlaceAux, VisionAux, whiten_patch_embed
from .tokenizer import build_tokenizer, world_corpus


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
    interleaved_rope: bool = True   # M-RoPE frequencies shared t/h/w in turn (models.mrope_section)
    content_weight: float = 1.0   # loss weight of answer tokens that name a fact (content_tokens) vs phrasing tokens
    tower_lr_scale: float = 0.3   # learning rate of the vision tower while the language model trains, x target_lr
    kind_weights: tuple[tuple[str, float], ...] = (("motion", 2.0), ("colour", 2.0), ("yesno", 2.5), ("shape", 1.5), ("position", 1.5))   # (kind, weight) drawing weights of training examples (data.KINDS; 1 if absent)
    draft_kind_weights: tuple[tuple[str, float], ...] = ()   # the same for the draft's distillation; none: the natural draw,
                                  # where descriptions carry most answer tokens (the long texts speculation pays on)
    retrieval_weight: float = 0.3  # weight of the retrieval loss (retrieval.py) on the target's retrieval_heads
    retrieval_heads: tuple[tuple[int, int], ...] = ((2, 0), (4, 0))   # (decoder layer, attention head) pairs it supervises
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
        if cfg.retrieval_weight > 0 and not (cache / TARGETS_FILE).exists():
            t0 = time.time()
            build_retrieval_targets(cache, tok, cfg.seed, cfg.n_images, cfg.n_videos)
            log(f"[data] retrieval targets replayed in {time.time() - t0:.0f}s")
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


def content_tokens(tok) -> torch.Tensor:
    """Bool (vocab,): the token ids that spell the world's facts (colours, shapes, sizes, numbers, places,
    events, yes / no), with and without a leading space or capital. Most of the answer loss sits on
    phrasing choices ("There", "The", "In", ...) that no picture decides; content_weight > 1 moves the
    gradient towards the words the picture does decide."""
    from .language import NUMBERS
    from .world import COLOURS, POSITIONS, SHAPES, SIZES
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
    place = PlaceAux(model, layer, data.image_token, data.video_token, cfg.place_rowcol_only) if cfg.place_weight > 0 else None
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
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 1), kind_weights=dict(cfg.kind_weights))
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
    batches = data.batches(cfg.batch_size, random.Random(cfg.seed + 2), kind_weights=dict(cfg.draft_kind_weights))
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
