"""Policies on hand-built frontiers: alpha, D/W mapping, width decay, thresholds, history, baselines."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from sage_engine.config import MEDUSA_25, Eagle2Config, SageConfig, parse_spec
from sage_engine.core.policy_io import Frontier, StepOutcome
from sage_engine.core.rules import confidence as _alpha
from sage_engine.core.tree import DraftTree
from sage_engine.policies import ChainPolicy, Eagle2Policy, SagePolicy, StaticTreePolicy, make_policy


def confidence(rows):
    return [_alpha(np.asarray(row, np.float64)) for row in rows]


def frontier(nodes, probs):
    probs = np.asarray(probs, dtype=float)
    tokens = np.arange(probs.size).reshape(probs.shape) + 100
    return Frontier(list(nodes), tokens.tolist(), probs.tolist())


def test_alpha_uniform_is_zero_onehot_is_one():
    assert confidence(np.full((1, 10), 0.1))[0] == pytest.approx(0.0, abs=1e-9)
    one = np.zeros((1, 10))
    one[0, 0] = 1.0
    assert confidence(one)[0] == pytest.approx(1.0)


def test_alpha_renormalises_the_top_k():
    p = np.array([[0.4, 0.2, 0.1, 0.1]])  # sums to 0.8: renormalised -> 0.5, 0.25, 0.125, 0.125
    q = np.array([0.5, 0.25, 0.125, 0.125])
    expected = 1 - (-(q * np.log(q)).sum()) / math.log(4)
    assert confidence(p)[0] == pytest.approx(expected)


PAPER = SageConfig(d_max=8)  # the paper's D_max (the engine's default starts at 12, the controller's top)


def test_depth_and_width_follow_eq_10_11():
    pol = SagePolicy(PAPER)
    assert (pol.depth_for(0.0), pol.width_for(0.0)) == (3, 10)
    assert (pol.depth_for(1.0), pol.width_for(1.0)) == (8, 2)
    assert pol.depth_for(0.9) == 8  # 7.5 rounds half up
    assert pol.width_for(0.9) == 3  # 2.8
    assert pol.depth_for(0.5) == 6 and pol.width_for(0.5) == 6  # 5.5 -> 6, 6.0 -> 6


def test_first_tree_is_planned_from_alpha0():
    shape = SagePolicy(dataclasses.replace(PAPER, alpha_source="prev_path")).shape(root_alpha=0.99)
    assert shape.alpha == 0.5 and shape.depth == 6


def test_current_root_source_uses_the_root_alpha():
    shape = SagePolicy(dataclasses.replace(PAPER, alpha_source="current_root")).shape(root_alpha=1.0)
    assert shape.depth == 8 and shape.width == 2
    default = SagePolicy(SageConfig()).shape(root_alpha=1.0)  # the default starts D_max at the controller's top
    assert default.depth == default.d_max == SageConfig().d_max_bounds[1] == 16


def test_level_one_width_and_threshold():
    pol = SagePolicy(PAPER)
    shape = pol.shape(None)  # alpha 0.5: D 6, W 6 -> theta_1 = 0.1/6
    tree = DraftTree()
    probs = [[0.5, 0.2, 0.1, 0.05, 0.03, 0.02, 0.016, 0.01, 0.005, 0.004]]
    grow = pol.expand(shape, 1, tree, frontier([-1], probs))
    # the 6 widest candidates, minus those at or below theta_1 = 0.0167: 0.5, 0.2, 0.1, 0.05, 0.03, 0.02
    assert len(tree) == 6 and grow == list(range(6))
    probs[0][5] = 0.016
    tree2 = DraftTree()
    pol.expand(shape, 1, tree2, frontier([-1], probs))
    assert len(tree2) == 5  # 0.016 < theta_1 pruned


def test_width_decays_with_depth_and_parent_probability():
    pol = SagePolicy(SageConfig(theta_scale=0.0))
    shape = pol.shape(None)  # W = 6
    tree = DraftTree()
    a = tree.add(1, -1, 0.9)
    b = tree.add(2, -1, 0.1)
    probs = np.full((2, 10), 0.09)
    pol.expand(shape, 2, tree, frontier([a, b], probs))
    kids_a = sum(1 for p in tree.parents if p == a)
    kids_b = sum(1 for p in tree.parents if p == b)
    assert kids_a == math.ceil(6 / 2 * (0.5 + 0.9))  # 5
    assert kids_b == math.ceil(6 / 2 * (0.5 + 0.1))  # 2


def test_node_budget_keeps_the_most_probable():
    pol = SagePolicy(SageConfig(n_max=4, theta_scale=0.0))
    shape = pol.shape(None)
    tree = DraftTree()
    probs = [[0.05, 0.3, 0.2, 0.1, 0.15, 0.02, 0.01, 0.01, 0.01, 0.01]]
    pol.expand(shape, 1, tree, frontier([-1], probs))
    assert sorted(tree.probs, reverse=True) == [0.3, 0.2, 0.15, 0.1]


def test_last_level_is_not_expanded():
    pol = SagePolicy(SageConfig())
    shape = pol.shape(None)
    tree = DraftTree()
    assert pol.expand(shape, shape.depth, tree, frontier([-1], [[0.9] + [0.01] * 9])) == []
    assert len(tree) >= 1


def outcome(tokens_this_step, alphas=(0.3,)):
    tree = DraftTree(root_alpha=alphas[0])
    return StepOutcome(tree, [], tokens_this_step)


def test_history_controller_lowers_raises_and_bounds_d_max():
    pol = SagePolicy(SageConfig(d_max_bounds=(4, 10)))
    for _ in range(20):
        pol.observe(outcome(1))
    assert pol.d_max == 4
    for _ in range(40):
        pol.observe(outcome(5))
    assert pol.d_max == 10
    before = pol.d_max
    pol.history = [2, 3] * 5
    pol.observe(outcome(3))  # mean 2.55: between the thresholds -> unchanged
    assert pol.d_max == before


def test_prev_path_alpha_is_the_mean_over_root_and_accepted_path():
    pol = SagePolicy(SageConfig(alpha_source="prev_path"))
    tree = DraftTree(root_alpha=0.2)
    a = tree.add(1, -1, 0.9)
    b = tree.add(2, a, 0.9)
    tree.alphas[a], tree.alphas[b] = 0.5, None
    pol.observe(StepOutcome(tree, [a, b], 3))
    assert pol.alpha == pytest.approx(0.35)


def test_chain_is_a_single_path_of_k():
    pol = ChainPolicy()
    shape = pol.shape(None)
    tree, front = DraftTree(), frontier([-1], [[0.6, 0.4]])
    for level in range(1, shape.depth + 1):
        grow = pol.expand(shape, level, tree, front)
        front = frontier(grow, [[0.6, 0.4]]) if grow else None
    assert len(tree) == 5 and tree.parents == [-1, 0, 1, 2, 3]


def test_static_default_is_the_25_node_medusa_tree():
    pol = StaticTreePolicy()
    shape = pol.shape(None)
    tree, front, level = DraftTree(), frontier([-1], np.full((1, 4), 0.25)), 1
    while front is not None:
        grow = pol.expand(shape, level, tree, front)
        front = frontier(grow, np.full((len(grow), 4), 0.25)) if grow else None
        level += 1
    per_level = [tree.depths.count(d) for d in range(1, 6)]
    assert len(tree) == 25 == len(MEDUSA_25) and per_level == [4, 8, 8, 3, 2]


def test_eagle2_reranks_to_an_ancestor_closed_top_n():
    pol = Eagle2Policy(Eagle2Config(depth=3, top_k=3, total_nodes=5))
    shape = pol.shape(None)
    tree = DraftTree()
    grow = pol.expand(shape, 1, tree, frontier([-1], [[0.5, 0.3, 0.2]]))
    assert grow == [0, 1, 2]
    grow = pol.expand(shape, 2, tree, frontier(grow, [[0.9, 0.05, 0.05], [0.5, 0.4, 0.1], [0.6, 0.3, 0.1]]))
    assert len(grow) == 3
    final = pol.finalize(tree)
    assert len(final) == 5
    assert all(p < i for i, p in enumerate(final.parents))  # parents precede children: ancestor-closed
    assert sorted(final.cum_probs, reverse=True) == sorted(sorted(tree.cum_probs, reverse=True)[:5], reverse=True)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("beam")


def test_policy_specs_change_scalar_knobs():
    from sage_engine.policies import make_policy

    pol = make_policy("sage:n_max=32:theta_scale=0.2:alpha_source=prev_root")
    assert (pol.cfg.n_max, pol.cfg.theta_scale, pol.cfg.alpha_source) == (32, 0.2, "prev_root")
    assert make_policy("sage").cfg.n_max == 64  # the paper's default is untouched
    assert make_policy("chain:k=3").cfg.k == 3
    assert parse_spec("eagle2") == ("eagle2", make_policy("eagle2").cfg)
    for bad in ("sage:n_max", "sage:nope=1", "sage:n_max=lots", "sage:d_max_bounds=3", "ar:k=2", "tree:k=1"):
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_k_sets_the_top_k_of_sages_confidence():
    """alpha is the normalised entropy of the draft's top k (Eq. 7-9): k is SAGE's knob, 10 for the others."""
    from sage_engine.core.draft import Drafter
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.005, 0.005, 0.0001, 0.0001]]))
    probs = torch.softmax(logits, -1).numpy()[0].astype(float)
    for k in (2, 5, 10):
        pol = SagePolicy(SageConfig(k=k))
        assert pol.entropy_k == k and pol.top_k == SageConfig().w_max  # candidates per node: W_max
        frontier, alpha = Drafter(None)._top(logits, pol, [-1], {})
        top = frontier.top_probs
        assert len(top[0]) == max(k, pol.top_k)
        assert alpha[0] == pytest.approx(confidence(np.sort(probs)[::-1][None, :k])[0])
    alphas = [Drafter(None)._top(logits, SagePolicy(SageConfig(k=k)), [-1], {})[1][0] for k in (2, 5, 10)]
    assert len(set(np.round(alphas, 6))) == 3  # alpha depends on k
    assert make_policy("chain").entropy_k == make_policy("eagle2").entropy_k == 10


def test_sampling_tempers_the_draft_distribution_that_alpha_reads():
    """Under sampling the draft's candidates and alpha come from its tempered distribution: hotter is flatter,
    so alpha falls (and SAGE plans wider, shallower trees); top-p cuts the tail to zero."""
    from sage_engine.core.draft import Drafter
    from sage_engine.core.sampling import DraftSampler, Sampling

    logits = torch.log(torch.tensor([[0.4, 0.3, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.005, 0.005, 0.0001, 0.0001]]))
    drafter, pol = Drafter(None), SagePolicy()
    alpha = {}
    for t in (0.5, 0.0, 2.0):
        drafter.sampler = None if t == 0 else DraftSampler(Sampling(t))
        alpha[t] = drafter._top(logits, pol, [-1], {})[1][0]
    assert alpha[2.0] < alpha[0.0] < alpha[0.5]
    assert pol.depth_for(alpha[2.0]) < pol.depth_for(alpha[0.5]) and pol.width_for(alpha[2.0]) > pol.width_for(
        alpha[0.5])
    drafter.sampler = DraftSampler(Sampling(1.0, top_p=0.75))
    top = drafter._top(logits, pol, [-1], {})[0].top_probs
    assert top[0][:3] == pytest.approx([0.5, 0.375, 0.125]) and sum(top[0][3:]) == 0


@pytest.mark.parametrize("knobs,message", [
    (dict(k=1), "k >= 2"), (dict(d_min=6, d_max=4), "D_min <= D_max"), (dict(w_min=5, w_max=2), "W_min <= W_max"),
    (dict(theta_scale=float("nan")), "finite"), (dict(theta_scale=float("inf")), "finite"),
    (dict(n_max=0), "N_max >= 1"), (dict(threshold="fast"), "unknown threshold"),
    (dict(alpha_source="tea leaves"), "unknown alpha source"), (dict(alpha0=2.0), "alpha0"),
    (dict(history_window=0), "history_window >= 1"), (dict(alpha0=float("nan")), "finite"),
])
def test_sage_config_refuses_bad_knobs_with_one_line(knobs, message):
    with pytest.raises(ValueError, match=message) as e:
        SageConfig(**knobs)
    assert str(e.value).startswith("SAGE knobs: ") and "\n" not in str(e.value)
    spec = "sage:" + ":".join(f"{k}={v}" for k, v in knobs.items())
    with pytest.raises(ValueError, match=message):  # bench/generate specs go through the same check
        parse_spec(spec)


def test_width_at_depth_three_uses_the_parents_own_probability_not_its_path():
    """Eq. 12 at l = 3: W_3 = ceil(W / 3 * (0.5 + P_parent)), P_parent the parent's own draft probability."""
    pol = SagePolicy(SageConfig(theta_scale=0.0, alpha_source="prev_path"))
    shape = pol.shape(None)  # alpha 0.5: W = 6, D = 6
    tree = DraftTree()
    root_child = tree.add(1, -1, 0.5)
    parent = tree.add(2, root_child, 0.9)  # own probability 0.9, cumulative 0.45
    pol.expand(shape, 3, tree, frontier([parent], np.full((1, 10), 0.09)))
    kids = sum(1 for p in tree.parents if p == parent)
    assert kids == 3  # ceil(6 / 3 * 1.4) = ceil(2.8); the cumulative 0.45 would give ceil(1.9) = 2


def test_threshold_grows_with_the_level_theta_l_is_0_1_l_over_d():
    """theta_l = 0.1 * l / D: with D = 4, 0.05 at level 2 and 0.075 at level 3 (cumulative probabilities)."""
    pol = SagePolicy(SageConfig(d_min=4, d_max=4, alpha_source="prev_path"))
    shape = pol.shape(None)
    assert shape.depth == 4
    cand = [[0.5, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, 0.01, 0.005, 0.005]]  # times the parent's 0.9
    # level 2 (width ceil(6/2 * 1.4) = 5): 0.045 < 0.05; level 3 (width 3): 0.063 < 0.075. Without the
    # factor l (0.025) both levels would keep 0.045 and 0.027 too; without the 1/D (0.2, 0.3) only 0.45.
    for level, kept in [(2, [0.45, 0.09, 0.063]), (3, [0.45, 0.09])]:
        tree = DraftTree()
        parent = tree.add(7, -1, 0.9)
        pol.expand(shape, level, tree, frontier([parent], cand))
        assert tree.cum_probs[1:] == pytest.approx(kept), level


def test_policy_keys_name_the_settings_and_are_made_once_per_setting():
    a, b = make_policy("sage"), make_policy("sage")
    assert a.key == b.key and a.key is b.key  # a fresh policy each run does not repr its settings again
    assert make_policy("sage:d_max=8").key != a.key and make_policy("chain").key.startswith("chain")

    @dataclasses.dataclass  # settings that cannot be hashed still give a key
    class Loose:
        k: int = 3

    class Mine(ChainPolicy):
        pass

    mine = Mine(ChainPolicy().cfg)
    mine.cfg = Loose()
    assert mine.key == f"chain{Loose()!r}" and mine.key.endswith("Loose(k=3)")
