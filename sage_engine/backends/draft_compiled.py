"""The draft's drafted step in one compiled call, where its layers are the compiled ones (backends/numba_layers.py).

A chain's or SAGE's step, greedy or sampled with a draft that ranks its candidates, runs in one Numba call
(`_draft_step`): the draft's read of the tokens it missed, the root's top-k and alpha, the tree's depth and width
from alpha, then every level (`_draft_levels`): the policy's expansion, the level's attention pattern, one forward
over the nodes to grow and their top-k. Every rule in it is rules.py's function (confidence, depth_for, width_for,
sage_children, level_pattern), the one the Python policies run too; this module only orders them around the
compiled forward. Which steps take this path is the policy's to say (Policy.draft_path, step_rule): where the shape
needs more than alpha (SAGE's try after plain steps, or a subclass's own depth_for/width_for) the drafter reads and
shapes in Python and only the levels are one call (`draft_levels`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..core import jit as jit_mod
from ..core import rules
from ..core.costs import price_numbers
from ..core.jit import jit, numba
from ..core.policy_io import CHAIN, LevelRule, StepRule, TreeShape
from ..core.rules import confidence, depth_for, level_pattern, sage_children, warped_top, width_for
from ..core.tree import DraftTree, chain_allowed
from .numba_layers import CompiledDecoder, _forward_jit, _top_jit, toy_weights


def _expand(kind, level, numbers, rows, top_p, top_t, t_tok, t_parent, t_prob, t_cum, count):
    """Append one level's nodes to the tree's arrays (the first `count` nodes): the chain's best child (CHAIN) or
    rules.sage_children (SAGE). numbers: (width, bias, theta scale, node price, level price (nan: none), max nodes,
    depth).  # -> (new count, whether the added nodes are grown)"""
    width, bias, theta_scale, node_price, level_price, max_nodes, depth = numbers
    if kind == CHAIN:
        chosen_rows, chosen_ranks, grow = np.zeros(1, np.int64), np.zeros(1, np.int64), level < depth
    else:
        F = rows.shape[0]
        parent_prob, parent_cum = np.ones(F), np.ones(F)
        for r in range(F):
            if rows[r] >= 0:
                parent_prob[r], parent_cum[r] = t_prob[rows[r]], t_cum[rows[r]]
        chosen_rows, chosen_ranks, grow = sage_children(level, width, depth, bias, theta_scale, node_price,
                                                              level_price, parent_prob, parent_cum, top_p,
                                                              max(max_nodes - count, 0))
    for i in range(chosen_rows.shape[0]):
        row, rank = chosen_rows[i], chosen_ranks[i]
        t_tok[count], t_parent[count], t_prob[count] = top_t[row, rank], rows[row], top_p[row, rank]
        t_cum[count] = (1.0 if rows[row] < 0 else t_cum[rows[row]]) * t_prob[count]  # DraftTree.add's product
        count += 1
    return count, grow


def _draft_levels(kind, numbers, temperature, nucleus, root_p, root_t, ends, p, root_pos, n, vocab, embed, cos,
                  sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor, head,
                  head_b, keys, values):
    """The levels after the draft's read, in one call: each level the policy's expansion (`_expand`), then one forward
    over the nodes to grow (end tokens are not grown) under rules.level_pattern, after n cached columns of which the
    newest p are the pending tokens, and their softmax top-k (temperature > 0: a sampled run's warped distribution
    with top-p `nucleus`, rules.warped_top). root_p, root_t [K]: the root's candidates.
    # -> the nodes' tokens, parents, depths, probs, cum probs, draft slots (-1: never fed), forwards, nodes fed"""
    max_nodes, depth = numbers[5], numbers[6]
    size = max(max_nodes, depth) + 1
    t_tok, t_parent, t_slot = np.empty(size, np.int64), np.empty(size, np.int64), np.full(size, -1, np.int64)
    t_prob, t_cum, t_depth = np.empty(size, np.float64), np.empty(size, np.float64), np.empty(size, np.int64)
    rows = np.full(1, -1, np.int64)
    top_p, top_t = root_p.reshape(1, -1), root_t.reshape(1, -1)
    count, fed, forwards = 0, 0, 0
    for level in range(1, depth + 1):
        start = count
        count, go = _expand(kind, level, numbers, rows, top_p, top_t, t_tok, t_parent, t_prob, t_cum, count)
        t_depth[start:count] = level
        grow = np.empty(count - start, np.int64)
        g = 0
        for node in range(start, count):
            if go and not np.any(ends == t_tok[node]):
                grow[g] = node
                g += 1
        if g == 0:
            break
        grow = grow[:g]
        tokens, positions = np.empty(g, np.int64), np.empty(g, np.int64)
        for j in range(g):
            t_slot[grow[j]] = fed + j
            tokens[j], positions[j] = t_tok[grow[j]], root_pos + level
        blocked = ~level_pattern(grow, t_parent, t_slot, p, fed)  # [g, p + fed + g]
        logits = _forward_jit(tokens, positions, blocked, n + fed, embed, cos, sin, floor1, qkv, qkv_b, heads, scaling,
                              out_w, out_b, floor2, gate_up, down, down_b, floor, head, head_b, keys, values)
        fed += g
        forwards += 1
        if temperature > 0:
            top_p, top_t = warped_top(logits[:, :vocab], root_p.shape[0], temperature, nucleus)
        else:
            probs, top_t = _top_jit(np.ascontiguousarray(logits[:, :vocab]), root_p.shape[0])
            top_p = probs.astype(np.float64)  # exact: the level loop reads the same float32 numbers
        rows = grow
    nodes = t_tok[:count], t_parent[:count], t_depth[:count], t_prob[:count], t_cum[:count], t_slot[:count]
    return (*nodes, forwards, fed)


def _draft_step(kind, plan, temperature, nucleus, max_depth, vocab, tokens, positions, blocked, n, ends, root_pos,
                embed, cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor,
                head, head_b, keys, values):
    """A drafted step in one call: the draft's read of the pending `tokens` (after n cached columns, `blocked` their
    causal pattern), the root's top-k (temperature > 0: of the warped distribution) and alpha (rules.confidence), the
    tree's depth and width from alpha (rules.depth_for, rules.width_for), then its levels (`_draft_levels`).
    plan: (alpha planned before the read, nan: the root's; D_min, D_max, depth cap, W_min, W_max, k, entropy k,
    width bias, theta scale, node price, level price (nan: none), max nodes); max_depth: the run's budget.
    # -> root alpha, the alpha used, depth, width, then `_draft_levels`' outputs"""
    fixed, d_min, d_max, cap, w_min, w_max, k, entropy_k, bias, theta_scale, node_price, level_price, max_nodes = plan
    p = tokens.shape[0]
    logits = _forward_jit(tokens, positions, blocked, n, embed, cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w,
                          out_b, floor2, gate_up, down, down_b, floor, head, head_b, keys, values)
    if temperature > 0:
        probs, top = warped_top(logits[p - 1 :, :vocab], k, temperature, nucleus)
    else:
        probs32, top = _top_jit(np.ascontiguousarray(logits[p - 1 :, :vocab]), k)
        probs = probs32.astype(np.float64)  # exact: the Python path reads the same float32 numbers
    root_alpha = confidence(probs[0, :entropy_k])
    alpha = root_alpha if math.isnan(fixed) else fixed
    depth = min(depth_for(alpha, d_min, d_max, cap), max_depth)
    width = width_for(alpha, w_min, w_max)
    numbers = (width, bias, theta_scale, node_price, level_price, max_nodes, depth)
    tok, parent, depths, prob, cum, slot, forwards, fed = _draft_levels(
        kind, numbers, temperature, nucleus, probs[0].copy(), top[0].copy(), ends, p, root_pos, n + p, vocab, embed,
        cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor, head,
        head_b, keys, values)
    return root_alpha, alpha, depth, width, tok, parent, depths, prob, cum, slot, forwards, fed


if numba is not None:  # the rules' arithmetic exactly as Python does it: no fast-math, Python's errors
    _expand, _draft_levels, _draft_step = map(jit, (_expand, _draft_levels, _draft_step))
AVAILABLE = numba is not None and _forward_jit is not None


def _warp(sampling) -> tuple[float, float]:
    """A sampled run's warp of the draft's distribution (temperature, top-p); (0, 1) when greedy."""
    return (0.0, 1.0) if sampling is None or sampling.greedy else (float(sampling.temperature), float(sampling.top_p))


def draft_levels(decoder: CompiledDecoder, rule: LevelRule, shape: TreeShape, sampling, root: tuple[list, list],
                 ends: np.ndarray, p: int, root_pos: int, vocab: int | None, cache) -> tuple[tuple, int]:
    """The levels after the draft's read in one compiled call (`_draft_levels`), shaped by `shape` and expanded by
    `rule`: `root` the root's candidates (probabilities, tokens), `ends` the tokens not to grow [int64], p the pending
    tokens the read fed, root_pos the root's (shifted) rotary position.  # -> the nodes (`tree_of`), forwards"""
    cos, sin = decoder._rope(root_pos + shape.depth)
    layers = [cache.layers[f.index] for f in decoder.layers]
    n = decoder.buffers.reserve(layers, max(shape.max_nodes, shape.depth))
    keys, values = decoder.buffers.arrays
    numbers = (int(shape.width), rule.bias, rule.theta_scale, *price_numbers(shape.price), int(shape.max_nodes),
               int(shape.depth))
    tok, parent, depth, prob, cum, slot, forwards, fed = _draft_levels(
        rule.kind, numbers, *_warp(sampling), np.array(root[0], np.float64), np.array(root[1], np.int64), ends, p,
        root_pos, n, decoder.head.shape[1] if vocab is None else vocab, decoder.embed, cos, sin, *decoder.weights,
        keys, values)
    decoder.buffers.publish(layers, n + fed)
    return (tok, parent, depth, prob, cum, slot), forwards


def draft_step(decoder: CompiledDecoder, rule: StepRule, sampling, k: int, entropy_k: int, pending: list[int],
               root_pos: int, max_depth: int, ends: np.ndarray, vocab: int | None, cache):
    """A drafted step in one compiled call (`_draft_step`): the read of the `pending` tokens (the last is the root, at
    (shifted) rotary position root_pos), the shape from `rule`, the levels; k candidates a node, alpha over the top
    entropy_k.  # -> the nodes (`tree_of`), the root's alpha, the shape, draft forwards"""
    p = len(pending)
    reach = max(rule.depth_cap, rule.max_nodes)  # the most cache columns the levels may feed
    cos, sin = decoder._rope(root_pos + reach)
    layers = [cache.layers[f.index] for f in decoder.layers]
    n = decoder.buffers.reserve(layers, p + reach)
    keys, values = decoder.buffers.arrays
    plan = (rule.alpha, rule.d_min, rule.d_max, rule.depth_cap, rule.w_min, rule.w_max, k, entropy_k,
            rule.level.bias, rule.level.theta_scale, *price_numbers(rule.price), rule.max_nodes)
    root_alpha, alpha, depth, width, tok, parent, depths, prob, cum, slot, forwards, fed = _draft_step(
        rule.level.kind, plan, *_warp(sampling), max_depth, decoder.head.shape[1] if vocab is None else vocab,
        np.array(pending, np.int64), np.arange(root_pos - p + 1, root_pos + 1, dtype=np.int64), _causal(p), n, ends,
        root_pos, decoder.embed, cos, sin, *decoder.weights, keys, values)
    decoder.buffers.publish(layers, n + p + fed)
    d_max = None if rule.level.kind == CHAIN else rule.d_max
    shape = TreeShape(depth, width, rule.max_nodes, alpha, d_max, rule.price)
    return (tok, parent, depths, prob, cum, slot), root_alpha, shape, 1 + forwards


def tree_of(nodes: tuple[np.ndarray, ...], root_alpha: float | None) -> DraftTree:
    """The DraftTree of a compiled call's nodes: their tokens, parents, depths, probs, cumulative probs (the products
    DraftTree.add forms, in the same order) and draft slots."""
    tok, parent, depth, prob, cum, slot = nodes
    n = len(tok)
    return DraftTree(tok.tolist(), parent.tolist(), depth.tolist(), prob.tolist(), cum.tolist(), [None] * n,
                     slot.tolist(), root_alpha, [None] * n, (tok, parent))


@functools.lru_cache(maxsize=64)
def _causal(p: int) -> np.ndarray:
    """The read's pattern as `_forward` takes it: blocked[i, j] for p pending tokens (none for one token).  # [p, p]"""
    return np.zeros((1, 0), np.bool_) if p == 1 else ~chain_allowed(p)


def warm() -> None:
    """Load the compiled step and levels now (from Numba's cache; compiled on a machine's first call), with a
    one-layer toy decoder of the real argument types, so that they do not land in a run's first drafted step."""
    rules.warm()
    if not AVAILABLE or not jit_mod.ACTIVE:
        return
    nan = math.nan
    _draft_levels(CHAIN, (1, 0.0, 0.0, nan, nan, 1, 1), 0.0, 1.0, np.zeros(2), np.zeros(2, np.int64),
                  np.zeros(0, np.int64), 1, 1, 1, 3, *toy_weights())
    one = np.zeros(1, np.int64)
    _draft_step(CHAIN, (nan, 1, 1, 1, 1, 1, 2, 2, 0.0, 0.0, nan, nan, 1), 0.0, 1.0, 1, 3, one, one, _causal(1), 0,
                np.zeros(0, np.int64), 0, *toy_weights())
