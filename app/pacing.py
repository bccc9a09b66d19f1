"""When the handler may send an update while the decoding thread runs.

Building an update (and Gradio serialising and sending it) takes the GIL, and on a small machine a
core, from the decoding thread: a figure rebuilt in the middle of a short speculative lane would slow the very
speed the demo measures. So updates are paid from a budget: all the updates sent since the lane
being decoded began may have cost at most `share` of its wall time so far (`new_lane`; with one budget for the
whole race, the short speculative lane spent what the autoregressive lane before it had saved). Costs are measured
(each update's round trip; each figure rebuild) and the last one of each kind is the estimate for the next. Two
exceptions keep the demo lively: the first update (the first token) is always sent, and the minimum spacings
`text_every` / `plot_every` apply on top of the budget. A run too short to afford a figure shows its
figures in the final update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Pacer:
    share: float = 0.04        # at most this share of the race's wall time goes to streamed updates
    text_every: float = 0.25   # seconds between text updates, at least
    plot_every: float = 1.0    # seconds between figure rebuilds, at least
    text_cost: float = 0.005   # estimated seconds per update round trip (replaced by the last measured one)
    plot_cost: float = 0.05    # estimated seconds per figure rebuild (replaced by the last measured one)
    start: float = field(default_factory=time.perf_counter)
    spent: float = 0.0         # seconds of updates so far
    sent: int = 0
    next_text: float = 0.0
    next_plot: float = 0.0

    def _affordable(self, cost: float, now: float) -> bool:
        return self.spent + cost <= self.share * (now - self.start)

    def new_lane(self, now: float) -> None:
        """The next lane starts decoding: its updates are paid from a budget of its own."""
        self.start, self.spent = now, 0.0

    def text_due(self, now: float) -> bool:
        return self.sent == 0 or (now >= self.next_text and self._affordable(self.text_cost, now))

    def plot_due(self, now: float) -> bool:
        """Rebuild the figures for the update about to be sent (call only when `text_due`)."""
        return now >= self.next_plot and self._affordable(self.text_cost + self.plot_cost, now)

    def plotted(self, seconds: float, now: float) -> None:
        self.plot_cost, self.spent, self.next_plot = seconds, self.spent + seconds, now + self.plot_every

    def sent_update(self, seconds: float, now: float) -> None:
        self.text_cost, self.spent, self.sent = seconds, self.spent + seconds, self.sent + 1
        self.next_text = now + self.text_every
