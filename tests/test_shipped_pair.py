"""The shipped pair (assets/models) as a user gets it: on its fast backends, drafting deep priced by this machine
(`priced:sage`), following a policy subclass's own rules; nothing falls back in silence. The priced policy's decisions
are made on a fixed model of the machine's costs (`SHIPPED_CPU`, read by a `ModelledMeter`), so that they do not
depend on how busy this machine is."""

from __future__ import annotations

from pathlib import Path

import pytest

from sage_engine import SageConfig, SagePolicy, SpecEngine, load_pair, prepare_input
from sage_engine.core.rules import numba
from sage_engine.evaluation.experiments.prices import ModelledMeter, PriceModel
from sage_engine.policies import make_policy

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (ROOT / "assets" / "models").is_dir(), reason="no shipped pair in assets/models")


# this 2-core CPU's costs on the shipped pair, roughly, instead of the clock: a plain step 4.5 ms, each verified node
# 0.1 ms more, each draft forward 0.3 ms
SHIPPED_CPU = PriceModel("the shipped pair on 2 CPU cores", plain=4.5, base=4.5, node=0.1, level=0.3)


@pytest.fixture(scope="module")
def shipped():
    pair = load_pair()
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "Describe it in detail.", images=[str(ROOT / "assets" / "examples" / "shapes_1.png")])
    return engine, prep


def test_the_shipped_pair_runs_on_its_fast_backends(shipped):
    engine, prep = shipped
    engine.generate(prep, "sage", max_new_tokens=8)  # both prompt paths checked on a real picture by now
    backends = engine.backends()
    assert backends["target"]["cached"] in ("fused", "fused+packed"), backends
    assert backends["draft"]["cached"] == ("fused+numba" if numba is not None else "fused+numpy"), backends
    assert backends["target"]["prompt"] == backends["draft"]["prompt"] == "fused+vision", backends
    assert backends["target"]["notes"] == backends["draft"]["notes"] == [], backends


def test_priced_sage_drafts_most_steps_and_deep_on_a_shipped_example(shipped):
    engine, prep = shipped
    engine.costs = ModelledMeter(SHIPPED_CPU)
    ar = engine.generate(prep, "ar", max_new_tokens=96, ignore_eos=True)
    res = engine.generate(prep, "priced:sage", max_new_tokens=96, ignore_eos=True)
    assert res.token_ids == ar.token_ids
    steps = res.steps[1:]
    drafted = [s for s in steps if s.draft_forwards > 0]
    assert len(drafted) >= 0.8 * len(steps) and res.stats.mean_accepted > 5, (len(drafted), len(steps),
                                                                              res.stats.mean_accepted)
    want = "compiled step" if numba is not None else "python"
    paths = dict(res.stats.draft_paths)
    # past the answer's end (ignore_eos) the draft misses, priced:sage takes plain steps, and its first try after
    # them takes the levels path, saying why; every other drafted step is one compiled call
    retries = paths.pop("compiled levels", 0) if numba is not None else 0
    assert paths == {want: len(drafted) - retries}, res.stats.draft_paths
    assert not retries or res.stats.draft_path_why == ["this step's shape reads more than alpha (a try after plain "
                                                       "steps)"], res.stats.draft_path_why


class Fixed(SagePolicy):
    """Depth 2 and width 3 whatever alpha."""

    def depth_for(self, alpha):
        return 2

    def width_for(self, alpha):
        return 3


def test_a_subclass_gets_the_trees_its_own_rules_ask_for_and_the_targets_tokens(shipped):
    engine, prep = shipped
    budget = 40
    ar = engine.generate(prep, "ar", max_new_tokens=budget, ignore_eos=True)
    policy = Fixed(SageConfig(threshold="paper", theta_scale=0.0))  # no threshold: every candidate may be a node
    res = engine.generate(prep, policy, max_new_tokens=budget, ignore_eos=True)
    assert res.token_ids == ar.token_ids
    before = 1  # the prefill's token
    for s in res.steps[1:]:
        depth = min(2, budget - before - 1)  # the run's remaining tokens cut the last trees
        assert (s.depth, s.width) == (depth, 3), s.step
        assert max(s.tree.depths) == depth and s.tree.depths.count(1) == 3, (s.step, s.tree.depths)
        if numba is not None:
            assert (s.draft_path, s.draft_path_why) == ("compiled levels", "Fixed overrides depth_for, width_for")
        before = s.total_tokens


def test_a_run_after_another_of_its_policy_starts_priced(shipped):
    """The documented choice (costs.py): the meter is the engine's, so prices carry over from run to run."""
    engine, prep = shipped
    engine.costs = ModelledMeter(SHIPPED_CPU)
    first = engine.generate(prep, make_policy("priced:sage"), max_new_tokens=96, ignore_eos=True)
    assert sum(s.node_price is not None for s in first.steps) >= 2  # priced once its steps were measured
    second = engine.generate(prep, make_policy("priced:sage"), max_new_tokens=32, ignore_eos=True)
    assert first.steps[1].node_price is None and second.steps[1].node_price is not None
