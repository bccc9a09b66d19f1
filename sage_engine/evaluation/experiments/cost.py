"""`cost` (RQ5): the balance of draft cost and target cost, and the regime we cannot run here, modelled.

1. Measured: every policy decodes the inputs on this machine's clock; every decode step's tokens, verified nodes,
   draft forwards and wall time are logged (prices.ModelledMeter).
2. This machine's price model is fitted on the even-numbered steps of every run (prices.fit_machine) and checked on
   the odd-numbered ones: each policy's modelled decode rate against its measured one. A model that cannot
   reproduce this machine is not trusted with another.
3. Each regime is a price model: this machine's (fitted), the flat-verify GPU-like one (prices.gpu_regime), and a
   sweep of a draft forward's price against a target forward's by a node's marginal verify price. Under each,
   the policies whose trees do not read prices are priced from their measured steps (their trees and accepted
   paths are the same on any machine); a policy that prices its trees (`priced:sage`) decodes the inputs
   again with the engine's meter reading the regime's prices, so it chooses its trees for that machine.
Everything under 3 is MODELLED: speedups are modelled decode rates against `ar`'s modelled one (prefill left out).
"""

from __future__ import annotations

import statistics

from ...policies import PricedPolicy, make_policy
from ..bench import prepare_bench_input
from .common import MODELLED, Context, Outcome, fmt
from .main import POLICIES  # the same policies as the main comparison
from .prices import ModelledMeter, PriceModel, fit_machine, gpu_regime, measured_rate, priced_rate, relative

NAME = "cost"
QUICK = ("ar", "chain", "eagle2", "priced:sage")
SUITES = ("tinyworld-images", "real")
LEVELS = (0.02, 0.05, 0.13, 0.3, 0.6)  # a draft forward, in target forwards
NODES = (0.0, 0.0025, 0.01, 0.025, 0.06)  # a verified node's marginal price, in target forwards
QUICK_LEVELS, QUICK_NODES = (0.05, 0.3), (0.0, 0.025)
CLAIM = ("Draft cost and verify cost must balance (RQ5); on GPUs a 64-node verify costs about one target forward, "
         "so wide and deep trees are nearly free there.")


def reads_prices(spec: str) -> bool:
    """Does the policy's tree depend on the step prices the engine quotes it? (a priced one: `priced:sage`)"""
    return isinstance(make_policy(spec), PricedPolicy)


def _steps(log, start: int) -> list[list[float]]:
    return [[t.tokens, t.nodes, t.draft_forwards, t.wall_ms] for t in log[start:]]


def _shape(result, steps: list[list[float]]) -> dict:
    """What a run's drafted steps chose: mean depth, root width, nodes (from its logged steps, one per decode step:
    no tree view is made); and the share of steps drafted."""
    decode = [e for e in result.steps if e.kind == "decode"]
    drafted = [e for e in decode if e.draft_forwards > 0]
    mean = (lambda xs: statistics.fmean(xs) if xs else 0.0)
    return {"depth": mean([e.depth for e in drafted]), "width": mean([e.width for e in drafted]),
            "nodes": mean([s[1] for s in steps if s[2] > 0]), "drafted": len(drafted) / max(1, len(decode)),
            "tau": result.stats.mean_accepted}


def _decode_all(ctx: Context, preps, policies, tokens, meter: ModelledMeter, reference=None) -> dict:
    """Every policy on every input (rotating order, after a short warm-up), on `meter`: per policy its steps and the
    shape of each run, and whether its tokens equal `ar`'s: those of this pass where `ar` is among `policies` (its
    ids are kept, as out["ar"]["ids"]), else `reference` (the ids of an earlier pass's `ar`, per input)."""
    engine = ctx.engine
    engine.costs = meter
    for pol in policies:
        engine.generate(preps[0], pol, max_new_tokens=min(16, tokens))
    out = {pol: {"steps": [], "shapes": [], "exact": True} for pol in policies}
    for n, prep in enumerate(preps):
        k = n % len(policies)
        ids = {}
        for pol in policies[k:] + policies[:k]:
            start = len(meter.log)
            res = engine.generate(prep, pol, max_new_tokens=tokens)
            steps = _steps(meter.log, start)
            out[pol]["steps"].append(steps)
            out[pol]["shapes"].append(_shape(res, steps))
            ids[pol] = res.token_ids
        truth = ids["ar"] if "ar" in ids else reference[n]
        for pol in policies:
            out[pol]["exact"] &= ids[pol] == truth
        if "ar" in ids:
            out["ar"].setdefault("ids", []).append(truth)
    return out


def _flat(runs: list[list[list[float]]], parity: int | None = None) -> list[list[float]]:
    return [s for run in runs for i, s in enumerate(run) if parity is None or i % 2 == parity]


def _mean_shape(shapes: list[dict]) -> dict:
    return {k: statistics.fmean(s[k] for s in shapes) for k in shapes[0]} if shapes else {}


def _regime(ctx: Context, price: PriceModel, measured: dict, preps, tokens) -> dict:
    """Each policy's modelled speedup against ar under `price`, and the shape the price-reading policies chose."""
    aware = [p for p in measured if reads_prices(p)]
    rerun = _decode_all(ctx, preps, aware, tokens, ModelledMeter(price), measured["ar"]["ids"]) if aware else {}
    out = {}
    ar = 1.0 / price.plain
    for pol, m in measured.items():
        runs = rerun[pol] if pol in rerun else m
        rate = priced_rate(price, _flat(runs["steps"]))
        out[pol] = {"speedup": None if rate is None else rate / ar, "shape": _mean_shape(runs["shapes"]),
                    "exact": runs["exact"] if pol in rerun else m["exact"]}
    return out


def run(ctx: Context) -> Outcome:
    suites = ctx.suites(SUITES, full_n=6)
    policies = ctx.policies(POLICIES, QUICK)
    policies = ["ar"] + [p for p in policies if p != "ar"]
    tokens = ctx.max_new_tokens(96)
    inputs = [i for s in suites for i in s.inputs]
    preps = [prepare_bench_input(ctx.pair, i) for i in inputs]
    measured = ctx.cell("measured", lambda: _decode_all(ctx, preps, policies, tokens, ModelledMeter(None)))
    machine = fit_machine(_flat([r for m in measured.values() for r in m["steps"]], parity=0))
    check = {}
    for pol, m in measured.items():
        held_out = _flat(m["steps"], parity=1)
        real, modelled = measured_rate(held_out), priced_rate(machine, held_out)
        check[pol] = {"measured": real, "modelled": modelled,
                      "error": None if not real or modelled is None else modelled / real - 1.0}
    levels, nodes = (QUICK_LEVELS, QUICK_NODES) if ctx.quick else (LEVELS, NODES)
    regimes = [machine, gpu_regime(machine.plain)]
    regimes += [relative(f"level {lv:g}, node {nd:g}", machine.plain, lv, node=nd, source="sweep")
                for lv in levels for nd in nodes]
    results = {}
    with ctx.progress(len(regimes), "regimes") as bar:
        for price in regimes:
            results[price.name] = ctx.cell(f"regime:{price.name}:{price.to_dict()}",
                                           lambda price=price: _regime(ctx, price, measured, preps, tokens))
            bar.update(1)
    return _outcome(measured, machine, regimes, results, check, levels, nodes, tokens)


def _outcome(measured, machine, regimes, results, check, levels, nodes, tokens) -> Outcome:
    policies = list(measured)
    clock = {p: measured_rate(_flat(m["steps"])) for p, m in measured.items()}
    rows = [["this machine (measured: the clock)", *(f"{fmt(clock[p] / clock['ar'])}x" for p in policies if p != "ar")]]
    rows += [[f"{r.name} ({MODELLED})", *(f"{fmt(results[r.name][p]['speedup'])}x" for p in policies if p != "ar")]
             for r in regimes[:2]]
    here, gpu = results[machine.name], results[regimes[1].name]
    winner = max((p for p in policies if p != "ar"), key=lambda p: gpu[p]["speedup"] or 0)
    runner_up = max((p for p in policies if p not in ("ar", winner)), key=lambda p: gpu[p]["speedup"] or 0,
                    default=None)
    aware = [p for p in policies if reads_prices(p)]
    moves = [f"`{p}` depth {here[p]['shape']['depth']:.1f} -> {gpu[p]['shape']['depth']:.1f}, width "
             f"{here[p]['shape']['width']:.1f} -> {gpu[p]['shape']['width']:.1f}, nodes "
             f"{here[p]['shape']['nodes']:.1f} -> {gpu[p]['shape']['nodes']:.1f}, drafted steps "
             f"{100 * here[p]['shape']['drafted']:.0f}% -> {100 * gpu[p]['shape']['drafted']:.0f}%" for p in aware]
    worst = max(abs(c["error"]) for c in check.values() if c["error"] is not None)
    lead = "" if runner_up is None else (f" ({gpu[winner]['speedup'] / gpu[runner_up]['speedup'] - 1:+.0%} "
                                         f"over {runner_up})")
    finding = (f"this machine's price model reproduces every policy's measured decode rate within "
               f"{100 * worst:.0f}% on held-out steps; in the GPU-like regime ({MODELLED}) {winner} wins at "
               f"{gpu[winner]['speedup']:.2f}x{lead}; from this machine to it: " + "; ".join(moves))
    grid = {"levels": list(levels), "nodes": list(nodes), "cells": {}}
    for lv in levels:
        for nd in nodes:
            r = results[f"level {lv:g}, node {nd:g}"]
            best = max((p for p in policies if p != "ar"), key=lambda p: r[p]["speedup"] or 0)
            grid["cells"][f"{lv:g},{nd:g}"] = {"winner": best, "speedup": r[best]["speedup"],
                                               **{f"{p}": r[p]["speedup"] for p in policies if p != "ar"},
                                               "shapes": {p: r[p]["shape"] for p in aware}}
    exact = all(r[p]["exact"] for r in results.values() for p in policies) and all(
        m["exact"] for m in measured.values())
    return Outcome(
        title="Draft cost against target cost, modelled (RQ5)", claim=CLAIM,
        columns=["regime", *(p for p in policies if p != "ar")], rows=rows,
        finding=finding + ("; every run equal to `ar`" if exact else "; NOT EXACT: a run differs from `ar`"),
        data={"regimes": [r.to_dict() for r in regimes], "results": results, "check": check, "grid": grid,
              "policies": policies, "max_new_tokens": tokens,
              "measured_tokens_per_ms": clock,
              "ar_tokens_per_second": 1e3 * (clock["ar"] or 0.0)},
        draw=draw,
        notes=[f"Every speedup in this table is {MODELLED} (decode steps only, prefill left out): the engine "
               "decoded for real, its steps were priced by the regime's model.",
               "This machine's model against the clock, on held-out steps (measured / modelled tokens per s, "
               "error): " + "; ".join(f"{p} {1e3 * c['measured']:.0f} / {1e3 * c['modelled']:.0f} "
                                      f"({100 * c['error']:+.0f}%)" for p, c in check.items()
                                      if c["measured"] and c["modelled"]),
               f"This machine's prices: {_prices(machine)}. GPU-like: {regimes[1].source}."])


def _prices(p: PriceModel) -> str:
    return (f"plain step {p.plain:.2f} ms, drafted step {p.base:.2f} ms + {p.node:.3f} ms per node + "
            f"{p.level:.3f} ms per draft forward ({p.source})")


def draw(data: dict, path) -> None:
    from .figures import heatmaps

    grid = data["grid"]
    aware = next((p for p in data["policies"] if reads_prices(p)), None)
    panels = []
    for pol in [p for p in (aware, "eagle2", "chain") if p in data["policies"]][:3]:
        panels.append((f"{pol}: speedup vs ar ({MODELLED})", grid["nodes"], grid["levels"],
                       [[grid["cells"][f"{lv:g},{nd:g}"][pol] for nd in grid["nodes"]] for lv in grid["levels"]]))
    heatmaps(path, panels, xlabel="a node's verify price (target forwards)",
             ylabel="a draft forward (target forwards)", title=f"Price sweep, {MODELLED} from this pair's acceptance")
