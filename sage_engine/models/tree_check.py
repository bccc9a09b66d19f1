"""The proof, once per model, that its tree passes are exact: before a model decodes a tree, the engine knows every
layer of it is of a kind it can verify a tree for (layer_kinds.py), and checks it on the model itself.

The check (`tree_refusal`), on a text prompt of the model's own tokenizer, long enough to run past the model's
narrowest window or chunk (up to 64 tokens), and again after a prompt of each kind of media the model takes (an image,
a clip: cross-attention layers and a prefix that attends both ways act only with one), on the backend its passes run
on:
  1. a tree pass over [root, a, b, c] (a and b children of the root, c a child of a), from the prompt's cache;
  2. the cache compacted to the path root -> b (a shorter branch than the tree's deepest), then one more token x;
  3. from the same prompt cache, the chains root, a, c and root, b, x each read alone, one token a pass (as `ar`).
Each tree row's logits must equal its chain's (root, a, b, c), and x's after the compaction x's after the chain,
within a tolerance far below what a wrong mask or a state that saw a rejected branch gives (fp32: 0.5% of the
logits' largest magnitude). A model whose layer kinds are not supported is refused without running it. A model
that fails is refused in one line; `ar` alone still runs on it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.cache import copy_cache
from ..core.tree import DraftTree
from ..errors import first_line

MAX_PROMPT = 64


def _prompt_length(plan) -> int:
    """Past the narrowest window or chunk where one is small enough to cross cheaply; else a short prompt."""
    narrowest = min((k.width for k in plan.kinds if getattr(k, "width", None)), default=None)
    return 8 if narrowest is None else max(8, min(narrowest + 6, MAX_PROMPT))


def tolerance(dtype: torch.dtype) -> float:
    """The largest gap, as a share of the logits' largest magnitude, two computations of the same logits may show:
    far below what a wrong mask, position or state gives."""
    return 5e-3 if dtype == torch.float32 else 5e-2


def _state(runner):
    return (copy_cache(runner.cache), runner.rope_delta, None if runner.columns is None else runner.columns.copy(),
            runner.seq_len)


def _restore(runner, state) -> None:
    cache, delta, columns, length = state
    runner.cache, runner.rope_delta = copy_cache(cache), delta
    runner.columns = None if columns is None else columns.copy()
    if runner.paths is not None:  # a recurrent model: nothing uncommitted after the prompt
        runner.paths.reset(length)


def _chain(runner, tokens: list[int]) -> torch.Tensor:
    """The logits after each of `tokens` read one at a time at positions start.., as `ar` reads them (so that a model
    whose several-token passes go wrong, a recurrent one among them, cannot pass for exact).  # [q, V]"""
    return torch.cat([runner.forward_tree(t, DraftTree()).logits for t in tokens])  # each a plain step's pass


def _passes(runner, root: int, a: int, b: int, c: int, x: int):
    """Steps 1-3 of the check from the prompt's cache: the tree's rows, x after the compaction, the two chains."""
    base, L = _state(runner), runner.seq_len
    tree = DraftTree()
    for token, parent in ((a, -1), (b, -1), (c, 0)):
        tree.add(token, parent, 1.0)
    rows = runner.forward_tree(root, tree).logits.float()  # root, a, b, c
    runner.keep(L, [0, 2])  # the path root -> b: not the tree's deepest, its node moved one column
    after = runner.forward([x], [L + 2], np.ones((1, 1), np.bool_)).logits.float()[0]
    _restore(runner, base)
    path = _chain(runner, [root, a, c]).float()
    _restore(runner, base)
    side = _chain(runner, [root, b, x]).float()
    return rows, after, path, side


def _gaps(rows, after, path, side, tol: float) -> tuple[str, float, float] | None:
    """The first of the check's pairs whose logits differ beyond `tol`: (what, gap, scale); None where none does."""
    pairs = {"the root": (rows[0], path[0]), "a node": (rows[1], path[1]), "a second branch": (rows[2], side[1]),
             "a node at depth 2": (rows[3], path[2]), "the token after a compaction": (after, side[2])}
    for what, (got, want) in pairs.items():
        scale = max(1.0, float(want.abs().max()))
        gap = float((got - want).abs().max())
        if not gap <= tol * scale:  # NaN fails too
            return what, gap, scale
    return None


def tree_refusal(runner, words: list[int], media: dict[str, dict] | None = None) -> str | None:
    """Why `runner`'s model cannot verify a tree, in a few words; None where the check passes. `words`: token ids
    of the model's tokenizer to build the check's prompt and tree from (at least 4); `media`: the model's inputs for
    each kind of prompt with a picture or a clip it takes ({"an image": inputs, ...}, ar_check.media_inputs), after
    which the check runs again (cross-attention and a prefix that attends both ways act only with a picture). Runs in
    the runner's scratch state (runner._scratch_check): nothing of it stays in the runner. Raises where no prompt
    could be read at all."""
    plan = runner.plan
    if plan.refusal is not None:
        return plan.refusal
    n = _prompt_length(plan)
    ids = (words * (n // max(len(words), 1) + 2))[: n + 4]
    prompt, (root, a, b, c) = ids[:n], ids[n:]
    x = prompt[0]
    text = {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, n, dtype=torch.long)}
    read, failure = False, None
    for medium, inputs in {"a text": text, **(media or {})}.items():
        with runner._scratch_check():
            try:
                runner.prefill(inputs, own=True)
            except Exception as e:  # noqa: BLE001 - a model that needs its picture: checked on the prompts it takes
                failure = failure or e
                continue
            read = True
            try:  # the prompt is read: from here on, any failure is the tree's
                rows, after, path, side = _passes(runner, root, a, b, c, x)
            except Exception as e:  # noqa: BLE001 - e.g. a cache whose layers cannot be compacted
                return f"a tree pass fails on it after {medium} prompt ({first_line(e)}; layers: {plan.describe()})"
        gap = _gaps(rows, after, path, side, tolerance(runner.dtype))
        if gap is not None:
            what, by, scale = gap
            return (f"its logits for {what} of a tree after {medium} prompt differ from the same tokens read alone "
                    f"(by {by:.3g}, {by / scale:.1%} of their scale; layers: {plan.describe()})")
    if not read:
        raise failure
    return None
