"""rules.py against reference definitions written here from the paper's text, on random inputs: the one copy of each
rule is right, and the masks every path builds (the draft's levels, the verify pass, in the builder that runs by
default) match a reference written from `DraftTree.path_to`."""

import math

import numpy as np
import pytest
import torch

from sage_engine.core import rules
from sage_engine.core.tree import DraftTree, additive_mask, verify_allowed, verify_inputs


def random_tree(rng: np.random.Generator, n: int) -> DraftTree:
    tree = DraftTree()
    for i in range(n):
        tree.add(int(rng.integers(0, 50)), int(rng.integers(-1, i)) if i else -1, float(rng.random()))
    return tree


def test_confidence_is_one_minus_normalised_entropy():
    rng = np.random.default_rng(0)
    for _ in range(50):
        top = np.sort(rng.random(10))[::-1] * rng.random()
        p = top / top.sum()
        assert rules.confidence(top) == pytest.approx(1 + (p * np.log(p)).sum() / math.log(10), abs=1e-12)
    assert rules.confidence(np.full(10, 0.1)) == pytest.approx(0.0, abs=1e-12)
    assert rules.confidence(np.array([1.0] + [0.0] * 9)) == pytest.approx(1.0)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.45, 0.5, 0.9, 1.0])
def test_depth_and_width_follow_eq_10_and_11(alpha):
    assert rules.depth_for(alpha, 3, 8, 16) == math.floor(3 + alpha * 5 + 0.5)
    assert rules.width_for(alpha, 2, 10) == math.floor(2 + (1 - alpha) * 8 + 0.5)
    assert rules.depth_for(alpha, 3, 40, 16) <= 16 and rules.width_for(alpha, 0, 0) == 1


def test_widths_decay_with_the_level_as_eq_12():
    parents = np.array([1.0, 0.9, 0.2, 0.0])
    assert rules.level_widths(1, 6, 0.5, parents).tolist() == [6, 6, 6, 6]
    assert rules.level_widths(2, 6, 0.5, parents).tolist() == [math.ceil(6 / 2 * (0.5 + q)) for q in parents]
    assert rules.level_widths(3, 6, 0.5, parents).tolist() == [3, 3, 2, 1]  # 6/3 * (0.5 + P): 3, 2.8, 1.4, 1


def reference_children(level, width, depth, bias, scale, node_price, level_price, parent_prob, parent_cum, top_p,
                       limit):
    """SAGE's level written plainly: Eq. 12's widths, theta_l, the best `limit` by cumulative probability."""
    theta = scale * level / depth
    if not math.isnan(node_price):
        theta = max(theta, node_price)
    found = []
    for r in range(len(parent_prob)):
        w = width if level == 1 else math.ceil(width / level * (bias + parent_prob[r]))
        found += [(parent_cum[r] * top_p[r][c], r, c) for c in range(min(w, len(top_p[r])))
                  if parent_cum[r] * top_p[r][c] > theta]
    found = sorted(found, key=lambda f: -f[0])[:limit]
    grow = level < depth and (math.isnan(level_price) or sum(f[0] for f in found) >= level_price)
    return [f[1] for f in found], [f[2] for f in found], grow


def test_sage_children_matches_the_reference_on_random_frontiers():
    rng = np.random.default_rng(1)
    for trial in range(300):
        F, K = int(rng.integers(1, 6)), 10
        top = -np.sort(-rng.dirichlet(np.ones(K) * rng.uniform(0.05, 2), size=F), axis=1)
        prob, cum = rng.random(F), rng.random(F)
        level, depth = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        prices = (math.nan, math.nan) if trial % 3 else (float(rng.random() * 0.2), float(rng.random()))
        args = (level, int(rng.integers(1, 11)), depth, 0.5, 0.1, *prices, prob, cum, top, int(rng.integers(0, 30)))
        rows, ranks, grow = rules.sage_children(*args)
        assert (rows.tolist(), ranks.tolist(), grow) == reference_children(*args)


def reference_allowed(tree: DraftTree) -> np.ndarray:
    """Row 0 the root, row 1 + i node i: each sees the root and the nodes on its own path, from `path_to`."""
    n = len(tree)
    allowed = np.zeros((n + 1, n + 1), bool)
    allowed[:, 0] = True
    for i in range(n):
        allowed[1 + i, [1 + j for j in tree.path_to(i)]] = True
    return allowed


def test_verify_masks_match_the_reference_in_every_builder():
    rng = np.random.default_rng(2)
    for n in [1, 2, 5, 17, 64]:
        tree = random_tree(rng, n)
        want = reference_allowed(tree)
        assert np.array_equal(verify_allowed(tree.parents), want)
        ids, pos, mask, depth = verify_inputs(tree, 7, 30, 12, -1e9)  # the builder a default verify pass runs
        assert np.array_equal(mask[0, 0, :, 12:] == 0, want) and (mask[0, 0, :, :12] == 0).all()
        assert np.array_equal(mask, additive_mask(want, 12, torch.float32, "cpu").numpy().clip(-1e9))
        assert ids[0].tolist() == [7] + tree.tokens and pos[0].tolist() == [30] + [30 + d for d in tree.depths]
        assert depth == tree.depth


def test_a_draft_levels_pattern_sees_the_pending_tokens_its_fed_ancestors_and_itself():
    rng = np.random.default_rng(3)
    tree = random_tree(rng, 12)
    slots = np.full(12, -1, np.int64)
    fed, p = 0, 3
    for level in range(1, tree.depth + 1):
        grow = np.array([i for i in range(12) if tree.depths[i] == level], np.int64)
        slots[grow] = fed + np.arange(len(grow))
        allowed = rules.level_pattern(grow, np.array(tree.parents, np.int64), slots, p, fed)
        for j, node in enumerate(grow):
            want = np.zeros(p + fed + len(grow), bool)
            want[:p] = True
            want[[p + slots[a] for a in tree.path_to(int(node))]] = True
            assert np.array_equal(allowed[j], want)
        fed += len(grow)
