"""Trees through recurrent layers: each tree node read along its own root-to-node path, the paths as one batch.

A recurrent layer (Qwen3.5's and Qwen3-Next's gated delta rule, Falcon-H1's Mamba-2) keeps a state that every token
it reads changes: a tree mask does not reach it, and cutting cache columns does not undo what a rejected branch
wrote. So for a model with such layers (layer_kinds.LayerPlan.recurrent) the runner keeps its cache only up to the
last *committed* column, and the columns read since (the region) as tokens, each with the region columns on its path:

  forward(tokens, allowed)  each new token's path is the region columns its pattern lets it see, then itself. The
                            paths that are no prefix of another run as one batch, each row a plain chain read from a
                            copy of the committed cache, so every layer, recurrent or attention, computes exactly what
                            it computes on that path alone; a token's logits are its row's at its place in it. Where
                            every new token's path before it is a row the last pass read whole (a draft's next level),
                            each is read as one token after that row's cache instead.
  keep(start, cols)         the kept columns (the accepted path): where the last pass read exactly that path as a row,
                            that row's cache becomes the committed one; otherwise the path is carried, uncommitted, to
                            the head of every row of the next pass (up to CARRY_MAX tokens; a longer one is read onto
                            the committed cache at once).
  commit(tokens)            a plain step's token, always kept, read onto the committed cache after the carried path,
                            in one pass.

Cost against a tree mask: a verify pass reads sum(row lengths) tokens, about P * (D + 1 + carried) for a tree of P
root-to-leaf paths of depth D, instead of the tree's n + 1, over P copies of the cache (its key/value columns too:
`row_bytes`); a draft level reads one token a node over copies of its parents' caches. The runner's cost meter sees
all of it in each step's time, so `sage` prices trees on such a model by what they cost here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.cache import cache_bytes, map_cache
from ..errors import ModelError

CARRY_MAX = 16  # the longest accepted path carried into the next pass's rows instead of read again at once


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
        base = len(self.tokens)
        w0 = base + q - r  # the pattern's first column, as a region index; every query sees every column before it
        if w0 < 0:
            raise ModelError("a pattern over committed columns of a recurrent model's cache")
        if w0 > CARRY_MAX:  # a long carried path: commit it, so that rows stay short
            cache = self._commit_region(model, cache, w0, device)
            base, w0 = len(self.tokens), 0
        for i in range(q):
            seen = list(range(w0)) + [j for j in range(w0, base) if allowed[i, j - w0]] + \
                [base + j for j in range(i) if allowed[i, base + j - w0]]
            self.tokens.append(tokens[i])
            self.positions.append(positions[i])
            self.paths.append(seen)
        wanted = [self.paths[base + i] + [base + i] for i in range(q)]
        parents = self._parents(wanted)
        if parents is not None:  # every token continues a row the last pass read whole: one token a row
            return self._continue(model, parents, wanted, device), cache
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

    def _parents(self, wanted: list[list[int]]) -> list[int] | None:
        """For each new token, the row of the last pass that read exactly its path before it (a draft's next level:
        its nodes' parents were the last level's nodes); None unless every one has such a row."""
        if self.rows is None:
            return None
        index = {tuple(path): b for b, path in enumerate(self.rows.paths) if path is not None}
        parents = [index.get(tuple(path[:-1])) for path in wanted]
        return None if None in parents else parents

    def _continue(self, model, parents: list[int], wanted: list[list[int]], device) -> torch.Tensor:
        """Each new token read as one token after its parent row's cache (gathered into a batch): logits [q, V]."""
        index = torch.tensor(parents)
        batch = map_cache(self.rows.cache, lambda t: t.index_select(0, index.to(t.device)))
        ids = torch.tensor([[self.tokens[path[-1]]] for path in wanted], device=device)
        pos = torch.tensor([[self.positions[path[-1]]] for path in wanted], device=device)
        logits = model(input_ids=ids, position_ids=pos, past_key_values=batch, use_cache=True).logits  # [q, 1, V]
        self.rows = _Rows(batch, wanted)
        self.row_tokens += len(wanted)
        self.row_bytes = cache_bytes(batch) // len(wanted)
        return logits[:, 0]

    def keep(self, model, cache, start: int, cols: list[int], device):
        """Keep region columns start + cols (the accepted path, in order) and drop the rest: the committed cache after
        them."""
        k0 = start - self.committed
        if k0 < 0:
            raise ModelError("cannot drop committed columns of a recurrent model's cache")
        kept = list(range(k0)) + [k0 + c for c in cols]
        if not self._is_path(kept):
            raise ModelError("the kept columns of a recurrent model's cache are not one path")
        row = None if self.rows is None else next(
            (b for b, path in enumerate(self.rows.paths) if path == kept and kept), None)
        if row is not None:  # the last pass read exactly this path: its cache is the committed one now
            cache = map_cache(self.rows.cache, lambda t: t[row : row + 1].clone())
            self.reset(self.committed + len(kept))
            return cache
        # carried: the next pass reads the path at the head of every row (one pass fewer than reading it now)
        tokens, positions = [self.tokens[c] for c in kept], [self.positions[c] for c in kept]
        self.reset(self.committed)
        self.tokens, self.positions, self.paths = tokens, positions, [list(range(m)) for m in range(len(kept))]
        return self._commit_region(model, cache, len(kept), device) if len(kept) > CARRY_MAX else cache

    def commit(self, model, cache, tokens: list[int], positions: list[int], device) -> torch.Tensor:
        """Read `tokens` (always kept: a plain step's) onto the committed cache after a carried path (one pass for
        both): their logits [q, V]."""
        if not self._is_path(list(range(len(self.tokens)))):
            raise ModelError("a recurrent model's plain step came with uncommitted branches")
        logits = self._read(model, cache, self.tokens + tokens, self.positions + positions, device, len(tokens))
        self.reset(self.committed + len(self.tokens) + len(tokens))
        return logits

    def _commit_region(self, model, cache, n: int, device):
        """The first n region columns, seen by every later query, read onto the committed cache."""
        if not self._is_path(list(range(n))):
            raise ModelError("columns every query sees are not one path in a recurrent model's region")
        self._read(model, cache, self.tokens[:n], self.positions[:n], device, 1)
        self.replays += 1
        self.tokens, self.positions = self.tokens[n:], self.positions[n:]
        self.paths = [[c - n for c in path[n:]] for path in self.paths[n:]]
        self.committed += n
        self.rows = None
        return cache

    def _is_path(self, cols: list[int]) -> bool:
        """Are region columns `cols` one path, each read after exactly the ones before it?"""
        return all(self.paths[c] == cols[:m] for m, c in enumerate(cols))

    @staticmethod
    def _read(model, cache, tokens: list[int], positions: list[int], device, last: int) -> torch.Tensor:
        """`tokens` read as one chain onto `cache`: the logits after the last `last` of them.  # [last, V]"""
        ids = torch.tensor([tokens], device=device)
        pos = torch.tensor([positions], device=device)
        return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                     logits_to_keep=last).logits[0]

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
