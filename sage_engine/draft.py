"""Drafting: the draft model grows the step's token tree level by level.

One draft forward per level over the whole frontier (not one per node), under a tree mask:
every frontier node sees the prompt, the accepted text, its own ancestors and itself.
The draft's KV cache region of a step holds the pending tokens (accepted text the draft has
not read yet; the last one is the root) followed by the fed tree nodes in feeding order;
`tree.draft_slots` records each node's column so the engine can compact it afterwards.
"""

from __future__ import annotations

import numpy as np
import torch

from .policy import Frontier, Policy, TreeShape, confidence
from .runner import ModelRunner
from .tree import DraftTree, chain_allowed

class Drafter:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    @staticmethod
    def _top(logits: torch.Tensor, k: int, entropy_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The top max(k, entropy_k) tokens and probabilities per row, and each row's confidence alpha over its
        top `entropy_k`.  # [F, V] -> [F, K] x2, [F]"""
        probs = torch.softmax(logits, dim=-1)
        p, t = torch.topk(probs, max(k, entropy_k), dim=-1)
        p, t = p.cpu().numpy(), t.cpu().numpy()
        return t, p, confidence(p[:, :entropy_k])

    def grow(self, policy: Policy, pending: list[int]) -> tuple[TreeShape, DraftTree, int]:
        """Read `pending` (its last token is the root), then draft. Returns (shape, verified tree, drafted)."""
        runner = self.runner
        p = len(pending)
        root_pos = runner.seq_len + p - 1  # sequence index of the root
        logits = runner.forward(pending, list(range(root_pos - p + 1, root_pos + 1)), chain_allowed(p))[-1:]
        tokens, probs, alpha = self._top(logits, policy.top_k, policy.entropy_k)
        tree = DraftTree(root_alpha=float(alpha[0]))
        shape = policy.shape(tree.root_alpha)
        frontier = Frontier([-1], tokens, probs)
        fed = 0  # tree nodes already in the draft cache
        for level in range(1, shape.depth + 1):
            grow = policy.expand(shape, level, tree, frontier)
            if not grow:
                break
            allowed = np.zeros((len(grow), p + fed + len(grow)), dtype=bool)  # [g, p + fed + g]
            allowed[:, :p] = True  # pending tokens: the root and what precedes it
            for j, node in enumerate(grow):
                tree.draft_slots[node] = fed + j
                a = node
                while a >= 0:
                    allowed[j, p + tree.draft_slots[a]] = True
                    a = tree.parents[a]
            logits = runner.forward(
                [tree.tokens[n] for n in grow], [root_pos + tree.depths[n] for n in grow], allowed
            )  # [g, V]
            fed += len(grow)
            tokens, probs, alpha = self._top(logits, policy.top_k, policy.entropy_k)
            for j, node in enumerate(grow):
                tree.alphas[node] = float(alpha[j])
            frontier = Frontier(grow, tokens, probs)
        drafted = len(tree)
        return shape, policy.finalize(tree), drafted
