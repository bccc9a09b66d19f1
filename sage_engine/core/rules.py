"""SAGE's rules and the tree's attention patterns, each written once, as plain functions over numbers and arrays.

Every path runs these functions and no other copy of them: the policies (policies/) and the drafter's level loop
(draft.py) call them from Python, and the draft's compiled step (draft_compiled.py) calls them from inside its one
Numba call. Where Numba is installed `rule` compiles each function (without fast-math: float64 arithmetic exactly as
Python computes it, so a tree is the same number for number whichever path drew it); where it is not, the very same
functions run as Python.

Symbols follow the paper: alpha (confidence), D (depth), W (width), theta_l (a level's threshold), N_max (nodes).

  confidence(top)                       alpha = 1 - H / log k over the renormalised top-k     (Eq. 7-9)
  depth_for(alpha, D_min, D_max, cap)   D(alpha) = D_min + alpha (D_max - D_min), rounded      (Eq. 10)
  width_for(alpha, W_min, W_max)        W(alpha) = W_min + (1 - alpha)(W_max - W_min), rounded (Eq. 11)
  level_widths(l, W, bias, P_parent)    W_l = ceil(W / l * (bias + P_parent)) for l > 1        (Eq. 12)
  threshold(l, D, scale, node_price)    theta_l = scale * l / D, raised to a node's price
  best_candidates(...)                  the candidates a level keeps: best cumulative probability first
  sage_children(...)                    one SAGE level: Eq. 12's widths, theta_l, the level's price
  level_pattern(...)                    what each node fed at one draft level attends to
  verify_pattern(parents)               what each row of a verify pass attends to
  warped_top(logits, k, T, top_p)       a sampled run's draft candidates: the top-k of softmax(logits / T), top-p
"""

from __future__ import annotations

import math

import numpy as np

from .jit import jit, numba  # noqa: F401 - numba: whether the rules are compiled

# `fn` compiled where Numba is installed, without fast-math (float64 exactly as Python computes it, Python's errors),
# else `fn` itself; `rule(fn).py_func` is always the plain function
rule = jit


@rule
def confidence(top):
    """alpha = 1 - H(p) / log k of one row of the draft's k largest probabilities, p = top / sum(top) (Eq. 7-9).
    With s = sum(top): H(p) = log s - sum(top log top) / s, summed left to right.  # [k] float64 -> alpha"""
    s = t = 0.0
    for j in range(top.shape[0]):
        p = top[j]
        s += p
        if p > 0:
            t += p * math.log(p)
    h = math.log(s) - t / s
    return 1.0 - h / math.log(top.shape[0])


@rule
def depth_for(alpha, d_min, d_max, cap):
    """D(alpha) = D_min + alpha (D_max - D_min), rounded half up (the paper leaves rounding open), in [1, cap]."""
    return max(1, min(cap, int(math.floor(d_min + alpha * (d_max - d_min) + 0.5))))


@rule
def width_for(alpha, w_min, w_max):
    """W(alpha) = W_min + (1 - alpha)(W_max - W_min), rounded half up, at least 1."""
    return max(1, int(math.floor(w_min + (1.0 - alpha) * (w_max - w_min) + 0.5)))


@rule
def level_widths(level, width, bias, parent_probs):
    """Children each frontier node may have at level `level` (Eq. 12): W at level 1, then
    ceil(W / l * (bias + P_parent)), so a likely parent keeps a child.  # parent_probs [F] (the root: 1) -> [F]"""
    out = np.empty(parent_probs.shape[0], np.int64)
    for r in range(parent_probs.shape[0]):
        out[r] = width if level == 1 else math.ceil(width / level * (bias + parent_probs[r]))
    return out


@rule
def threshold(level, depth, scale, node_price):
    """theta_l = scale * l / D: the least cumulative draft probability a node at level l needs; with a node price
    (not nan: the cost rule, costs.py) at least that price too."""
    theta = scale * level / depth
    return theta if math.isnan(node_price) else max(theta, node_price)


@rule
def best_candidates(per_row, parent_cum, top_p, floor, limit):
    """The candidates one level keeps: at most per_row[r] of frontier row r (its best first), each with cumulative
    probability parent_cum[r] * top_p[r, rank] above `floor`, at most `limit` in all, best first (ties in (row, rank)
    order).  # per_row [F] int, parent_cum [F], top_p [F, K] float64 -> rows [m], ranks [m], cums [m]"""
    F, K = top_p.shape
    rows, ranks = np.empty(F * K, np.int64), np.empty(F * K, np.int64)
    cums = np.empty(F * K, np.float64)
    n = 0
    for r in range(F):
        for rank in range(min(per_row[r], K)):
            c = parent_cum[r] * top_p[r, rank]
            if c > floor:
                rows[n], ranks[n], cums[n] = r, rank, c
                n += 1
    order = np.argsort(-cums[:n], kind="mergesort")[: max(limit, 0)]  # stable: ties stay in (row, rank) order
    return rows[order], ranks[order], cums[order]


@rule
def sage_children(level, width, depth, bias, theta_scale, node_price, level_price, parent_probs, parent_cum, top_p,
                  limit):
    """One SAGE level: each frontier node's children by Eq. 12's widths, kept above theta_l, at most `limit` in all;
    and whether they are grown further: below depth D, and (with a level price, not nan) only while the kept nodes'
    cumulative probabilities add up to the tokens one more draft forward must bring.
    # parent_probs, parent_cum [F], top_p [F, K] float64 -> rows [m], ranks [m], grow"""
    per_row = level_widths(level, width, bias, parent_probs)
    rows, ranks, cums = best_candidates(per_row, parent_cum, top_p, threshold(level, depth, theta_scale, node_price),
                                        limit)
    total = 0.0
    for c in cums:
        total += c
    grow = level < depth and (math.isnan(level_price) or total >= level_price)
    return rows, ranks, grow


@rule
def level_pattern(grow, parents, slots, p, fed):
    """What the nodes fed at one draft level attend to, over the step's region of the draft's cache: the p pending
    tokens (the root last), the fed nodes' columns p + slots[i] (the ancestors' among them), and these nodes (whose
    slots are fed .. fed + g - 1).  # grow [g], parents, slots [n] int64 -> allowed [g, p + fed + g] bool"""
    g = grow.shape[0]
    allowed = np.zeros((g, p + fed + g), np.bool_)
    allowed[:, :p] = True
    for j in range(g):
        a = grow[j]
        while a >= 0:
            allowed[j, p + slots[a]] = True
            a = parents[a]
    return allowed


@rule
def verify_pattern(parents):
    """What each row of a verify pass over [root, node_0 .. node_n-1] attends to besides the cached past: the root
    sees itself; a node sees the root, its ancestors and itself.  # parents [n] int64 -> allowed [n + 1, n + 1]"""
    n = parents.shape[0]
    allowed = np.zeros((n + 1, n + 1), np.bool_)
    allowed[:, 0] = True
    for i in range(n):
        a = i
        while a >= 0:
            allowed[i + 1, a + 1] = True
            a = parents[a]
    return allowed


@rule
def tree_depths(parents):
    """Each node's depth (1: a child of the root) in a level-ordered tree.  # parents [n] int64 -> [n]"""
    depth = np.empty(parents.shape[0], np.int64)
    for i in range(parents.shape[0]):
        depth[i] = 1 if parents[i] < 0 else depth[parents[i]] + 1
    return depth


@rule
def largest(row, best, order):
    """The len(best) largest values of `row` into `best`, in descending order, and their indices into `order` (ties:
    the lower index first), by insertion: no sort of the whole row. `best` must start below every value of `row`."""
    k = best.shape[0]
    for j in range(row.shape[0]):
        v = row[j]
        if v > best[k - 1]:
            s = k - 1
            while s > 0 and best[s - 1] < v:
                best[s], order[s] = best[s - 1], order[s - 1]
                s -= 1
            best[s], order[s] = v, j


@rule
def warped_top(logits, k, temperature, top_p):
    """The draft's candidates under a sampled run's warp: each row's k most probable tokens, best first (ties: the lower
    token first), with their probabilities under softmax(logits / T) cut to the top-p nucleus and renormalised, in
    float64 (tokens outside the nucleus have probability 0). Both draft paths rank a sampled run's candidates with it;
    sampling.warped gives the same distribution whole, on the model's device, for the acceptance rules.
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
        largest(q, probs[i], tokens[i])
    return probs, tokens


def warm() -> None:
    """Compile (first run on a machine) or load (from Numba's cache) the rules called from Python, with the argument
    types the policies pass, so that no run's first step pays for it."""
    from . import jit as jit_module  # ACTIVE is read at call time (jit.defer_compile may clear it)

    if numba is None or not jit_module.ACTIVE:
        return
    one = np.ones((1, 2), np.float64)
    confidence(one[0])
    depth_for(0.5, 3, 8, 12)
    width_for(0.5, 2, 10)
    sage_children(1, 2, 3, 0.5, 0.1, math.nan, math.nan, np.ones(1), np.ones(1), one, 4)
    best_candidates(np.ones(1, np.int64), np.ones(1), one, 0.0, 4)
    level_pattern(np.zeros(1, np.int64), np.full(1, -1, np.int64), np.zeros(1, np.int64), 1, 0)
    verify_pattern(np.full(1, -1, np.int64))
    warped_top(np.zeros((1, 3), np.float32), 2, 0.7, 0.9)
