"""The priced policies' fall-back to plain steps (priced.py), as a small state machine.

While this run's drafted steps decode slower than plain ones (one target forward, no draft), the policy takes plain
steps, then tries the draft again; the wait doubles after each losing try (up to 8x `fallback_steps`) and a winning
stretch resets it.

  DRAFTING --drafted steps lose--> WAITING (n plain steps) --waited--> TRYING --next step--> PROBING
  PROBING  --the probe says the draft cannot pay--> WAITING (the wait doubled)
  PROBING  --the probe lets the try through--> DRAFTING (judged on a window of its own steps)

The judge is the run's last `fallback_window` drafted steps against the engine's plain rate (costs.robust_rate:
their rate plus `fallback_z` standard errors must reach it). A run's first step is judged by the engine's last drafted
steps of this policy: a draft that kept losing on earlier inputs starts the run with the longest wait, and the draft
reads the prompt only when tried, so a short answer never pays for it. A try reads the tokens the plain steps emitted
(the probe: how many of them were the draft's own top choice) and drafts only if a chain with that agreement would
beat plain steps (costs.Quote.chain_pays).
"""

from __future__ import annotations

from ..config import PricedConfig
from ..core.costs import Quote, robust_rate
from ..core.policy_io import Probe

DRAFTING, WAITING, TRYING, PROBING = "drafting", "waiting", "trying", "probing"


class PlainFallback:
    """The fall-back's state for one run of one policy: `skip` before a step, `probe_declines` when a try's shape
    is decided, `observed` after every step."""

    def __init__(self, cfg: PricedConfig):
        self.cfg = cfg
        self.state = DRAFTING
        self.plain_left = 0  # WAITING: plain steps still to take after this one
        self.wait = cfg.fallback_steps  # plain steps of the next wait
        self.drafted: list[tuple[int, float]] = []  # this run's drafted steps: (tokens, wall ms)
        self.started = False  # has the run's first step been judged?
        self.declined = False  # this step was a try the probe turned down: its read is not a drafted step to judge
        # where the judge's window starts in `drafted`: None, the run's first drafted step (judged from two steps
        # on); after a try the probe let through, that try's first step (judged once it holds a whole window)
        self.window_from: int | None = None

    @property
    def active(self) -> bool:
        return self.cfg.fallback_steps >= 1

    def skip(self, quote: Quote | None) -> bool:
        """Is this step plain? Moves WAITING on, TRYING to PROBING, DRAFTING to WAITING when the draft loses."""
        if not self.active or quote is None:
            return False
        if self.state == WAITING:
            if self.plain_left > 0:
                self.plain_left -= 1
                return True
            self.state = TRYING
        if self.state == PROBING:  # a try whose read drafted nothing yet: back to drafting, judged as usual
            self.state = DRAFTING
        plain = quote.plain_rate()
        if not self.started:
            self.started = True
            earlier = quote.drafted_rate(self.cfg.fallback_z)
            if plain is not None and earlier is not None and earlier < plain:
                self.wait = 8 * self.cfg.fallback_steps  # the longest wait: the draft lost on earlier inputs
                return self._fall_back()
        if self.state == TRYING:
            self.state = PROBING
            return False
        window, start = self.cfg.fallback_window, self.window_from
        recent = self.drafted[max(start or 0, len(self.drafted) - window):]
        if len(recent) < (2 if start is None else window) or plain is None:
            return False
        if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= plain:
            self.wait = self.cfg.fallback_steps
            return False
        return self._fall_back()

    def _fall_back(self) -> bool:
        """This step and the next `wait` - 1 are plain, then the draft is tried; the next wait doubles."""
        self.state, self.plain_left = WAITING, self.wait - 1
        self.wait = min(8 * self.cfg.fallback_steps, 2 * self.wait)
        return True

    @property
    def probing(self) -> bool:
        """Is this step a try, whose shape depends on the probe and not on alpha alone?"""
        return self.state == PROBING

    def probe_declines(self, probe: Probe | None, quote: Quote | None, chain_depth: int) -> bool:
        """A try's verdict (PROBING only): True turns the try down (back to WAITING, the step drafts nothing), else
        the try drafts and is judged on a window of its own steps from now on."""
        if self.state != PROBING:
            return False
        self.state = DRAFTING
        read = probe is not None and probe.pairs > 0
        if read and quote is not None and quote.chain_pays(probe.agreement, chain_depth) is False:
            self._fall_back()
            self.declined = True
            return True
        self.window_from = len(self.drafted) if read else None
        return False

    def observed(self, drafted: bool, stalled: bool, tokens: int, wall_ms: float) -> bool:
        """After a step: does it speak for the draft? A plain step or a turned-down try does not; a drafted step
        joins the judge's window unless the meter found something else slowed it (costs.CostMeter.stalled)."""
        if not drafted or self.declined:
            self.declined = False
            return False
        if not stalled:
            self.drafted.append((tokens, wall_ms))
        return True
