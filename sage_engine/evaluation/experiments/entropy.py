"""`entropy` (RQ3): does the draft's confidence alpha predict what the target accepts, node by node and step by step?

Measured on `static` (the 25-node SpecVLM/Medusa tree), whose shape ignores alpha, with every drafted node's own
alpha recorded (Policy.node_alphas), so that what a node is accepted for is not also shaped by alpha. Along each
step's accepted path, every node that has children in the tree (the root included) is a trial: alpha of its own
next-token distribution (normalised top-10 entropy, rules.confidence) against whether the target's next token was
the draft's top choice there, and whether it was any of the node's children. Binned by tenths of alpha.

The step-level premise (premise.py): alpha's lag-1 autocorrelation across steps, and how well the previous step's
root alpha (the paper's signal for planning step t+1) and the current root's predict the tokens a step accepts.
"""

from __future__ import annotations

from ...policies import StaticTreePolicy
from ..bench import prepare_bench_input
from ..premise import pearson, premise
from .common import Context, Outcome, fmt

NAME = "entropy"
SUITES = ("tinyworld-images", "tinyworld-clips", "real")
CLAIM = ("The draft's normalised top-k entropy predicts acceptance (theorems 4.4-4.8), and it is strongly "
         "autocorrelated from one step to the next, so step t's confidence can shape step t+1's tree.")


class _Observed(StaticTreePolicy):
    """`static`, every drafted node's alpha recorded."""

    node_alphas = True


def trials(steps) -> list[tuple[float, bool, bool]]:
    """(alpha, top choice accepted, a child accepted) for every node with children on each step's accepted path."""
    out = []
    for e in steps:
        if e.kind != "decode" or e.tree is None or not e.tree.tokens or e.root_alpha is None:
            continue
        tree = e.tree
        children: dict[int, list[int]] = {}
        for n, parent in enumerate(tree.parents):
            children.setdefault(parent, []).append(n)
        path = [-1, *e.accepted_nodes]
        for j, node in enumerate(path):
            kids = children.get(node)
            alpha = e.root_alpha if node < 0 else (tree.alphas[node] if node < len(tree.alphas) else None)
            if not kids or alpha is None:
                continue
            top = max(kids, key=lambda k: tree.probs[k])
            nxt = path[j + 1] if j + 1 < len(path) else None
            out.append((alpha, nxt == top, nxt is not None))
    return out


def binned(points: list[tuple[float, bool, bool]]) -> list[dict]:
    bins = [{"alpha": f"{b / 10:.1f}-{(b + 1) / 10:.1f}", "n": 0, "top": 0, "any": 0} for b in range(10)]
    for alpha, top, any_ in points:
        b = bins[min(9, max(0, int(alpha * 10)))]
        b["n"], b["top"], b["any"] = b["n"] + 1, b["top"] + top, b["any"] + any_
    for b in bins:
        b["top_rate"] = b["top"] / b["n"] if b["n"] else None
        b["any_rate"] = b["any"] / b["n"] if b["n"] else None
    return bins


def _suite_cell(ctx: Context, suite, tokens: int) -> dict:
    points, runs = [], []
    for inp in suite.inputs:
        prep = prepare_bench_input(ctx.pair, inp)
        res = ctx.engine.generate(prep, _Observed(), max_new_tokens=tokens)
        points += trials(res.steps)
        runs.append(res.steps)
    return {"points": points, "premise": premise(runs).to_dict()}


def run(ctx: Context) -> Outcome:
    suites = ctx.suites(SUITES, full_n=20)
    tokens = ctx.max_new_tokens(96)
    results = {}
    with ctx.progress(len(suites), "suites") as bar:
        for suite in suites:
            results[suite.name] = ctx.cell(suite.name, lambda suite=suite: _suite_cell(ctx, suite, tokens))
            bar.update(1)
    rows, found, data = [], [], {}
    for name, cell in results.items():
        pts = [tuple(p) for p in cell["points"]]
        bins = binned(pts)
        corr = pearson([p[0] for p in pts], [float(p[1]) for p in pts])
        pr = cell["premise"]
        data[name] = {"bins": bins, "node_corr": corr, "premise": pr, "trials": len(pts)}
        for b in bins:
            if b["n"]:
                rows.append([name, b["alpha"], b["n"], fmt(b["top_rate"]), fmt(b["any_rate"])])
        filled = [b for b in bins if b["n"] >= 10]
        rising = all(a["top_rate"] <= c["top_rate"] + 0.05 for a, c in zip(filled, filled[1:]))
        trend = ("too few bins of 10+ trials to see a trend" if len(filled) < 3 else
                 f"{'rising' if rising else 'not monotone'} over the {len(filled)} bins of 10+ trials")
        found.append(f"{name}: node alpha vs top choice accepted r = {fmt(corr)} over {len(pts)} trials "
                     f"({trend}), lag-1 autocorrelation of root "
                     f"alpha {fmt(pr['lag1'])}, previous root alpha vs accepted r = {fmt(pr['previous_root'])}, "
                     f"current root's r = {fmt(pr['current_root'])}")
    return Outcome(
        title="Entropy against acceptance (RQ3)", claim=CLAIM,
        columns=["suite", "alpha", "trials", "top choice accepted", "a child accepted"], rows=rows,
        finding="; ".join(found), data={"suites": data, "max_new_tokens": tokens}, draw=draw,
        notes=["Greedy decoding: these are acceptance counts, not timings; they do not depend on the machine."])


def draw(data: dict, path) -> None:
    from .figures import lines

    series_top, series_any = {}, {}
    for name, d in data["suites"].items():
        xs = [i / 10 + 0.05 for i, b in enumerate(d["bins"]) if b["n"] >= 5]
        series_top[name] = (xs, [b["top_rate"] for b in d["bins"] if b["n"] >= 5])
        series_any[name] = (xs, [b["any_rate"] for b in d["bins"] if b["n"] >= 5])
    lines(path, [("rate", "the draft's top choice accepted", series_top),
                 ("rate", "one of the node's children accepted", series_any)],
          xlabel="the node's alpha (bins of 5+ trials)",
          title="Entropy against acceptance: measured counts (static tree)")
