"""A draft's step in one compiled call (sage_engine/backends/draft_compiled.py): its expansion appends the nodes
SagePolicy's and ChainPolicy's expand() add, number for number (both run core/rules.py), and drafting a step in one
call draws the same trees as the engine's level loop (end tokens, a cut vocabulary), lossless, only where the
compiled layers are kept."""

import copy
import random

import numpy as np
import pytest
import torch
from test_equivalence import MAX_NEW, sharp_case
from test_host import _prefer
from test_stack import pair_for

from sage_engine import SpecEngine, make_policy
from sage_engine.backends import draft_compiled as levels_mod
from sage_engine.config import SageConfig
from sage_engine.core import rules
from sage_engine.core.costs import BreakEven
from sage_engine.core.draft import Drafter
from sage_engine.core.policy_io import COMPILED_LEVELS, COMPILED_STEP, PYTHON, DraftPath, Frontier, TreeShape
from sage_engine.core.sampling import Sampling, warped
from sage_engine.core.tree import DraftTree
from sage_engine.policies import ChainPolicy, SagePolicy

K = 10  # candidates per row (SAGE's and the chain's: max(top_k, entropy_k))


def _random_case(rng: random.Random, chain: bool):
    """A tree drafted so far, one level's frontier over some of its nodes (or the root), and a shape."""
    tree = DraftTree()
    for _ in range(rng.randint(0, 12)):
        tree.add(rng.randrange(600), rng.randrange(-1, len(tree)) if len(tree) else -1,
                 float(np.float32(rng.random())))
    level = 1 if not len(tree) or rng.random() < 0.3 else max(tree.depths) + 1
    rows = [-1] if level == 1 else rng.sample(range(len(tree)), rng.randint(1, min(1 if chain else 5, len(tree))))
    probs = []
    for _ in rows:
        row = sorted((np.float32(rng.random() ** 3) for _ in range(K)), reverse=True)
        if rng.random() < 0.4:  # ties between ranks and rows: the order must be the policy's (stable, row first)
            row[2] = row[1]
        probs.append([float(p) for p in row])
    if len(rows) > 1 and rng.random() < 0.4:
        probs[1] = list(probs[0])
    frontier = Frontier(rows, [[rng.randrange(600) for _ in range(K)] for _ in rows], probs)
    price = None if rng.random() < 0.3 else BreakEven(rate=rng.uniform(0.1, 2.0), node_ms=rng.uniform(0.0, 0.3),
                                                      level_ms=rng.uniform(0.0, 1.0), trust=rng.uniform(0.3, 1.0))
    depth = rng.randint(level, level + 3)
    shape = TreeShape(depth=depth, width=1 if chain else rng.randint(1, K), max_nodes=rng.randint(len(tree), 40),
                      price=price)
    return tree, level, frontier, shape


def _compiled_expand(policy, shape, level, tree: DraftTree, frontier: Frontier):
    """draft_compiled._expand on the tree's arrays: the nodes it appends and whether it grows them."""
    rule = policy.level_rule()
    node, level_price = (np.nan, np.nan) if shape.price is None else (shape.price.node, shape.price.level)
    numbers = (shape.width, rule.bias, rule.theta_scale, node, level_price, shape.max_nodes, shape.depth)
    size = len(tree) + len(frontier.nodes) * K + 1
    arrays = [np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size), np.zeros(size)]
    for a, values in zip(arrays, (tree.tokens, tree.parents, tree.probs, tree.cum_probs)):
        a[: len(tree)] = values
    count, go = levels_mod._expand(rule.kind, level, numbers, np.array(frontier.nodes, np.int64),
                                         np.array(frontier.top_probs, np.float64),
                                         np.array(frontier.top_tokens, np.int64), *arrays, len(tree))
    return [tuple(a[len(tree) : count].tolist()) for a in arrays], go, count


@pytest.mark.parametrize("chain", [False, True])
def test_the_compiled_expansion_is_the_policys_own(chain):
    rng = random.Random(7 + chain)
    grown = priced_out = 0
    for trial in range(400):
        cfg = SageConfig(theta_scale=rng.choice([0.0, 0.05, 0.1, 0.3]), width_parent_bias=rng.choice([0.5, 0.2]))
        policy = ChainPolicy() if chain else SagePolicy(cfg)
        tree, level, frontier, shape = _random_case(rng, chain)
        want_tree = copy.deepcopy(tree)
        want_grow = policy.expand(shape, level, want_tree, frontier)
        added, go, count = _compiled_expand(policy, shape, level, tree, frontier)
        new = range(len(tree), len(want_tree))
        assert added == [tuple(want_tree.tokens[i] for i in new), tuple(want_tree.parents[i] for i in new),
                         tuple(want_tree.probs[i] for i in new), tuple(want_tree.cum_probs[i] for i in new)], trial
        assert (list(range(len(tree), count)) if go else []) == want_grow, trial
        grown += bool(want_grow)
        priced_out += bool(added[0]) and not want_grow and level < shape.depth
    assert grown > 100 and (chain or priced_out > 10)  # both outcomes were met, the level price's among them


def _levels_off(monkeypatch):
    monkeypatch.setattr(Drafter, "path", lambda self, policy: DraftPath(PYTHON, "the test's level loop"))


def _count_compiled(monkeypatch) -> list:
    """Steps whose levels a compiled call drafted: "step" (read, shape and levels in one call,
    draft_compiled.draft_step) or "levels" (the levels after the read, draft_compiled.draft_levels)."""
    calls = []
    levels, step = levels_mod.draft_levels, levels_mod.draft_step
    monkeypatch.setattr(levels_mod, "draft_levels", lambda *a: calls.append("levels") or levels(*a))
    monkeypatch.setattr(levels_mod, "draft_step", lambda *a: calls.append("step") or step(*a))
    return calls


def _trees(res):
    """Each step's tree, and the shape and confidences it was drawn from (the compiled step computes them itself)."""
    return [(s.tree.tokens, s.tree.parents, s.tree.probs, s.tree.cum_probs, s.depth, s.width, s.alpha, s.root_alpha)
            for s in res.steps[1:] if s.tree]


@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "copy"), ("qwen2.5-vl", "video", "noisy"),
                                               ("llava", "image", "noisy")])
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_compiled_levels_draw_the_level_loops_trees_and_stay_lossless(monkeypatch, family, media, kind, ignore_eos):
    pair, prep = sharp_case(family, media, kind)
    _prefer(monkeypatch, "numba")
    engine = SpecEngine(pair)
    assert engine.draft.tree_forward == "fused+numba"
    engine.draft.vocab_limit -= 40  # the draft's last rows cut, as for a draft with a larger vocabulary
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=ignore_eos).token_ids
    calls = _count_compiled(monkeypatch)
    runs = {}
    for compiled in (True, False):
        if not compiled:
            _levels_off(monkeypatch)
        for spec in ("chain", "sage:threshold=paper", "sage:threshold=paper:d_min=1:w_min=3:theta_scale=0.02",
                     "sage"):
            res = engine.generate(prep, make_policy(spec), max_new_tokens=MAX_NEW, ignore_eos=ignore_eos)
            assert res.token_ids == reference, (compiled, spec)
            assert all(t < engine.draft.vocab_limit for s in res.steps[1:] if s.tree for t in s.tree.tokens)
            runs[compiled, spec] = res
        if compiled:
            assert "step" in calls, "the compiled step was not used"
            calls.clear()
    assert not calls  # the level loop drafted the second time
    for spec in ("chain", "sage:threshold=paper", "sage:threshold=paper:d_min=1:w_min=3:theta_scale=0.02"):
        assert _trees(runs[True, spec]) == _trees(runs[False, spec]), spec  # shapes fixed by the draft's numbers
    assert max(len(t[0]) for t in _trees(runs[True, "sage:threshold=paper:d_min=1:w_min=3:theta_scale=0.02"])) > 4


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_a_sampled_draft_that_ranks_its_candidates_draws_the_level_loops_trees_and_the_targets_own_draws(
        monkeypatch, temperature, top_p):
    """Its drafted steps are one compiled call too (the read's candidates from the warped distribution)."""
    pair, prep = sharp_case("qwen2.5-vl", "image", "noisy")
    _prefer(monkeypatch, "numba")
    engine = SpecEngine(pair)
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=3)
    assert make_policy("sage:draw=sample").draft_path(sampled=True).name == PYTHON  # the loop
    assert make_policy("sage:draw=sample").draft_path(sampled=False).name == COMPILED_STEP  # greedy: ranked
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, sampling=sampling).token_ids  # the target alone
    calls = _count_compiled(monkeypatch)
    runs = {}
    specs = ("sage:threshold=paper", "sage:threshold=paper:d_min=1:w_min=3:theta_scale=0.02", "sage")
    for compiled in (True, False):
        if not compiled:
            _levels_off(monkeypatch)
        for spec in specs:
            res = engine.generate(prep, make_policy(spec), max_new_tokens=MAX_NEW, sampling=sampling)
            assert res.token_ids == reference, (compiled, spec)  # the tree rule: the very draws of the target alone
            runs[compiled, spec] = res
        assert ("step" in calls) == compiled
        calls.clear()
    for spec in specs[:2]:  # the same trees, shapes, probabilities and alphas: both paths rank by rules.warped_top
        assert _trees(runs[True, spec]) == _trees(runs[False, spec]), spec


def test_the_warped_top_k_is_the_samplers_distribution():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((4, 640)) * 3).astype(np.float32)
    logits[1, 10] = logits[1, 11] = logits[1].max() + 1  # a tie: the lower token first
    for temperature, top_p in [(0.7, 1.0), (1.0, 0.9), (1.3, 0.5), (0.5, 0.05)]:
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=0)
        want = warped(torch.from_numpy(logits), sampling).numpy()
        probs, tokens = rules.warped_top(logits, 12, temperature, top_p)
        for row in range(4):
            assert np.allclose(probs[row], want[row, tokens[row]], rtol=1e-12, atol=0)
            kept = want[row] > 0
            assert tokens[row, 0] == want[row].argmax() and (probs[row] > 0).sum() == min(12, kept.sum())
            assert list(probs[row]) == sorted(probs[row], reverse=True)
        if (want[1] > 0).sum() >= 2:  # both tied tokens in the nucleus
            assert list(tokens[1, :2]) == [10, 11]
        else:  # the nucleus of the tightest top-p holds the first of them alone
            assert top_p == 0.05 and tokens[1, 0] == 10 and probs[1, 0] == 1.0


def test_the_compiled_levels_run_only_where_the_compiled_layers_are_kept(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    _prefer(monkeypatch, "numpy")
    engine = SpecEngine(pair)
    assert engine.draft.tree_forward == "fused+numpy"
    path = engine.drafter.path(make_policy("chain"))
    assert path.name == PYTHON and "fused+numpy" in path.why  # said, with the reason
    assert make_policy("eagle2").draft_path(False).name == PYTHON  # other policies: the loop
    assert make_policy("sage:alpha_source=prev_path").draft_path(False) == DraftPath(
        PYTHON, "it reads every node's alpha (alpha_source=prev_path)")
    assert make_policy("sage").draft_path(False).name == COMPILED_STEP


def test_a_subclass_keeps_the_fastest_path_its_overrides_allow():
    class Wide(SagePolicy):
        def width_for(self, alpha):
            return 3

    class Mine(SagePolicy):
        def expand(self, shape, level, tree, frontier):
            return super().expand(shape, level, tree, frontier)

    assert Wide().draft_path(False) == DraftPath(COMPILED_LEVELS, "Wide overrides width_for")
    assert Mine().draft_path(False) == DraftPath(PYTHON, "Mine overrides expand")
    assert SagePolicy().draft_path(False) == DraftPath(COMPILED_STEP)


def test_the_engine_loads_the_compiled_step_when_it_is_built(monkeypatch):
    """Loaded inside a run, their first call would fall in its first drafted step (~0.4 s from Numba's cache)."""
    calls = []
    for name in ("_draft_levels", "_draft_step"):
        jit = getattr(levels_mod, name)
        monkeypatch.setattr(levels_mod, name, lambda *a, jit=jit, name=name: calls.append(name) or jit(*a))
    SpecEngine(pair_for("qwen2.5-vl"))
    assert set(calls) == {"_draft_levels", "_draft_step"}


def test_the_compiled_confidence_is_the_python_functions_number_for_number():
    """The compiled step plans SAGE's depth and width from alpha: compiled without fast-math, rules.confidence gives
    the plain Python function's number exactly (a last-bit difference could move a depth across a rounding edge)."""
    rng = np.random.default_rng(5)
    rows = [rng.dirichlet(np.full(10, a)).astype(np.float32) for a in (0.05, 0.3, 1.0, 5.0) for _ in range(500)]
    rows += [np.array([1.0] + [0.0] * 9, np.float32), np.array([0.3, 0.2, 0.0, 0.0, 0.1], np.float32)]
    rows += [np.sort(rng.random(k, dtype=np.float32))[::-1] * 0.01 for k in (2, 3, 10) for _ in range(100)]
    for row in rows:
        row = np.ascontiguousarray(row, dtype=np.float64)
        assert rules.confidence(row) == rules.confidence.py_func(row), row
