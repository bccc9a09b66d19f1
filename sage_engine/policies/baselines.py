"""The paper's baselines as policies: `ar` (the target alone), `chain` (classic speculative decoding), `static` (a
fixed tree), `eagle2` (EAGLE-2's dynamic tree) and `specvlm` (that tree from a draft that reads part of the visual
tokens). The engine runs one loop for all of them and SAGE."""

from __future__ import annotations

import numpy as np

from ..config import ChainConfig, Eagle2Config, SpecVLMConfig, StaticConfig
from ..core import rules
from ..core.policy_io import CHAIN, COMPILED_STEP, PYTHON, DraftPath, LevelRule, StepRule, TreeShape
from ..models.pruning import VisualPruning
from .base import Policy, overridden


class AutoregressivePolicy(Policy):
    """`ar`: the target alone, one token per forward."""

    name = "ar"
    uses_draft = False

    def shape(self, root_alpha, quote=None, probe=None):
        return self.plain_shape()

    def expand(self, shape, level, tree, frontier):
        return []


class ChainPolicy(Policy):
    """`chain`: classic speculative decoding, a chain of k draft tokens."""

    name = "chain"

    def __init__(self, cfg: ChainConfig = ChainConfig()):
        self.cfg = cfg
        self.samples_draft = cfg.draw == "sample"

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.k, width=1, max_nodes=self.cfg.k, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        tokens, probs = ((frontier.top_tokens, frontier.top_probs) if frontier.drawn_tokens is None
                         else (frontier.drawn_tokens, frontier.drawn_probs))
        node = tree.add(tokens[0][0], frontier.nodes[0], probs[0][0])
        return [node] if level < shape.depth else []

    def draft_path(self, sampled):
        if sampled and self.samples_draft:
            return DraftPath(PYTHON, "its draft samples its tokens (draw=sample)")
        changed = overridden(self, ChainPolicy, ("expand", "shape", "finalize"))
        if changed:
            return DraftPath(PYTHON, f"{type(self).__name__} overrides {', '.join(changed)}")
        return DraftPath(COMPILED_STEP)

    def level_rule(self):
        return LevelRule(CHAIN)

    def step_rule(self, quote):
        k = int(self.cfg.k)  # depth k, width 1, whatever alpha
        return StepRule(LevelRule(CHAIN), float("nan"), k, k, k, 1, 1, k)


class StaticTreePolicy(Policy):
    """`static`: a fixed tree given as rank paths (default: the 25-node SpecVLM/Medusa tree)."""

    name = "static"

    def __init__(self, cfg: StaticConfig = StaticConfig()):
        paths = sorted(set(tuple(p) for p in cfg.paths), key=lambda p: (len(p), p))
        for p in paths:
            if len(p) > 1 and p[:-1] not in paths:
                raise ValueError(f"static tree path {p} has no parent path {p[:-1]}")
        self.child_ranks: dict[tuple[int, ...], list[int]] = {}
        for p in paths:
            self.child_ranks.setdefault(p[:-1], []).append(p[-1])
        self.depth = max(len(p) for p in paths)
        self.n_nodes = len(paths)
        self.top_k = max(p[-1] for p in paths) + 1
        self._path_of: dict[int, tuple[int, ...]] = {}

    def shape(self, root_alpha, quote=None, probe=None):
        self._path_of = {-1: ()}
        return TreeShape(depth=self.depth, width=len(self.child_ranks[()]), max_nodes=self.n_nodes, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        grow = []
        for row, parent in enumerate(frontier.nodes):
            prefix = self._path_of[parent]
            for rank in self.child_ranks.get(prefix, ()):
                node = tree.add(frontier.top_tokens[row][rank], parent, frontier.top_probs[row][rank])
                self._path_of[node] = prefix + (rank,)
                if self._path_of[node] in self.child_ranks:
                    grow.append(node)
        return grow


def parent_numbers(tree, nodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each frontier node's draft probability and cumulative probability (the root: 1, 1).  # -> [F], [F] float64"""
    probs = np.array([1.0 if n < 0 else tree.probs[n] for n in nodes], np.float64)
    cums = np.array([1.0 if n < 0 else tree.cum_probs[n] for n in nodes], np.float64)
    return probs, cums


class Eagle2Policy(Policy):
    """`eagle2`: expand the top-k nodes by cumulative draft probability per level, rerank all, keep N."""

    name = "eagle2"

    def __init__(self, cfg: Eagle2Config = Eagle2Config()):
        self.cfg = cfg
        self.top_k = cfg.top_k

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.depth, width=self.cfg.top_k, max_nodes=self.cfg.total_nodes, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        k = self.cfg.top_k
        # a candidate outside its level's top N can never reach the global top N: skip it early
        _, cums = parent_numbers(tree, frontier.nodes)
        rows, ranks, _ = rules.best_candidates(np.full(len(frontier.nodes), k, np.int64), cums,
                                               np.asarray(frontier.top_probs, np.float64), 0.0,
                                               int(self.cfg.total_nodes))
        added = [tree.add(frontier.top_tokens[r][c], frontier.nodes[r], frontier.top_probs[r][c])
                 for r, c in zip(rows.tolist(), ranks.tolist())]
        return added[:k] if level < shape.depth else []  # best first: the first k are the top-k

    def finalize(self, tree):
        order = sorted(range(len(tree)), key=lambda i: (-tree.cum_probs[i], tree.depths[i], i))
        return tree.subtree(order[: self.cfg.total_nodes])


class SpecVLMPolicy(Eagle2Policy):
    """`specvlm`: SpecVLM as the SAGE paper runs it, an EAGLE-2 tree drafted by a draft that reads only part of the
    visual tokens (80% of an image's and 90% of a video's left out; `draft_pruning`). The tree rule is EAGLE-2's;
    the pruning changes what the draft costs and how often it agrees, never the output."""

    name = "specvlm"

    def __init__(self, cfg: SpecVLMConfig = SpecVLMConfig()):
        super().__init__(cfg)

    @property
    def draft_pruning(self) -> VisualPruning:
        return VisualPruning(image=self.cfg.image_prune, video=self.cfg.video_prune)
