"""A researcher's policy by name, everywhere; `sage` the same in every run; a priced run recorded and replayed; what
a step drafted beside what it planned; the two related-work policies (svip, ddd) exact against `ar`."""

from __future__ import annotations

import json

import pytest
from test_cli import media, run_main  # noqa: F401 - the CLI tests' media fixture

from sage_engine import SageConfig, SagePolicy, SpecEngine, make_policy, prepare_input, register_policy
from sage_engine.core.costs import StepTiming
from sage_engine.core.sampling import Sampling
from sage_engine.policies import PricedPolicy, replay_of
from sage_testing.tiny_pairs import image, sharp_pair

POLICY_FILE = '''
from dataclasses import dataclass

from sage_engine import Policy, TreeShape, register_policy


@dataclass(frozen=True)
class SureConfig:
    depth: int = 6
    sure: float = 0.5


class SureChain(Policy):
    """A chain of up to `depth` draft tokens that stops after the first one the draft is unsure of."""

    name = "sure-chain"

    def __init__(self, cfg=SureConfig()):
        self.cfg = cfg

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.depth, width=1, max_nodes=self.cfg.depth, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        p = frontier.top_probs[0][0]
        node = tree.add(frontier.top_tokens[0][0], frontier.nodes[0], p)
        return [node] if level < shape.depth and p > self.cfg.sure else []


register_policy("sure-chain", SureChain, SureConfig)
'''


@pytest.fixture(autouse=True)
def registry():
    """A policy a test registers (by hand or with a --policy-module file) is gone after it, from every table that
    knows the names (restored in place: modules hold these objects by reference), so that later tests' messages list
    the policies there are."""
    from sage_engine import config, policies

    tables = (policies._POLICIES, config.POLICY_CONFIGS, policies.MODULE_POLICIES)
    saved = [table.copy() for table in tables]
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before) if isinstance(table, dict) else table.extend(before)


@pytest.fixture(scope="module")
def sharp():
    pair = sharp_pair("qwen2.5-vl", "noisy")
    return pair, prepare_input(pair, "describe what you see", images=[image(10)])


def trees(result):
    return [(e.tree.tokens, e.tree.parents) for e in result.steps[1:]]


def test_sage_draws_the_same_trees_whatever_the_meter_has_seen(sharp):
    """Two runs of `sage`, and one on an engine whose meter says every drafted step loses (a busy neighbour): the same
    trees step for step; `priced:sage` reads that meter and takes plain steps."""
    pair, prep = sharp
    engine = SpecEngine(pair)
    first, second = (engine.generate(prep, "sage", 32, ignore_eos=True) for _ in range(2))
    busy = SpecEngine(pair)
    key = make_policy("priced:sage").key
    for _ in range(40):  # plain steps at 1 token per ms, drafted ones of sage (priced or not) at 0.01
        busy.costs.record(StepTiming("ar", 1, 0, 1.0, 0.9, 0.0, 0))
        for k in (key, make_policy("sage").key):
            busy.costs.record(StepTiming(k, 1, 8, 100.0, 50.0, 40.0, 4, 3.0))
    loaded = busy.generate(prep, "sage", 32, ignore_eos=True)
    assert trees(first) == trees(second) == trees(loaded) and max(len(t[0]) for t in trees(first)) > 4
    priced = busy.generate(prep, "priced:sage", 32, ignore_eos=True)
    assert priced.token_ids == first.token_ids and trees(priced) != trees(first)
    assert sum(not e.tree.tokens for e in priced.steps[1:]) > 4  # plain steps: the meter says drafting loses


def test_a_policy_object_used_again_starts_afresh(sharp):
    pair, prep = sharp
    engine = SpecEngine(pair)
    policy = SagePolicy(SageConfig(history_low=9.0, history_high=10.0))  # D_max falls every step
    first, again = (engine.generate(prep, policy, 32, ignore_eos=True) for _ in range(2))
    assert trees(first) == trees(again) and first.steps[1].d_max == again.steps[1].d_max == 16


def test_a_priced_run_records_its_prices_and_replays_exactly(sharp):
    pair, prep = sharp
    engine = SpecEngine(pair)
    policy = make_policy("priced:sage")
    for _ in range(24):  # a machine where plain steps are slow (5 ms a token) and drafted ones pay
        engine.costs.record(StepTiming("ar", 1, 0, 5.0, 4.5, 0.0, 0))
    for nodes, forwards in [(8, 4), (4, 2), (16, 6), (2, 1)] * 6:
        engine.costs.record(StepTiming(policy.key, 6, nodes, 1.0 + 0.1 * (nodes + forwards), 0.5 + 0.05 * nodes,
                                       0.1 * forwards, forwards, 5.0))
    run = engine.generate(prep, policy, 32, ignore_eos=True)
    assert len(policy.used) == len(run.steps) - 1 and sum(s.price is not None for s in policy.used) > 3
    prices = [(e.node_price, e.level_price) for e in run.steps[1:]]
    assert prices == [(None, None) if s.price is None else (s.price.node, s.price.level) for s in policy.used]
    recorded = json.loads(json.dumps(run.to_dict()))["steps"]  # as `generate --json` prints it
    for replay in (policy.used, replay_of(recorded)):
        again = SpecEngine(pair).generate(prep, PricedPolicy(make_policy("sage"), replay=replay), 32,
                                          ignore_eos=True)
        assert trees(again) == trees(run) and again.token_ids == run.token_ids


def test_a_step_event_says_what_was_drafted_beside_what_was_planned(sharp):
    pair, prep = sharp
    res = SpecEngine(pair).generate(prep, "svip:threshold=0.2", 32, ignore_eos=True)
    drafted = [e for e in res.steps[1:] if e.draft_path]
    assert drafted[0].depth == 12 and all(e.depth <= 12 for e in drafted)  # planned: svip's longest chain (the
    # run's last steps plan no deeper than the tokens left)
    assert all(e.drafted_depth == e.nodes == len(e.tree.tokens) and e.drafted_width <= 1 for e in drafted)
    assert any(e.drafted_depth < e.depth for e in drafted)  # it stopped where the draft was unsure


@pytest.mark.parametrize("sampling", [None, Sampling(0.8, seed=4)])
def test_svip_and_ddd_are_exact(sharp, sampling):
    pair, prep = sharp
    engine = SpecEngine(pair)
    ar = engine.generate(prep, "ar", 32, ignore_eos=True, sampling=sampling).token_ids
    for spec in ("svip", "ddd", "ddd:min_beam_mass=0.6", "priced:ddd"):
        res = engine.generate(prep, spec, 32, ignore_eos=True, sampling=sampling)
        assert res.token_ids == ar, spec
        # the draft was accepted (priced, this machine may find that plain steps pay better)
        assert spec.startswith("priced") or res.stats.mean_accepted > 1.2, spec


def test_ddd_stops_where_the_beam_is_unlikely(sharp):
    pair, prep = sharp
    engine = SpecEngine(pair)
    deep = engine.generate(prep, "ddd:min_beam_mass=0.0", 24, ignore_eos=True)
    cut = engine.generate(prep, "ddd:min_beam_mass=0.9", 24, ignore_eos=True)
    mean_depth = (lambda r: sum(e.drafted_depth for e in r.steps[1:]) / (len(r.steps) - 1))
    assert mean_depth(cut) < mean_depth(deep)


def test_register_policy_refuses_the_engines_names():
    with pytest.raises(ValueError, match="cannot register"):
        register_policy("sage", SagePolicy, SageConfig)
    with pytest.raises(ValueError, match="cannot register"):
        register_policy("priced", SagePolicy)


def test_a_policy_module_runs_by_name_in_generate_and_bench(saved_qwen_pair, media, tmp_path, capsys):  # noqa: F811
    target, draft = saved_qwen_pair
    module = tmp_path / "my_policy.py"
    module.write_text(POLICY_FILE)
    common = ["--max-new-tokens", "16", "--target", target, "--draft", draft, "--policy-module", str(module)]
    gen = ["generate", "--prompt", "describe", "--image", str(media / "a.png"), "--json", *common]
    code, out, _ = run_main(capsys, *gen, "--policy", "ar")
    ar = json.loads(out)
    code, out, _ = run_main(capsys, *gen, "--policy", "sure-chain:depth=4")
    mine = json.loads(out)
    assert code == 0 and mine["token_ids"] == ar["token_ids"] and mine["policy"] == "sure-chain"
    assert max(s["drafted_depth"] for s in mine["steps"]) <= 4
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.png").write_bytes((media / "a.png").read_bytes())
    report = tmp_path / "r.json"
    code, _, _ = run_main(capsys, "bench", "--inputs", str(d), "--policies", "sure-chain,priced:sage,svip",
                          "--out", str(report), *common)
    policies = json.loads(report.read_text())["policies"]
    assert code == 0 and all(policies[p]["exact_match_vs_ar"] == 1.0 for p in ("sure-chain", "priced:sage", "svip"))
    code, _, err = run_main(capsys, "bench", "--inputs", str(d), "--policies", "nobody", "--out", str(report),
                            *common)
    assert code == 2 and "unknown policy 'nobody'" in err
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no')\n")
    code, _, err = run_main(capsys, *gen, "--policy", "ar", "--policy-module", str(bad))
    assert code == 2 and err.startswith("error: --policy-module") and "RuntimeError: no" in err


def test_a_policy_module_s_policy_is_in_the_app_s_dropdown_and_races_exactly(media, tmp_path):  # noqa: F811
    """app.py --policy-module: the dropdown offers the registered name after the engine's own, and the race runs it
    (with knobs) token for token like `ar`; a demo without the module refuses the name in one line."""
    from dataclasses import fields

    import app_server

    from app.arguments import speculative_policy
    from app.demo import build_demo
    from app.handlers import Handlers, InputError
    from app.layout import POLICIES, policy_choices
    from app.media import RunFiles
    from app.pool import PairPool
    from app.view import View
    from sage_engine.policies import load_policy_module

    module = tmp_path / "my_policy.py"
    module.write_text(POLICY_FILE)
    names = tuple(load_policy_module(str(module)))
    assert names == ("sure-chain",)
    tiny = {app_server.TINY.name: app_server.TINY}
    demo = build_demo(tiny, pair_factory=app_server.pair_factory, examples=[], cache_examples="off", policies=names)
    dropdown = next(c for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "policy")
    choices = [c[0] if isinstance(c, (list, tuple)) else c for c in dropdown["props"]["choices"]]
    assert choices == [*POLICIES, "sure-chain"] and choices[0] == "sage"
    h = Handlers(PairPool(tiny, app_server.pair_factory), RunFiles(), app_server.TINY.name,
                 policies=policy_choices(names))
    *_, last = h.compare(str(media / "a.png"), None, "describe the image", 16, "sure-chain:depth=4")
    record = dict(zip([f.name for f in fields(View)], last))["run_state"]
    assert record.spec.done and record.spec.token_ids == record.ar.token_ids and len(record.ar.token_ids) == 16
    with pytest.raises(InputError, match="unknown policy 'sure-chain'"):
        speculative_policy("sure-chain", {}, POLICIES)
