"""Model cards (README.md) for the shipped pair, written from measured numbers only: an `eval --json`
result, the summary.json the training run wrote (train.py: its config, steps and seconds), and
`timing.measure` run here and now."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...policies import POLICY_NAMES
from ..language import DESCRIPTION_KINDS
from ..world import CLIP_FPS, CLIP_FRAMES, MODEL_FRAMES, OCCLUSION, SIZE
from .data import IMAGE_TOKENS, VIDEO_TOKENS

ATTRIBUTES = ("colour", "shape", "size", "position", "count", "yesno", "motion")
BAR = 0.97  # every attribute, pooled over the fresh seeds
DESCRIPTION_BAR = 0.90  # every (size, colour, shape) triple right, none invented, pooled
SEED_BAR = 0.95  # a single seed's attribute below this is named on the card


def _aux_text(tc: dict, labels_version: int) -> str:
    """What the auxiliary heads predict, as the card's clause (PlaceAux only with a place weight)."""
    text = ("which colours / sizes, or nothing, fill each 28x28 cell and the shape of the object covering most\n"
            "of it, images and each temporal patch group of the clips")
    if labels_version >= 3:
        text += ("; also which shapes and which (size, colour, shape) triples show in the cell, so that the\n"
                 "token of a cell with an occluding pair says which colour and size go with which shape")
    if tc["whiten_eps"] > 0:
        text += "; patch embedding initialised from whitened\npatches"
    if tc["place_weight"] > 0:
        text += (f". While the target's language model trains, a second training-only head (weight "
                 f"{tc['place_weight']}) on its layer-{tc['place_layer']} state at\n"
                 "each visual token predicts the token's row, column, temporal group and whether its cell changed\n"
                 "and, for a clip's second temporal group, what its cell held before\n"
                 "(vision_aux.PlaceAux), so that later layers can read WHERE an attended object is")
    return text


def _mix_text(tc: dict) -> str:
    """The data-mix options of the training config, as a clause (empty for the plain recipe)."""
    out = ""
    if tc.get("occlusion", OCCLUSION) != OCCLUSION:
        out += (f"; {tc['occlusion']:.0%} of the training scenes of 3 or 4 objects have an occluding pair "
                f"(the world's own share, which the evaluation draws: {OCCLUSION:.0%})")
    if tc["content_weight"] != 1.0:
        out += f"; answer tokens that name a fact weigh {tc['content_weight']:g}x the phrasing"
    if tc["kind_weights"]:
        out += "; examples" + _weights_text(tc["kind_weights"])
    if tc["hard_weights"]:
        descriptions = ("and descriptions of scenes with an occluding pair "
                        if any(k in DESCRIPTION_KINDS for k, _ in tc["hard_weights"]) else "")
        out += ("; within a kind, questions a partial match answers wrongly (another object shares the named one's "
                f"colour or shape, or the named one is in an occluding pair) {descriptions}drawn "
                + ", ".join(f"{k} {w:g}x" for k, w in tc["hard_weights"]) + " as often, each kind's share unchanged")
    if tc["mirror"]:
        out += (f"; {tc['mirror']:.0%} of the short-question examples shown left-right mirrored (picture flipped, "
                "'left' / 'right' swapped, per-token targets moved with their tokens; descriptions, which name their "
                "objects in reading order with the place first, never)")
    if tc["interleaved_rope"]:
        out += "; M-RoPE frequencies interleaved over t / h / w"
    if tc["retrieval_weight"] > 0:
        heads = ", ".join(f"layer {layer} head {h}" for layer, h in tc["retrieval_heads"])
        out += f"; retrieval loss {tc['retrieval_weight']:g} on the attention of {heads} (retrieval.py"
        if tc["prompt_targets"]:
            out += ("; also on a question's tokens once it has named its object, for "
                    + ", ".join(tc["prompt_targets"]) + " questions")
        out += "; an event sentence's target: its cells in both temporal groups)"
    return out


def _weights_text(weights) -> str:
    return " drawn with kind weights " + ", ".join(f"{k} {w:g}" for k, w in weights)


def _draft_draw(tc: dict) -> str:
    """How the draft's distillation drew its examples."""
    weights = tc["draft_kind_weights"]
    if weights:
        return "," + _weights_text(weights)
    return ", drawn in their natural mix (descriptions carry most answer tokens)"


def _draft_retrieval(tc: dict) -> str:
    """The retrieval loss on the draft's heads, where its distillation had one."""
    w = tc.get("draft_retrieval_weight", 0.0)
    if not w:
        return ""
    heads = ", ".join(f"layer {layer} head {h}" for layer, h in tc["draft_retrieval_heads"])
    return f", plus the retrieval loss {w:g} on the attention of {heads}"


def _draft_place(tc: dict) -> str:
    """PlaceAux on the draft's layer, where its distillation had it."""
    w = tc.get("draft_place_weight", 0.0)
    return f" and PlaceAux {w:g} on its layer-{tc['draft_place_layer']} state" if w else ""


def _seed_dips(eval_result: dict) -> list[str]:
    """The attributes a single seed of a pooled `eval --seeds` result has below SEED_BAR, as 'position 0.92 on seed 4
    (n 100)'; empty when every seed meets it (or the result is one seed's)."""
    return [f"{k} {r['target']['by_kind'][k]:.3f} on seed {seed} (n {r['n']})"
            for seed, r in eval_result.get("per_seed", {}).items()
            for k in ATTRIBUTES if r["target"]["by_kind"].get(k, 1.0) < SEED_BAR]


def _seeds_text(eval_result: dict) -> str:
    seeds = eval_result.get("per_seed", {})
    return "; seeds " + ", ".join(f"{s} (n {r['n']})" for s, r in seeds.items()) if seeds else ""


def _status(eval_result: dict, note: str = "") -> str:
    """The card's status line, from the pooled table and, for a pooled result, each seed's; `note` is appended."""
    t = eval_result["target"]["by_kind"]
    below = ([f"{k} {t[k]:.3f}" for k in ATTRIBUTES if k in t and t[k] < BAR]
             + [f"{k} {t[k]:.3f}" for k in DESCRIPTION_KINDS if k in t and t[k] < DESCRIPTION_BAR])
    seeds = eval_result.get("per_seed")
    if seeds:
        dips = _seed_dips(eval_result)
        note = (f"Pooled over {len(seeds)} fresh seeds; "
                + (f"every seed alone has every attribute >= {SEED_BAR:.0%}." if not dips
                   else f"single seeds dip below {SEED_BAR:.0%}: " + ", ".join(dips) + ".")
                + (f" {note}" if note else ""))
    note = f" {note}" if note else ""
    bar = f">= {BAR:.0%} on every attribute and >= {DESCRIPTION_BAR:.0%} on descriptions of images and of clips"
    if not below:
        return (f"> **Status: meets the project's accuracy bar** ({bar} for the target, fresh scenes, table below)."
                f"{note}\n")
    return (f"> **Status: does not meet the project's accuracy bar yet** ({bar}; the target is below it on: "
            f"{', '.join(below)}; table below).{note}\n")


def store_bf16(src, dst) -> None:
    """Copy a trained pair member to `dst` with bfloat16 weights (half the bytes; the engine loads float32); its
    config says that it reads every picture on the world's square canvas (media.square_canvas)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..world import SIZE
    model = AutoModelForImageTextToText.from_pretrained(src, dtype=torch.float32).to(torch.bfloat16)
    model.config.square_canvas = SIZE
    model.save_pretrained(dst)
    AutoProcessor.from_pretrained(src).save_pretrained(dst)


def _arch(model) -> str:
    t, v = model.config.text_config, model.config.vision_config
    sec = t.rope_parameters["mrope_section"]
    interleaved = len(sec) > 3 and set(sec) == {1}
    rope = (f"M-RoPE interleaved ({len(sec)} one-frequency sections, t / h / w in turn)" if interleaved
            else f"M-RoPE sections {sec}")
    return (f"text: {t.num_hidden_layers} layer(s), hidden {t.hidden_size}, {t.num_attention_heads} heads "
            f"({t.num_key_value_heads} KV), FFN {t.intermediate_size}, vocab {t.vocab_size}, {rope}; "
            f"vision: {v.depth} block(s), hidden {v.hidden_size}, "
            f"patch 14, 2x2 merge")


def _tree_forward_text(report: dict) -> str:
    how = report.get("tree_forward") or {}
    parts = {"layers": "through its decoder layers directly (sage_engine/backends/hf_layers.py)",
             "fused": "with fused products (sage_engine/backends/fused_torch.py)",
             "fused+packed": "with fused products on oneDNN-packed weights (sage_engine/backends/fused_torch.py)",
             "fused+numpy": "with fused products computed in NumPy (sage_engine/backends/numpy_host.py)"}
    said = [f"the {who}'s {parts[how[who]]}" for who in ("target", "draft") if how.get(who) in parts]
    return "; decode steps: " + ", ".join(said) if said else ""


def _bench_text(bench: dict | None) -> str:
    """The benchmark section from `bench --out` reports: {"cmd": ..., "float32": report, "bfloat16": report}."""
    if not bench:
        return ""
    fp = bench["float32"]
    # the engine's policies in their order, then any other spec the benchmark ran (e.g. sage:threshold=cost)
    names = [k for k in POLICY_NAMES if k in fp["policies"]] + [k for k in fp["policies"] if k not in POLICY_NAMES]
    rows = "\n".join(f"| {k} | {p['mean_accepted']:.2f} | {p['tokens_per_second']:.1f} | "
                     f"{p['speedup_vs_ar'] or 1:.2f}x | {p['exact_match_vs_ar']:.2f} |"
                     for k, p in ((k, fp["policies"][k]) for k in names))
    sage, static = fp["policies"].get("sage"), fp["policies"].get("static")
    out = f"""
## Speculative decoding with this pair (the engine's benchmark)

`{bench['cmd']}` on this 2-core CPU ({fp['inputs']} inputs, {fp['max_new_tokens']} new tokens at most,
{fp['threads']} thread(s), float32, the default{_tree_forward_text(fp)}):

| policy | tau | tok/s | speedup vs ar | exact match vs ar |
|---|---|---|---|---|
{rows}
"""
    if sage and static:
        out += (f"\nsage tau / static tau = {sage['mean_accepted'] / static['mean_accepted']:.2f}. "
                f"The draft's alpha varies within a run (mean std {sage['alpha_std_within_run']:.2f} for sage).\n")
    bf = bench.get("bfloat16")
    if bf and "sage" in bf["policies"]:
        b = bf["policies"]
        faster = fp["policies"]["sage"]["tokens_per_second"] >= b["sage"]["tokens_per_second"]
        out += (f"In bfloat16 (`--dtype bfloat16`): ar {b['ar']['tokens_per_second']:.1f} tok/s, sage "
                f"{b['sage']['tokens_per_second']:.1f} tok/s ({b['sage']['speedup_vs_ar']:.2f}x of bf16 ar, tau "
                f"{b['sage']['mean_accepted']:.2f}, exact match {b['sage']['exact_match_vs_ar']:.2f}); float32 is "
                f"{'faster' if faster else 'slower'} here and is the default.\n")
    return out


def _minutes_text(summary: dict) -> str:
    """Cache, target, draft and total time of the run, from summary.json's seconds."""
    sec = summary["seconds"]
    cache = f"{sec['cache']:.0f} s" if sec.get("cache") is not None else "reused from an earlier run of the same seed"
    mins = {k: f"{sec[k] / 60:.1f}" if sec.get(k) is not None else "?" for k in ("target", "draft", "total")}
    if summary.get("only_draft"):
        return (f"cache {cache},\ntarget {mins['target']} min (an earlier run), draft re-distilled alone in "
                f"{mins['draft']} min.")
    return f"cache {cache},\ntarget {mins['target']} min, draft {mins['draft']} min, total {mins['total']} min."


def _training_text(summary: dict, train_threads: int, train_note: str) -> str:
    """The card's training section, from the run's summary.json (its TrainConfig and its seconds)."""
    tc = summary["config"]
    distil = _draft_draw(tc) + _draft_retrieval(tc) + _draft_place(tc)  # what the draft's distillation added
    return f"""## Training

`python -m sage_engine.tinyworld train --threads {train_threads}` (seeded; writes both models). \
Data: {tc['n_images']:,}
rendered images x 3 questions and {tc['n_videos']:,} clips (through an MP4 round trip) x 2 questions: detailed
descriptions, count, colour, shape, size, position, yes/no, "what happens". Each model's vision tower
first trains alone for {tc['vision_steps']} steps (draft: {tc['draft_vision_steps']}) on a dense auxiliary loss \
(a training-only linear head on the merged
visual tokens predicts {_aux_text(tc, summary.get('labels_version', 1))}: scene ground truth), which then stays
on (weight {tc['aux_weight']}; the tower then learns at {tc['tower_lr_scale']}x the language model's rate); \
the head is not saved.
Each of the world's 3x3 cells is exactly one merged visual token, so these targets are exact per token. \
The target is trained with
cross-entropy on the answers ({tc['target_steps']:,} steps of batch {tc['batch_size']}, AdamW, \
cosine{_mix_text(tc)}); the draft is distilled from
the target, teacher-forced KL(p_target || q_draft) on the same answers{distil} \
({tc['draft_steps']:,} steps, learning rate {tc['draft_lr']:g}).
Measured on this 2-core CPU, {train_threads} thread(s), {train_note}: {_minutes_text(summary)}"""


def _occluded_text(eval_result: dict) -> str:
    """The target's accuracy on the evaluated images that have an occluding pair (two shapes in one cell, so in
    one visual token), a line for the card; empty for an evaluation made before `eval` reported it."""
    occ, n = eval_result["target"].get("occluded"), eval_result["target"].get("n_occluded")
    if not occ:
        return ""
    return (f"\nOn the {n} of the {eval_result['n']} images that have an occluding pair (two shapes in one cell, so "
            "one visual token shows both), the target scores " + ", ".join(f"{k} {v:.3f}" for k, v in occ.items())
            + ".\n")


def eval_section(eval_result: dict, eval_cmd: str) -> str:
    """The card's evaluation section: the world's table (pooled, lowest seed, draft), the occluded images' line and,
    when the evaluation scored them (`eval --pictures`), the facts of held-out pictures and clips from outside it."""
    kinds = sorted(eval_result["target"]["by_kind"])
    seeds = eval_result.get("per_seed", {})
    lowest = {k: min((r["target"]["by_kind"][k], seed) for seed, r in seeds.items()) for k in kinds} if seeds else {}
    table = "\n".join(f"| {k} | {eval_result['target']['by_kind'][k]:.3f} |"
                      + (f" {lowest[k][0]:.3f} (seed {lowest[k][1]}) |" if seeds else "")
                      + f" {eval_result['draft']['by_kind'][k]:.3f} |" for k in kinds)
    header = ("| kind | target | target, lowest seed | draft |\n|---|---|---|---|" if seeds else
              "| kind | target | draft |\n|---|---|---|")
    total = (f"| **all** | **{eval_result['target']['accuracy']:.3f}** |" + (" |" if seeds else "")
             + f" **{eval_result['draft']['accuracy']:.3f}** |")
    return f"""## Evaluation (fresh scenes, never seen in training)

`{eval_cmd}`: greedy answers scored against the ground truth
(n = {eval_result['n']} images with one question of each image kind, and {eval_result['n']} clips \
with one of each video kind{_seeds_text(eval_result)}).
A description counts as right when it names exactly the true (size, colour, shape) triples.

{header}
{table}
{total}
{_occluded_text(eval_result)}{_pictures_text(eval_result)}"""


def _pictures_text(eval_result: dict) -> str:
    """The facts of held-out pictures and clips from outside the world (`eval --pictures`), per fact, as a table."""
    t, d = eval_result["target"].get("pictures"), eval_result["draft"].get("pictures")
    if not t:
        return ""
    rows = "\n".join(f"| {k} | {v:.3f} | {d['by_fact'].get(k, float('nan')):.3f} |" for k, v in t["by_fact"].items())
    return f"""
### Pictures and clips from outside the world (held out)

{t['n']} questions about held-out pictures and clips (pictures.py: generated ones of a stream training never
drew, crops of photos training never saw, and every packaged held-out photo and video whole), each answer scored
fact by fact against what pixels.py computes from the pixels (`kind`: it says the picture is not one of shapes and
names no shape; `region`: each of the 3 x 3 cells named with a colour covering at least 30% of it; `main`,
`brightness`, `brightest`, `darkest`, `colour` (at an asked place), and for clips `change` and `motion`).
Clean text (no stutter, glued words or character runs): target {t['clean']:.3f}, draft {d['clean']:.3f}.

| fact | target | draft |
|---|---|---|
{rows}
"""


def finetune_card(models_dir: Path, eval_result: dict, summary: dict, eval_cmd: str, ft_cmd: str,
                  title: str = "") -> None:
    """Rewrite both cards after `finetune`: the status line and evaluation section from `eval_result`, and a
    section on this fine-tune (its command, data and minutes) after the sections of the training and of any earlier
    fine-tune, which stay (the pair was trained on from them); the benchmark section of the older pair is dropped.
    title: the section's heading (default: "on pictures from outside the world" for the first fine-tune, "again:
    which cell holds a colour or the light" for the second)."""
    ft, sec = summary["finetune"], summary["seconds"]
    minutes = ", ".join(f"{k} {sec[k] / 60:.1f} min" for k in ("cache", "target", "draft", "total") if k in sec)
    described = (f", the world's descriptions drawn {ft['describe_weight']:g}x"
                 if ft.get("describe_weight") is not None else "")
    pixels = (f", and the towers asked each cell's colours and lightness (weight {ft['pixel_weight']:g})"
              if ft.get("pixel_weight") else "")
    for role in ("target", "draft"):
        path = models_dir / f"tinyworld-{role}" / "README.md"
        text = path.read_text()
        head, rest = text.split("## Training", 1)
        training, rest = rest.split("## Evaluation", 1)
        again = "## Fine-tuned on pictures" in training
        title = f"## {title}" if title else (
            "## Fine-tuned again: which cell holds a colour or the light" if again
            else "## Fine-tuned on pictures from outside the world")
        start = "the weights of the section above" if again else "the weights above"
        section = f"""{title}

`{ft_cmd}` ({summary['threads']} threads, {minutes}) trained the pair on from {start} (seed {ft['seed']}):
{ft['world_images']:,} fresh world scenes x 3 questions and {ft['world_videos']:,} clips x 2, with
{ft['pictures']:,} pictures x 3 and {ft['picture_clips']:,} clips x 2 of pictures.py's training split (gradients,
noise fields, blobs, stripes, horizons and jittered crops of packaged photos; clips that pan, lighten, darken or
recolour a region), their answers made from their pixel facts (pixels.py, picture_talk.py){described}: the target
{ft['target_steps']:,} steps (learning rate {ft['target_lr']:g}, the answers' cross-entropy and the retrieval loss:
a world answer's heads look at its objects' cells, a picture answer's at the cells its words name, picture_data.py's
`picture_spans`{pixels}), then the draft distilled from it {ft['draft_steps']:,} steps. Every picture and frame
reaches the pair squeezed onto its {SIZE} x {SIZE} canvas (config `square_canvas`: the engine does it).

"""
        tail = rest.split("## Per-forward cost", 1)[1].split("## Speculative decoding with this pair", 1)[0]
        lines = head.splitlines()
        lines[2] = _status(eval_result).rstrip("\n")
        head = "\n".join(lines).replace("6 colours, 6 shapes, 2 sizes, 9 positions, 1-4 objects, occlusion and 6 kinds "
                                        "of event.", "6 colours, 6 shapes, 2 sizes, 9 positions, 1-4 objects, "
                                        "occlusion and 6 kinds of event; in any other picture or clip it says what "
                                        "its 3 x 3 regions show (colours, light and dark, what changes).")
        path.write_text(head + "\n## Training" + training.rstrip("\n") + "\n\n" + section
                        + eval_section(eval_result, eval_cmd) + "\n## Per-forward cost" + tail.rstrip("\n") + "\n")


def write_cards(models_dir: Path, eval_result: dict, summary: dict, timing: dict, eval_cmd: str,
                bench: dict | None = None, train_threads: int | None = None, train_note: str = "shared with other work",
                eval_note: str = "") -> None:
    """Write README.md into both model folders. summary: the training run's summary.json; train_threads
    defaults to the threads it records."""
    from transformers import AutoModelForImageTextToText
    train_threads = summary["threads"] if train_threads is None else train_threads
    pair = {r: AutoModelForImageTextToText.from_pretrained(models_dir / f"tinyworld-{r}") for r in ("target", "draft")}
    n = {r: sum(p.numel() for p in m.parameters()) for r, m in pair.items()}
    dtype = json.loads((models_dir / "tinyworld-target" / "config.json").read_text()).get("dtype", "float32")
    storage = ("Stored in bfloat16 (safetensors, to keep the repository small); the engine loads it in float32 "
               "by default\n  (`--dtype`)." if dtype == "bfloat16" else "Stored in float32 (safetensors).")
    for role, model in pair.items():
        other = "draft" if role == "target" else "target"
        text = f"""# tinyworld-{role}

{_status(eval_result, eval_note)}
The {role} of SAGE's embedded default VLM pair (its {other}: `tinyworld-{other}`), trained from scratch
on the procedurally generated tinyworld (`sage_engine/tinyworld/`): coloured shapes on plain
backgrounds, and short clips in which one thing happens. Not a general-purpose model: it knows
6 colours, 6 shapes, 2 sizes, 9 positions, 1-4 objects, occlusion and 6 kinds of event.

- Architecture: `Qwen2_5_VLForConditionalGeneration` (processor `Qwen2_5_VLProcessor`), {_arch(model)}.
- Parameters: {n[role]:,} (target {n['target']:,} = {n['target'] / n['draft']:.1f}x the draft's {n['draft']:,}).
- {storage} Load with `AutoModelForImageTextToText.from_pretrained` and
  `AutoProcessor.from_pretrained`; both work offline (`HF_HUB_OFFLINE=1`).
- Inputs: images are resized to {SIZE}x{SIZE} pixels = {IMAGE_TOKENS} visual tokens \
(one per cell of the world's 3x3 grid). Videos: pass
  {MODEL_FRAMES} frames sampled uniformly (`video_processor.num_frames` = {MODEL_FRAMES}) with
  `do_sample_frames=False` and `video_metadata`; the training clips are {CLIP_FRAMES}-frame MP4s at
  {CLIP_FPS:g} fps ({VIDEO_TOKENS} visual tokens: two temporal groups, before and after the event).
- Tokenizer: byte-level BPE (any text encodes) trained on the world's corpus, Qwen chat template and
  special tokens, shared by target and draft.

{_training_text(summary, train_threads, train_note)}
{eval_section(eval_result, eval_cmd)}
## Per-forward cost on this CPU (fp32, {torch.get_num_threads()} thread(s), 130-token cached prefix, median ms)

Measured by `python -m sage_engine.tinyworld card` (sage_engine/tinyworld/training/timing.py) \
on a machine shared with other work.

| forward | ms |
|---|---|
""" + "\n".join(f"| {k.replace('_', ', ')} tokens | {v} |" for k, v in timing.items()) + "\n" + _bench_text(bench)
        (models_dir / f"tinyworld-{role}" / "README.md").write_text(text)
