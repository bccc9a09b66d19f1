"""What passes between the engine, the drafter and a policy (policies/): small typed messages, no logic.

A step's tree shape (`TreeShape`, the policy's answer to `shape()`), the candidates of the nodes being expanded
(`Frontier`, read by `expand()`), what the draft's read showed of its agreement after plain steps (`Probe`), what a
verified step taught (`StepOutcome`, given to `observe()`), and the policy's rules as numbers for the draft's compiled
step (`LevelRule`, `StepRule`; the rules themselves are in rules.py), with the path a step's draft took
(`DraftPath`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .costs import BreakEven
from .tree import DraftTree


class TreeShape(NamedTuple):
    """What a policy decided for one step's tree (its answer to `shape()`).

    Contract, checked on every step's verified tree (`check_tree`; the compiled paths draw within it by their
    rules): the tree is at most `depth` deep, the root has at most `width` children and the tree (after `finalize`)
    holds at most `max_nodes` nodes. The drafter also stops at `depth` and at the run's budget (the depth may be cut
    to the tokens the run may still emit). A policy may draft more than `max_nodes` before `finalize` prunes
    (EAGLE-2 reranks)."""

    depth: int  # maximum depth D drafted this step (0 = no draft)
    width: int  # at most this many children of the root, W
    max_nodes: int  # node budget N_max of the verified tree (root excluded)
    alpha: float | None = None  # confidence the shape was planned from
    d_max: int | None = None  # current D_max of the history controller (SAGE only)
    # a priced policy (policies/priced.py): this step's node and level prices, which a policy that reads them applies
    # (SAGE); None: unpriced
    price: BreakEven | None = None


def check_tree(shape: TreeShape, tree: DraftTree) -> None:
    """ValueError where a policy's tree breaks its own shape (TreeShape's contract)."""
    roots = tree.parents.count(-1)
    if tree.depth > shape.depth or roots > shape.width or len(tree) > shape.max_nodes:
        raise ValueError(f"the policy's tree (depth {tree.depth}, {roots} root children, {len(tree)} nodes) breaks its "
                         f"shape (depth {shape.depth}, width {shape.width}, {shape.max_nodes} nodes)")


@dataclass
class Frontier:
    """The draft's next-token candidates after each node being expanded at one level (`expand()` reads it), as
    plain lists: a policy reads a few dozen numbers per level, for which Python lists are cheaper than arrays.

    Contract: row r is after tree node `nodes[r]` (-1: the root); each row holds K = max(policy.top_k,
    policy.entropy_k) candidates, best first (ties: the lower token first), with their draft probabilities over the
    whole vocabulary the two models share (not renormalised over the K; under sampling the draft's warped q, i.e.
    after temperature and top-p). `rules.confidence(top_probs[r][:entropy_k])` is that row's alpha. A child's
    probability goes into `DraftTree.add` as given, so that cumulative probabilities stay the draft's."""

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


CHAIN, SAGE = 0, 1  # LevelRule.kind: a chain's one best child, or rules.sage_children


class LevelRule(NamedTuple):
    """A policy's expansion of one level, as numbers the compiled draft step reads: the chain's best child (CHAIN) or
    SAGE's rules.sage_children with these settings and the step's shape (SAGE)."""

    kind: int  # CHAIN or SAGE
    bias: float = 0.0  # Eq. 12's width_parent_bias (SAGE)
    theta_scale: float = 0.0  # theta_l = theta_scale * l / D (SAGE)


class StepRule(NamedTuple):
    """A whole step's shape as numbers, frozen for the step: depth and width from the root's alpha by rules.depth_for
    and rules.width_for (a chain: D_min = D_max = k and W = 1, whatever alpha), then the levels by `level`."""

    level: LevelRule
    alpha: float  # alpha planned before the read; nan: the new root's own (alpha_source "current_root")
    d_min: int
    d_max: int
    depth_cap: int
    w_min: int
    w_max: int
    max_nodes: int  # N_max
    price: BreakEven | None = None  # a priced policy's node and level prices this step (policies/priced.py), None: none


COMPILED_STEP, COMPILED_LEVELS, PYTHON = "compiled step", "compiled levels", "python"


class DraftPath(NamedTuple):
    """How a step's draft was drawn: "compiled step" (the draft's read, the shape and the levels in one compiled
    call), "compiled levels" (the read and the policy's shape() in Python, the levels in one call) or "python" (level
    by level through the policy's expand()); `why` says what kept it off a faster path ("" on the fastest)."""

    name: str
    why: str = ""
