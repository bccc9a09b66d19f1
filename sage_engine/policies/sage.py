"""`sage`: the tree shaped by the draft's confidence alpha, with a history controller on D_max (the SAGE paper).

Depth and width come from alpha (Eq. 10-11: deep and narrow when sure, shallow and wide when not), each level's
children from Eq. 12's decaying widths above theta_l, all through rules.py, the one definition every path runs.
Nothing here reads the clock: the same input and settings draw the same trees in every run. This machine's prices
are a wrapper any policy can take (priced.py, `priced:sage`): it hands SAGE each step's node and level prices in
`TreeShape.price`, which `expand` and the compiled levels apply on top of theta_l.

A subclass may override `depth_for`, `width_for` (the compiled levels still serve it) or `expand` (then it drafts
level by level in Python); `draft_path` says which path its hooks allow and why.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import SageConfig
from ..core import rules
from ..core.costs import price_numbers
from ..core.policy_io import COMPILED_LEVELS, COMPILED_STEP, PYTHON, SAGE, DraftPath, LevelRule, StepRule, TreeShape
from .base import Policy, overridden
from .baselines import parent_numbers

# the hooks a subclass may change: each keeps the policy off the paths that would not call it
_SHAPE_HOOKS = ("depth_for", "width_for", "shape")
_LEVEL_HOOKS = ("expand", "finalize")


class SagePolicy(Policy):
    """`sage`: entropy-guided depth and width, width decay, thresholds, history controller on D_max."""

    name = "sage"

    def __init__(self, cfg: SageConfig = SageConfig()):
        """A SagePolicy is unpriced whatever `cfg.threshold` says: that knob is read by make_policy, which wraps the
        policy in PricedPolicy for "cost" (as `priced:sage`)."""
        self.cfg = cfg
        self.samples_draft = cfg.draw == "sample"
        self.top_k = cfg.w_max  # candidates per node: at most W_max children
        self.entropy_k = cfg.k
        self.node_alphas = cfg.alpha_source == "prev_path"  # the accepted path's alphas plan the next tree
        self.reset()

    def reset(self) -> None:
        """A new run: confidence alpha0, D_max from the settings, an empty history."""
        self.alpha = self.cfg.alpha0  # confidence planned for the next tree
        self.d_max = self.cfg.d_max  # moved by the history controller
        self.history: list[int] = []
        self._cooldown = 0

    # Eq. 10-11 (rules.py)
    def depth_for(self, alpha: float) -> int:
        return rules.depth_for(float(alpha), int(self.cfg.d_min), int(self.d_max), int(self.cfg.max_depth_cap))

    def width_for(self, alpha: float) -> int:
        return rules.width_for(float(alpha), int(self.cfg.w_min), int(self.cfg.w_max))

    def plain_shape(self) -> TreeShape:
        return TreeShape(depth=0, width=0, max_nodes=0, d_max=self.d_max)

    def _planned_alpha(self, root_alpha: float | None) -> float:
        return root_alpha if (self.cfg.alpha_source == "current_root" and root_alpha is not None) else self.alpha

    def shape(self, root_alpha, quote=None, probe=None):
        alpha = self._planned_alpha(root_alpha)
        return TreeShape(self.depth_for(alpha), self.width_for(alpha), self.cfg.n_max, alpha, self.d_max)

    def expand(self, shape, level, tree, frontier):
        cfg = self.cfg
        node_price, level_price = price_numbers(shape.price)
        probs, cums = parent_numbers(tree, frontier.nodes)
        rows, ranks, grow = rules.sage_children(
            level, int(shape.width), int(shape.depth), float(cfg.width_parent_bias), float(cfg.theta_scale),
            node_price, level_price, probs, cums, np.asarray(frontier.top_probs, np.float64),
            int(shape.max_nodes - len(tree)))
        rows = rows.tolist()
        if frontier.drawn_tokens is None:
            added = [tree.add(frontier.top_tokens[r][c], frontier.nodes[r], frontier.top_probs[r][c])
                     for r, c in zip(rows, ranks.tolist())]
        else:  # a sampled draft: as many children per row as the ranked candidates earned, the first drawn ones
            added = [tree.add(frontier.drawn_tokens[r][c], frontier.nodes[r], frontier.drawn_probs[r][c])
                     for r in range(len(frontier.nodes)) for c in range(rows.count(r))]
        return added if grow else []

    def observe(self, outcome):
        cfg = self.cfg
        if not outcome.drafted:
            return  # a plain step says nothing of the draft
        tree, path = outcome.tree, outcome.accepted
        if cfg.alpha_source == "prev_root" and tree.root_alpha is not None:
            self.alpha = tree.root_alpha
        elif cfg.alpha_source == "prev_path":
            seen = [tree.root_alpha] + [tree.alphas[n] for n in path]
            seen = [a for a in seen if a is not None]
            if seen:
                self.alpha = float(sum(seen) / len(seen))
        # History controller: sliding window of tokens per step.
        self.history = (self.history + [outcome.tokens_this_step])[-cfg.history_window :]
        if self._cooldown > 0:
            self._cooldown -= 1
            return
        mean = sum(self.history) / len(self.history)
        lo, hi = cfg.d_max_bounds
        if mean < cfg.history_low and self.d_max > lo:
            self.d_max = max(lo, self.d_max - cfg.history_step)
            self._cooldown = cfg.history_cooldown
        elif mean > cfg.history_high and self.d_max < hi:
            self.d_max = min(hi, self.d_max + cfg.history_step)
            self._cooldown = cfg.history_cooldown

    # ------------------------------------------------------------------ compiled forms
    def draft_path(self, sampled):
        name = type(self).__name__
        if sampled and self.samples_draft:
            return DraftPath(PYTHON, "its draft samples its tokens (draw=sample)")
        if self.node_alphas:
            return DraftPath(PYTHON, "it reads every node's alpha (alpha_source=prev_path)")
        changed = overridden(self, SagePolicy, _LEVEL_HOOKS)
        if changed:
            return DraftPath(PYTHON, f"{name} overrides {', '.join(changed)}")
        changed = overridden(self, SagePolicy, _SHAPE_HOOKS)
        if changed:
            return DraftPath(COMPILED_LEVELS, f"{name} overrides {', '.join(changed)}")
        return DraftPath(COMPILED_STEP)

    def level_rule(self):
        return LevelRule(SAGE, float(self.cfg.width_parent_bias), float(self.cfg.theta_scale))

    def step_rule(self, quote):
        cfg = self.cfg
        alpha = math.nan if cfg.alpha_source == "current_root" else float(self.alpha)
        return StepRule(self.level_rule(), alpha, int(cfg.d_min), int(self.d_max), int(cfg.max_depth_cap),
                        int(cfg.w_min), int(cfg.w_max), int(cfg.n_max))
