"""What decoding costs on this machine, and what the draft's forecasts are worth, measured as the engine runs.

A tree node is worth verifying when the tokens it is expected to add buy more than the time it costs at the
rate the engine already decodes at; a draft level is worth running when the nodes it would expand could add
more than one draft forward costs; a drafted step at all is worth it only while drafted steps decode faster
than plain ones (one target forward, no draft). The paper's thresholds (theta_l = 0.1 l / D) and node budget
(64) are constants tuned for large models on GPUs, where verifying 64 nodes costs about as much as verifying
one. On a CPU, and with small models, every node and every draft level has a price, and a verify pass with
any node costs a step more than a plain one (matrix products over several rows take a slower path than over
one); `CostMeter` measures all of it (the same idea as EAGLE-2's per-device budget, `total_token=-1`, made
continuous).

A node's expected tokens are its cumulative draft probability times `trust`: accepted tokens per forecast
token over recent drafted steps. A draft that is overconfident on an input it has not learnt (a user's own
photo for the embedded pair) earns a low trust within a few steps, and its trees shrink with it.

The engine records every decode step of every policy (`StepTiming`) and hands each step's policy a `Quote`
(these figures as they stood when the step began) as an argument.

One engine, one meter, on purpose: what the machine charges (a plain step's rate, a node's and a draft level's price)
is measured over every policy's steps and carries over from run to run and from policy to policy (a `chain` run
teaches a later `sage` run what a node costs, and a first step is priced from the start); what a policy earns (its
rate, its trust, its drafted rate) is kept per policy key.
Only the tree's shape depends on these timings, never the output: every emitted token is still the
target's own choice.
"""

from __future__ import annotations

import math
from collections import deque
from operator import attrgetter
from typing import NamedTuple

from .cost_windows import DRAFT, FORWARDS, NODES, VERIFY, WALL, Moments, StepTiming, Window

# a window's steps are read through map() with these where they are read at all (`CostMeter.typical_rate`): C loops,
# where a generator expression runs a Python frame per step
_TOKENS, _WALL = attrgetter("tokens"), attrgetter("wall_ms")


class BreakEven(NamedTuple):
    """What a node or a draft level must be expected to add to pay for itself (in tokens)."""

    rate: float  # tokens per ms this policy decodes at (recent steps)
    node_ms: float  # one more tree node: its verification, its share of a draft forward and of the bookkeeping
    level_ms: float  # one more draft level: a draft forward's fixed cost
    trust: float = 1.0  # accepted tokens per forecast token on recent drafted steps (1 until measured)

    @property
    def node(self) -> float:
        """Minimum cumulative draft probability of a node worth verifying."""
        return self.rate * self.node_ms / self.trust

    @property
    def level(self) -> float:
        """Minimum sum of the frontier's cumulative draft probabilities worth another draft level."""
        return self.rate * self.level_ms / self.trust


def price_numbers(price: BreakEven | None) -> tuple[float, float]:
    """A node's and a level's price as the rules read them (rules.threshold, rules.sage_children); nan: none."""
    return (math.nan, math.nan) if price is None else (float(price.node), float(price.level))


SPIKE = 3.0  # a step that took over SPIKE x the median step's time was slowed by something else
STALL_RUN = 32  # more stalled steps in a row than this: the machine's speed has changed, and the meter follows it


def _median(values: list[float]) -> float:
    """statistics.median's value, without its type checks (a few values, every step, right after a model forward;
    no numpy call either)."""
    values = sorted(values)
    m = len(values) // 2
    return values[m] if len(values) % 2 else (values[m - 1] + values[m]) / 2


def robust_rate(steps: list[tuple[int, float]], z: float = 0.0) -> float | None:
    """Tokens per ms over (tokens, ms) steps, leaving out the steps slower than SPIKE x the median step; with z > 0,
    that rate plus z standard errors (the ratio estimator's, by the delta method): the rate the steps cannot be said
    to fall short of. A drafted step's tokens vary a lot from step to step (1 to a dozen) where a draft the target
    often agrees with meets an input it does not know, and hardly at all where the draft is plainly wrong (one token a
    step): a few steps then tell the second apart, and not the first."""
    return _robust_rate(*zip(*steps), z=z) if steps else None


def _robust_rate(tokens: tuple[int, ...] | list[int], walls: tuple[float, ...] | list[float],
                 z: float = 0.0) -> float | None:
    """`robust_rate` over the steps' tokens and ms as two columns."""
    slowest = max(walls)
    if slowest > SPIKE * min(walls):  # else none is slower than SPIKE x the median (at least the fastest): no sort
        limit = SPIKE * _median(walls)
        if slowest > limit:
            kept = [(t, ms) for t, ms in zip(tokens, walls) if ms <= limit]
            if not kept:
                return None
            tokens, walls = zip(*kept)
    wall = sum(walls)
    if wall <= 0:
        return None
    rate, n = sum(tokens) / wall, len(walls)
    if z <= 0 or n < 2:
        return rate
    spread = sum([(t - rate * ms) ** 2 for t, ms in zip(tokens, walls)]) / (n * (n - 1))
    return rate + z * math.sqrt(spread) / (wall / n)


class CostMeter:
    """Sliding windows of step timings: the engine's recent steps, its last `window` drafted ones as `Moments` (for
    the prices), and each policy's (its rate)."""

    def __init__(self, window: int = 96, policy_window: int = 24, min_steps: int = 3, recent: int = 8,
                 refit: int = 8):
        self.steps: deque[StepTiming] = deque(maxlen=window)
        self.by_policy: dict[str, Window] = {}
        self.drafted: dict[str, Window] = {}  # each policy's last `recent` drafted steps
        self.plain: deque[StepTiming] = deque(maxlen=policy_window)  # the last plain steps, of any policy
        self.policy_window = policy_window
        self.min_steps = min_steps
        self.recent = recent  # drafted steps that judge the draft now (trust, drafted rate)
        # drafted steps between two fits: the prices move slowly over a window of 96 steps, and a fit costs a step
        # more than the rest of the meter's work (it runs from cold caches)
        self.refit = refit
        self._counts = [0, 0]  # plain, drafted steps recorded so far
        self._moments = Moments(window, refit)  # the last `window` drafted steps (any policy), for the two fits
        self._plain_rate: tuple[int, float | None] | None = None  # (plain count, value) of the last computation
        self._prices: tuple[int, tuple[float, float] | None] | None = None  # (drafted count, value) of the last fit
        self._plain_estimate: tuple[int, float | None] | None = None  # (drafted count, value) of the last fit
        self._line: tuple[int, tuple[float, float] | None] | None = None  # (drafted count, drafted_line) for `stalled`
        self._stalled_run = 0  # stalled steps in a row, the last recorded
        self.stalls = 0  # stalled steps left out of the windows

    def record(self, timing: StepTiming) -> bool:
        """Add a step to every window, unless something else slowed it (`stalled`): such steps are left out of the
        rates and prices, up to STALL_RUN of them in a row (after that, they are the machine's speed now). Whether
        it was left out (then its time says nothing of the policy's choices either)."""
        self.steps.append(timing)
        if self.stalled(timing):
            self._stalled_run += 1
            if self._stalled_run <= STALL_RUN:
                self.stalls += 1
                return True
        else:
            self._stalled_run = 0
        mine = self.by_policy.get(timing.policy)
        if mine is None:
            mine = self.by_policy[timing.policy] = Window(self.policy_window)
        mine.append(timing)
        plain = timing.plain
        self._counts[not plain] += 1
        if plain:
            self.plain.append(timing)
        else:
            drafted = self.drafted.get(timing.policy)
            if drafted is None:
                drafted = self.drafted[timing.policy] = Window(self.recent)
            drafted.append(timing)
            self._moments.add((timing.nodes, timing.draft_forwards, timing.wall_ms, timing.verify_ms, timing.draft_ms))
        return False

    def stalled(self, timing: StepTiming) -> bool:
        """Did something other than the step's own work slow it: did it take over SPIKE x a typical step of its
        kind (a plain step: the measured plain rate; a drafted one: `drafted_line` at its nodes and draft forwards)?
        A stall that slows a whole run (another process takes the cores for a tenth of a second) leaves no step
        above that run's own median; kept in the windows, its steps would set the rates and prices of the next runs
        (a draft that looks beaten on the next inputs, trees priced too dear to grow)."""
        if timing.plain:
            rate = self.plain_rate() if len(self.plain) >= self.min_steps else None
            return rate is not None and timing.wall_ms * rate > SPIKE
        line = self._fitted("_line", self.drafted_line)
        units = timing.nodes + timing.draft_forwards
        return line is not None and timing.wall_ms > SPIKE * (line[0] + line[1] * units)

    def rate(self, policy: str) -> float | None:
        """Tokens per ms of `policy`'s recent steps, None before it has `min_steps`."""
        mine = self.by_policy.get(policy)
        if mine is None or len(mine) < self.min_steps or mine.wall <= 0:
            return None
        return mine.tokens / mine.wall

    @staticmethod
    def typical_rate(steps, z: float = 0.0) -> float | None:
        """Tokens per ms of `steps`, those that took over `SPIKE` times the median step left out: the judge of
        drafted against plain steps. On a shared machine one step in a few can take many times its usual time
        (another process got the core); a median of per-step rates would be robust too, but biased against
        drafted steps, whose accepted lengths are skewed (a few long paths carry the throughput)."""
        return _robust_rate(list(map(_TOKENS, steps)), list(map(_WALL, steps)), z) if steps else None

    def drafted_rate(self, policy: str, z: float = 0.0) -> float | None:
        """Typical tokens per ms of `policy`'s last `recent` drafted steps (plus z standard errors), None before it has
        `min_steps` of them."""
        mine = self.drafted.get(policy, ())
        return self.typical_rate(mine, z) if len(mine) >= self.min_steps else None

    def plain_rate(self) -> float | None:
        """Typical tokens per ms of a plain step (one target forward): measured on recent plain steps of any
        policy; where there are none, estimated as one token per the verify time of a tree of no node (the
        intercept of the drafted steps' verify time on their node count, which a plain step never exceeds: the
        estimate errs towards drafting). None when neither can be had."""
        if self._plain_rate is None or self._plain_rate[0] != self._counts[0]:  # a new plain step since
            rate = self.typical_rate(self.plain) if len(self.plain) >= self.min_steps else None
            self._plain_rate = (self._counts[0], rate)
        if self._plain_rate[1] is not None:
            return self._plain_rate[1]
        return self._fitted("_plain_estimate", self._estimate_plain_rate)

    def _estimate_plain_rate(self) -> float | None:
        if self._moments.n < self.min_steps:
            return None
        fit = self._moments.fit(y=VERIFY, x=(NODES,))
        return 1.0 / fit[0] if fit is not None and fit[0] > 0 else None

    def trust(self, policy: str) -> float:
        """Accepted draft tokens per forecast token over `policy`'s last `recent` drafted steps (1 until measured;
        kept within [0.05, 1.5] so that one lucky or unlucky step cannot switch pricing off or on entirely)."""
        mine = self.drafted.get(policy)
        if mine is None or mine.forecast_steps < self.min_steps or mine.forecast <= 0:
            return 1.0
        return min(1.5, max(0.05, (mine.forecast_tokens - mine.forecast_steps) / mine.forecast))

    def prices_ms(self) -> tuple[float, float] | None:
        """(ms per verified node, ms per draft level), over recent drafted steps of every policy (their trees differ
        in size and depth, which is what makes the slopes measurable), each a line through the part of a step's time
        that the engine measured apart: a node's price is the slope of the step's time less its draft forwards on its
        node count (the verification, and the bookkeeping that grows with the tree), a level's the slope of the draft
        forwards' time on their number; never negative. Not one least-squares fit of the wall time on both counts:
        nodes and draft forwards grow together (a chain has one of each per level), and over a window of chain and
        SAGE steps their correlation reached 0.98, where such a fit swung within one run from (0.25, 0) to (0, 0.43)
        ms and SAGE drafted chains under those prices."""
        return self._fitted("_prices", self._fit)

    def _fitted(self, slot: str, fit):
        """The value kept in `slot` as (drafted count, value), fitted again once the drafted count reaches the next
        multiple of `refit` (the same steps for every slot: the window's sums take in the steps queued since in one
        go, `Moments`), and after every new drafted step while there is none yet."""
        done, held = self._counts[1], getattr(self, slot)
        if held is None or done // self.refit != held[0] // self.refit or (held[1] is None and done != held[0]):
            held = (done, fit())
            setattr(self, slot, held)
        return held[1]

    def _fit(self) -> tuple[float, float] | None:
        if self._moments.n < self.min_steps:
            return None
        node = self._moments.line(y=WALL, x=(NODES,), minus=DRAFT)
        level = self._moments.line(y=DRAFT, x=(FORWARDS,))
        return None if node is None or level is None else (node[1], level[1])

    def drafted_line(self) -> tuple[float, float] | None:
        """(ms of a drafted step with no node and no draft forward, ms per node or draft forward): a line through
        recent drafted steps' wall times against their nodes + draft forwards (one slope: the two counts grow
        together, a chain has as many of each, and the window may hold only the small trees of a losing draft,
        too little for two), its intercept never below a plain step's time. None until measured."""
        plain = self.plain_rate()
        line = self._moments.line(y=WALL, x=(NODES, FORWARDS)) if self._moments.n >= self.min_steps else None
        if plain is None or line is None:
            return None
        return max(1.0 / plain, line[0]), line[1]

    def break_even(self, policy: str) -> BreakEven | None:
        """The current prices for `policy`, None until enough steps are measured."""
        rate, prices = self.rate(policy), self.prices_ms()
        if rate is None or prices is None:
            return None
        return BreakEven(rate=rate, node_ms=prices[0], level_ms=prices[1], trust=self.trust(policy))

    def quote(self, policy: str) -> Quote:
        """The prices `policy` (a policy key) decides this step with (the engine asks once a step)."""
        return Quote(self, policy)

    def timing(self, measured: StepTiming) -> StepTiming:
        """The timing the meter and the step's policy judge a step by: as measured. A subclass may put a model of the
        machine here (tests do, so that what a policy decides does not depend on how busy the machine is)."""
        return measured


class Quote:
    """The meter's figures as one policy setting sees them at one step, handed to the policy with the step. Each
    figure is read from the meter when first asked and kept: the engine records the step only after the policy has
    decided, so every figure of a quote is the meter as it stood when the step began (a policy that prices nothing
    asks nothing, and pays nothing for it)."""

    __slots__ = ("meter", "policy", "_seen")

    def __init__(self, meter: CostMeter, policy: str):
        self.meter, self.policy, self._seen = meter, policy, {}

    def _kept(self, name, make):
        seen = self._seen
        if name not in seen:
            seen[name] = make()
        return seen[name]

    def break_even(self) -> BreakEven | None:
        return self._kept("break_even", lambda: self.meter.break_even(self.policy))

    def plain_rate(self) -> float | None:
        return self._kept("plain", self.meter.plain_rate)

    def drafted_rate(self, z: float = 0.0) -> float | None:
        """This policy's typical rate over its last drafted steps on the engine (earlier runs included), plus z
        standard errors."""
        return self._kept(("drafted", z), lambda: self.meter.drafted_rate(self.policy, z))

    def chain_pays(self, agreement: float, max_depth: int) -> bool | None:
        """Would drafted steps beat plain ones for a draft whose next token is the target's with probability
        `agreement`: is there a chain depth D <= max_depth whose expected tokens (1 + a + ... + a^D) per its
        measured wall time (D nodes, D draft forwards) beat the plain rate? None while either is unmeasured."""
        plain, line = self.plain_rate(), self._kept("line", self.meter.drafted_line)
        if plain is None or line is None:
            return None
        base, per_unit = line  # base >= a plain step's time > 0
        tokens = 1.0
        for depth in range(1, max_depth + 1):
            tokens += agreement**depth
            if tokens / (base + per_unit * 2 * depth) > plain:
                return True
        return False
