"""Windows of recent decode steps whose sums the cost meter (costs.py) keeps as steps come and go: a policy's steps
(`Window`: tokens, wall time, forecasts) and the drafted steps' cross-products (`Moments`, for the meter's
least-squares lines). They keep sums, not only steps, because the meter reads them between two model forwards of
every step, where reading a window's steps (scattered over the heap) runs from cold caches.
"""

from __future__ import annotations

from collections import deque
from operator import add, itemgetter, mul, sub
from typing import NamedTuple


class StepTiming(NamedTuple):
    """One decode step as the engine measured it (a named tuple: made every step, in under half a frozen dataclass's
    time)."""

    policy: str
    tokens: int  # tokens the step produced (accepted + bonus)
    nodes: int  # tree nodes the target verified (root excluded)
    wall_ms: float  # the whole step
    verify_ms: float  # the target's verification forward
    draft_ms: float  # the draft's forwards
    draft_forwards: int
    forecast: float = 0.0  # sum of the verified nodes' cumulative draft probabilities (the draft's own tau - 1)

    @property
    def plain(self) -> bool:
        """One target forward and nothing else (ar, or a drafting policy that skipped its draft)."""
        return self.nodes == 0 and self.draft_forwards == 0


NODES, FORWARDS, WALL, VERIFY, DRAFT = 1, 2, 3, 4, 5  # a drafted step's columns in `Moments` (0: the constant 1)
_COLUMNS = 6
_PAIRS = [(i, j) for i in range(_COLUMNS) for j in range(i, _COLUMNS)]  # the products `Moments` sums, i <= j
# a row's two factors of every product, as two tuples in `_PAIRS` order, and each column's row of the symmetric matrix
# of sums from the flat list: itemgetters, so that taking a row in runs in C calls, not a Python loop over 21 products
_LEFT, _RIGHT = itemgetter(*(i for i, _ in _PAIRS)), itemgetter(*(j for _, j in _PAIRS))
_ROWS = [itemgetter(*(_PAIRS.index((min(i, j), max(i, j))) for j in range(_COLUMNS))) for i in range(_COLUMNS)]


class Moments:
    """Sums of the products of every two columns of (1, nodes, draft forwards, wall, verify and draft ms) over the last
    `window` drafted steps, kept as steps come and go: a least-squares fit of one column on others is then a small
    linear system. Plain Python, not numpy: the engine fits between model forwards, where the first numpy calls
    after a forward run from cold caches (numpy's lstsq there costs many times its own arithmetic).
    A step is queued when it comes (`add`); the sums take in the queued steps, and drop those that left the window,
    `batch` at a time as they come, or when a fit reads them: code run once a step runs from cold caches, where a
    few steps at a time run warm after the first. Taking them in as they come, not only when read, has each policy's
    steps pay for their own rows: a chain reads no fit, and its run would otherwise leave a whole run of rows to the
    first step of the next run that reads one."""

    def __init__(self, window: int, batch: int = 4):
        self.batch = batch
        self.rows: deque[tuple[float, ...]] = deque(maxlen=window)
        self._sums = [0.0] * len(_PAIRS)  # in `_PAIRS` order
        self._matrix: list[tuple[float, ...]] | None = None  # `sums`, made from `_sums` when first read
        self._entered: list[tuple[float, ...]] = []  # rows added since the sums were last brought up to date
        self._left: list[tuple[float, ...]] = []  # rows that left the window since then

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def sums(self) -> list[tuple[float, ...]]:
        """The sums over the window now, as a symmetric matrix: sums[i][j] = sums[j][i]."""
        self._take_in()
        if self._matrix is None:
            self._matrix = [row(self._sums) for row in _ROWS]
        return self._matrix

    def _take_in(self) -> None:
        """Bring the sums up to date: the rows that left the window subtracted, the rows that entered it added."""
        if not self._entered and not self._left:
            return
        sums = self._sums
        for row in self._left:
            sums = list(map(sub, sums, map(mul, _LEFT(row), _RIGHT(row))))
        for row in self._entered:
            sums = list(map(add, sums, map(mul, _LEFT(row), _RIGHT(row))))
        self._sums, self._matrix = sums, None
        self._left.clear()
        self._entered.clear()

    def add(self, step: tuple[float, float, float, float, float]) -> None:
        row = (1.0, *step)  # ints and floats: every product and sum the same as over floats (counts stay small)
        if len(self.rows) == self.rows.maxlen:
            self._left.append(self.rows[0])
        self.rows.append(row)
        self._entered.append(row)
        if len(self._entered) >= self.batch:
            self._take_in()

    def fit(self, y: int, x: tuple[int, ...]) -> list[float] | None:
        """Intercept and slopes of column `y` on columns `x`, None when the columns of x (with the constant) are
        linearly dependent over the window (e.g. every step of the same size)."""
        cols = (0, *x)
        s = self.sums
        return _solve([[s[i][j] for j in cols] + [s[i][y]] for i in cols])

    def line(self, y: int, x: tuple[int, ...], minus: int | None = None) -> tuple[float, float] | None:
        """(intercept, slope) of column `y` (less column `minus`) on the sum of columns `x`, the slope kept >= 0 (the
        intercept then refitted); None when that sum is the same for every step of the window. Plain loops, no
        generator or closure: a fit runs between model forwards, from cold caches."""
        s = self.sums
        first = s[0]
        n, u, uu, xy = first[0], 0.0, 0.0, 0.0  # steps; sums of x, of x squared, of x times y (less minus)
        w = first[y] - (0.0 if minus is None else first[minus])  # sum of y (less minus)
        for i in x:
            u += first[i]
            xy += s[i][y] - (0.0 if minus is None else s[i][minus])
            for j in x:
                uu += s[i][j]
        det = n * uu - u * u
        if det <= 1e-9 * n * uu:
            return None
        slope = max(0.0, (n * xy - u * w) / det)
        return (w - slope * u) / n, slope


def _solve(a: list[list[float]]) -> list[float] | None:
    """The solution of the square system in augmented rows `a` (Gaussian elimination, partial pivoting), None when
    it is singular relative to the scale of its diagonal."""
    n = len(a)
    scale = max(abs(a[i][i]) for i in range(n)) or 1.0
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) <= 1e-9 * scale:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(c + 1, n):
            f = a[r][c] / a[c][c]
            a[r] = [u - f * v for u, v in zip(a[r], a[c])]
    out = [0.0] * n
    for c in range(n - 1, -1, -1):
        out[c] = (a[c][n] - sum(a[c][j] * out[j] for j in range(c + 1, n))) / a[c][c]
    return out


class _NoStep:
    """What leaves a window that is not full yet: nothing."""

    tokens, wall_ms, forecast = 0, 0.0, 0.0


_NO_STEP = _NoStep()


class Window:
    """A policy's last `maxlen` steps (a deque), with their tokens and wall time, and the forecast and tokens of those
    that had a forecast, kept summed as steps come and go: a rate or the trust reads a few numbers, not the steps
    (which lie all over the heap and come back from memory right after a model forward). The sums are made
    again from the steps every `maxlen` steps, so that rounding in the running sums cannot build up."""

    def __init__(self, maxlen: int):
        self.steps: deque[StepTiming] = deque(maxlen=maxlen)
        self.tokens, self.wall, self.forecast, self.forecast_tokens, self.forecast_steps = 0, 0.0, 0.0, 0, 0
        self._fresh = maxlen  # steps until the sums are made again from the steps

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def _count(self, s: StepTiming) -> None:
        self.tokens += s.tokens
        self.wall += s.wall_ms
        if s.forecast > 0:
            self.forecast += s.forecast
            self.forecast_tokens += s.tokens
            self.forecast_steps += 1

    def append(self, step: StepTiming) -> None:
        """Add `step`; the step it pushes out of a full window leaves the sums in the same statements (no call per
        step: this runs twice a step, right after the target's forward)."""
        steps = self.steps
        self._fresh -= 1
        if self._fresh <= 0:  # the sums made again from the steps held
            steps.append(step)
            self._fresh = steps.maxlen
            self.tokens, self.wall, self.forecast, self.forecast_tokens, self.forecast_steps = 0, 0.0, 0.0, 0, 0
            for s in steps:
                self._count(s)
            return
        gone = steps[0] if len(steps) == steps.maxlen else _NO_STEP
        steps.append(step)
        self.tokens += step.tokens - gone.tokens
        self.wall += step.wall_ms - gone.wall_ms
        if step.forecast > 0 or gone.forecast > 0:
            came, left = step.forecast > 0, gone.forecast > 0
            self.forecast += came * step.forecast - left * gone.forecast
            self.forecast_tokens += came * step.tokens - left * gone.tokens
            self.forecast_steps += came - left
