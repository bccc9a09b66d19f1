"""Lossless sampling (sage_engine/core/sampling.py): the settings, the target's tempered top-p distribution, the tree
rule by exact enumeration (with a wrong variant that the same check catches), inverse-CDF draws, and on tiny
VLMs of two families: every policy's sample equals the target-only sample of the same seed, token for token."""

import itertools
import math

import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.core.passes import Pass
from sage_engine.core.sampling import RatioAcceptance, SampledAcceptance, Sampling, inverse_cdf, warped
from sage_engine.core.tree import DraftTree
from sage_testing.tiny_pairs import image, llava_pair, qwen25_pair


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(seed=-1), dict(temperature=float("inf"))])
def test_bad_sampling_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Sampling(**kwargs)


def test_warped_temper_and_cut_to_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert warped(logits, Sampling(1.0)).tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert warped(logits, Sampling(1.0, top_p=0.7)).tolist() == pytest.approx([0.625, 0.375, 0, 0])
    squared = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert warped(logits, Sampling(0.5)).tolist() == pytest.approx((squared / squared.sum()).tolist())


def test_inverse_cdf_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3], dtype=torch.float64)
    assert [inverse_cdf(probs, torch.tensor(u)) for u in (0.05, 0.1, 0.69, 0.71, 0.99)] == [0, 1, 1, 3, 3]
    acc = SampledAcceptance(Sampling(1.0, seed=3))
    counts = torch.bincount(torch.tensor([acc.draw(torch.log(probs)) for _ in range(20000)]), minlength=4)
    assert (counts / 20000 - probs).abs().sum() < 0.02 and counts[2] == 0


V = 4  # a vocabulary small enough to enumerate every outcome
WARP = Sampling(0.8, top_p=0.9)  # both warps on, for the target and the draft


def table_logits(prefix: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """A made-up model: different logits after every prefix (salt 0: the target, salt 7: the draft)."""
    g = torch.Generator().manual_seed((hash(prefix) + salt) % 2**31)
    return torch.randn(V, generator=g) * 1.5


def p_of(prefix: tuple[int, ...]) -> torch.Tensor:
    return warped(table_logits(prefix), WARP)


class Branch(Exception):
    """A run asked for a random outcome its script does not fix yet: one branch per option."""

    def __init__(self, options):
        self.options = options


class Chooser:
    """Replays a script of option indices and multiplies the probabilities of the options taken."""

    def __init__(self, script):
        self.script, self.used, self.weight = script, 0, 1.0

    def choose(self, options):  # options: [(value, probability)]
        if self.used == len(self.script):
            raise Branch(options)
        value, weight = options[self.script[self.used]]
        self.used, self.weight = self.used + 1, self.weight * weight
        return value


def outcomes(run) -> dict:
    """The exact distribution of run(chooser)'s result over every sequence of random outcomes."""
    out, todo = {}, [[]]
    while todo:
        script = todo.pop()
        chooser = Chooser(script)
        try:
            result = run(chooser)
        except Branch as b:
            todo += [script + [i] for i, (_, w) in enumerate(b.options) if w > 0]
            continue
        out[result] = out.get(result, 0.0) + chooser.weight
    return out


def scripted(rule, wrong=None):
    """The acceptance rule with its randomness (token draws, ratio tests) taken from a Chooser; `wrong`: a mixin
    that changes the rule (it runs first and reaches the scripted randomness through super())."""

    class Scripted(rule):
        def __init__(self, chooser):
            super().__init__(WARP)
            self.chooser = chooser

        def pick(self, probs):
            probs = probs / probs.sum()
            return self.chooser.choose([(t, float(probs[t])) for t in range(V)]), 0.5

        def passes(self, p_x, q_x):
            a = 1.0 if p_x >= q_x else p_x / q_x
            return self.chooser.choose([(True, a), (False, 1.0 - a)]), 0.5

    return Scripted if wrong is None else type(wrong.__name__, (wrong, Scripted), {})


def run_tree_step(rule, tree: DraftTree, length: int, wrong=None):
    """One step of `rule` on `tree`, its output then continued by the target alone to `length` tokens."""

    def run(chooser):
        logits = torch.stack([table_logits(())] + [table_logits(tuple(tree.tokens[i] for i in tree.path_to(n)))
                                                   for n in range(len(tree))])
        verdict = scripted(rule, wrong)(chooser)(tree, Pass(logits, 0.0))
        return continued(chooser, tuple(verdict.accepted_tokens) + (verdict.bonus,), length)

    return run


def run_sampled_chain(rule, k: int, wrong=None):
    """The draft samples a chain of k tokens from its warped q, then one step of `rule` verifies it."""

    def run(chooser):
        tree = DraftTree()
        for i in range(k):
            q = warped(table_logits(tuple(tree.tokens), salt=7), WARP)
            x = chooser.choose([(t, float(q[t])) for t in range(V)])
            tree.q_dists[tree.add(x, i - 1, float(q[x]))] = q
        logits = torch.stack([table_logits(tuple(tree.tokens[:i])) for i in range(k + 1)])
        verdict = scripted(rule, wrong)(chooser)(tree, Pass(logits, 0.0))
        return continued(chooser, tuple(verdict.accepted_tokens) + (verdict.bonus,), k + 1)

    return run


def run_sampled_tree(rule, wrong=None):
    """The draft draws 2 children of the root without replacement from q, then 2 children of the first drawn one;
    one step of `rule` verifies the tree (siblings in draw order)."""

    def run(chooser):
        tree = DraftTree()

        def draw_children(parent: int, prefix: tuple[int, ...], m: int) -> list[int]:
            q = warped(table_logits(prefix, salt=7), WARP)
            left, nodes = q.clone(), []
            for _ in range(min(m, int((q > 0).sum()))):
                r = left / left.sum()
                x = chooser.choose([(t, float(r[t])) for t in range(V)])
                nodes.append(tree.add(x, parent, float(q[x])))
                tree.q_dists[nodes[-1]] = q
                left[x] = 0.0
            return nodes

        first = draw_children(-1, (), 2)[0]
        draw_children(first, (tree.tokens[first],), 2)
        logits = torch.stack([table_logits(())] + [table_logits(tuple(tree.tokens[i] for i in tree.path_to(n)))
                                                   for n in range(len(tree))])
        verdict = scripted(rule, wrong)(chooser)(tree, Pass(logits, 0.0))
        return continued(chooser, tuple(verdict.accepted_tokens) + (verdict.bonus,), 3)

    return run


def continued(chooser, emitted: tuple[int, ...], length: int) -> tuple[int, ...]:
    while len(emitted) < length:
        p = p_of(emitted)
        emitted += (chooser.choose([(t, float(p[t])) for t in range(V)]),)
    return emitted


def tv_to_target(got: dict, length: int) -> float:
    """Total variation between `got` and the target alone over all sequences of `length` tokens."""
    want = {s: math.prod(float(p_of(s[:i])[t]) for i, t in enumerate(s))
            for s in itertools.product(range(V), repeat=length)}
    assert abs(sum(got.values()) - 1.0) < 1e-12
    return 0.5 * sum(abs(got.get(s, 0.0) - w) for s, w in want.items()) + 0.5 * sum(
        v for s, v in got.items() if s not in want)


def sample_tree() -> DraftTree:
    """A depth-3 tree of likely tokens (the target's top ones, so the rule descends often), with one child the
    top-p cut leaves out."""
    def ranked(prefix):
        return torch.argsort(p_of(prefix), descending=True, stable=True).tolist()

    tree = DraftTree()
    r = ranked(())
    a = tree.add(r[0], -1, 0.6)
    tree.add(r[1], -1, 0.3)
    ra = ranked((r[0],))
    b = tree.add(ra[0], a, 0.5)
    tree.add(ra[1], a, 0.4)
    tree.add(ra[-1], a, 0.05)
    tree.add(ranked((r[0], ra[0]))[0], b, 0.9)
    return tree


def test_the_tree_rule_gives_the_targets_distribution_by_enumeration():
    tree = sample_tree()
    got = outcomes(run_tree_step(SampledAcceptance, tree, tree.depth + 1))
    assert sum(v for s, v in got.items() if s[:3] == tuple(tree.tokens[i] for i in tree.path_to(5))) > 0.1  # deep
    assert tv_to_target(got, tree.depth + 1) < 1e-12


def test_the_ratio_rule_on_a_sampled_chain_gives_the_targets_distribution_by_enumeration():
    for k in (1, 2, 3):
        assert tv_to_target(outcomes(run_sampled_chain(RatioAcceptance, k)), k + 1) < 1e-12, k


def test_the_ratio_rule_on_a_tree_sampled_without_replacement_gives_the_targets_distribution():
    assert tv_to_target(outcomes(run_sampled_tree(RatioAcceptance)), 3) < 1e-12


class RawQForLaterSiblings:
    """Wrong: a later sibling tested against the parent's raw q, not q without the earlier siblings."""

    @staticmethod
    def _without(q, x):
        return q


class AcceptsTheDraftsFavourite:
    """Wrong: where the target's draw is not a child, the draft's most probable child is taken anyway."""

    def __call__(self, tree, verify):
        verdict = super().__call__(tree, verify)
        last = verdict.accepted[-1] if verdict.accepted else -1
        kids = [i for i in range(len(tree)) if tree.parents[i] == last]
        if not kids:
            return verdict
        best = max(kids, key=lambda i: tree.probs[i])
        return type(verdict)(verdict.accepted + [best], verdict.accepted_tokens + [tree.tokens[best]], verdict.bonus)


class TreeRuleOnASampledChain:
    """Wrong: a sampled token tested like a top-k node (accept with probability p(x), i.e. draw and compare)."""

    def passes(self, p_x, q_x):
        return super().passes(p_x, 1.0)


class ResamplesFromP:
    """Wrong: after a rejection the token is drawn from p instead of the residual max(0, p - q)."""

    def pick(self, probs):
        return super().pick(self._p) if getattr(self, "_rejecting", False) else super().pick(probs)

    def passes(self, p_x, q_x):
        ok, u = super().passes(p_x, q_x)
        self._rejecting = not ok
        return ok, u

    def __call__(self, tree, verify):
        self._p = warped(verify.logits[0], self.sampling)  # k = 1 below: the only rejection is at the root
        return super().__call__(tree, verify)


class InvertedRatio:
    """Wrong: the ratio the other way round, min(1, q/p)."""

    def passes(self, p_x, q_x):
        return super().passes(q_x, p_x)


@pytest.mark.parametrize("wrong", [AcceptsTheDraftsFavourite, TreeRuleOnASampledChain, ResamplesFromP,
                                   InvertedRatio, RawQForLaterSiblings])
def test_each_wrong_rule_fails_the_same_enumeration(wrong):
    if wrong is RawQForLaterSiblings:
        tv = tv_to_target(outcomes(run_sampled_tree(RatioAcceptance, wrong)), 3)
    elif wrong is AcceptsTheDraftsFavourite:
        tree = sample_tree()
        tv = tv_to_target(outcomes(run_tree_step(SampledAcceptance, tree, tree.depth + 1, wrong)), tree.depth + 1)
    else:
        tv = tv_to_target(outcomes(run_sampled_chain(RatioAcceptance, 1, wrong)), 2)
    assert tv > 0.01, (wrong.__name__, tv)


@pytest.fixture(scope="module", params=["qwen2.5-vl", "llava"])
def family(request):
    build = {"qwen2.5-vl": qwen25_pair, "llava": llava_pair}[request.param]
    pair = build("noisy", seed=0, sigma=0.05, sharpness=4.0)  # peaked enough for deep trees at T <= 1
    return pair, prepare_input(pair, "describe what you see", images=[image(10)])


TREE_RULE_POLICIES = ("chain:draw=top", "static", "eagle2", "sage:threshold=paper", "sage")


@pytest.mark.parametrize("sampling", [Sampling(1.0, top_p=0.9, seed=1), Sampling(0.7, seed=2),
                                      Sampling(1.0, seed=3)])
def test_every_tree_rule_policy_samples_what_the_target_alone_samples_with_the_same_seed(family, sampling):
    pair, prep = family
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", 32, ignore_eos=True, sampling=sampling).token_ids
    greedy = engine.generate(prep, "ar", 32, ignore_eos=True).token_ids
    assert reference != greedy  # it samples
    accepted = 0
    for policy in TREE_RULE_POLICIES:
        res = engine.generate(prep, policy, 32, ignore_eos=True, sampling=sampling)
        assert res.token_ids == reference, policy
        assert all(s.tree.rule == "tree" for s in res.steps[1:] if s.tree is not None)
        accepted += sum(len(s.accepted_tokens) for s in res.steps)
    assert accepted > 0  # the draft's trees served draws


def test_the_sampled_chain_draws_differently_and_accepts_by_the_ratio(family):
    """chain (draw=sample): the draft samples, the target tests min(1, p/q): another draw than the target alone
    for the same seed, recorded per node (p, q, u) on the step's tree."""
    pair, prep = family
    engine = SpecEngine(pair)
    differ = 0
    for seed in range(4):
        sampling = Sampling(1.0, seed=seed)
        res = engine.generate(prep, "chain", 24, ignore_eos=True, sampling=sampling)
        again = engine.generate(prep, "chain", 24, ignore_eos=True, sampling=sampling)
        assert again.token_ids == res.token_ids  # a seed makes the run reproducible
        differ += res.token_ids != engine.generate(prep, "ar", 24, ignore_eos=True, sampling=sampling).token_ids
        for s in res.steps[1:]:
            tv = s.tree
            assert tv.rule == "ratio"
            tested = [i for i, p in enumerate(tv.target_p) if p is not None]
            assert tested == list(range(len(s.accepted_nodes) + (len(s.accepted_nodes) < len(tv.tokens))))
            for i in tested:  # accepted exactly when u * q < p
                assert (i in s.accepted_nodes) == (tv.draw_u[i] * tv.probs[i] < tv.target_p[i] + 1e-5), (i, tv)
    assert differ >= 2


# Each family meets one setting and each setting one family: the acceptance rules are the same code for every
# family, and 5,000 draws under three policies take about 25 s a case on a machine where `ar` decodes the shipped pair
# at 430 tokens/s, so the full cross of families and settings would add a minute and no rule the diagonal leaves
# unchecked.
DRAWS = 5_000  # sized by power: a 3% bias (total variation, the hardest kind to see) is caught with >= 80% power
MUST_CATCH = 0.03
DIAGONAL = [("qwen2.5-vl", Sampling(1.0, top_p=0.9)), ("llava", Sampling(0.7))]


@pytest.mark.parametrize("family,sampling", DIAGONAL, indirect=["family"], ids=["qwen2.5-vl-T1-top_p0.9", "llava-T0.7"])
def test_the_first_two_tokens_follow_the_targets_distribution_for_every_policy(family, sampling):
    """check-sampling's chi-square over the first two tokens (DRAWS draws, fixed seeds: deterministic) for the
    target alone, the sampled chain and SAGE's sampled tree (the ways of drawing), with enough draws to catch a 3%
    bias (80% power for the hardest one to see, computed by the check: 2.4-2.6% here; a ratio test 10% too lenient
    moves the llava case's p-value to 1e-12, tools/planted_bugs.sh); the tree-rule policies draw exactly the
    target alone's tokens for each of 30 seeds (and of every seed: the same-seed test above), so they share its
    distribution."""
    from sage_engine.evaluation.sampling_check import check_sampling

    pair, prep = family
    engine = SpecEngine(pair)
    for policy in ("ar", "chain", "sage:draw=sample:threshold=paper"):
        ok = check_sampling(engine, prep, policy, sampling, DRAWS)
        assert ok.detectable_bias <= MUST_CATCH, ok
        assert ok.p_value > 0.001 and ok.tv < 0.04, ok
    for seed in range(30):
        s = Sampling(sampling.temperature, sampling.top_p, seed)
        first = engine.generate(prep, "ar", 3, ignore_eos=True, sampling=s).token_ids
        for policy in TREE_RULE_POLICIES:
            assert engine.generate(prep, policy, 3, ignore_eos=True, sampling=s).token_ids == first, (seed, policy)


def test_check_sampling_fails_a_broken_rule(family, monkeypatch):
    """The same check catches the mistakes of each rule: a tree rule that takes the draft's first child whatever
    the target drew, and a sampled chain tested like a top-k node (accept with probability p(x), not p/q)."""
    from sage_engine.evaluation.sampling_check import check_sampling

    pair, prep = family
    engine = SpecEngine(pair)
    sampling = Sampling(1.0, top_p=0.9)
    real_tree, real_passes = SampledAcceptance.__call__, RatioAcceptance.passes

    def favours_the_draft(self, tree, verify):
        verdict = real_tree(self, tree, verify)
        if tree.tokens and not verdict.accepted:
            return type(verdict)([0], [tree.tokens[0]], verdict.bonus)
        return verdict

    monkeypatch.setattr(SampledAcceptance, "__call__", favours_the_draft)
    bad = check_sampling(engine, prep, "sage:threshold=paper", sampling, 300)
    assert bad.p_value < 0.001, bad
    monkeypatch.setattr(SampledAcceptance, "__call__", real_tree)
    monkeypatch.setattr(RatioAcceptance, "passes", lambda self, p_x, q_x: real_passes(self, p_x, 1.0))
    bad = check_sampling(engine, prep, "chain", sampling, 1500)
    assert bad.p_value < 0.001, bad


@pytest.mark.parametrize("flags", [["--temperature", "-1"], ["--temperature", "nan"], ["--top-p", "0"],
                                   ["--top-p", "1.5"], ["--seed", "-3"]])
def test_bad_sampling_flags_are_usage_errors(capsys, flags):
    from sage_engine.cli import main

    assert main(["generate", "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_generate_samples_the_same_tokens_with_every_policy_for_a_seed(saved_qwen_pair, tmp_path, capsys):
    import json

    from sage_engine.cli import main

    target, draft = saved_qwen_pair
    image(4).save(tmp_path / "a.png")
    base = ["generate", "--prompt", "describe", "--image", str(tmp_path / "a.png"), "--target", target,
            "--draft", draft, "--max-new-tokens", "12", "--temperature", "0.8", "--top-p", "0.95", "--json"]
    ids = {}
    for policy in ("ar", "sage", "chain:draw=top"):
        for seed in ("5", "6"):
            assert main([*base, "--policy", policy, "--seed", seed]) == 0
            ids[policy, seed] = json.loads(capsys.readouterr().out)["token_ids"]
    assert ids["ar", "5"] == ids["sage", "5"] == ids["chain:draw=top", "5"] != ids["ar", "6"] == ids["sage", "6"]
    assert main(["bench", "--inputs", str(tmp_path), "--out", str(tmp_path / "r.json"), "--target", target,
                 "--draft", draft, "--policies", "ar,hf_generate", "--temperature", "0.5"]) == 2


def test_check_sampling_command(saved_qwen_pair, capsys):
    import json

    from sage_engine.cli import main

    target, draft = saved_qwen_pair
    base = ["check-sampling", "--target", target, "--draft", draft, "--samples", "60", "--json"]
    assert main([*base, "--policy", "chain"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"policy", "temperature", "top_p", "samples", "chi2", "dof", "p_value", "tv",
                        "detectable_bias"}
    assert out["temperature"] == 1.0 and out["samples"] == 60
    assert out["detectable_bias"] > 0.05  # 60 draws catch only a large bias
    assert main([*base, "--temperature", "0"]) == 2 and "error:" in capsys.readouterr().err


def test_generate_num_samples_prints_one_json_line_per_seed(saved_qwen_pair, tmp_path, capsys):
    import json

    from sage_engine.cli import main

    target, draft = saved_qwen_pair
    image(5).save(tmp_path / "a.png")
    base = ["generate", "--prompt", "describe", "--image", str(tmp_path / "a.png"), "--target", target,
            "--draft", draft, "--max-new-tokens", "8", "--temperature", "1.0", "--json"]
    assert main([*base, "--num-samples", "3", "--seed", "5"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [x["seed"] for x in lines] == [5, 6, 7]
    assert main([*base, "--seed", "6", "--policy", "ar"]) == 0  # the same seed alone, target only
    assert json.loads(capsys.readouterr().out)["token_ids"] == lines[1]["token_ids"]
    assert main([*base, "--num-samples", "0"]) == 2


@pytest.mark.parametrize("knobs,message", [(dict(temperature="nan"), "temperature"), (dict(top_p=2.0), "top-p"),
                                           (dict(seed=1.5), "seed"), (dict(temperature=float("inf")), "temperature")])
def test_the_apps_sampling_knobs_are_checked_in_one_line(knobs, message):
    from app.arguments import sampling_of
    from sage_engine import InputError

    with pytest.raises(InputError, match=message) as e:
        sampling_of(dict(knobs))
    assert "\n" not in str(e.value)
    assert sampling_of({"temperature": 0.7, "top_p": 0.9, "seed": 3.0}) == Sampling(0.7, 0.9, 3)
