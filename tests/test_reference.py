"""reference.py, the loop written for reading, draws the engine's trees and tokens: every policy, greedy and sampled,
on image, video and text prompts of two families (tiny Qwen2.5-VL and LLaVA, sharpened so that SAGE drafts deep) and
on the shipped pair.

The engine runs here on transformers' forward() (tree_forward="forward") with the compiled functions off
(jit.ACTIVE False: the draft's candidates from torch's softmax and top-k, as on a machine without Numba): the
configuration the reference mirrors call for call. That every other backend and the compiled draft compute what
forward() does is the equivalence suites' business (test_equivalence, test_backends_equivalence, test_compiled_levels).
"""

from __future__ import annotations

import pytest

from sage_engine import reference
from sage_engine.core import jit
from sage_engine.core.engine import SpecEngine
from sage_engine.core.sampling import Sampling
from sage_engine.models.inputs import prepare_input
from sage_engine.models.loading import load_pair
from sage_testing.tiny_pairs import clip, image, sharp_pair

GREEDY = ("ar", "chain", "static", "eagle2", "specvlm", "sage", "sage:d_max=8:alpha_source=prev_path", "svip", "ddd")
SAMPLED = ("chain", "chain:draw=top", "eagle2", "sage", "sage:draw=sample", "svip")
SAMPLING = Sampling(temperature=0.8, top_p=0.95, seed=3)
CASES = [("qwen2.5-vl", "image"), ("qwen2.5-vl", "video"), ("qwen2.5-vl", "text"), ("llava", "image"),
         ("shipped", "image")]
_pairs: dict = {}


def case(family: str, media: str):
    if family not in _pairs:
        _pairs[family] = load_pair() if family == "shipped" else sharp_pair(family, "noisy")
    pair = _pairs[family]
    if family == "shipped":
        return pair, prepare_input(pair, "Describe the image.", images=["assets/examples/shapes_1.png"])
    media_kw = {"image": {"images": [image(10)]}, "video": {"video": clip(10)}, "text": {}}[media]
    return pair, prepare_input(pair, "describe what you see", **media_kw)


def engine_steps(engine, prep, policy, sampling, tokens):
    """(tree tokens, parents, probs to 5 digits, accepted nodes, bonus, emitted tokens) per decode step."""
    events = list(engine.stream(prep, policy, tokens, sampling=sampling, ignore_eos=True))[1:]
    return [(e.tree.tokens, e.tree.parents, e.tree.probs, e.accepted_nodes, e.bonus_token, e.new_token_ids)
            for e in events]


def reference_steps(pair, prep, policy, sampling, tokens):
    steps = list(reference.generate(pair, prep, policy, tokens, sampling, ignore_eos=True))[1:]
    return [(s.tree.tokens, s.tree.parents, [round(p, 5) for p in s.tree.probs], s.accepted, s.bonus, s.tokens)
            for s in steps]


@pytest.mark.parametrize("family,media", CASES)
def test_the_reference_loop_draws_the_engines_trees_and_tokens(monkeypatch, family, media):
    monkeypatch.setattr(jit, "ACTIVE", False)
    pair, prep = case(family, media)
    engine = SpecEngine(pair, tree_forward="forward")
    tokens = 24
    drafted = 0
    for sampling, policies in ((None, GREEDY), (SAMPLING, SAMPLED)):
        for policy in policies:
            ours = engine_steps(engine, prep, policy, sampling, tokens)
            theirs = reference_steps(pair, prep, policy, sampling, tokens)
            for i, (a, b) in enumerate(zip(ours, theirs)):
                assert a == b, f"{policy} ({'sampled' if sampling else 'greedy'}): step {i + 1} differs"
            assert len(ours) == len(theirs), policy
            drafted += sum(len(s[0]) > 1 for s in ours)
    assert drafted > 0  # trees were drawn, not only plain steps


def test_the_reference_loop_is_one_screen_and_names_no_backend():
    from pathlib import Path

    source = Path(reference.__file__).read_text()
    assert len(source.splitlines()) <= 200
    assert "backends" not in source.split('"""', 2)[2] and "costs" not in source  # forward() alone, no meter


def test_a_reference_with_a_wrong_rule_is_caught(monkeypatch):
    """The comparison can fail: a reference whose verify pass lets every node see the whole tree (a causal mask, not
    the tree's) parts from the engine."""
    monkeypatch.setattr(jit, "ACTIVE", False)
    pair, prep = case("qwen2.5-vl", "image")
    engine = SpecEngine(pair, tree_forward="forward")
    ours = engine_steps(engine, prep, "eagle2", None, 16)
    monkeypatch.setattr(reference, "verify_allowed", lambda parents: __import__("numpy").tril(
        __import__("numpy").ones((len(parents) + 1,) * 2, bool)))
    assert reference_steps(pair, prep, "eagle2", None, 16) != ours
