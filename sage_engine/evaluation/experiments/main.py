"""`main` (RQ1, RQ2): every policy on every suite, tau and speedup against `ar`, as the paper's main table.

The paper's columns are SD-Chain (`chain`), SD-Tree (`static`, the 25-node SpecVLM/Medusa tree), SpecVLM (`specvlm`,
EAGLE-2's tree from a draft that reads 20% of an image's visual tokens and 10% of a video's) and SAGE
(`sage:threshold=paper:d_max=8`, the paper's rules). `sage` is the project's default (D_max 16, alpha from the new
tree's root), `priced:sage` the same priced by this machine's nodes and levels; `svip` and `ddd` are two related-work
policies (policies/svip.py, policies/ddd.py). Each suite is one bench (bench.run_bench): after a warm-up, every
input decoded by every policy back to back in rotating order, speeds as ratios to `ar` measured in the same rounds.
"""

from __future__ import annotations

from ...config import PAPER_SAGE
from ..bench import run_bench
from .common import Context, Outcome, ar_rate, check_exact, fmt, summary

NAME = "main"
POLICIES = ("ar", "chain", "static", "eagle2", "specvlm", "svip", "ddd", "sage", "priced:sage", PAPER_SAGE)
QUICK = ("ar", "chain", "specvlm", "sage")
SUITES = ("tinyworld-images", "tinyworld-clips", "real")
CLAIM = ("SAGE accepts longer paths and runs faster than SD-Chain, SD-Tree and SpecVLM on image and video "
         "benchmarks (LLaVA-OV-72B: tau 5.4-5.9 against 3.8-4.2, 2.6-3.4x against 2.2-2.9x).")


def run(ctx: Context) -> Outcome:
    suites = ctx.suites(SUITES, full_n=8)
    policies = ctx.policies(POLICIES, QUICK)
    tokens = ctx.max_new_tokens(96)
    rounds = ctx.rounds
    results = {}
    with ctx.progress(len(suites), "suites") as bar:
        for suite in suites:
            def bench(suite=suite):
                return summary(run_bench(ctx.pair, list(suite.inputs), policies, tokens, warmup=1, rounds=rounds,
                                         engine=ctx.engine))
            results[suite.name] = ctx.cell(suite.name, bench)
            bar.update(1)
    rows = []
    for name, s in results.items():
        for pol in policies:
            p = s["policies"][pol]
            worst = p["worst"]
            rows.append([name, pol, fmt(p["tau"]), fmt(p["tokens_per_second"], 0), f"{fmt(p['speedup'])}x",
                         fmt(p["exact"] == 1.0), "-" if pol == "ar" or not worst else f"{worst[0]} {worst[1]:.2f}x"])
    best = {name: max((p for p in policies if p != "ar"), key=lambda q: s["policies"][q]["speedup"] or 0)
            for name, s in results.items()}
    finding = "; ".join(f"{name}: fastest {pol} at {results[name]['policies'][pol]['speedup']:.2f}x "
                        f"(tau {results[name]['policies'][pol]['tau']:.2f})" for name, pol in best.items())
    return Outcome(
        title="Policies by suite (RQ1, RQ2)", claim=CLAIM,
        columns=["suite", "policy", "tau", "tokens/s", "speedup vs ar", "== ar", "worst input"],
        rows=rows, finding=f"{finding}; {check_exact(results)}",
        data={"suites": results, "policies": policies, "max_new_tokens": tokens, "rounds": rounds,
              "ar_tokens_per_second": ar_rate(list(results.values()))},
        draw=draw,
        notes=[f"`{PAPER_SAGE}` is the paper's SAGE (its thresholds, D_max 8); `sage` the project's default.",
               "`specvlm` prunes the draft's visual tokens (80% of an image's, 90% of a video's); the others read "
               "the whole prompt."])


def draw(data: dict, path) -> None:
    """Grouped bars: each policy's speedup on each suite."""
    from .figures import grouped_bars

    suites = list(data["suites"])
    policies = [p for p in data["policies"] if p != "ar"]
    values = {pol: [data["suites"][s]["policies"][pol]["speedup"] or 0.0 for s in suites] for pol in policies}
    grouped_bars(path, suites, values, ylabel="speedup vs ar (measured)", hline=1.0,
                 title="Policies by suite: speedup against ar, measured on this machine")
