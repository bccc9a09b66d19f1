"""`priced:NAME`: any policy priced by this machine's measured costs (not in the paper; ours).

The wrapped policy shapes its trees as it always does; the wrapper adds what this machine charges, read from the
engine's cost meter (costs.py) at each step:
  - prices: this step's node and level prices (costs.BreakEven) go to the policy in `TreeShape.price` (and in its
    compiled step's `StepRule.price`); a policy that reads them (SAGE: rules.threshold, rules.sage_children) keeps a
    node only where its trusted cumulative probability pays for its verification, and grows a level only where the
    frontier pays for another draft forward;
  - the plain-step fall-back (fallback.py): while drafted steps decode slower than plain ones, plain steps.

The meter reads the wall clock, so a priced run's trees depend on the machine's load; the run records what it used,
step by step (`PricedPolicy.used`, and each StepEvent's node_price and level_price), and
`PricedPolicy(policy, replay=steps)` replays those decisions and prices without a meter: the same trees and tokens.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

from ..config import PRICED_PREFIX, PricedConfig
from ..core.costs import BreakEven, Quote
from ..core.policy_io import StepOutcome
from .base import Policy
from .fallback import PlainFallback

PRICED = PRICED_PREFIX[:-1]  # the spec prefix: `priced:sage:d_max=8`

StepKind = Literal["plain", "declined", "drafted"]


class PricedStep(NamedTuple):
    """What pricing decided for one decode step, in the order the steps ran."""

    kind: StepKind  # "plain": no draft; "declined": the draft read, then its probe turned the try down; "drafted"
    price: BreakEven | None  # the node and level prices the tree was drawn under (None: none measured yet)


def replay_of(steps) -> list[PricedStep]:
    """The decisions and prices a priced run's StepEvents record (a `GenerationResult.steps`, or their JSON dicts), for
    `PricedPolicy(policy, replay=...)`. A price comes back as a BreakEven whose node and level are the recorded
    numbers exactly (rate and trust 1)."""
    out = []
    for e in steps:
        e = e if isinstance(e, dict) else e.to_dict()
        if e["kind"] != "decode":
            continue
        kind = "plain" if e["draft_path"] is None else "declined" if e["depth"] == 0 else "drafted"
        node, level = e["node_price"], e["level_price"]
        out.append(PricedStep(kind, None if node is None else BreakEven(1.0, node, level, 1.0)))
    return out


class PricedPolicy(Policy):
    """`policy` priced by this machine (module doc); `replay`: a priced run's record (`used`, `replay_of`) to follow
    instead of the meter."""

    def __init__(self, policy: Policy, cfg: PricedConfig = PricedConfig(), replay: list[PricedStep] | None = None):
        self.inner, self.pricing, self.replay = policy, cfg, replay
        self.name = f"{PRICED}:{policy.name}"
        self.reset()

    # what the drafter and the engine read of a policy: the wrapped one's
    uses_draft = property(lambda self: self.inner.uses_draft)
    top_k = property(lambda self: self.inner.top_k)
    entropy_k = property(lambda self: self.inner.entropy_k)
    samples_draft = property(lambda self: self.inner.samples_draft)
    node_alphas = property(lambda self: self.inner.node_alphas)
    draft_pruning = property(lambda self: self.inner.draft_pruning)

    @functools.cached_property
    def key(self) -> str:
        return f"{PRICED}:{self.inner.key}"

    def reset(self) -> None:
        self.inner.reset()
        self.fallback = PlainFallback(self.pricing)
        self.used: list[PricedStep] = []  # this run's decisions and prices, step by step
        self._kind: StepKind = "drafted"
        self._price: BreakEven | None = None

    def _replayed(self) -> PricedStep | None:
        return None if self.replay is None else self.replay[len(self.used)]

    def _prices(self, quote: Quote | None) -> BreakEven | None:
        """This step's node and level prices (None until the meter has measured them)."""
        held = self._replayed()
        self._price = held.price if held is not None else None if quote is None else quote.break_even()
        return self._price

    def skip_draft(self, quote=None):
        held = self._replayed()
        skip = held.kind == "plain" if held is not None else self.fallback.skip(quote)
        self._kind = "plain" if skip else "drafted"
        return skip

    def plain_shape(self):
        return self.inner.plain_shape()

    def shape(self, root_alpha, quote=None, probe=None):
        held = self._replayed()
        if held is not None:
            declined = held.kind == "declined"
        else:  # a try after plain steps: the probe says whether a chain as deep as this policy drafts would pay
            declined = self.fallback.probing and self.fallback.probe_declines(
                probe, quote, self.inner.shape(1.0, None, None).depth)
        if declined:
            self._kind = "declined"
            return self.inner.plain_shape()._replace(alpha=root_alpha)
        return self.inner.shape(root_alpha, quote, probe)._replace(price=self._prices(quote))

    def expand(self, shape, level, tree, frontier):
        return self.inner.expand(shape, level, tree, frontier)

    def finalize(self, tree):
        return self.inner.finalize(tree)

    def observe(self, outcome: StepOutcome) -> None:
        kind = self._kind if outcome.drafted else "plain"
        self.used.append(PricedStep(kind, self._price if kind == "drafted" else None))
        self._kind, self._price = "drafted", None
        if self.replay is None:
            speaks = self.fallback.observed(outcome.drafted, outcome.stalled, outcome.tokens_this_step,
                                            outcome.wall_ms)
        else:
            speaks = kind == "drafted"
        if speaks:  # a plain step, or a turned-down try, says nothing of the draft
            self.inner.observe(outcome)

    def draft_path(self, sampled):
        return self.inner.draft_path(sampled)

    def level_rule(self):
        return self.inner.level_rule()

    def step_rule(self, quote):
        held = self._replayed()
        if (held.kind == "declined") if held is not None else self.fallback.probing:
            return None  # a try after plain steps: its shape reads the probe (shape())
        rule = self.inner.step_rule(quote)
        return None if rule is None else rule._replace(price=self._prices(quote))

    def __getattr__(self, name: str):
        """Anything else (SAGE's cfg, d_max, history) is the wrapped policy's."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PricedPolicy({self.inner!r})"
