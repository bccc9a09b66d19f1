"""`pruning`: the share of visual tokens the draft leaves out, from 0 to 0.95, for `specvlm` and `sage`.

Each ratio prunes images and videos alike (SpecEngine.draft_pruning, which every policy's draft then reads with;
the output never depends on it). The draft reads a shorter prompt, so its prefill and every draft forward's
attention get cheaper, and it sees less of the picture, so it may agree less often. The paper finds the best
speedup at 0.8-0.9 on VideoDetailedCaption (its 72B target, 7B draft).
"""

from __future__ import annotations

from ...models.pruning import VisualPruning
from ..bench import run_bench
from .common import Context, Outcome, ar_rate, check_exact, fmt, need, summary

NAME = "pruning"
RATIOS = (0.0, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95)
QUICK_RATIOS = (0.0, 0.9)
POLICIES = ("ar", "specvlm", "sage")
SUITES = ("tinyworld-images", "tinyworld-clips")
CLAIM = "Pruning 80-90% of the draft's visual tokens gives the best speedup (VideoDetailedCaption)."


def run(ctx: Context) -> Outcome:
    need(not ctx.text_only, "pruning needs images or videos; this pair is text-only")
    suites = ctx.suites(SUITES, full_n=6)
    policies = ctx.policies(POLICIES, POLICIES)
    ratios = QUICK_RATIOS if ctx.quick else RATIOS
    tokens = ctx.max_new_tokens(96)
    engine = ctx.engine
    results: dict[str, dict[str, dict]] = {}
    with ctx.progress(len(suites) * len(ratios), "ratios") as bar:
        for suite in suites:
            for r in ratios:
                def bench(suite=suite, r=r):
                    held, engine.draft_pruning = engine.draft_pruning, VisualPruning(r, r)
                    try:
                        return summary(run_bench(ctx.pair, list(suite.inputs), policies, tokens, warmup=1,
                                                 rounds=ctx.rounds, engine=engine))
                    finally:
                        engine.draft_pruning = held
                results.setdefault(suite.name, {})[f"{r:g}"] = ctx.cell(f"{suite.name}@{r:g}", bench)
                bar.update(1)
    rows, best = [], []
    drafting = [p for p in policies if p != "ar"]
    for name, by_ratio in results.items():
        for pol in drafting:
            cells = {r: s["policies"][pol] for r, s in by_ratio.items()}
            rows += [[name, pol, r, fmt(c["tau"]), f"{fmt(c['speedup'])}x"] for r, c in cells.items()]
            top = max(cells, key=lambda r: cells[r]["speedup"] or 0.0)
            best.append(f"{pol} on {name} fastest at {top} ({cells[top]['speedup']:.2f}x against "
                        f"{cells['0']['speedup']:.2f}x unpruned, tau {cells[top]['tau']:.2f} against "
                        f"{cells['0']['tau']:.2f})")
    flat = {f"{name}@{r}": s for name, by in results.items() for r, s in by.items()}
    return Outcome(
        title="The draft's visual-token pruning", claim=CLAIM,
        columns=["suite", "policy", "pruned", "tau", "speedup vs ar"], rows=rows,
        finding="; ".join(best) + f"; {check_exact(flat)}",
        data={"suites": results, "ratios": list(ratios), "policies": policies, "max_new_tokens": tokens,
              "ar_tokens_per_second": ar_rate(list(flat.values()))},
        draw=draw,
        notes=["A ratio prunes images and videos alike, for every policy of the run (specvlm's own 0.8/0.9 give "
               "way to it); `ar` has no draft and is the reference of each ratio's run."])


def draw(data: dict, path) -> None:
    from .figures import lines

    panels = []
    for key, label in (("speedup", "speedup vs ar (measured)"), ("tau", "tau")):
        series = {}
        for name, by_ratio in data["suites"].items():
            for pol in data["policies"]:
                if pol == "ar":
                    continue
                xs = [float(r) for r in by_ratio]
                series[f"{pol}, {name}"] = (xs, [by_ratio[r]["policies"][pol][key] or 0.0 for r in by_ratio])
        panels.append((label, label, series))
    lines(path, panels, xlabel="share of the draft's visual tokens left out",
          title="Draft visual-token pruning: measured on this machine", hline=None)
