"""Benchmark: every policy on every image and video of a folder, interleaved per input.

Timings on a shared machine drift, so contenders are compared inside one run: after a
warm-up, each input is decoded by every policy back to back (the order rotates from one
input to the next), and speeds are reported as ratios to `ar` measured the same way.
Besides the engine's policies, `hf_generate` and `hf_assisted[:schedule=...]` run transformers'
own generate() as outside references (hf_reference.py); their ids are checked against `ar` too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
from collections import Counter
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch

from ..core.engine import SpecEngine
from ..core.events import GenerationResult
from ..core.sampling import Sampling
from ..errors import InputError, SageError
from ..models.inputs import PreparedInput, prepare_input
from ..models.loading import ModelPair
from ..models.pruning import VisualPruning
from ..policies import make_policy, policy_names
from .hf_reference import HF_POLICIES, hf_notes, is_hf_spec, parse_hf_spec, run_hf
from .premise import premise

IMAGE_EXT = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
VIDEO_EXT = {".mp4", ".avi", ".mov", ".mkv", ".webm"}
DEFAULT_PROMPT = "Describe the image in detail."
DEFAULT_VIDEO_PROMPT = "Describe what happens in the video in detail."


def check_spec(spec: str) -> None:
    """ValueError (one line) unless `spec` is a bench policy: an engine policy with knobs, or an HF reference."""
    name = spec.split(":")[0]
    if name in HF_POLICIES:
        parse_hf_spec(spec)
    elif name == "priced" or name in policy_names():
        make_policy(spec)  # its knobs checked (priced:SPEC: SPEC's)
    else:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join((*policy_names(), *HF_POLICIES))} "
                         "(or priced:NAME)")


def needs_draft(spec: str) -> bool:
    """True when `spec` (already checked) cannot run without a draft model."""
    if is_hf_spec(spec):
        return parse_hf_spec(spec).name == "hf_assisted"
    return make_policy(spec).uses_draft


@dataclass(frozen=True)
class BenchInput:
    path: str  # the media file; for a text input, a name for it (benchmark file and row)
    media: str  # "image" | "video" | "text"
    prompt: str


def find_inputs(folder: str, prompt: str | None = None) -> list[BenchInput]:
    """Media files of `folder`, each with its own prompt from prompts.jsonl when the folder has one."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"--inputs is not a directory: {folder}")
    own: dict[str, str] = {}
    prompts_file = root / "prompts.jsonl"
    if prompts_file.is_file():
        for line in prompts_file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                own[row["file"]] = row["prompt"]
    found = []
    for f in sorted(root.iterdir()):
        ext = f.suffix.lower()
        media = "image" if ext in IMAGE_EXT else "video" if ext in VIDEO_EXT else None
        if media is None:
            continue
        fallback = prompt or (DEFAULT_PROMPT if media == "image" else DEFAULT_VIDEO_PROMPT)
        found.append(BenchInput(str(f), media, own.get(f.name, fallback)))
    if not found:
        raise InputError(f"no images or videos in {folder}")
    return found


def prepare_bench_input(pair: ModelPair, inp: BenchInput) -> PreparedInput:
    """The processor's inputs for one bench input (an image, a video, or a text prompt alone)."""
    return prepare_input(pair, inp.prompt, images=[inp.path] if inp.media == "image" else [],
                         video=inp.path if inp.media == "video" else None)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (Linux: KiB)


def _run_record(inp: BenchInput, res: GenerationResult, ar_ids: list[int] | None) -> dict:
    s = res.stats
    alphas = [e.root_alpha for e in res.steps if e.root_alpha is not None]
    decode = [e for e in res.steps if e.kind == "decode"]
    return {
        "input": os.path.basename(inp.path),
        "media": inp.media,
        "policy": res.policy,
        **s.to_dict(),
        "tokens_per_step": [len(e.new_token_ids) for e in decode],
        "alpha_mean": statistics.fmean(alphas) if alphas else None,
        "alpha_std": statistics.pstdev(alphas) if len(alphas) > 1 else None,
        "tree_nodes_mean": statistics.fmean(len(e.tree.tokens) for e in decode) if decode else 0.0,
        "root_width_mean": statistics.fmean(e.tree.parents.count(-1) for e in decode) if decode else 0.0,
        **_depth_counts(decode),
        "overhead_ms_per_step": 1e3 * s.other_seconds / len(decode) if decode else 0.0,
        "exact_match_vs_ar": None if ar_ids is None else res.token_ids == ar_ids,
        "token_ids": res.token_ids,
    }


def _depth_counts(decode) -> dict:
    """Per tree level l (index l - 1): steps whose verified tree reached depth l, and steps whose accepted
    path did. Their ratio is the policy's acceptance-through rate by depth: how deep drafting still paid."""
    drafted: list[int] = []
    accepted: list[int] = []
    for e in decode:
        depth = max(e.tree.depths, default=0)
        drafted += [0] * (depth - len(drafted))
        accepted += [0] * (depth - len(accepted))
        for level in range(depth):
            drafted[level] += 1
            accepted[level] += level < len(e.accepted_nodes)
    return {"depth_drafted": drafted, "depth_accepted": accepted}


def _sum_lists(lists: list[list[int]]) -> list[int]:
    return [sum(col) for col in zip_longest(*lists, fillvalue=0)]


def _weighted(pairs: list[tuple[float, int]]) -> float | None:
    """The mean of values weighted by counts (steps), None without any weight."""
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def _aggregate(runs: list[dict], ar_tps: float | None) -> dict:
    steps = sum(r["target_forwards"] for r in runs)
    decode_tokens = sum(r["mean_accepted"] * r["target_forwards"] for r in runs)  # HF runs have no step events
    tokens = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    decode_s = sum(r["target_seconds"] + r["draft_seconds"] + r["other_seconds"] for r in runs)
    tps = tokens / seconds if seconds else 0.0
    alpha_std = [r["alpha_std"] for r in runs if r["alpha_std"] is not None]
    matches = [r["exact_match_vs_ar"] for r in runs if r["exact_match_vs_ar"] is not None]
    drafted = _sum_lists([r["depth_drafted"] for r in runs])
    accepted = _sum_lists([r["depth_accepted"] for r in runs])
    return {
        "mean_accepted": decode_tokens / steps if steps else 0.0,
        "tokens_per_second": tps,
        "speedup_vs_ar": tps / ar_tps if ar_tps else None,
        "exact_match_vs_ar": sum(matches) / len(matches) if matches else None,
        "target_forwards": steps,
        "draft_forwards": sum(r["draft_forwards"] for r in runs),
        "overhead_fraction": sum(r["other_seconds"] for r in runs) / decode_s if decode_s else 0.0,
        "overhead_ms_per_step": 1e3 * sum(r["other_seconds"] for r in runs) / steps if steps else 0.0,
        "time_split": {
            "prefill": sum(r["prefill_seconds"] for r in runs) / seconds if seconds else 0.0,
            "verify": sum(r["target_seconds"] for r in runs) / seconds if seconds else 0.0,
            "draft": sum(r["draft_seconds"] for r in runs) / seconds if seconds else 0.0,
            "other": sum(r["other_seconds"] for r in runs) / seconds if seconds else 0.0,
        },
        "alpha_std_within_run": statistics.fmean(alpha_std) if alpha_std else None,
        "alpha_mean": _weighted([(r["alpha_mean"], r["target_forwards"]) for r in runs if r["alpha_mean"] is not None]),
        "root_width_mean": _weighted([(r.get("root_width_mean") or 0.0, r["target_forwards"]) for r in runs]),
        "tree_nodes_mean": sum(r["tree_nodes_mean"] * r["target_forwards"] for r in runs) / steps if steps else 0.0,
        "tree_depth_mean": sum(drafted) / steps if steps else 0.0,  # levels verified per step
        "accepted_by_depth": [a / d for a, d in zip(accepted, drafted)],  # P(accepted path reaches l | tree does)
        "draft_paths": dict(sum((Counter(r.get("draft_paths") or {}) for r in runs), Counter())),
        "draft_path_why": list(dict.fromkeys(w for r in runs for w in r.get("draft_path_why") or ())),
        "new_tokens": tokens,
        "seconds": seconds,
    }


def run_bench(pair: ModelPair, inputs: list[BenchInput], policies: list[str], max_new_tokens: int,
              warmup: int = 1, progress=None, draft_pruning: VisualPruning | None = None,
              tree_forward: str = "auto", sampling: Sampling | None = None, rounds: int = 1,
              engine: SpecEngine | None = None) -> dict:
    """Decode every input with every policy (ar first in the list is added if missing); returns the report.

    rounds: decode each input with every policy this many times, the policies back to back in rotating order each
    round; per input and policy the report keeps the run of median wall time (all rounds' times in
    `round_seconds`), so a stall of the shared machine during one run does not decide an input's speedup. An input's
    own speedup (`speedup_vs_ar` of its run) is the median over rounds of the speedup within each round, where the
    policy and ar ran back to back (`paired_speedup`). engine: an engine of `pair` to run on (its own draft_pruning
    and backends, the two flags then unused), so that many benches in a row check the models' layers once."""
    check_rounds(rounds)
    policies = ["ar"] + [p for p in policies if p != "ar"]
    engine = engine or SpecEngine(pair, draft_pruning=draft_pruning, tree_forward=tree_forward)
    prepared = [prepare_bench_input(pair, i) for i in inputs]
    for prep in prepared[:warmup]:  # warm-up: allocator, kernels, caches
        for pol in policies:
            _decode(engine, prep, pol, min(16, max_new_tokens), sampling)
    device, runs, peak = engine.target.device, [], {}
    events: dict[str, list] = {}  # policy -> each input's step events (the premise's correlations)
    paths = _PathWork(engine)  # what reading trees path by path cost each policy (recurrent models: recurrent_paths.py)
    for n, (inp, prep) in enumerate(zip(inputs, prepared)):
        tries: dict[str, list[GenerationResult]] = {pol: [] for pol in policies}
        for r in range(rounds):
            k = (n + r) % len(policies)
            for pol in policies[k:] + policies[:k]:  # rotate to cancel drift
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                tries[pol].append(paths.measure(pol, _decode, engine, prep, pol, max_new_tokens, sampling))
                peak[pol] = max(peak.get(pol, 0.0), _peak_memory_mb(device))
                if progress is not None:
                    progress.update(1)
        results = {pol: _median_run(tries[pol]) for pol in policies}
        for pol in policies:
            events.setdefault(pol, []).append(results[pol].steps)
        ar_ids = results["ar"].token_ids
        for pol in policies:
            record = _run_record(inp, results[pol], None if pol == "ar" else ar_ids)
            runs.append({**record, "round_seconds": [t.stats.seconds for t in tries[pol]],
                         "speedup_vs_ar": paired_speedup(tries[pol], tries["ar"])})
    ar_tps = _aggregate([r for r in runs if r["policy"] == "ar"], None)["tokens_per_second"]
    report = {
        "device": str(device),
        "dtype": str(pair.target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "models": pair.describe(),
        "max_new_tokens": max_new_tokens,
        "sampling": None if sampling is None else dataclasses.asdict(sampling),
        "draft_pruning": (None if engine.draft_pruning is None
                          else {"image": engine.draft_pruning.image, "video": engine.draft_pruning.video}),
        "tree_forward": {"target": engine.target.tree_forward,
                         "draft": None if engine.draft is None else engine.draft.tree_forward},
        "prompt_path": {"target": engine.target.prompt_path,
                        "draft": None if engine.draft is None else engine.draft.prompt_path},
        "backends": engine.backends(),  # each model's paths, and why a faster one was turned down
        "inputs": len(inputs),
        "rounds": rounds,
        "policies": {},
        "runs": runs,
    }
    if any(is_hf_spec(p) for p in policies):
        report["notes"] = hf_notes(pair, [(i.media, os.path.basename(i.path), p) for i, p in zip(inputs, prepared)],
                                    policies)
    report["policies"] = {pol: _policy_summary(pol, runs, ar_tps, peak.get(pol), events.get(pol, ()))
                          for pol in policies}
    for pol, per_step in paths.per_step().items():
        report["policies"][pol]["paths"] = per_step
    return report


class _PathWork:
    """Each policy's path work on a model whose trees are read path by path (recurrent_paths.py): chains read again and
    tokens read in rows, by role, over its runs' decode steps."""

    def __init__(self, engine: SpecEngine):
        self.runners = {role: r for role, r in (("target", engine.target), ("draft", engine.draft))
                        if r is not None and r.paths is not None}
        self.work: dict[str, dict] = {}  # policy -> {"steps": n, role: [replays, row tokens]}

    def measure(self, policy: str, decode, *args) -> GenerationResult:
        """decode(*args) (one run of `policy`), its path work added to the policy's."""
        before = {role: (r.paths.replays, r.paths.row_tokens) for role, r in self.runners.items()}
        result = decode(*args)
        if self.runners:
            work = self.work.setdefault(policy, {"steps": 0})
            work["steps"] += max(len(result.steps) - 1, 1)  # decode steps (step 0 is the prompt)
            for role, r in self.runners.items():
                total = work.setdefault(role, [0, 0])
                total[0] += r.paths.replays - before[role][0]
                total[1] += r.paths.row_tokens - before[role][1]
        return result

    def per_step(self) -> dict[str, dict]:
        """{policy: {role: per step work, and a row's cache at the engine's last pass (MB)}} for the policies that
        read rows (`ar` reads no tree)."""
        out = {}
        for policy, work in self.work.items():
            if any(work[role][1] for role in self.runners):
                out[policy] = {role: {"chains_read_again_per_step": work[role][0] / work["steps"],
                                      "row_tokens_per_step": work[role][1] / work["steps"],
                                      "row_cache_mb": r.paths.row_bytes / 1e6} for role, r in self.runners.items()}
        return out


def _policy_summary(pol: str, runs: list[dict], ar_tps: float, peak_mb: float | None, events) -> dict:
    """A policy's aggregate over its runs, with its peak memory and (where its steps read alpha) the premise."""
    agg = _aggregate([r for r in runs if r["policy"] == pol], ar_tps)
    agg["peak_memory_mb"] = peak_mb
    if any(e.root_alpha is not None for run in events for e in run):
        agg["premise"] = premise(events).to_dict()
    if pol == "ar":
        agg["exact_match_vs_ar"] = 1.0
    return agg


def check_rounds(rounds: int) -> None:
    """--rounds must be at least 1 (a usage error; the CLI and the report check it before any model loads)."""
    if rounds < 1:
        raise SageError(f"--rounds must be at least 1 (got {rounds})")


def paired_speedup(runs: list[GenerationResult], ar_runs: list[GenerationResult]) -> float:
    """An input's speedup vs ar: the median over rounds of the tokens/s ratio of round r's runs. The two ran back to
    back, so a slow patch of a shared machine, which can outlast one run but rarely a round's pair, cancels in each
    ratio; a ratio of per-policy medians would pair runs from different rounds."""
    return statistics.median(run.stats.tokens_per_second / ar.stats.tokens_per_second
                             for run, ar in zip(runs, ar_runs))


def _median_run(results: list[GenerationResult]) -> GenerationResult:
    """The run of median wall time (the faster middle one of an even count)."""
    ordered = sorted(results, key=lambda r: r.stats.seconds)
    return ordered[(len(ordered) - 1) // 2]


def _decode(engine: SpecEngine, prep: PreparedInput, spec: str, max_new_tokens: int,
            sampling: Sampling | None = None) -> GenerationResult:
    """One input, one policy: the engine's, or transformers' generate() for the HF references (greedy)."""
    if is_hf_spec(spec):
        return run_hf(engine.pair, prep, spec, max_new_tokens)
    return engine.generate(prep, spec, max_new_tokens=max_new_tokens, sampling=sampling)


def format_table(report: dict) -> str:
    """The report as text: one row per policy, then each tree policy's acceptance-through rate by depth."""
    w = max(8, *map(len, report["policies"]))
    head = (f"{'policy':{w}} {'tau':>6} {'tok/s':>8} {'speedup':>8} {'exact':>6} {'nodes':>6} {'depth':>6} "
            f"{'ovh%':>6} {'ovh ms/step':>11}")
    lines = [head, "-" * len(head)]
    for name, p in report["policies"].items():
        lines.append(
            f"{name:{w}} {p['mean_accepted']:6.2f} {p['tokens_per_second']:8.1f} {p['speedup_vs_ar'] or 0:7.2f}x "
            f"{p['exact_match_vs_ar'] or 0:6.2f} {p['tree_nodes_mean']:6.1f} {p['tree_depth_mean']:6.2f} "
            f"{100 * p['overhead_fraction']:6.1f} {p['overhead_ms_per_step']:11.2f}"
        )
    premises = [(n, p["premise"]) for n, p in report["policies"].items() if p.get("premise")]
    if premises:
        lines += ["", "does alpha predict the accepted length? corr(this root's alpha, accepted) / "
                      "corr(previous root's alpha, accepted) / alpha's lag-1 autocorrelation:"]
        lines += [f"{name:{w}} " + " / ".join("-" if v is None else f"{v:+.2f}" for v in
                                              (q["current_root"], q["previous_root"], q["lag1"]))
                  + f"  ({q['steps']} steps)" for name, q in premises]
    profiles = [(n, p["accepted_by_depth"]) for n, p in report["policies"].items() if p["accepted_by_depth"]]
    if profiles:
        lines += ["", "accepted path reaches depth l, given the tree does (l = 1, 2, ...):"]
        lines += [f"{name:{w}} " + " ".join(f"{r:.2f}" for r in rates) for name, rates in profiles]
    read = [(n, p["paths"]) for n, p in report["policies"].items() if p.get("paths")]
    if read:
        lines += ["", "trees read path by path (recurrent layers), a step: tokens read in rows / chains read again / "
                      "a row's cache (MB), target; draft:"]
        lines += [f"{name:{w}} " + "; ".join(
            f"{c['row_tokens_per_step']:.1f} / {c['chains_read_again_per_step']:.2f} / {c['row_cache_mb']:.2f}"
            for c in cost.values()) for name, cost in read]
    lines += ["", "backends: " + "; ".join(
        f"{role} {b['cached']} (prompt {b['prompt']})" + "".join(f" - {n}" for n in b["notes"])
        for role, b in report.get("backends", {}).items())]
    slower = [(n, p["draft_paths"], p["draft_path_why"]) for n, p in report["policies"].items() if p.get("draft_paths")]
    lines += ["draft paths:"] + [f"{name:{w}} " + ", ".join(f"{k} {v}" for k, v in paths.items())
                                 + "".join(f" ({why})" for why in whys) for name, paths, whys in slower]
    return "\n".join(lines)
