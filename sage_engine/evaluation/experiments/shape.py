"""`shape` (RQ4): SAGE's D_max by W_max grid, on images and on video, and its history controller on and off.

Each cell is a bench of `ar` and SAGE with that D_max (the depth at alpha = 1, where the controller starts) and
W_max (the root width at alpha = 0). The base policy is the paper's SAGE (`sage:threshold=paper`: its thresholds and
node budget alone, so that the grid is not also shaped by this machine's prices); `--policies SPEC` sets another.
The controller is switched off by `history_step=0` (D_max then stays where it starts).
"""

from __future__ import annotations

from ..bench import run_bench
from .common import Context, Outcome, ar_rate, check_exact, fmt, summary

NAME = "shape"
BASE = "sage:threshold=paper"
D_MAX = (4, 6, 8, 12, 16)
W_MAX = (2, 4, 6, 10)
QUICK_D, QUICK_W = (4, 8), (2, 10)
SUITES = ("tinyworld-images", "tinyworld-clips")
CLAIM = ("Depth and width from confidence beat a fixed shape; video, where the draft is surer, takes deeper trees "
         "(RQ4); the history controller on D_max helps.")


def _spec(base: str, d: int, w: int, history: bool = True) -> str:
    return f"{base}:d_max={d}:w_max={w}" + ("" if history else ":history_step=0")


def run(ctx: Context) -> Outcome:
    base = ctx.policies((BASE,), (BASE,))[0]
    suites = ctx.suites(SUITES, full_n=6)
    ds, ws = (QUICK_D, QUICK_W) if ctx.quick else (D_MAX, W_MAX)
    tokens = ctx.max_new_tokens(96)
    cells = [(s, d, w, True) for s in suites for d in ds for w in ws] + [(s, d, ws[-1], False) for s in suites
                                                                          for d in ds]
    results: dict[str, dict] = {}
    with ctx.progress(len(cells), "grid") as bar:
        for suite, d, w, history in cells:
            spec = _spec(base, d, w, history)
            key = f"{suite.name}:{spec}"
            results[key] = ctx.cell(key, lambda suite=suite, spec=spec: summary(
                run_bench(ctx.pair, list(suite.inputs), [spec], tokens, warmup=1, rounds=ctx.rounds,
                          engine=ctx.engine)))
            bar.update(1)
    grids, rows, found = {}, [], []
    for suite in suites:
        tau = [[results[f"{suite.name}:{_spec(base, d, w)}"]["policies"][_spec(base, d, w)]["tau"] for w in ws]
               for d in ds]
        speed = [[results[f"{suite.name}:{_spec(base, d, w)}"]["policies"][_spec(base, d, w)]["speedup"]
                  for w in ws] for d in ds]
        off = [results[f"{suite.name}:{_spec(base, d, ws[-1], False)}"]["policies"][_spec(base, d, ws[-1], False)]
               for d in ds]
        grids[suite.name] = {"tau": tau, "speedup": speed, "history_off": off}
        best = max(((d, w) for d in ds for w in ws), key=lambda dw: speed[ds.index(dw[0])][ws.index(dw[1])] or 0)
        bi, bj = ds.index(best[0]), ws.index(best[1])
        for i, d in enumerate(ds):
            rows.append([suite.name, d, *(f"{fmt(tau[i][j])} / {fmt(speed[i][j])}x" for j in range(len(ws))),
                         f"{fmt(off[i]['tau'])} / {fmt(off[i]['speedup'])}x"])
        gain = [speed[i][-1] / off[i]["speedup"] - 1 for i in range(len(ds)) if off[i]["speedup"]]
        found.append(f"{suite.name}: best D_max {best[0]}, W_max {best[1]} at {speed[bi][bj]:.2f}x (tau "
                     f"{tau[bi][bj]:.2f}); the controller changes speed by {100 * min(gain):+.0f}% to "
                     f"{100 * max(gain):+.0f}% across D_max")
    return Outcome(
        title="Tree shape: D_max by W_max, and the history controller (RQ4)", claim=CLAIM,
        columns=["suite", "D_max", *(f"W_max {w}: tau / speedup" for w in ws), f"W_max {ws[-1]}, controller off"],
        rows=rows, finding="; ".join(found) + f"; {check_exact(results)}",
        data={"base": base, "d_max": list(ds), "w_max": list(ws), "grids": grids, "max_new_tokens": tokens,
              "ar_tokens_per_second": ar_rate(list(results.values()))},
        draw=draw,
        notes=[f"Base policy `{base}`; each cell its own bench against `ar` (speedups measured on this machine)."])


def draw(data: dict, path) -> None:
    from .figures import heatmaps

    panels = [(f"{name}: speedup vs ar (measured)", data["w_max"], data["d_max"], g["speedup"])
              for name, g in data["grids"].items()]
    heatmaps(path, panels, xlabel="W_max", ylabel="D_max", title=f"Tree shape grid of {data['base']}")
