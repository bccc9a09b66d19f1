"""A windowed model's cache, column by column: which sequence index each column holds, and how many leading columns
each windowed layer type has dropped (layer_kinds.py says which kinds see what; the runner keeps one `Columns`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.cache import compact_layers
from .layer_kinds import LayerPlan


@dataclass
class Columns:
    """The cache of a model with windowed layers, column by column: the sequence index of every column a
    full-attention layer would hold (`seq`), and for each windowed layer type how many of the first it has dropped
    because no later query can see them (`dropped`; its layers hold seq[dropped:]). The runner's cache length is
    len(seq) whatever the layers hold, so positions, regions and compactions speak of the same columns for every
    kind."""

    seq: np.ndarray  # [n] int64
    dropped: dict[str, int]

    @classmethod
    def prompt(cls, plan: LayerPlan, n: int) -> Columns:
        return cls(np.arange(n, dtype=np.int64), {k.name: 0 for k in plan.by_name.values() if k.windowed})

    def copy(self) -> Columns:
        return Columns(self.seq.copy(), dict(self.dropped))

    def append(self, q_seq: np.ndarray) -> None:
        self.seq = np.concatenate([self.seq, q_seq])

    def keep(self, start: int, cols: list[int]) -> None:
        """Columns start + cols kept, in order, the rest after `start` dropped (cache.compact's rule)."""
        self.seq = np.concatenate([self.seq[:start], self.seq[start + np.asarray(cols, np.int64)]])

    def compact(self, plan: LayerPlan, layers: list, start: int, cols: list[int]) -> None:
        """cache.compact for a windowed model's layers: each group by what it has dropped, its region counted over the
        columns it holds; then the columns kept and rolled."""
        for dropped in set(self.dropped.values()) | {0}:
            group = [layer for i, (layer, kind) in enumerate(zip(layers, plan.kinds))
                     if self.dropped.get(kind.name, 0) == dropped and i not in plan.whole_layers]
            compact_layers(group, start - dropped, cols)
        self.keep(start, cols)
        self.roll(plan, layers)

    def roll(self, plan: LayerPlan, layers: list, slack: int = 16) -> None:
        """Drop from each windowed type's layers the leading columns no query after the last column can see, once at
        least `slack` of them (or a quarter of the window) have gathered: their keys and values become views of the
        rest, which the layer's next update copies into a tensor of its own, so a windowed layer holds about its
        window, not the whole sequence."""
        n = self.seq.shape[0]
        if not n:
            return
        after = int(self.seq[-1]) + 1  # every later query sits at this sequence index or after it
        for name, kind in plan.by_name.items():
            if not kind.windowed:
                continue
            unseen = self.seq < kind.first_visible(after)
            k = n if unseen.all() else int(np.argmin(unseen))  # the leading run of columns no later query sees
            k = min(k, n - 1)  # keep one column: a layer's length is read off its keys
            step = k - self.dropped[name]
            if step < max(slack, kind.width // 4):
                continue
            for i, (layer, layer_kind) in enumerate(zip(layers, plan.kinds)):
                if layer_kind.name == name and layer.is_initialized and i not in plan.whole_layers:
                    layer.keys, layer.values = layer.keys[:, :, step:], layer.values[:, :, step:]
            self.dropped[name] = k

    def masks(self, plan: LayerPlan, q_seq: np.ndarray, allowed: np.ndarray) -> dict[str, np.ndarray]:
        """Each layer type's pattern for a pass of queries at `q_seq` [q] after these columns: the older columns
        all allowed, `allowed` [q, r] over the newest r (the last q of them these queries'), narrowed by the kind, over
        the columns that type's layers hold: {layer type: [q, held + q] bool}."""
        q, r = allowed.shape
        out = {}
        for name, kind in plan.by_name.items():
            kv_seq = np.concatenate([self.seq[self.dropped.get(name, 0):], q_seq])
            pattern = np.ones((q, kv_seq.shape[0]), np.bool_)
            pattern[:, kv_seq.shape[0] - r:] = allowed
            vis = kind.visible(q_seq, kv_seq)
            out[name] = pattern if vis is None else pattern & vis
        return out

