"""Does every policy write the target's own greedy tokens here? fp32: exactly, and `ar` as transformers' generate()
does; bf16: how often, and where a run parts from `ar`. And how far apart are the logits of one token computed alone
and inside a tree pass (the reason bf16 runs can part: ~1e-5 in fp32, ~1e-2 in bf16)?
"""

from __future__ import annotations

import gc
import time

import torch

from ...config import PAPER_SAGE
from ...core.engine import SpecEngine
from ...models.inputs import PreparedInput
from ..hf_reference import run_hf
from .cases import Case, scratch_pass, spread, to_device

POLICIES = ("chain", "static", "eagle2", "sage", PAPER_SAGE)  # with those of --policy-module (`add_policies`)


def add_policies(names) -> None:
    """Check these policies against `ar` too (`doctor --policy-module FILE`: the file's policies)."""
    global POLICIES
    POLICIES = (*POLICIES, *(n for n in names if n not in POLICIES))


def parted_at(ids: list[int], reference: list[int]) -> int | None:
    """The first index where `ids` differs from `reference` (a shorter run parts where it ends); None: equal."""
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return i
    return None if len(ids) == len(reference) else min(len(ids), len(reference))


def run_policies(engine: SpecEngine, prep: PreparedInput, budget: int, reference: list[int] | None = None) -> dict:
    """`ar`, then each policy, decoded greedily past any end of sequence: each run's tokens against `ar`'s; with a
    `reference` (another placement's `ar`), `ar`'s too."""
    ar = engine.generate(prep, "ar", max_new_tokens=budget, ignore_eos=True)
    ref = ar.token_ids if reference is None else reference
    rows = [] if reference is None else [{"policy": "ar", "tokens": len(ar.token_ids),
                                          "parted_at": parted_at(ar.token_ids, ref), "tau": 1.0}]
    for policy in POLICIES:
        res = engine.generate(prep, policy, max_new_tokens=budget, ignore_eos=True)
        rows.append({"policy": policy, "tokens": len(res.token_ids), "parted_at": parted_at(res.token_ids, ref),
                     "tau": round(res.stats.mean_accepted, 2), "deepest": max(
                         (len(s.accepted_tokens) for s in res.steps), default=0)})
    for row in rows:
        row["exact"] = row["parted_at"] is None
    return {"ar_ids": ar.token_ids, "rows": rows, "backends": engine.backends()}


def pass_gap(engine: SpecEngine, prep: PreparedInput, token: int, sizes=(4, 24, 64)) -> float:
    """The largest difference between the target's logits after `token` (following the prompt) computed in a one-token
    pass and as the root of a tree pass of `sizes` nodes (four children a node, level by level), over the logits'
    largest magnitude: a near-tie closer than this may be decided one way by `ar` and the other by verification."""
    runner = engine.target
    runner.prefill(prep.target_inputs)
    start = runner.seq_len
    alone = scratch_pass(runner, start, 0, token).logits[0].clone()
    gap = max(float((alone - scratch_pass(runner, start, n, token).logits[0]).abs().max()) for n in sizes)
    return gap / float(alone.abs().max().clamp_min(1e-30))


def check_fp32(case: Case, device: str) -> dict:
    """The case in fp32 on `device`: every policy against `ar`, and `ar` against generate()."""
    t0 = time.perf_counter()
    pair, prep = case.make(torch.float32)
    to_device(pair, device)
    engine = SpecEngine(pair)
    out = run_policies(engine, prep, case.budget)
    hf = run_hf(pair, prep, "hf_generate", case.budget).token_ids  # transformers' own greedy decoding
    out["rows"].insert(0, {"policy": "generate() vs ar", "tokens": len(hf),
                           "parted_at": parted_at(out["ar_ids"][: len(hf)], hf), "exact": None})
    out["rows"][0]["exact"] = out["rows"][0]["parted_at"] is None and len(hf) > 0
    out.update(case=case.name, dtype="float32", device=device, pass_gap=pass_gap(engine, prep, out["ar_ids"][0]),
               seconds=round(time.perf_counter() - t0, 1))
    return out


def check_bf16(case: Case, device: str, fp32_ar: list[int]) -> dict:
    """The case in bf16 on `device`: each policy against bf16 `ar`, and bf16 `ar` against fp32 `ar`."""
    t0 = time.perf_counter()
    pair, prep = case.make(torch.bfloat16)
    to_device(pair, device)
    engine = SpecEngine(pair)
    out = run_policies(engine, prep, case.budget)
    out.update(case=case.name, short=case.short or case.name, dtype="bfloat16", device=device,
               pass_gap=pass_gap(engine, prep, out["ar_ids"][0]),
               agreement=round(sum(r["exact"] for r in out["rows"]) / len(out["rows"]), 2),
               ar_vs_fp32_parted_at=parted_at(out["ar_ids"], fp32_ar), seconds=round(time.perf_counter() - t0, 1))
    return out


def check_spread(case: Case, devices: list[str], draft_device: str) -> dict:
    """The case in fp32 with the target spread over `devices` and the draft on `draft_device`: every policy against
    the one-device `ar`."""
    t0 = time.perf_counter()
    pair, prep = case.make(torch.float32)
    to_device(pair, devices[0])
    reference = SpecEngine(pair).generate(prep, "ar", max_new_tokens=case.budget, ignore_eos=True).token_ids
    placed, device_map = spread(pair, devices, draft_device)
    out = run_policies(SpecEngine(placed), prep, case.budget, reference=reference)
    out.update(case=case.name, dtype="float32", devices=devices, draft_device=draft_device, device_map=device_map,
               seconds=round(time.perf_counter() - t0, 1))
    del placed, pair
    gc.collect()
    return out
