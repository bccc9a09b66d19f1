"""A greedy chain's or SAGE's drafted levels in one compiled call, where the draft's layers are the compiled ones.

Around each level's compiled forward and top-k (compiled.py), the drafter's level loop (draft.py) spends ~60 us of
Python: the policy's expansion, the level's tree mask, the runner's and the top-k's wrappers. `_draft_levels` runs a
step's levels after the draft's read in one call: per level the policy's expansion (`_expand`), the tree mask over
the pending tokens, the nodes fed so far and these nodes, the forward and the top-k. `_expand` is ChainPolicy's and
SagePolicy's `expand` (policy.py, the reference) computed in the same float64 arithmetic as Python's, without
fast-math, so the compiled levels draw the same trees number for number (tests/test_compiled_levels.py checks the
rule on random frontiers and the trees in whole runs). `level_rule` says which policies and steps it serves: any
other policy, a subclass, SAGE reading its nodes' alphas, or a sampled run whose draft samples its tokens takes the
level loop; a sampled run whose draft ranks them (SAGE's default `draw=top`) reads each level's candidates from the
warped distribution (`_warped_top`, sampling.warped's float64 steps). The whole call counts as the step's draft
time: its expansions are a few microseconds.
A chain's or SAGE's whole drafted step is one call (`_draft_step`, planned by `step_plan`; greedy, or sampled with a
draft that ranks its candidates): the draft's read of the tokens it missed, the root's top-k and its alpha
(`_confidence`, shapes.confidence's sums in the same order), the tree's depth and width from alpha
(SagePolicy.depth_for and width_for's float64 steps), then `_draft_levels`; where the shape depends on more than
alpha (SAGE's try after plain steps reads the probe), the drafter reads in Python and the levels alone are one
call.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .compiled import CompiledDecoder, _forward_jit, _largest, _top_jit, numba, toy_weights
from .config import SageConfig
from .costs import BreakEven, Quote
from .policy import ChainPolicy, Policy, SagePolicy, by_identity
from .sampling import Sampling
from .shapes import TreeShape
from .tree import DraftTree, chain_allowed

CHAIN, SAGE = 0, 1  # LevelRule.kind: ChainPolicy.expand, SagePolicy.expand


def _expand(kind, level, rule, rows, top_p, top_t, t_tok, t_parent, t_prob, t_cum, count):
    """One level of SagePolicy.expand (kind SAGE: Eq. 12's widths, theta_l, the node and level prices) or
    ChainPolicy.expand (kind CHAIN: the best child of the one frontier row), on the tree's arrays (the first `count`
    nodes), in the same float64 arithmetic as the Python policies (this function is compiled without fast-math).
    rule: (width, bias, theta_scale, node price, level price (nan: none), max nodes, depth). Nodes are appended from
    `count`. # -> (new count, whether the added nodes are grown)"""
    width, bias, theta_scale, node_price, level_price, max_nodes, depth = rule
    if kind == CHAIN:
        t_tok[count], t_parent[count], t_prob[count] = top_t[0, 0], rows[0], top_p[0, 0]
        t_cum[count] = (1.0 if rows[0] < 0 else t_cum[rows[0]]) * t_prob[count]
        return count + 1, level < depth
    F, K = top_p.shape
    theta = theta_scale * level / depth
    if not math.isnan(node_price):
        theta = max(theta, node_price)
    found_row, found_rank = np.empty(F * K, np.int64), np.empty(F * K, np.int64)
    found_cum = np.empty(F * K, np.float64)
    nf = 0
    for row in range(F):
        node = rows[row]
        per_row = width if level == 1 else math.ceil(width / level * (bias + (t_prob[node] if node >= 0 else 1.0)))
        parent = 1.0 if node < 0 else t_cum[node]
        for rank in range(min(per_row, K)):
            c = parent * np.float64(top_p[row, rank])
            if c > theta:
                found_row[nf], found_rank[nf], found_cum[nf] = row, rank, c
                nf += 1
    order = np.argsort(-found_cum[:nf], kind="mergesort")  # stable: ties stay in (row, rank) order
    total = 0.0
    for i in range(min(nf, max(max_nodes - count, 0))):
        j = order[i]
        row, rank = found_row[j], found_rank[j]
        t_tok[count], t_parent[count], t_prob[count] = top_t[row, rank], rows[row], top_p[row, rank]
        t_cum[count] = (1.0 if rows[row] < 0 else t_cum[rows[row]]) * t_prob[count]
        total += found_cum[j]
        count += 1
    return count, level < depth and not (not math.isnan(level_price) and total < level_price)


def _warped_top(logits, k, temperature, top_p):
    """Each row's k most probable tokens under a sampled run's warp, best first (ties: the lower token first), with
    their probabilities: sampling.warped's softmax(logits / T) cut to the top-p nucleus and renormalised, in the
    same float64 steps (tokens outside the nucleus have probability 0).
    # logits [F, V] -> probs [F, k], tokens [F, k]"""
    F, V = logits.shape
    probs, tokens = np.zeros((F, k), np.float64), np.zeros((F, k), np.int64)
    q = np.empty(V, np.float64)
    for i in range(F):
        m = -np.inf
        for j in range(V):
            q[j] = np.float64(logits[i, j]) / temperature
            m = max(m, q[j])
        z = 0.0
        for j in range(V):
            q[j] = math.exp(q[j] - m)
            z += q[j]
        q /= z
        if top_p < 1.0:  # keep a token while the mass of the more probable ones is short of top_p
            order = np.argsort(-q, kind="mergesort")  # descending, ties in token order
            total = 0.0
            for j in order:
                total += q[j]  # the cumulative sum, and what comes before this token as warped computes it
                if total - q[j] >= top_p:
                    q[j] = 0.0
            q /= q.sum()
            for s in range(k):  # the nucleus is a prefix of the order
                probs[i, s], tokens[i, s] = q[order[s]], order[s]
            continue
        probs[i] = -1.0  # below every probability: the k largest by insertion, ties: the lower token first
        _largest(q, probs[i], tokens[i])
    return probs, tokens


def _draft_levels(kind, rule, temperature, nucleus, root_p, root_t, ends, p, root_pos, n, vocab, embed, cos, sin,
                  floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor, head, head_b,
                  keys, values):
    """Drafter.grow's levels after the draft's read, in one call: each level the policy's expansion (`_expand`), then
    one forward over the nodes to grow (end tokens are not grown) under their tree mask, after n cached columns of
    which the newest p are the pending tokens, and their softmax top-k (temperature > 0: a sampled run's warped
    distribution with top-p `nucleus`, `_warped_top`). root_p, root_t [K]: the root's candidates.
    # -> the nodes' tokens, parents, depths, probs, cumulative probs (DraftTree.add's products), draft slots (-1: never
    #    fed), forwards, nodes fed (the cache columns the levels wrote)"""
    max_nodes, depth = rule[5], rule[6]
    size = max(max_nodes, depth) + 1
    t_tok, t_parent, t_slot = np.empty(size, np.int64), np.empty(size, np.int64), np.full(size, -1, np.int64)
    t_prob, t_cum, t_depth = np.empty(size, np.float64), np.empty(size, np.float64), np.empty(size, np.int64)
    rows = np.full(1, -1, np.int64)
    top_p, top_t = root_p.reshape(1, -1), root_t.reshape(1, -1)
    count, fed, forwards = 0, 0, 0
    for level in range(1, depth + 1):
        start = count
        count, go = _expand_jit(kind, level, rule, rows, top_p, top_t, t_tok, t_parent, t_prob, t_cum, count)
        t_depth[start:count] = level
        grow = np.empty(count - start, np.int64)
        g = 0
        for node in range(start, count):
            if go and not np.any(ends == t_tok[node]):
                grow[g] = node
                g += 1
        if g == 0:
            break
        blocked = np.ones((g, p + fed + g), np.bool_)  # [g, r]: the pending tokens, the fed nodes, these nodes
        blocked[:, :p] = False
        tokens, positions = np.empty(g, np.int64), np.empty(g, np.int64)
        for j in range(g):
            node = grow[j]
            t_slot[node] = fed + j
            tokens[j], positions[j] = t_tok[node], root_pos + level
            a = node
            while a >= 0:
                blocked[j, p + t_slot[a]] = False
                a = t_parent[a]
        logits = _forward_jit(tokens, positions, blocked, n + fed, embed, cos, sin, floor1, qkv, qkv_b, heads, scaling,
                              out_w, out_b, floor2, gate_up, down, down_b, floor, head, head_b, keys, values)
        fed += g
        forwards += 1
        if temperature > 0:
            top_p, top_t = _warped_top_jit(logits[:, :vocab], root_p.shape[0], temperature, nucleus)
        else:
            probs, top_t = _top_jit(np.ascontiguousarray(logits[:, :vocab]), root_p.shape[0])
            top_p = probs.astype(np.float64)  # exact: the level loop reads the same float32 numbers
        rows = grow[:g]
    nodes = t_tok[:count], t_parent[:count], t_depth[:count], t_prob[:count], t_cum[:count], t_slot[:count]
    return (*nodes, forwards, fed)


def _confidence(row):
    """shapes.confidence of one row of top-k probabilities (read as float64), in its order of operations.
    # [k] -> alpha"""
    s = t = 0.0
    for j in range(row.shape[0]):
        p = np.float64(row[j])
        s += p
        if p > 0:
            t += p * math.log(p)
    h = math.log(s) - t / s
    return 1.0 - h / math.log(row.shape[0])


def _draft_step(kind, plan, temperature, nucleus, max_depth, vocab, tokens, positions, blocked, n, ends, root_pos,
                embed, cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor,
                head, head_b, keys, values):
    """A drafted step in one call: the draft's read of the pending `tokens` (after n cached columns, `blocked` their
    causal pattern), the root's top-k (temperature > 0: of a sampled run's warped distribution, `_warped_top`) and
    alpha (`_confidence`), the tree's depth and width from alpha (SagePolicy.depth_for and width_for: a chain's plan
    gives depth k and width 1 whatever alpha), then its levels (`_draft_levels`). plan: (alpha planned before the
    read, nan: the root's; D_min, D_max, depth cap, W_min, W_max, k, entropy k, width bias, theta scale, node price,
    level price (nan: none), max nodes); max_depth: the run's budget.
    # -> root alpha, the alpha used, depth, width, then `_draft_levels`' outputs"""
    fixed, d_min, d_max, cap, w_min, w_max, k, entropy_k, bias, theta_scale, node_price, level_price, max_nodes = plan
    p = tokens.shape[0]
    logits = _forward_jit(tokens, positions, blocked, n, embed, cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w,
                          out_b, floor2, gate_up, down, down_b, floor, head, head_b, keys, values)
    if temperature > 0:
        probs, top = _warped_top_jit(logits[p - 1 :, :vocab], k, temperature, nucleus)
    else:
        probs32, top = _top_jit(np.ascontiguousarray(logits[p - 1 :, :vocab]), k)
        probs = probs32.astype(np.float64)  # exact: the Python path reads the same float32 numbers
    root_alpha = _confidence(probs[0, :entropy_k])
    alpha = root_alpha if math.isnan(fixed) else fixed
    depth = max(1, min(cap, int(math.floor(d_min + alpha * (d_max - d_min) + 0.5))))
    width = max(1, int(math.floor(w_min + (1.0 - alpha) * (w_max - w_min) + 0.5)))
    depth = min(depth, max_depth)
    rule = (width, bias, theta_scale, node_price, level_price, max_nodes, depth)
    tok, parent, depths, prob, cum, slot, forwards, fed = _levels_jit(
        kind, rule, temperature, nucleus, probs[0].copy(), top[0].copy(), ends, p, root_pos, n + p, vocab, embed,
        cos, sin, floor1, qkv, qkv_b, heads, scaling, out_w, out_b, floor2, gate_up, down, down_b, floor, head,
        head_b, keys, values)
    return root_alpha, alpha, depth, width, tok, parent, depths, prob, cum, slot, forwards, fed


# the policies' arithmetic exactly as Python does it: no fast-math, Python's errors
_expand_jit = numba.njit(cache=True, nogil=True)(_expand) if numba is not None else None
_warped_top_jit = numba.njit(cache=True, nogil=True)(_warped_top) if numba is not None else None
_levels_jit = numba.njit(cache=True, nogil=True)(_draft_levels) if numba is not None else None
_confidence = numba.njit(cache=True, nogil=True)(_confidence) if numba is not None else _confidence
_step_jit = numba.njit(cache=True, nogil=True)(_draft_step) if numba is not None else None


@dataclass(frozen=True)
class LevelRule:
    """A policy's expansion as `_expand` computes it: SagePolicy's or ChainPolicy's, with this step's shape."""

    kind: int  # SAGE or CHAIN
    width: int  # W (the chain: 1)
    bias: float  # width_parent_bias of Eq. 12
    theta_scale: float
    node_price: float  # threshold "cost": the least cumulative probability a node needs (nan: no price)
    level_price: float  # ... and the least a level's nodes need together for another level (nan: no price)
    max_nodes: int
    depth: int
    temperature: float = 0.0  # a sampled run's warp of the draft's distribution (0: greedy, the plain softmax)
    nucleus: float = 1.0  # ... and its top-p

    @property
    def numbers(self) -> tuple:
        return (self.width, self.bias, self.theta_scale, self.node_price, self.level_price, self.max_nodes,
                self.depth)


def _compiled_kind(policy: Policy, sampling: Sampling | None) -> tuple[int | None, tuple[float, float]]:
    """(CHAIN or SAGE, or None where the compiled expansion does not serve `policy`; the run's warp (temperature,
    top-p), (0, 1) when greedy). It serves ChainPolicy and SagePolicy themselves (not a subclass, which may expand
    otherwise), SAGE not reading its nodes' alphas; greedy, or under `sampling` a draft that ranks its candidates
    (not one that samples them, `Policy.samples_draft`)."""
    warp = (0.0, 1.0) if sampling is None or sampling.greedy else (float(sampling.temperature), float(sampling.top_p))
    if warp[0] > 0 and policy.samples_draft:
        return None, warp
    if type(policy) is ChainPolicy:
        return CHAIN, warp
    if type(policy) is SagePolicy and not policy.node_alphas:
        return SAGE, warp
    return None, warp


def _prices(price: BreakEven | None) -> tuple[float, float]:
    """A node's and a level's price as the compiled expansion reads them (nan: none)."""
    return (math.nan, math.nan) if price is None else (float(price.node), float(price.level))


def level_rule(policy: Policy, shape: TreeShape, sampling: Sampling | None = None) -> LevelRule | None:
    """The compiled form of `policy`'s expansion for this step, where there is one (`_compiled_kind`)."""
    kind, warp = _compiled_kind(policy, sampling)
    if _levels_jit is None or kind is None:
        return None
    if kind == CHAIN:
        return LevelRule(CHAIN, 1, 0.0, 0.0, math.nan, math.nan, shape.max_nodes, shape.depth, *warp)
    cfg = policy.cfg
    return LevelRule(SAGE, shape.width, cfg.width_parent_bias, cfg.theta_scale, *_prices(shape.price),
                     shape.max_nodes, shape.depth, *warp)


def draft_levels(decoder: CompiledDecoder, rule: LevelRule, root: tuple[list[float], list[int]], ends: np.ndarray,
                 p: int, root_pos: int, vocab: int | None,
                 cache) -> tuple[tuple[np.ndarray, ...], int]:
    """The drafted levels after the draft's read, in one compiled call (`_draft_levels`): `root` the root's
    candidates (probabilities, tokens), `ends` the tokens not to grow [int64], p the pending tokens the read fed,
    root_pos the root's (shifted) rotary position. # -> the nodes (`tree_of`), forwards"""
    cos, sin = decoder._rope(root_pos + rule.depth)
    layers = [cache.layers[f.index] for f in decoder.layers]
    n = decoder.buffers.reserve(layers, max(rule.max_nodes, rule.depth))
    keys, values = decoder.buffers.arrays
    tok, parent, depth, prob, cum, slot, forwards, fed = _levels_jit(
        rule.kind, rule.numbers, rule.temperature, rule.nucleus, np.array(root[0], np.float64),
        np.array(root[1], np.int64), ends, p, root_pos, n,
        decoder.head.shape[1] if vocab is None else vocab, decoder.embed, cos, sin, *decoder.weights, keys, values)
    decoder.buffers.publish(layers, n + fed)
    return (tok, parent, depth, prob, cum, slot), forwards


def tree_of(nodes: tuple[np.ndarray, ...], root_alpha: float | None) -> DraftTree:
    """The DraftTree of a compiled call's nodes: their tokens, parents, depths, probs, cumulative probs (the products
    DraftTree.add forms, in the same order) and draft slots."""
    tok, parent, depth, prob, cum, slot = nodes
    n = len(tok)
    return DraftTree(tok.tolist(), parent.tolist(), depth.tolist(), prob.tolist(), cum.tolist(), [None] * n,
                     slot.tolist(), root_alpha, [None] * n, (tok, parent))


class StepPlan(NamedTuple):
    """What `_draft_step` needs to shape a greedy step's tree from its root's alpha and grow it: SagePolicy's
    depth_for and width_for and its expansion's numbers, or the chain's (depth k and width 1 for any alpha)."""

    kind: int  # SAGE or CHAIN
    numbers: tuple  # `_draft_step`'s plan
    d_max: int | None  # TreeShape.d_max (SAGE's history controller; the chain: None)
    price: BreakEven | None  # TreeShape.price: this step's node and level prices (SAGE, threshold "cost")
    temperature: float = 0.0  # a sampled run's warp of the draft's distribution (0: greedy, the plain softmax)
    nucleus: float = 1.0  # ... and its top-p

    @property
    def max_nodes(self) -> int:
        return self.numbers[_MAX_NODES]

    @property
    def reach(self) -> int:
        """The most cache columns the tree's levels may feed."""
        return max(self.numbers[_DEPTH_CAP], self.numbers[_MAX_NODES])


_DEPTH_CAP, _MAX_NODES = 3, 12  # their places in StepPlan.numbers (`_draft_step`'s plan)


def step_plan(policy: Policy, quote: Quote | None, sampling: Sampling | None) -> StepPlan | None:
    """The plan of this step's one compiled call, where the compiled expansion serves the policy (`_compiled_kind`)
    and, for SAGE, the step is not a try after plain steps (whose shape depends on the probe). SAGE's prices are
    asked for here, as its shape() does (`SagePolicy.prices`)."""
    kind, warp = _compiled_kind(policy, sampling)
    if _step_jit is None or kind is None or (kind == SAGE and policy.probing):
        return None
    k, entropy_k = int(max(policy.top_k, policy.entropy_k)), int(policy.entropy_k)
    if kind == CHAIN:
        depth = int(policy.cfg.k)
        return StepPlan(CHAIN, (math.nan, depth, depth, depth, 1, 1, k, entropy_k, 0.0, 0.0, math.nan, math.nan, depth),
                        None, None, *warp)
    cfg, price = policy.cfg, policy.prices(quote)
    fixed = math.nan if cfg.alpha_source == "current_root" else float(policy.alpha)
    numbers = (fixed, *_sage_numbers(cfg, k, entropy_k, int(policy.d_max)), *_prices(price), int(cfg.n_max))
    return StepPlan(SAGE, numbers, policy.d_max, price, *warp)


_SAGE_NUMBERS: dict[tuple, tuple[SageConfig, tuple]] = {}  # `_sage_numbers`' values (policy.by_identity)


def _sage_numbers(cfg: SageConfig, k: int, entropy_k: int, d_max: int) -> tuple:
    """The part of a SAGE plan that only its settings and D_max fix, made once per settings object and D_max: D_min,
    D_max, depth cap, W_min, W_max, k, entropy k, width bias, theta scale, each of the type `_draft_step` is compiled
    for (one set of argument types: one compiled specialisation)."""
    return by_identity(_SAGE_NUMBERS, cfg, (k, entropy_k, d_max), lambda: (
        int(cfg.d_min), d_max, int(cfg.max_depth_cap), int(cfg.w_min), int(cfg.w_max), k, entropy_k,
        float(cfg.width_parent_bias), float(cfg.theta_scale)))


def draft_step(decoder: CompiledDecoder, plan: StepPlan, pending: list[int], root_pos: int, max_depth: int,
               ends: np.ndarray, vocab: int | None, cache) -> tuple[tuple[np.ndarray, ...], float, TreeShape, int]:
    """A greedy drafted step in one compiled call (`_draft_step`): the read of the `pending` tokens (the last is the
    root, at (shifted) rotary position root_pos), the shape, the levels.
    # -> the nodes (`tree_of`), the root's alpha, the shape, draft forwards"""
    p = len(pending)
    cos, sin = decoder._rope(root_pos + plan.reach)
    layers = [cache.layers[f.index] for f in decoder.layers]
    n = decoder.buffers.reserve(layers, p + plan.reach)
    keys, values = decoder.buffers.arrays
    root_alpha, alpha, depth, width, tok, parent, depths, prob, cum, slot, forwards, fed = _step_jit(
        plan.kind, plan.numbers, plan.temperature, plan.nucleus, max_depth,
        decoder.head.shape[1] if vocab is None else vocab,
        np.array(pending, np.int64), np.arange(root_pos - p + 1, root_pos + 1, dtype=np.int64), _causal(p), n, ends,
        root_pos, decoder.embed, cos, sin, *decoder.weights, keys, values)
    decoder.buffers.publish(layers, n + p + fed)
    nodes = (tok, parent, depths, prob, cum, slot)
    return nodes, root_alpha, TreeShape(depth, width, plan.max_nodes, alpha, plan.d_max, plan.price), 1 + forwards


@functools.lru_cache(maxsize=64)
def _causal(p: int) -> np.ndarray:
    """The read's pattern as `_forward` takes it: blocked[i, j] for p pending tokens (none for one token).  # [p, p]"""
    return np.zeros((1, 0), np.bool_) if p == 1 else ~chain_allowed(p)


def warm() -> None:
    """Load the compiled levels now (~0.4 s from Numba's cache; compiled on a machine's first call), with a one-layer
    toy decoder of the real argument types, so that they do not land in a run's first drafted step."""
    if _levels_jit is None:
        return
    _levels_jit(CHAIN, (1, 0.0, 0.0, math.nan, math.nan, 1, 1), 0.0, 1.0, np.zeros(2), np.zeros(2, np.int64),
                np.zeros(0, np.int64), 1, 1, 1, 3, *toy_weights())
    one = np.zeros(1, np.int64)
    _step_jit(CHAIN, (math.nan, 1, 1, 1, 1, 1, 2, 2, 0.0, 0.0, math.nan, math.nan, 1), 0.0, 1.0, 1, 3, one, one,
              _causal(1), 0, np.zeros(0, np.int64), 0, *toy_weights())
