"""Trees through recurrent layers: each tree node read along its own root-to-node path, the paths as one batch.

A recurrent layer (Qwen3.5's and Qwen3-Next's gated delta rule, Falcon-H1's Mamba-2) keeps a state that every token
it reads changes: a tree mask does not reach it, and cutting cache columns does not undo what a rejected branch
wrote. So for a model with such layers (layer_kinds.LayerPlan.recurrent) the runner keeps its cache only up to the
last *committed* column, and the columns read since (the step's region) as tokens, each with the region columns on
its path:

  forward(tokens, allowed)  each new token's path is the region columns its pattern lets it see, then itself. The
                            paths that are not a prefix of another run as one batch, each row a plain chain read from
                            a copy of the committed cache, so every layer, recurrent or attention, computes exactly
                            what it computes on that path alone; a token's logits are its row's at its place in it.
  keep(start, cols)         the kept columns (the accepted path) are read onto the committed cache as one chain, or,
                            where the last pass ran exactly that path as a row, that row's cache is taken instead.
  commit(tokens)            a plain step's token, always kept, is read onto the committed cache directly.

Cost against a tree mask: a pass reads sum(path lengths) tokens instead of the tree's n (a tree of P root-to-leaf
paths of depth D: P * (D + 1)), over P copies of the cache (its key/value columns too); a step whose accepted path was
not one whole row reads it once more (one chain of accepted + 1 tokens). A draft's level re-reads its nodes' paths
from the step's start. The cost meter sees all of it in the step's time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import ModelError

_STATES = ("conv_states", "recurrent_states")  # a recurrent layer's per-layer dicts of batch-first tensors


def map_cache(cache, fn):
    """A new cache whose every batch-first tensor (keys, values, convolution and recurrent states) is fn(tensor); the
    layers' bookkeeping copied, so that the new one's updates never touch `cache`'s."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                setattr(twin, name, fn(t))
        for name in _STATES:
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                setattr(twin, name, {i: fn(t) if isinstance(t, torch.Tensor) else t for i, t in states.items()})
        for name, value in vars(layer).items():  # flags kept per state index (has_previous_state, ...): own copies
            if isinstance(value, dict) and name not in _STATES:
                setattr(twin, name, dict(value))
        new.layers.append(twin)
    return new


def cache_bytes(cache) -> int:
    """Bytes of every batch-first tensor of `cache` (keys, values, convolution and recurrent states)."""
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        for name in _STATES:
            for t in (getattr(layer, name, None) or {}).values():
                total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
    return total


@dataclass
class _Rows:
    """The last pass's batch: its cache after the pass and each row's region columns (None: a padded row, whose
    cache read past its path)."""

    cache: object
    paths: list[list[int] | None]


@dataclass
class PathRegion:
    """A recurrent model's uncommitted columns (see the module docstring). `committed`: the columns its cache holds."""

    committed: int = 0
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # shifted (the model's own) positions
    paths: list[list[int]] = field(default_factory=list)  # region columns before each one on its path
    rows: _Rows | None = None
    # what the paths cost, counted over the runner's life (bench and the docs read them): chains read again to commit
    # an accepted path, tokens read in batch rows, and a row's cache (keys, values, states) at the last pass, in bytes
    replays: int = 0
    row_tokens: int = 0
    row_bytes: int = 0

    @property
    def length(self) -> int:
        return self.committed + len(self.tokens)

    def reset(self, committed: int) -> None:
        """`committed` columns in the cache, nothing read since (the counters go on)."""
        self.committed, self.tokens, self.positions, self.paths, self.rows = committed, [], [], [], None

    def forward(self, model, cache, tokens: list[int], positions: list[int], allowed: np.ndarray,
                device) -> tuple[torch.Tensor, object]:
        """Append `tokens` at (shifted) `positions` under `allowed` [q, r] over the newest r columns (older ones seen
        by all): their logits [q, V], and the committed cache (columns before the pattern committed first)."""
        q, r = allowed.shape
        first = self.length + q - r  # the pattern's first column; every query sees every column before it
        if first > self.committed:
            cache = self._commit_region(model, cache, first - self.committed, device)
        base = len(self.tokens)
        for i in range(q):
            seen = [j for j in range(base) if allowed[i, j]] + [base + j for j in range(i) if allowed[i, base + j]]
            self.tokens.append(tokens[i])
            self.positions.append(positions[i])
            self.paths.append(seen)
        wanted = [self.paths[base + i] + [base + i] for i in range(q)]
        rows = _maximal(wanted)
        width = max(len(row) for row in rows)
        ids = torch.tensor([[self.tokens[c] for c in _padded(row, width)] for row in rows], device=device)
        pos = torch.tensor([self._row_positions(row, width) for row in rows], device=device)
        batch = map_cache(cache, lambda t: t.repeat(len(rows), *([1] * (t.dim() - 1))))
        logits = model(input_ids=ids, position_ids=pos, past_key_values=batch, use_cache=True).logits  # [B, T, V]
        self.rows = _Rows(batch, [row if len(row) == width else None for row in rows])
        self.row_tokens += len(rows) * width
        self.row_bytes = cache_bytes(batch) // len(rows)
        out = []
        for path in wanted:
            b = next(b for b, row in enumerate(rows) if row[: len(path)] == path)
            out.append(logits[b, len(path) - 1])
        return torch.stack(out), cache

    def keep(self, model, cache, start: int, cols: list[int], device):
        """Keep region columns start + cols (the accepted path, in order) and drop the rest: the committed cache after
        them."""
        k0 = start - self.committed
        if k0 < 0:
            raise ModelError("cannot drop committed columns of a recurrent model's cache")
        kept = list(range(k0)) + [k0 + c for c in cols]
        for m, c in enumerate(kept):
            if self.paths[c] != kept[:m]:
                raise ModelError("the kept columns of a recurrent model's cache are not one path")
        row = None if self.rows is None else next(
            (b for b, path in enumerate(self.rows.paths) if path == kept and kept), None)
        if row is not None:  # the last pass read exactly this path: its cache is the committed one now
            cache = map_cache(self.rows.cache, lambda t: t[row : row + 1].clone())
        elif kept:
            cache = self._chain(model, cache, [self.tokens[c] for c in kept], [self.positions[c] for c in kept], device)
            self.replays += 1
        self.reset(self.committed + len(kept))
        return cache

    def commit(self, model, cache, tokens: list[int], positions: list[int], device) -> torch.Tensor:
        """Read `tokens` (always kept: a plain step's) onto the committed cache: their logits [q, V]. Only with
        nothing uncommitted."""
        if self.tokens:
            raise ModelError("a recurrent model's plain step came with uncommitted columns")
        ids = torch.tensor([tokens], device=device)
        pos = torch.tensor([positions], device=device)
        logits = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True).logits[0]
        self.committed += len(tokens)
        self.rows = None
        return logits

    def _commit_region(self, model, cache, n: int, device):
        """The first n region columns, seen by every later query, read onto the committed cache."""
        for m in range(n):
            if self.paths[m] != list(range(m)):
                raise ModelError("columns every query sees are not one path in a recurrent model's region")
        cache = self._chain(model, cache, self.tokens[:n], self.positions[:n], device)
        self.replays += 1
        self.tokens, self.positions = self.tokens[n:], self.positions[n:]
        self.paths = [[c - n for c in path[n:]] for path in self.paths[n:]]
        self.committed += n
        self.rows = None
        return cache

    @staticmethod
    def _chain(model, cache, tokens: list[int], positions: list[int], device):
        ids = torch.tensor([tokens], device=device)
        pos = torch.tensor([positions], device=device)
        model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    def _row_positions(self, row: list[int], width: int) -> list[int]:
        """The row's positions, a padded row's continuing one by one after its last."""
        pos = [self.positions[c] for c in row]
        return pos + list(range(pos[-1] + 1, pos[-1] + 1 + width - len(row)))


def _maximal(paths: list[list[int]]) -> list[list[int]]:
    """The paths that are no prefix of another (each other one is read inside one of them), longest first."""
    out: list[list[int]] = []
    for path in sorted(paths, key=len, reverse=True):
        if not any(row[: len(path)] == path for row in out):
            out.append(path)
    return out


def _padded(row: list[int], width: int) -> list[int]:
    """A row made `width` long by repeating its last column (read after the path: it changes nothing the path's
    tokens compute)."""
    return row + [row[-1]] * (width - len(row))
