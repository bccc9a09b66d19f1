"""Price models of a decode step, for the `cost` experiment: what a step would cost on a machine we cannot run here.

A step's price is a line in what it does: a plain step (one target forward of one token) costs `plain`; a drafted
step costs `base` (its verify pass with no node, and the engine's own work) plus `node` per verified node plus
`level` per draft forward, or, where a verify curve is given, the curve at its node count plus `level` per draft
forward. Prices are in ms; a regime stated in target forwards (the GPU-like one) is scaled by this machine's plain
step, so that the cost meter reads numbers of the size it always does.

`ModelledMeter` is the engine's cost meter (costs.py) with the clock replaced by a price model: the engine still
decodes for real (the trees, the accepted paths and the output are real), but every step's timing, which the
meter and the step's policy judge by, is the model's. A policy that prices its trees (`sage` with threshold
"cost") then chooses its trees for the modelled machine. The measured timings are logged beside.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass

import numpy as np

from ...core.cost_windows import StepTiming
from ...core.costs import CostMeter

# The paper's regime, stated as its assumptions (no GPU report in docs/doctor): a 72B target and a 7B draft on GPUs.
GPU_VERIFY = ((0, 1.0), (64, 1.05), (128, 1.3))  # verify of n nodes in target forwards: flat to 64 ("about what one
# token does"), then rising as the batch of nodes stops hiding under the weights' memory reads
GPU_LEVEL = 0.13  # a draft forward in target forwards: the paper's split (draft decode 35%, target verify 37%) over
# about seven draft levels a step, and close to the weights' ratio 7B / 72B of a memory-bound decode
GPU_BASE = 0.01  # the engine's own work per drafted step in target forwards (the paper: tree update 0.4%)


@dataclass(frozen=True)
class PriceModel:
    name: str
    plain: float  # ms of a plain step
    base: float  # ms of a drafted step before its nodes and draft forwards
    node: float  # ms per verified node
    level: float  # ms per draft forward
    curve: tuple[tuple[int, float], ...] | None = None  # (nodes, ms of the verify pass and the engine's step)
    source: str = ""  # where the prices come from, one line

    def step(self, nodes: int, forwards: int) -> float:
        if nodes == 0 and forwards == 0:
            return self.plain
        return self.verify(nodes) + self.level * forwards

    def verify(self, nodes: int) -> float:
        if self.curve is None:
            return self.base + self.node * nodes
        xs, ys = zip(*self.curve)
        if nodes >= xs[-1]:  # past the last point: its last slope
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (nodes - xs[-1])
        return float(np.interp(nodes, xs, ys))

    def to_dict(self) -> dict:
        return {"name": self.name, "plain_ms": self.plain, "base_ms": self.base, "node_ms": self.node,
                "level_ms": self.level, "curve": self.curve, "source": self.source}


def relative(name: str, plain_ms: float, level: float, node: float = 0.0, base: float = 1.0,
             curve: tuple[tuple[int, float], ...] | None = None, source: str = "") -> PriceModel:
    """A regime stated in target forwards (a plain step = 1), scaled to this machine's plain step."""
    scaled = None if curve is None else tuple((n, c * plain_ms) for n, c in curve)
    return PriceModel(name, plain_ms, base * plain_ms, node * plain_ms, level * plain_ms, scaled, source)


def gpu_regime(plain_ms: float, doctor_glob: str = "docs/doctor/*.json") -> PriceModel:
    """The flat-verify regime: a verify curve from a `sage doctor` report made on a GPU where the project has one,
    else the paper's shape (GPU_VERIFY, GPU_LEVEL, GPU_BASE above, each assumption stated there)."""
    for path in sorted(glob.glob(doctor_glob)):
        try:
            report = json.loads(open(path).read())
        except (OSError, ValueError):
            continue
        speed = report.get("speed") or {}
        rel = (speed.get("verify") or {}).get("relative")
        if str(speed.get("device", "")).startswith("cuda") and rel:
            curve = ((0, 1.0), *sorted((int(n), float(c)) for n, c in rel.items()))
            return relative("GPU (doctor report)", plain_ms, GPU_LEVEL, curve=curve,
                            source=f"verify curve from {path}; a draft forward {GPU_LEVEL} target forwards")
    curve = tuple((n, c + GPU_BASE) for n, c in GPU_VERIFY)
    return relative("GPU-like (the paper's shape)", plain_ms, GPU_LEVEL, curve=curve,
                    source=f"no GPU doctor report: verify flat to 64 nodes ({GPU_VERIFY}), a draft forward "
                           f"{GPU_LEVEL} of a target forward, {GPU_BASE} per step of engine work")


class ModelledMeter(CostMeter):
    """The cost meter judging steps by `price` (None: by the clock), every measured timing kept in `log`."""

    def __init__(self, price: PriceModel | None):
        super().__init__()
        self.price = price
        self.log: list[StepTiming] = []

    def timing(self, measured: StepTiming) -> StepTiming:
        self.log.append(measured)
        price = self.price
        if price is None:
            return measured
        draft = price.level * measured.draft_forwards
        wall = price.step(measured.nodes, measured.draft_forwards)
        return measured._replace(wall_ms=wall, verify_ms=wall - draft, draft_ms=draft)


def fit_machine(steps: list[list[float]]) -> PriceModel:
    """This machine's prices from measured steps [tokens, nodes, forwards, wall_ms]: a plain step's mean time, and a
    least-squares line of a drafted step's time on its nodes and draft forwards (each slope kept >= 0). Means, not
    medians: a run's time is the sum of its steps, the occasional slow one included."""
    plain = [s[3] for s in steps if s[1] == 0 and s[2] == 0]
    drafted = np.array([s for s in steps if s[1] or s[2]], np.float64).reshape(-1, 4)
    plain_ms = float(np.mean(plain)) if plain else float("nan")
    if len(drafted) < 3:
        return PriceModel("this machine (fitted)", plain_ms, plain_ms, 0.0, 0.0, source="too few drafted steps")
    x = np.column_stack([np.ones(len(drafted)), drafted[:, 1], drafted[:, 2]])
    coef = np.linalg.lstsq(x, drafted[:, 3], rcond=None)[0]
    for j in (1, 2):  # a negative slope is noise on collinear counts: drop it and fit the rest again
        if coef[j] < 0:
            keep = [0, 3 - j]
            sub = np.linalg.lstsq(x[:, keep], drafted[:, 3], rcond=None)[0]
            coef = np.zeros(3)
            coef[keep] = sub
    return PriceModel("this machine (fitted)", plain_ms, float(coef[0]), float(coef[1]), float(coef[2]),
                      source=f"fitted on {len(plain)} plain and {len(drafted)} drafted steps")


def priced_rate(price: PriceModel, steps: list[list[float]]) -> float | None:
    """Tokens per ms of `steps` [tokens, nodes, forwards, ...] under `price`."""
    cost = sum(price.step(int(s[1]), int(s[2])) for s in steps)
    return sum(s[0] for s in steps) / cost if cost > 0 else None


def measured_rate(steps: list[list[float]]) -> float | None:
    wall = sum(s[3] for s in steps)
    return sum(s[0] for s in steps) / wall if wall > 0 else None
