"""What decoding costs on this machine, measured by the engine as it runs.

A tree node is worth verifying when the tokens it is expected to add (its cumulative draft probability,
the chance that the target accepts the whole path to it) buy more than the time it costs at the rate the
engine is already decoding at; a draft level is worth running when the nodes it would expand could add
more than one draft forward costs. The paper's thresholds (theta_l = 0.1 l / D) and node budget (64) are
constants tuned for large models on GPUs, where verifying 64 nodes costs about as much as verifying one.
On a CPU, and with small models, every node and every draft level has a price; `CostMeter` measures it
(the same idea as EAGLE-2's per-device budget, `total_token=-1`, made continuous).

The engine records every decode step of every policy (`StepTiming`); a policy asks `break_even(name)`.
Only the tree's shape depends on these timings, never the output: every emitted token is still the
target's own argmax.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepTiming:
    """One decode step as the engine measured it."""

    policy: str
    tokens: int  # tokens the step produced (accepted + bonus)
    nodes: int  # tree nodes the target verified (root excluded)
    wall_ms: float  # the whole step
    verify_ms: float  # the target's verification forward
    draft_ms: float  # the draft's forwards
    draft_forwards: int


@dataclass(frozen=True)
class BreakEven:
    """What a node or a draft level must be expected to add to pay for itself (in tokens)."""

    rate: float  # tokens per ms this policy decodes at (recent steps)
    node_ms: float  # one more tree node: its verification, its share of a draft forward and of the bookkeeping
    level_ms: float  # one more draft level: a draft forward's fixed cost

    @property
    def node(self) -> float:
        """Minimum cumulative probability of a node worth verifying."""
        return self.rate * self.node_ms

    @property
    def level(self) -> float:
        """Minimum expected tokens (sum of the frontier's cumulative probabilities) worth another draft level."""
        return self.rate * self.level_ms


class CostMeter:
    """Sliding windows of step timings: the engine's recent steps (for the prices) and each policy's (its rate)."""

    def __init__(self, window: int = 96, policy_window: int = 24, min_steps: int = 3):
        self.steps: deque[StepTiming] = deque(maxlen=window)
        self.by_policy: dict[str, deque[StepTiming]] = {}
        self.policy_window = policy_window
        self.min_steps = min_steps

    def record(self, timing: StepTiming) -> None:
        self.steps.append(timing)
        self.by_policy.setdefault(timing.policy, deque(maxlen=self.policy_window)).append(timing)

    def rate(self, policy: str) -> float | None:
        """Tokens per ms of `policy`'s recent steps, None before it has `min_steps`."""
        mine = self.by_policy.get(policy, ())
        wall = sum(s.wall_ms for s in mine)
        return sum(s.tokens for s in mine) / wall if len(mine) >= self.min_steps and wall > 0 else None

    def prices_ms(self) -> tuple[float, float] | None:
        """(ms per verified node, ms per draft level): least squares of a step's wall time on its node count
        and draft forwards, over recent steps of every policy (their trees differ in size and depth, which is
        what makes both slopes measurable). Everything a step costs is charged to one or the other: a node
        also costs its share of the draft forward that feeds it and of the bookkeeping; never negative."""
        if len(self.steps) < self.min_steps:
            return None
        x = np.array([[1.0, s.nodes, s.draft_forwards] for s in self.steps])
        y = np.array([s.wall_ms for s in self.steps])
        if np.linalg.matrix_rank(x) < 3:
            return None
        _, node, level = np.linalg.lstsq(x, y, rcond=None)[0]
        return max(0.0, float(node)), max(0.0, float(level))

    def break_even(self, policy: str) -> BreakEven | None:
        """The current prices for `policy`, None until enough steps are measured."""
        rate, prices = self.rate(policy), self.prices_ms()
        if rate is None or prices is None:
            return None
        return BreakEven(rate=rate, node_ms=prices[0], level_ms=prices[1])
