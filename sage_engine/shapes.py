"""What passes between the engine, the drafter and a policy (policy.py), and the confidence alpha they read.

A step's tree shape (`TreeShape`, the policy's answer to `shape()`), the candidates of the nodes being expanded
(`Frontier`, read by `expand()`), what the draft's read showed of its agreement after plain steps (`Probe`), what a
verified step taught (`StepOutcome`, given to `observe()`), and alpha itself (`confidence`, Eq. 7-9), which the
drafter computes from each read and level (levels.py computes the same numbers in its compiled step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .costs import BreakEven
from .tree import DraftTree


class TreeShape(NamedTuple):
    """What a policy decided for one step's tree."""

    depth: int  # maximum depth D drafted this step (0 = no draft)
    width: int  # children of the root, W
    max_nodes: int  # node budget N_max (root excluded)
    alpha: float | None = None  # confidence the shape was planned from
    d_max: int | None = None  # current D_max of the history controller (SAGE only)
    price: BreakEven | None = None  # threshold "cost": this step's node and level prices (SAGE only)


@dataclass
class Frontier:
    """The draft's top-K next-token candidates for each node being expanded at one level, as plain lists: a policy
    reads a few dozen numbers per level, for which Python lists are cheaper than arrays (see `confidence`)."""

    nodes: list[int]  # tree node per row, -1 = the root
    top_tokens: list[list[int]]  # [F][K], best first
    top_probs: list[list[float]]  # [F][K], draft probabilities (not renormalised)
    # a draft that samples (Policy.samples_draft under sampling): per row, tokens drawn without replacement from
    # q in draw order, and their q. A policy takes a row's first m drawn tokens as its children, m decided from
    # the sorted candidates above (never from the draws: that would bias the output)
    drawn_tokens: list[list[int]] | None = None  # [F][top_k]
    drawn_probs: list[list[float]] | None = None  # [F][top_k]


@dataclass(frozen=True)
class Probe:
    """What the draft's read at the start of a step showed: of the `pairs` tokens that plain steps emitted since
    it last read, how many were its own top choice. Teacher-forced on the target's tokens, it measures the draft's
    agreement without verifying anything."""

    pairs: int = 0
    matches: int = 0

    @property
    def agreement(self) -> float:
        return (self.matches + 0.5) / (self.pairs + 1)  # pulled towards 1/2 while the pairs are few


class StepOutcome(NamedTuple):
    """What a policy may learn from a verified step."""

    tree: DraftTree  # the tree that was verified
    accepted: list[int]  # accepted node indices, root side first
    tokens_this_step: int  # accepted + bonus (before truncation at EOS / budget)
    wall_ms: float = 0.0  # what the whole step cost
    drafted: bool = True  # False: a plain step (one target forward, no draft), which says nothing of the draft
    stalled: bool = False  # the engine's meter found something else slowed the step (costs.py): not the draft's cost


def confidence(top_probs: Sequence[Sequence[float]]) -> list[float]:
    """alpha = 1 - H(p) / log k over the renormalised top-k probabilities (Eq. 7-9).  # [F][k] -> [F]

    With s = sum(top_probs) and p = top_probs / s: H(p) = log s - sum(top_probs log top_probs) / s. Plain Python on
    a few rows of k numbers, once per draft level: cheaper there than numpy calls from cold caches."""
    out = []
    for row in top_probs:
        s = t = 0.0  # left-to-right sums, as levels._confidence adds them (Python 3.12's sum() compensates)
        for p in row:
            s += p
            if p > 0:
                t += p * math.log(p)
        h = math.log(s) - t / s
        out.append(1.0 - h / math.log(len(row)))
    return out
