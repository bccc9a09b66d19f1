"""Speed on a target large enough for the device to matter: `ar` against `sage`, what a verify pass of a bigger
tree costs against a one-token pass, the engine's own time per step, and where a step reads values to the host.

The pair is built on the spot: a random Qwen2.5-VL target of a few hundred million parameters (24 layers of width
1024; 12 of 512 in quick mode) and a draft made of its first two layers with its embeddings, norm and head. The
target's later layers have their output products scaled down so that they move the residual stream little: the
draft then agrees with the target on most tokens, as a well-trained draft does, and acceptance is high. Its head is
sharpened (tiny_pairs.sharpen) so that its distributions are as peaked as a trained model's.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from ...core.engine import SpecEngine
from ...models.loading import ModelPair
from .cases import scratch_pass
from .syncs import cuda_sync_warnings, watch

SIZES = {"full": dict(layers=24, hidden=1024, heads=16, kv_heads=2, intermediate=2816),
         "quick": dict(layers=12, hidden=512, heads=8, kv_heads=2, intermediate=1408)}
DRAFT_LAYERS, DAMP, SHARPNESS = 2, 0.02, 50.0
TREE_SIZES = (1, 8, 32, 64)


def speed_pair(size: str, dtype: torch.dtype, device: str) -> ModelPair:
    """The large random target and its two-layer draft (see the module's note), on `device` in `dtype`."""
    from sage_testing.tiny_pairs import qwen25_model, qwen25_processor, sharpen

    proc = qwen25_processor()
    target = sharpen(qwen25_model(proc.tokenizer, seed=0, init=0.02, **SIZES[size]), SHARPNESS)
    with torch.no_grad():
        for layer in target.model.language_model.layers[DRAFT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(DAMP)
            layer.mlp.down_proj.weight.mul_(DAMP)
    draft = copy.deepcopy(target)
    text = draft.model.language_model
    text.layers = text.layers[:DRAFT_LAYERS]
    for config in (draft.config.text_config, text.config):
        config.num_hidden_layers = DRAFT_LAYERS
        config.layer_types = config.layer_types[:DRAFT_LAYERS] if getattr(config, "layer_types", None) else None
    target.to(device=device, dtype=dtype)
    draft.to(device=device, dtype=dtype)
    return ModelPair(target, draft, proc, None, f"random Qwen2.5-VL ({size})", "its first two layers")


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def verify_costs(engine: SpecEngine, prep, rounds: int = 5) -> dict:
    """The target's pass over a root and a tree of n draft nodes (TREE_SIZES; four children per node, level by
    level), each against a one-token pass after the same prompt: medians of `rounds` interleaved passes. Each pass's
    columns are dropped after it."""
    runner = engine.target
    runner.prefill(prep.target_inputs)
    start = runner.seq_len
    times: dict[int, list[float]] = {0: [], **{n: [] for n in TREE_SIZES}}
    for _ in range(rounds + 1):  # the first round warms each shape up and is not kept
        for n in times:
            times[n].append(scratch_pass(runner, start, n).ms)
    one = statistics.median(times[0][1:])
    return {"one_token_ms": round(one, 2),
            "relative": {str(n): round(statistics.median(times[n][1:]) / one, 2) for n in TREE_SIZES}}


def measure(device: str, dtype: torch.dtype, size: str, budget: int, rounds: int = 2) -> dict:
    """ar and sage tokens/s (interleaved, medians), tau, the engine's time per step, the verify costs and the host
    reads of a step, on the large pair."""
    from sage_testing.tiny_pairs import image

    from ...models.inputs import prepare_input

    t0 = time.perf_counter()
    pair = speed_pair(size, dtype, device)
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "describe what you see", images=[image(3)])
    runs: dict[str, list] = {"ar": [], "sage": []}
    for policy in runs:  # warm-up, not kept
        engine.generate(prep, policy, max_new_tokens=8, ignore_eos=True)
    for _ in range(rounds):
        for policy in runs:
            runs[policy].append(engine.generate(prep, policy, max_new_tokens=budget, ignore_eos=True))
    figures = {}
    for policy, results in runs.items():
        best = sorted(results, key=lambda r: r.stats.tokens_per_second)[len(results) // 2]
        decode = [s for s in best.steps if s.kind == "decode"]
        figures[policy] = {
            "tokens_per_second": round(best.stats.tokens_per_second, 1), "tau": round(best.stats.mean_accepted, 2),
            "engine_ms_per_step": round(statistics.mean(s.other_ms for s in decode), 3),
            "target_ms_per_step": round(statistics.mean(s.target_ms for s in decode), 2),
            "draft_ms_per_step": round(statistics.mean(s.draft_ms for s in decode), 2),
            "steps": len(decode), "exact": results[0].token_ids == runs["ar"][0].token_ids}
    figures["speedup"] = round(figures["sage"]["tokens_per_second"] / figures["ar"]["tokens_per_second"], 2)
    verify = verify_costs(engine, prep)
    syncs = {}
    for policy in ("ar", "sage"):  # census runs are slow (a stack walk per torch call): short, never timed
        with cuda_sync_warnings() as warned, watch(device) as census:
            engine.generate(prep, policy, max_new_tokens=min(budget, 24), ignore_eos=True)
        syncs[policy] = {**census.summary(), "cuda_sync_warnings": len(warned) if torch.cuda.is_available() else None}
    return {"target": pair.target_name, "target_params_m": round(_params(pair.target) / 1e6, 1),
            "draft_params_m": round(_params(pair.draft) / 1e6, 1), "dtype": str(dtype).replace("torch.", ""),
            "device": device, "new_tokens": budget, "backends": engine.backends(), **figures, "verify": verify,
            "host_reads": syncs, "seconds": round(time.perf_counter() - t0, 1)}
