"""`svip`: SVIP's self-verification length policy (Zhang et al., "Draft Model Knows When to Stop"), as a user writes a
policy: a chain that stops where the draft is unsure of its next token.

At each level the chain adds the draft's top token after its last node, unless the normalised entropy of the draft's
next-token distribution there exceeds `threshold` (SVIP's bound on that entropy). The entropy is the one alpha is made
of (rules.confidence: H over the renormalised top `entropy_k`, divided by log k, so that it lies in [0, 1]); SVIP
reads the whole distribution's, which the top 10 approximate. Exact like every policy: the draft only decides what
the target verifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import rules
from ..core.policy_io import TreeShape
from .base import Policy

SVIP_NAME = "svip"


@dataclass(frozen=True)
class SvipConfig:
    threshold: float = 0.35  # stop before a position whose normalised draft entropy is above this
    max_depth: int = 12  # the longest chain


class SvipPolicy(Policy):
    """`svip`: a chain as long as the draft's next-token entropy stays at or below the threshold."""

    name = SVIP_NAME

    def __init__(self, cfg: SvipConfig = SvipConfig()):
        self.cfg = cfg

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.max_depth, width=1, max_nodes=self.cfg.max_depth, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        top = frontier.top_probs[0]
        entropy = 1.0 - rules.confidence(np.asarray(top[: self.entropy_k], np.float64))
        if entropy > self.cfg.threshold:
            return []  # the draft does not know its next token: stop the chain here
        node = tree.add(frontier.top_tokens[0][0], frontier.nodes[0], top[0])
        return [node] if level < shape.depth else []
