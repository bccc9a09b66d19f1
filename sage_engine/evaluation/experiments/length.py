"""`length`: tau and speed against the generation budget, as far as the pair's answers go.

The paper's ablation: SAGE's tau gain over SpecVLM grows with the length generated (+25% at 512 tokens, +57% at
2048), as the history controller has more steps to settle. The embedded pair answers in 20-100 tokens and stops
at its end-of-sequence token, so budgets past its longest answer would repeat the same runs: the sweep keeps the
budgets up to the longest answer `ar` gives at the largest budget (measured first), and reports the tokens each
budget really produced.
"""

from __future__ import annotations

from ...config import PAPER_SAGE
from ..bench import run_bench
from .common import Context, Outcome, ar_rate, check_exact, fmt, summary

NAME = "length"
BUDGETS = (8, 16, 32, 64, 128, 256, 512)
QUICK_BUDGETS = (8, 32)
POLICIES = ("ar", "specvlm", "sage", PAPER_SAGE)
QUICK = ("ar", "specvlm", "sage")
SUITES = ("tinyworld-images", "tinyworld-clips")
CLAIM = "SAGE's tau gain over SpecVLM grows with the generation length (+25% at 512 tokens, +57% at 2048)."


def _reach(ctx: Context, suites, largest: int) -> int:
    """The longest answer `ar` gives within `largest` tokens over the suites' inputs (a cell: measured once)."""
    def longest():
        return max(max(r["new_tokens"] for r in s["runs"])
                   for s in (run_bench(ctx.pair, list(x.inputs), ["ar"], largest, warmup=0, engine=ctx.engine)
                             for x in suites))
    return int(ctx.cell("reach", longest))


def run(ctx: Context) -> Outcome:
    suites = ctx.suites(SUITES, full_n=6)
    policies = ctx.policies(POLICIES, QUICK)
    budgets = QUICK_BUDGETS if ctx.quick else BUDGETS
    reach = _reach(ctx, suites, budgets[-1])
    kept = [b for b in budgets if b <= reach] + [b for b in budgets if b > reach][:1]  # one budget past the longest
    inputs = [i for s in suites for i in s.inputs]
    results = {}
    with ctx.progress(len(kept), "budgets") as bar:
        for b in kept:
            results[str(b)] = ctx.cell(str(b), lambda b=b: summary(run_bench(ctx.pair, inputs, policies, b, warmup=1,
                                                                             rounds=ctx.rounds, engine=ctx.engine)))
            bar.update(1)
    rows = []
    gains = {}
    for b, s in results.items():
        p = s["policies"]
        produced = p["ar"]["new_tokens"] / max(1, s["inputs"])
        for pol in policies:
            rows.append([b, fmt(produced, 1), pol, fmt(p[pol]["tau"]), f"{fmt(p[pol]['speedup'])}x"])
        if "specvlm" in p and PAPER_SAGE in p and p["specvlm"]["tau"]:
            gains[b] = p[PAPER_SAGE]["tau"] / p["specvlm"]["tau"] - 1.0
    gain_text = ", ".join(f"{100 * g:+.0f}% at {b}" for b, g in gains.items())
    ends = (f"answers reach the largest budget ({reach} tokens)" if reach >= budgets[-1]
            else f"the longest answer ends at {reach} tokens")
    finding = (f"{ends}; paper-SAGE's tau against specvlm's: {gain_text or 'not run'}; "
               f"`sage` {results[str(kept[0])]['policies'].get('sage', {}).get('speedup') or 0:.2f}x at {kept[0]} "
               f"tokens and {results[str(kept[-1])]['policies'].get('sage', {}).get('speedup') or 0:.2f}x at "
               f"{kept[-1]}; {check_exact(results)}")
    return Outcome(
        title="Generation length", claim=CLAIM,
        columns=["budget", "tokens per answer", "policy", "tau", "speedup vs ar"], rows=rows, finding=finding,
        data={"budgets": results, "reach": reach, "policies": policies, "tau_gain_over_specvlm": gains,
              "ar_tokens_per_second": ar_rate(list(results.values()))},
        draw=draw,
        notes=[f"Budgets past {reach} tokens (the longest answer) would repeat the last row; one is kept to show it."])


def draw(data: dict, path) -> None:
    from .figures import lines

    budgets = [int(b) for b in data["budgets"]]
    panels = []
    for key, label in (("tau", "tau"), ("speedup", "speedup vs ar (measured)")):
        series = {pol: (budgets, [data["budgets"][str(b)]["policies"][pol][key] or 0.0 for b in budgets])
                  for pol in data["policies"] if pol != "ar"}
        panels.append((label, label, series))
    lines(path, panels, xlabel="max new tokens", title="Generation length: measured on this machine", xlog=True)
