"""`ddd`: Dynamic Depth Decoding (Brown et al.) as a user writes a policy: an EAGLE-2 tree that stops growing where
its beam has become unlikely.

Each level is EAGLE-2's (baselines.Eagle2Policy: the top-k candidates by cumulative draft probability are the beam
grown next); DDD stops the tree after the level whose beam's summed cumulative draft probability is below
`min_beam_mass`: the paths it would extend are, together, unlikely to be accepted. The final rerank to
`total_nodes` is EAGLE-2's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Eagle2Config
from .baselines import Eagle2Policy

DDD_NAME = "ddd"


@dataclass(frozen=True)
class DddConfig(Eagle2Config):
    depth: int = 10  # the deepest tree (DDD decides the depth within it)
    min_beam_mass: float = 0.3  # stop where the beam's summed cumulative draft probability falls below this


class DddPolicy(Eagle2Policy):
    """`ddd`: EAGLE-2's levels, stopped once the beam's mass is below `min_beam_mass`."""

    name = DDD_NAME

    def __init__(self, cfg: DddConfig = DddConfig()):
        super().__init__(cfg)

    def expand(self, shape, level, tree, frontier):
        beam = super().expand(shape, level, tree, frontier)
        return beam if sum(tree.cum_probs[n] for n in beam) >= self.cfg.min_beam_mass else []
