"""The draft token tree as data, and the pure tensor functions over it.

A tree is stored in level order (a parent always precedes its children), with
`parents[i] == -1` meaning "child of the root". The root is the last token that is
already decided (the previous step's bonus token); it is not a node of the tree.

Nothing here runs a model: masks, positions and acceptance are plain functions
of the tree, testable on hand-built trees.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from . import rules
from .rules import tree_depths, verify_pattern


@dataclass
class DraftTree:
    """Nodes proposed by the draft model for one step (root excluded), in level order."""

    tokens: list[int] = field(default_factory=list)  # token id per node
    parents: list[int] = field(default_factory=list)  # parent node index, -1 = root
    depths: list[int] = field(default_factory=list)  # 1 = child of the root
    probs: list[float] = field(default_factory=list)  # draft probability p(token | parent path)
    cum_probs: list[float] = field(default_factory=list)  # product of probs along the path
    alphas: list[float | None] = field(default_factory=list)  # its own next-token confidence (Policy.node_alphas)
    draft_slots: list[int] = field(default_factory=list)  # column in the draft's tree region, -1 if never fed
    root_alpha: float | None = None  # confidence of the root's next-token distribution
    # a sampled draft (chain under the ratio rule): the distribution q each node's token was drawn from, else None
    q_dists: list[torch.Tensor | None] = field(default_factory=list)
    # (tokens, parents) as int64 arrays where the compiled draft made them (draft_compiled.tree_of), for the compiled
    # verify inputs; `columns()` reads them while the tree has not grown since
    arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """tokens and parents as int64 arrays.  # [n], [n]"""
        held = self.arrays
        if held is None or len(held[0]) != len(self.tokens):
            held = self.arrays = (np.array(self.tokens, np.int64), np.array(self.parents, np.int64))
        return held

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def add(self, token: int, parent: int, prob: float) -> int:
        """Append one node; returns its index."""
        parent_cum = 1.0 if parent < 0 else self.cum_probs[parent]
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.probs.append(prob)
        self.cum_probs.append(parent_cum * prob)
        self.alphas.append(None)
        self.draft_slots.append(-1)
        self.q_dists.append(None)
        return len(self.tokens) - 1

    def subtree(self, keep: list[int]) -> DraftTree:
        """The tree restricted to `keep` (must be closed under ancestors), renumbered in level order."""
        keep = sorted(keep, key=lambda i: (self.depths[i], i))
        new_index = {old: new for new, old in enumerate(keep)}
        out = DraftTree(root_alpha=self.root_alpha)
        for old in keep:
            p = self.parents[old]
            if p >= 0 and p not in new_index:
                raise ValueError(f"node {old} kept without its parent {p}")
            out.tokens.append(self.tokens[old])
            out.parents.append(-1 if p < 0 else new_index[p])
            out.depths.append(self.depths[old])
            out.probs.append(self.probs[old])
            out.cum_probs.append(self.cum_probs[old])
            out.alphas.append(self.alphas[old])
            out.draft_slots.append(self.draft_slots[old])
            out.q_dists.append(self.q_dists[old])
        return out

    def children_by_token(self) -> dict[int, dict[int, int]]:
        """parent (-1: the root) -> {token: child node}; the first sibling wins on duplicates."""
        children: dict[int, dict[int, int]] = {}
        for i, (parent, tok) in enumerate(zip(self.parents, self.tokens)):
            children.setdefault(parent, {}).setdefault(tok, i)
        return children

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    @classmethod
    def from_paths(cls, paths: list[tuple[int, ...]], tokens_of: dict[tuple[int, ...], int] | None = None):
        """A tree whose nodes are the given paths (tuples of child ranks), in level order, each node's draft
        probability 1; its token `tokens_of[path]`, else 0. Every path's prefixes must be among `paths` (else
        KeyError). For tests: hand-built trees of a known shape (the static policy builds its trees from the draft's
        ranks in `expand`, not here)."""
        tree = cls()
        index: dict[tuple[int, ...], int] = {}
        for path in sorted(set(paths), key=lambda p: (len(p), p)):
            parent = -1 if len(path) == 1 else index[path[:-1]]
            token = 0 if tokens_of is None else tokens_of[path]
            index[path] = tree.add(token, parent, 1.0)
        return tree


def verify_allowed(parents: list[int]) -> np.ndarray:
    """Attention pattern of a verify pass over [root, node_0, ..., node_{n-1}] (rules.verify_pattern).
    # [n+1, n+1] bool

    An empty tree (a plain step) gets the cached, read-only one-token pattern: nothing to build.
    """
    if not parents:
        return chain_allowed(1)
    return rules.verify_pattern(np.array(parents, np.int64))


@functools.lru_cache(maxsize=64)
def chain_allowed(q: int) -> np.ndarray:
    """Causal pattern for q consecutive tokens, read-only (one array per q, kept).  # [q, q] bool"""
    out = np.tril(np.ones((q, q), dtype=bool))
    out.flags.writeable = False
    return out


def additive_mask(allowed: np.ndarray, past_len: int, dtype: torch.dtype, device) -> torch.Tensor:
    """4D additive float mask: every query sees the whole cached past plus `allowed` in the new region.

    allowed: [q, r] bool over the r newest key columns.  Returns [1, 1, q, past_len + r].
    Additive float (0 / finfo.min) is the one format that both eager and sdpa honour.
    Built in numpy: for masks this small, one numpy pass is cheaper than several torch ops.
    """
    q, r = allowed.shape
    mask = np.zeros((1, 1, q, past_len + r), dtype=np.float32)
    mask[0, 0, :, past_len:][~allowed] = torch.finfo(dtype).min
    out = torch.from_numpy(mask)
    return out.to(device=device, dtype=dtype) if (dtype != torch.float32 or str(device) != "cpu") else out


@rules.rule
def _verify_inputs(tokens, parents, root, start, past, blocked):
    """The inputs of a verify pass over [root, nodes] appended after `past` cached columns: ids and positions [1, q]
    (the root at `start`, a node at start + its depth), the additive mask [1, 1, q, past + q] (0 over the past and
    where rules.verify_pattern allows, `blocked` elsewhere: `additive_mask(verify_allowed(parents), past)`), and the
    tree's depth, in one call.  # tokens, parents [n] int64"""
    n = tokens.shape[0]
    q = n + 1
    allowed, depth = verify_pattern(parents), tree_depths(parents)
    ids, pos = np.empty((1, q), np.int64), np.empty((1, q), np.int64)
    ids[0, 0], pos[0, 0] = root, start
    for i in range(n):
        ids[0, i + 1], pos[0, i + 1] = tokens[i], start + depth[i]
    mask4 = np.zeros((1, 1, q, past + q), np.float32)
    mask4[0, 0, :, past:] = np.where(allowed, np.float32(0.0), np.float32(blocked))
    return ids, pos, mask4, depth.max() if n else 0


def verify_inputs(tree: DraftTree, root: int, start: int, past: int,
                  blocked: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """ids and positions [1, 1 + n], the additive mask [1, 1, 1 + n, past + 1 + n] and the depth of a verify pass over
    `tree` (`_verify_inputs`), compiled where Numba is installed."""
    return _verify_inputs(*tree.columns(), root, start, past, blocked)


def warm() -> None:
    """Load the compiled builder now (compiled on a machine's first call, else read from Numba's cache), not in a
    run's first verify pass."""
    verify_inputs(DraftTree([0, 0], [-1, 0]), 0, 1, 1, -1.0)


def accept_greedy(tree: DraftTree, target_next: list[int]) -> tuple[list[int], int]:
    """Greedy acceptance: the longest root-to-node path whose tokens all equal the target's argmax.

    target_next[0] is the target's argmax after the root, target_next[1 + i] after node i.
    Returns (accepted node indices from the root down, bonus token).
    """
    path: list[int] = []
    node, want = -1, target_next[0]
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):  # one pass: a child follows its parent
        if parent == node and token == want:  # the first such sibling, as `children_by_token` picks
            path.append(i)
            node, want = i, target_next[1 + i]
    return path, want
