"""Does SAGE's premise hold for a pair? How well the draft's confidence alpha predicts what a step accepts.

The paper plans step t+1's tree from step t's confidence, on the premise that confidence carries over from
one step to the next. The engine can also read the confidence of the new tree's own root (the draft computes
that distribution before the tree is shaped). For a run's decode steps, in order, this reports:
  current_root   corr(alpha of this step's root, tokens this step accepted)
  previous_root  corr(alpha of the previous step's root, tokens this step accepted)   (the paper's signal)
  lag1           corr(alpha at step t, alpha at step t + 1)                           (its autocorrelation)
Pairs never cross from one run to the next. Measured best on a policy whose tree shape ignores alpha
(`static`, `chain`): there the accepted length is not also shaped by alpha. Steps decoded without a draft
(plain steps) carry no alpha and are skipped, and so is the pair they would have formed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from ..core.events import StepEvent


@dataclass(frozen=True)
class Premise:
    steps: int  # decode steps with an alpha
    current_root: float | None
    previous_root: float | None
    lag1: float | None
    # per tenth of alpha (0-0.1, ..., 0.9-1): [mean accepted draft tokens, steps] of the steps whose root alpha fell
    # there (the figure of alpha against the accepted length)
    by_alpha: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson correlation; None with fewer than 3 pairs or a constant side."""
    n = len(x)
    if n < 3:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def premise(runs: Iterable[Sequence[StepEvent]]) -> Premise:
    """The three correlations over the decode steps of `runs` (each run's events in order)."""
    cur: tuple[list[float], list[float]] = ([], [])
    prev: tuple[list[float], list[float]] = ([], [])
    lag: tuple[list[float], list[float]] = ([], [])
    for events in runs:
        last: float | None = None
        for e in events:
            if e.kind != "decode" or e.root_alpha is None:
                last = None
                continue
            accepted = float(len(e.accepted_tokens))
            cur[0].append(e.root_alpha)
            cur[1].append(accepted)
            if last is not None:
                prev[0].append(last)
                prev[1].append(accepted)
                lag[0].append(last)
                lag[1].append(e.root_alpha)
            last = e.root_alpha
    bins = [[0.0, 0] for _ in range(10)]
    for alpha, accepted in zip(*cur):
        b = bins[min(9, max(0, int(alpha * 10)))]
        b[0], b[1] = b[0] + accepted, b[1] + 1
    by_alpha = [[total / n if n else None, n] for total, n in bins]
    return Premise(len(cur[0]), pearson(*cur), pearson(*prev), pearson(*lag), by_alpha)
