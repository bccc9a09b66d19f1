"""Can a freshly initialised pair member learn to READ a small object? A probe on one question.

Single-object scenes, one question ("What colour is the shape?", or shape / position), the
same text for every image, so the only way to fit the answer word is through the image.
Minibatch AdamW on --n training scenes; the answer word is scored (argmax over the possible
answers) on the training scenes and on --held fresh scenes. `--aux W` adds the dense auxiliary
loss of vision_aux.py (per merged token: colour / shape / size / empty) with weight W, `--pre K`
first trains the vision tower and that head alone for K steps. "vision" in the log: accuracy of
the auxiliary head's colour (and shape) multi-hot on the non-empty tokens of the held-out scenes.

  python -m sage_engine.tinyworld.grounding_probe [--aux 1 --pre 200] [--question colour|shape|position]
      [--vision draft|target|deep|wide] [--steps 300] [--lr 2e-3] [--n 512] [--held 96] [--solid] [--white]
  python -m sage_engine.tinyworld.grounding_probe --vision-only CACHE [--anchor] [--vision target] [--steps 1000]
  python -m sage_engine.tinyworld.grounding_probe --place MODEL_DIR   (does each layer know where a token is?)

Text model: 2 layers, hidden 128; vision "draft" = 1 block hidden 64 (default), "target" = 2
blocks hidden 128, "deep" = 4 blocks hidden 128. Seen on this machine (Nov 2026, 1 thread):

- Without help the LM learns the language prior and ignores the image. Old overfit version
  (24 scenes, full batch): `--solid` (full-frame colour) fits in < 100 steps; a single small
  object does not (predictions collapse to one colour word), even on white, even with the tower
  frozen, after 800 steps; untied embeddings, 6x sharper q/k init, 0.05x or 10x merger output
  scale, LR 5e-4..3e-3 did not help. At init the merger output varies only 0.014 (std) across
  the 16 tokens of one image and 0.006 across images: the object barely shows.
  This version, colour, no aux, 512 scenes, lr 2e-3: held-out 0.17 after 100 steps (chance 1/6),
  answer loss stuck at ln 6 / 3 tokens.
- `--aux 1` (no pre-training), colour: held-out 0.90 at step 200 (0.83 at 300: lr 2e-3 is noisy).
- `--aux 1 --pre 200`, colour: held-out 1.00 (train 1.00) 100 LM steps after the vision stage,
  stays there (one wobble to 0.74 at step 300 of LM at lr 2e-3).
- shape is slower: with `--aux 1 --pre 300` the head reads colour 0.9-0.98 and shape 0.8-0.93 on
  non-empty held-out tokens (target/deep vision), but the 2-layer LM reaches only 0.2-0.3
  held-out in 200 LM steps; position (a word about WHERE, read through M-RoPE) 0.32 after 300.
  The dense loss fixes "the image does not reach the LM" (colour); shape is the open part.

Vision tower alone on the real training cache (`--vision-only CACHE`: tower + head, batch 32,
lr 2e-3, scored on 256 cached images kept out; exact match of the multi-hot group on tokens that
have that group's labels). Target-size tower (2 blocks, 128): colour 0.95 after 250 steps, 0.97
after 1250; size 0.54 -> 0.84; SHAPE 0.02 throughout (multi-object scenes: a token must name the
shape of the object fragment it holds). `--anchor` (shape / size only on the token holding the
object's centre): shape still 0.00-0.02 after 500 steps. 4 blocks of 256: shape 0.01 after 250.
With single objects (above) the head reached shape 0.8-0.9, probably through an image-global
feature that does not bind shapes to places. Shape does come, late: a 2,500-step run (target
tower, ~11 min) stays at shape <= 0.04 until step 1500, then 0.08 (1750), 0.16 (2000), 0.25 (2250)
while colour sits at 0.97 and size reaches 0.92.

Full run with this recipe (train.py defaults: 400 vision steps, aux weight 1, 4,000 target steps,
1,500 draft steps; 62.5 min at 1 thread), `eval --seed 1 --n 20`, vs the pair shipped before:
target 0.425 overall (was 0.305): colour 0.65 (0.40), count 0.825 (0.475), position 0.40 (0.15),
size 0.75 (0.55), shape 0.30 (0.15: it always says "triangle"), yesno 0.40 (0.75: always "No"),
motion / describe / describe_video 0.00 / 0.05 / 0.05 (same). Draft 0.32 (was 0.24). The image
now reaches the LM (colour, count, position, size), shapes do not (the tower has not learned
them after 400 + 4,000 steps, see above); yes/no and motion need the shape. Next: a much longer
vision stage (>= 3,000 steps; 0.27 s/step) before the LM, then smaller patches or more vision depth.
Tried at the end (target only, not shipped): 2,500 vision steps (aux 0.10 -> 0.05) + 1,200 target
steps, 24 min: 0.435 overall on the same eval (colour 0.70, count 0.875, size 0.80, position 0.20,
yesno 0.45, motion 0.05, describe 0.15) in less than half the time of the 4,000-step run; shape
answers now vary (circle / star / diamond / ...) but are right only 0.15: the LM needs the longer
vision stage AND more LM steps; not yet run end to end.

Why the tower did not learn shape on multi-object scenes (Nov 2026, target tower, batch 32,
lr 2e-3, 400-600 steps each, scored on 256 kept-out cache images; /tmp/tw3/exp.py-style runs,
then this file's --vision-only). Shape is now scored as the argmax of the six shape logits
against the shape of the object covering most of the block (>= 40 px; chance 1/6): the old
exact-match of a multi-hot group hid any partial progress.
- Not a label / order bug: blanking each 28 x 28 block changes exactly merged token r*4+c
  (blocks made identities), batch members do not mix, and the label grids printed next to
  rendered scenes match the objects. Attention is already global: window_size 112 = the whole
  8 x 8 patch grid, so every block attends to all 64 patches (fullatt_block_indexes moot).
- Old recipe (mean BCE over 15 multi-hot labels): shape argmax 0.22-0.25 after 400 steps
  (colour 0.96 exact): barely above chance. With `--anchor` style labels, wider MLP (4x),
  4 blocks, lr 6e-4: 0.3-0.43 at 400.
- Two causes. (1) The loss: six rare positive shape labels inside a BCE averaged with the
  colour labels give shape almost no gradient. A softmax cross-entropy on the dominant shape
  (other labels kept as BCE): 0.41 at 400. (2) The input conditioning: the patch embedding is
  a linear map of 14 x 14 pixel patches whose variance is almost all mean colour; the fine
  structure that separates a square's corner from a circle's sits in directions with
  100-1000x less variance, which a randomly initialised embedding passes on weakly and
  gradient descent grows slowly. A random projection of ZCA-whitened patches as the init
  (vision_aux.whiten_patch_embed, eps 1e-3): CE + whitening 0.39 / 0.57 / 0.65 at 200 / 300 /
  400 steps (colour slower: 0.48 at 400, rising). Whitening with the old BCE alone: 0.25 (colour
  0.95): both changes are needed. Weighting the BCE more (sum over labels, x3 the mean) brought
  colour back faster but shape down to 0.3-0.44 at 400-500; BCE weight 1 is the default.
  Whitening over video patches as well was worse (it amplifies the MP4 noise in the frame
  difference and shrinks the image features): the init whitens one frame and splits it over
  the two temporal slices.
- Videos now get the same targets per temporal patch group (frames 0-1 / 2-3 of the four
  the models see): vision_aux.clip_targets, 8 videos per vision pre-training step.
- Full run with that recipe (`train --threads 1 --recipe shape-ce --cache <seed-0 cache>`:
  train.SHAPE_CE = 1,500 vision steps with 8 videos each, whitened init, shape CE, 2,600 target
  steps, 400 + 1,200 draft steps; 51.8 min: target 43.0, draft 8.6). Vision stage, on 256
  training images: shape 0.31 / 0.69 / 0.80 / 0.88 / 0.94 / 0.96 at 250 / 500 / ... / 1,500
  steps (was ~0.02), colour exact 0.13 -> 0.81 (the old recipe had 0.95 after 250), size
  0.38 -> 0.79. `eval --seed 1 --n 20`, vs the shipped pair: target 0.345 overall (shipped
  0.425): shape 0.70 (0.30), yesno 0.40 (0.40), colour 0.25 (0.65), size 0.40 (0.75), count
  0.675 (0.825), position 0.30 (0.40), motion / describe / describe_video 0.00 / 0.05 / 0.00.
  Draft 0.235 (0.32). NOT shipped. The answers (`eval --show`) say "yellow", "bottom left" and
  "white background" almost whatever the picture: the LM reads the shape (and count) from the
  tokens but fell back to the prior for colour and position, and there is no background
  label in the aux targets. Likely causes, untested: colour is weaker in the tower than with
  the old recipe (0.81 vs 0.95-0.97: the CE dominates; a BCE weight of ~3 with the longer
  vision stage, or separate colour CE on the dominant object), and 2,600 LM steps instead of
  4,000. Next run to try: SHAPE_CE with BCE_WEIGHT 3, target_steps 4,000 (~75 min), and a
  background label per token.

One token per cell (Nov 2026, session 4; shipped). The world was re-laid so that each of the 3x3
cells is exactly one merged visual token (84 px images, 9 tokens; clips 18), the clips' sampled
frames 0, 2 | 4, 6 are cleanly before | after the event, and the size label of a growing or
shrinking object follows its drawn radius (it was the start size). Vision stage (800 steps):
colour 0.98, size 0.99, shape 1.00 on 256 training images (shape 0.97 after 250 steps; the old
geometry needed 1,500 steps for 0.96). Two full runs side by side (1 thread each, `eval --seed 1
--n 20`): without PlaceAux, tower at 0.3x LR, 5,000 target steps (75.9 min): target 0.54
(colour .85, count .825, size .80, shape .55, yesno .60, position .35, describe .30 / .30,
motion 0), draft 0.36: SHIPPED. With PlaceAux weight 0.3 on layer 1: behind at every check
(quick eval 0.29 vs 0.46 at 2,000 steps) and stopped. A third run drew a 2 px frame around each
picture so that the tower could tell cells apart and added row / column / change targets to the
tower's head (3,500 steps): target 0.345 (colour 0.00): not kept. What the shipped target still
gets wrong (`eval --show`): questions that go from a place to an attribute ("What shape is in the
bottom right?") are mostly right, the reverse ("Where is the red triangle?", descriptions) often
names the wrong place, and "what happens" names the wrong object or event: the answer needs WHERE
an attended token is, which no value vector carries (2D RoPE in the tower, RoPE in the LM).
Quick evals were still climbing at the end (0.60 at 4,000 -> 0.73 at 5,000 steps), so a longer
run is the next thing to try.

Where is a token? (session 5, `--place MODEL`: linear probe of row / column on each layer's hidden
state at the visual tokens, fresh scenes, chance 0.33). Shipped target: layer 0 (tower output) row
0.34 column 0.33, layers 1-6 row 0.68-0.82, column 0.39-0.42: the model never learned columns, so
"Where is X?" cannot be answered (its answers are almost always corners). The PlaceAux-0.3 run
(checkpoint at step 3,000): column 1.00 already at layer 0 and row 0.97-1.00 from layer 1 on.
Full runs of session 5 (1 thread each, side by side, 6,000 target steps): defaults only: target
0.515 (shape .85, colour .90, size .50, describe .10, position .35): longer alone does not help;
PlaceAux 0.3: 77.8 min total, `eval --seed 1 --n 20` target 0.47: position 0.55 (0.35), size 0.95,
count 0.85, shape 0.75, but colour 0.25 (0.85) and describe 0.00: place is learned, colour is lost.
Not shipped. Next: PlaceAux with row / column only (no change target) or a lower weight.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

import numpy as np
import torch

from . import models as M
from . import world as W
from .tokenizer import build_tokenizer, user_turn, world_corpus
from .training.vision_aux import VisionAux, scene_labels

QUESTIONS = {"colour": "What colour is the shape?", "shape": "What shape is it?", "position": "Where is the shape?"}
VISION = {"draft": (64, 1, 2), "target": (128, 2, 4), "deep": (128, 4, 4), "wide": (256, 4, 4)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--question", choices=list(QUESTIONS), default="colour")
    p.add_argument("--vision", choices=list(VISION), default="draft")
    p.add_argument("--aux", type=float, default=0.0, help="weight of the per-token auxiliary loss")
    p.add_argument("--pre", type=int, default=0, help="vision-only pre-training steps (needs --aux)")
    p.add_argument("--solid", action="store_true", help="full-frame patch of the object's colour")
    p.add_argument("--white", action="store_true", help="white background only")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--held", type=int, default=96)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vision-only", metavar="CACHE", help="train the tower + head alone on a training cache")
    p.add_argument("--anchor", action="store_true", help="--vision-only: shape/size labels on the centre token only")
    p.add_argument("--old", action="store_true", help="--vision-only: the old recipe (mean BCE over all labels, "
                   "default patch-embedding init, images only) instead of train.py's")
    p.add_argument("--whiten", type=float, default=1e-3, help="--vision-only: whiten_patch_embed eps (0 = off)")
    p.add_argument("--videos", type=int, default=8, help="--vision-only: videos per step (new recipe)")
    p.add_argument("--place", metavar="MODEL", help="linear probe: does each layer of a trained MODEL know where "
                   "each visual token is (row / column)?")
    return p.parse_args(argv)


class Probe:
    """One small model, single-object scenes and one question: can the answer be read from the picture?"""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        tok = build_tokenizer(world_corpus(200, 0))
        self.proc = M.build_processor(tok)
        vh, vd, vheads = VISION[a.vision]
        member = M.PairMember(hidden=128, layers=2, heads=2, kv_heads=1, ffn=384, vis_hidden=vh, vis_depth=vd,
                              vis_heads=vheads)
        self.model = M.build_model(member, tok)
        self.aux = VisionAux(self.model)
        self.rng = random.Random(0)
        self.train, self.held = self.make(a.n), self.make(a.held)
        self.words = sorted(set(self.train[1]) | set(self.held[1]))
        # first token of each answer; "top" / "top left" share one: then only the first token is scored
        self.first = {w: tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in self.words}
        self.ambiguous = len(set(self.first.values())) < len(self.first)
        self.pos = {"train": self.answer_pos(*self.train[:2]), "held": self.answer_pos(*self.held[:2])}
        self.labels = self.train[0]["input_ids"].clone()
        for i, q in enumerate(self.pos["train"]):
            self.labels[i, :q] = -100
        self.patches = int(self.train[0]["image_grid_thw"][0].prod())

    def answer(self, s: W.Scene) -> str:
        o = s.objects[0]
        return {"colour": o.colour, "shape": o.shape, "position": o.position}[self.a.question]

    def make(self, n: int):
        """n scenes -> (processor batch, true answers, per-token vision labels)."""
        a, rng = self.a, self.rng
        scenes = [W.sample_scene(rng, 1, 1) for _ in range(n)]
        if a.white:
            scenes = [dataclasses.replace(s, background="white") for s in scenes]
        if a.solid:
            imgs = [np.full((W.SIZE, W.SIZE, 3), W.COLOURS[s.objects[0].colour], np.uint8) for s in scenes]
        else:
            imgs = [W.render_image(s, noise_seed=rng.randrange(1 << 30)) for s in scenes]
        truth = [self.answer(s) for s in scenes]
        texts = [user_turn("image", QUESTIONS[a.question]) + f"It is {t}.<|im_end|>" for t in truth]
        enc = self.proc(text=texts, images=imgs, return_tensors="pt", padding=True)
        return enc, truth, torch.from_numpy(np.stack([scene_labels(s) for s in scenes]))

    def answer_pos(self, enc, truth) -> list[int]:
        """Index of each answer's first token (its last occurrence: after the question)."""
        return [max(k for k, x in enumerate(enc["input_ids"][i].tolist()) if x == self.first[t])
                for i, t in enumerate(truth)]

    def batch(self, enc, idx) -> dict:
        d = {k: enc[k][idx] for k in ("input_ids", "attention_mask", "mm_token_type_ids") if k in enc}
        n = self.patches
        d["pixel_values"] = torch.cat([enc["pixel_values"][i * n:(i + 1) * n] for i in idx.tolist()])
        d["image_grid_thw"] = enc["image_grid_thw"][idx]
        return d

    @torch.no_grad()
    def score(self, split: str):
        """(answer accuracy, [vision head exact on colour, on shape]) on `split`."""
        enc, truth, lab = self.train if split == "train" else self.held
        model, aux = self.model, self.aux
        model.eval()
        hits, vis = 0, []
        for k in range(0, len(truth), 48):
            idx = torch.arange(k, min(k + 48, len(truth)))
            logits = model(**self.batch(enc, idx)).logits
            feats = torch.cat(aux._feats)
            aux.clear()
            pred, gold = aux.head(feats).view(lab[idx].shape) > 0, lab[idx].bool()
            full = gold[..., -1] == 0
            vis.append([float((pred[full][:, s] == gold[full][:, s]).all(-1).float().mean())
                        for s in (slice(0, 6), slice(6, 12))])
            for j, i in enumerate(idx.tolist()):
                cand = {w: logits[j, self.pos[split][i] - 1, t].item() for w, t in self.first.items()}
                hits += self.first[max(cand, key=cand.get)] == self.first[truth[i]]
        model.train()
        return hits / len(truth), np.mean(vis, 0)

    def run(self) -> None:
        a, model, aux, train = self.a, self.model, self.aux, self.train
        opt = torch.optim.AdamW(list(model.parameters()) + list(aux.parameters()), a.lr, weight_decay=0.01)
        g = torch.Generator().manual_seed(0)
        t0 = time.time()
        print(f"answers {self.words}" + (" (scored on the first token)" if self.ambiguous else ""), flush=True)
        for step in range(a.pre + a.steps):
            idx = torch.randint(0, a.n, (a.batch,), generator=g)
            b = self.batch(train[0], idx)
            aux.clear()
            if step < a.pre:   # the vision tower and the head alone
                model.model.visual(b["pixel_values"], grid_thw=b["image_grid_thw"])
                loss = lm = aux.loss(train[2][idx])
            else:
                lm = model(**b, labels=self.labels[idx]).loss
                loss = lm + a.aux * aux.loss(train[2][idx]) if a.aux else lm
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 50 == 0 or step == a.pre + a.steps - 1:
                stage = "vision" if step < a.pre else "lm"
                tr = self.score("train")[0] if step >= a.pre else float("nan")
                he, vis = self.score("held")
                print(f"step {step} [{stage}] loss {lm.item():.3f} answer right: train {tr:.2f} held-out {he:.2f} | "
                      f"vision head on objects: colour {vis[0]:.2f} shape {vis[1]:.2f} | {time.time() - t0:.0f}s",
                      flush=True)


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    if a.vision_only:
        return vision_only(a)
    if a.place:
        from .place_probe import place_probe
        return place_probe(a.place)
    Probe(a).run()


def _anchor_labels(data) -> np.ndarray:
    """Replay the cache's scene stream (seed 0, 3 questions per image): centre-token labels per image."""
    from .training.data import IMAGE_WEIGHTS, sample_kind
    from .language import image_example
    from .training.vision_aux import token_labels
    rng, labels = random.Random(0), np.zeros_like(data.labels)
    for i in range(len(data.images)):
        scene = W.sample_scene(rng)
        rng.randrange(1 << 30)
        labels[i] = token_labels(scene.objects, anchor=True)
        for kind in sample_kind(rng, IMAGE_WEIGHTS, 3):
            image_example(scene, rng, kind)
    return labels


def _report(aux, feats, lab, dom) -> str:
    """Exact match of the colour / size multi-hot on blocks that have one; shape argmax vs the dominant shape."""
    from .training.vision_aux import SHAPE
    with torch.no_grad():
        lg = aux.head(feats).view(lab.shape)
    pred, r = lg > 0, []
    for s in (slice(0, 6), slice(12, 14)):
        has = lab[..., s].any(-1)
        r.append(float((pred[has][:, s] == lab[has][:, s]).all(-1).float().mean()))
    d = dom.long()
    r.append(float((lg[..., SHAPE].argmax(-1)[d >= 0] == d[d >= 0]).float().mean()))
    return "colour {:.2f} size {:.2f} shape {:.2f}".format(*r)


def vision_only(a) -> None:
    """Tower + head alone on a training cache; scored on the last 256 images / 64 videos (kept out).
    Printed: exact match of the colour / size multi-hot on blocks that have one, and the argmax of the
    six shape logits against the block's dominant shape (vision_aux.token_targets; chance 1/6)."""
    from pathlib import Path
    from transformers import PreTrainedTokenizerFast
    from .training.trainset import TrainSet
    from .training.train import aux_loss
    from .training.vision_aux import whiten_patch_embed
    cache = Path(a.vision_only)
    tok = PreTrainedTokenizerFast.from_pretrained(cache / "tokenizer")
    data = TrainSet.load(cache, tok)
    n, nv = len(data.images), len(data.videos)
    if a.anchor:
        data.labels = _anchor_labels(data)
    vh, vd, vheads = VISION[a.vision]
    model = M.build_model(dataclasses.replace(M.TARGET, vis_hidden=vh, vis_depth=vd, vis_heads=vheads), tok)
    if not a.old and a.whiten > 0:
        whiten_patch_embed(model, data.patch_sample(1000, 0), a.whiten, 0)
    aux = VisionAux(model)
    params = list(model.model.visual.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)

    held, vheld = list(range(n - 256, n)), list(range(nv - 64, nv))
    hp, hg = data.image_pixels(held)
    hl = torch.from_numpy(data.labels[held]).bool()
    tg = data.targets
    if tg is not None:
        vp, vg = data.video_pixels(vheld)
    rng, t0 = random.Random(0), time.time()
    for step in range(a.steps + 1):
        if step % 250 == 0:
            with torch.no_grad():
                aux.clear()
                model.model.visual(hp, grid_thw=hg)
                feats = torch.cat(aux._feats)
                line = f"step {step} held-out images: "
                if tg is None:
                    line += _report(aux, feats, hl, torch.full(hl.shape[:2], -1))
                else:
                    line += _report(aux, feats, hl, torch.from_numpy(tg["image_dom"][held]))
                    model.model.visual(vp, grid_thw=vg)
                    line += " | videos: " + _report(aux, torch.cat(aux._vfeats),
                                                    torch.from_numpy(tg["video_labels"][vheld]).bool(),
                                                    torch.from_numpy(tg["video_dom"][vheld]))
                aux.clear()
            print(f"{line} | {time.time() - t0:.0f}s", flush=True)
        if step == a.steps:
            break
        ids = rng.sample(range(n - 256), a.batch)
        pix, grid = data.image_pixels(ids)
        aux.clear()
        model.model.visual(pix, grid_thw=grid)
        if a.old or tg is None:
            loss = aux.loss(torch.from_numpy(data.labels[ids]))
        else:
            vids = rng.sample(range(nv - 64), a.videos) if a.videos else []
            if vids:
                model.model.visual(*data.video_pixels(vids))
            loss = aux_loss(aux, data.vision_targets(ids, vids))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


if __name__ == "__main__":
    main()
