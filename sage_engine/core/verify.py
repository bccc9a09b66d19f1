"""Verification: one target forward over [root, whole tree], then an acceptance rule.

Positions: the root sits at the target's cache length L, a node at L + its depth.
Acceptance is a separate strategy: greedy here, sampling in sampling.py; both choose the run's first token
too (`first`), from the prefill's logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .passes import Pass, rows_argmax
from .runner import ModelRunner
from .tree import DraftTree, accept_greedy


@dataclass(frozen=True)
class Trial:
    """One draft node a sampling rule tested (for the demo's tree view and its explanation; the outcome is whether
    the node is on the accepted path)."""

    node: int
    p: float  # the target's probability of the node's token after its parent (warped; ratio rule: after the
    #           earlier siblings' rejections, the residual)
    q: float  # the draft's probability of it (ratio rule: with the earlier siblings removed, renormalised)
    u: float  # the uniform behind the decision: the target's draw at the parent (tree rule) or the ratio test's


class Verdict(NamedTuple):
    """What the target decided about one tree."""

    accepted: list[int]  # accepted node indices, root side first
    accepted_tokens: list[int]  # their tokens
    bonus: int  # the target's own next token after the accepted path
    trials: list[Trial] | tuple = ()  # sampling rules: each node tested, in order


def verify_tree(runner: ModelRunner, root: int, tree: DraftTree, argmax: bool = False,
                past: int | None = None) -> Pass:
    """Target logits after the root and after every node, in one pass (with `argmax`, each row's argmax taken in
    it; `past`: the target's cache length, where the caller has it).  # [1 + n, V]"""
    return runner.forward_tree(root, tree, argmax, past)


class GreedyAcceptance:
    """Accept the longest path on which every draft token equals the target's argmax (lossless greedy)."""

    name = "greedy"
    argmax = True  # asks the verify pass for its rows' argmax (`Pass.argmax`)

    def first(self, logits: torch.Tensor) -> int:
        """The token after the prompt.  # [V]"""
        return int(logits.argmax())

    def __call__(self, tree: DraftTree, verify: Pass) -> Verdict:
        """The verdict on `tree` from its verify pass (logits [1 + n, V]; their argmax where the pass took it)."""
        best = verify.argmax
        if not tree.tokens:  # a plain step: the target's argmax after the root
            return Verdict([], [], int(verify.logits.argmax() if best is None else best.item()))
        if best is None:  # a pass that did not take it
            best = rows_argmax(verify.logits, verify.logits.device.type == "cpu")
        path, bonus = accept_greedy(tree, best.tolist())
        return Verdict(path, [tree.tokens[i] for i in path], bonus)
