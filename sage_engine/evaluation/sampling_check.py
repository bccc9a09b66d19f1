"""`check-sampling`: is a policy's sampling lossless on this pair? A test a user can run.

Draws the first two generated tokens `samples` times (seeds 0, 1, ...) with the policy, and compares their
empirical distribution with the target's exact one, P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1), read from
the target's own logits (one prefill, then one forward per possible t1). Pearson's chi-square over the pairs
(those expected fewer than 5 times pooled into one cell), its p-value, and the total variation distance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..core.engine import SpecEngine
from ..core.sampling import Sampling, warped
from ..core.tree import chain_allowed
from ..models.inputs import PreparedInput


@dataclass(frozen=True)
class SamplingCheck:
    policy: str
    temperature: float
    top_p: float
    samples: int
    chi2: float
    dof: int
    p_value: float
    tv: float
    detectable_bias: float  # the smallest bias this test catches with power POWER (see `detectable_bias`)

    def to_dict(self) -> dict:
        return asdict(self)


def exact_pairs(engine: SpecEngine, prepared: PreparedInput, sampling: Sampling) -> dict[tuple[int, int], float]:
    """P(first two generated tokens), from the target's logits after the prompt and after each possible first."""
    runner = engine.target
    first = warped(runner.prefill(prepared.target_inputs).logits, sampling)
    start = runner.seq_len
    out: dict[tuple[int, int], float] = {}
    for t1 in torch.nonzero(first).flatten().tolist():
        second = warped(runner.forward([t1], [start], chain_allowed(1)).logits[0], sampling)
        runner.keep(start, [])
        for t2 in torch.nonzero(second).flatten().tolist():
            out[(t1, t2)] = float(first[t1] * second[t2])
    return out


def check_sampling(engine: SpecEngine, prepared: PreparedInput, policy: str, sampling: Sampling,
                   samples: int) -> SamplingCheck:
    """The chi-square test of `samples` two-token draws under `policy` against the exact distribution."""
    from scipy.stats import chi2 as chi2_dist

    exact = exact_pairs(engine, prepared, sampling)
    counts: dict[tuple[int, int], int] = {}
    kept, engine.keep_prompt = engine.keep_prompt, True  # every draw starts from the same prefilled prompt
    try:
        for seed in range(sampling.seed, sampling.seed + samples):
            s = Sampling(sampling.temperature, sampling.top_p, seed)
            # three tokens, so that the step after the first one drafts (the engine drafts no deeper than the
            # run's budget): its first level's tests decide the second token
            run = engine.generate(prepared, policy, max_new_tokens=3, ignore_eos=True, sampling=s)
            ids = tuple(run.token_ids[:2])
            counts[ids] = counts.get(ids, 0) + 1
    finally:
        engine.keep_prompt = kept
    cells = set(exact) | set(counts)
    expected = np.array([exact.get(c, 0.0) * samples for c in cells])
    observed = np.array([counts.get(c, 0) for c in cells], dtype=float)
    small = expected < 5  # pooled into one cell, so that every cell's expectation is large enough
    exp_cells = np.append(expected[~small], expected[small].sum())
    obs_cells = np.append(observed[~small], observed[small].sum())
    keep = exp_cells > 0
    if (obs_cells[~keep] > 0).any():  # a pair the target can never emit: not lossless
        chi2, dof, p_value = float("inf"), int(keep.sum()) - 1, 0.0
    else:
        chi2 = float(((obs_cells[keep] - exp_cells[keep]) ** 2 / exp_cells[keep]).sum())
        dof = max(1, int(keep.sum()) - 1)
        p_value = float(chi2_dist.sf(chi2, dof))
    tv = 0.5 * float(np.abs(observed / samples - expected / samples).sum())
    return SamplingCheck(policy, sampling.temperature, sampling.top_p, samples, chi2, dof, p_value, tv,
                         detectable_bias(exp_cells[keep] / samples, samples))


LEVEL = 0.001  # the test fails below this p-value
POWER = 0.8  # the chance of failing that `detectable_bias` is computed for


def detectable_bias(cells: np.ndarray, samples: int) -> float:
    """The smallest total-variation bias that the chi-square test over `cells` (the expected probabilities of its
    pooled cells) catches with probability POWER at LEVEL with `samples` draws, for the hardest bias to see: mass
    moved between the two likeliest cells. Moving d from a to b gives the statistic a noncentral chi-square law
    with noncentrality samples * d^2 * (1/a + 1/b); the bias is found by bisection on d."""
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import ncx2

    if len(cells) < 2:
        return 1.0  # one cell: no bias shows
    dof = len(cells) - 1
    critical = chi2_dist.isf(LEVEL, dof)
    a, b = np.sort(cells)[::-1][:2]

    def caught(d: float) -> bool:
        return ncx2.sf(critical, dof, samples * d * d * (1 / a + 1 / b)) >= POWER

    lo, hi = 0.0, float(a)  # at most all of a moves
    if not caught(hi):
        return 1.0
    for _ in range(40):
        lo, hi = (lo, (lo + hi) / 2) if caught((lo + hi) / 2) else ((lo + hi) / 2, hi)
    return hi
