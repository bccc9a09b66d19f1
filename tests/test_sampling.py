"""Lossless sampling (sage_engine/sampling.py): the settings, the target's tempered top-p distribution, the tree
rule by exact enumeration (with a wrong variant that the same check catches), inverse-CDF draws, and on tiny
VLMs of two families: every policy's sample equals the target-only sample of the same seed, token for token."""

import itertools
import math

import pytest
import torch
from tiny_models import image, llava_pair, qwen25_pair

from sage_engine import SpecEngine, prepare_input
from sage_engine.sampling import SampledAcceptance, Sampling, inverse_cdf, target_probs
from sage_engine.tree import DraftTree


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(seed=-1), dict(temperature=float("inf"))])
def test_bad_sampling_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Sampling(**kwargs)


def test_target_probs_temper_and_cut_to_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert target_probs(logits, Sampling(1.0)).tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert target_probs(logits, Sampling(1.0, top_p=0.7)).tolist() == pytest.approx([0.625, 0.375, 0, 0])
    squared = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert target_probs(logits, Sampling(0.5)).tolist() == pytest.approx((squared / squared.sum()).tolist())


def test_inverse_cdf_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3], dtype=torch.float64)
    assert [inverse_cdf(probs, torch.tensor(u)) for u in (0.05, 0.1, 0.69, 0.71, 0.99)] == [0, 1, 1, 3, 3]
    acc = SampledAcceptance(Sampling(1.0, seed=3))
    counts = torch.bincount(torch.tensor([acc.draw(torch.log(probs)) for _ in range(20000)]), minlength=4)
    assert (counts / 20000 - probs).abs().sum() < 0.02 and counts[2] == 0


V = 3


def table_logits(prefix: tuple[int, ...]) -> torch.Tensor:
    """A made-up target: a different distribution over V tokens after every prefix."""
    g = torch.Generator().manual_seed(hash(prefix) % 2**31)
    return torch.randn(V, generator=g) * 1.5


class Scripted(SampledAcceptance):
    """The rule with its draws replaced by a script of tokens (every random outcome, one at a time)."""

    def __init__(self, script):
        super().__init__(Sampling(1.0))
        self.script = list(script)

    def draw(self, logits):
        self.used = getattr(self, "used", 0) + 1
        return self.script[self.used - 1]


def step_distribution(tree: DraftTree, rule) -> dict[tuple[int, ...], float]:
    """P(the step emits this sequence), enumerating every script of draws, each weighted by the target's
    probabilities of its draws at the positions the rule read them."""
    logits = torch.stack([table_logits(())] + [table_logits(tuple(tree.tokens[i] for i in tree.path_to(n)))
                                               for n in range(len(tree))])
    out: dict[tuple[int, ...], float] = {}
    for script in itertools.product(range(V), repeat=tree.depth + 1):
        acc = rule(script)
        verdict = acc(tree, logits)
        emitted = tuple(verdict.accepted_tokens) + (verdict.bonus,)
        if emitted != tuple(script[: acc.used]):
            continue  # the script's later draws were never used: counted once, with its shortest form
        if any(s != 0 for s in script[acc.used:]):
            continue
        weight = math.prod(float(target_probs(table_logits(emitted[:i]), Sampling(1.0))[t])
                           for i, t in enumerate(emitted))
        out[emitted] = out.get(emitted, 0.0) + weight
    return out


def exact_distribution(tree: DraftTree) -> dict[tuple[int, ...], float]:
    """What the target alone would emit over the same positions, truncated where the tree stops matching."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], node: int, p: float):
        probs = target_probs(table_logits(prefix), Sampling(1.0))
        kids = {tree.tokens[i]: i for i in range(len(tree)) if tree.parents[i] == node}
        for t in range(V):
            if t in kids:
                walk(prefix + (t,), kids[t], p * float(probs[t]))
            else:
                out[prefix + (t,)] = out.get(prefix + (t,), 0.0) + p * float(probs[t])

    walk((), -1, 1.0)
    return out


def sample_tree() -> DraftTree:
    tree = DraftTree()
    a = tree.add(0, -1, 0.6)
    tree.add(2, -1, 0.3)
    b = tree.add(1, a, 0.5)
    tree.add(2, a, 0.4)
    tree.add(0, b, 0.9)
    return tree


def test_the_tree_rule_gives_the_targets_distribution_by_enumeration():
    tree = sample_tree()
    got, want = step_distribution(tree, Scripted), exact_distribution(tree)
    assert set(got) == set(want) and sum(abs(got[k] - want[k]) for k in want) < 1e-12


def test_a_wrong_rule_fails_the_same_enumeration():
    class AcceptsTheDraftsFavourite(Scripted):
        """Wrong: when the draw is not a child, descend into the draft's most probable child anyway (once)."""

        def __call__(self, tree, logits):
            verdict = super().__call__(tree, logits)
            kids = [i for i in range(len(tree)) if tree.parents[i] == (verdict.accepted[-1] if verdict.accepted
                                                                         else -1)]
            if not verdict.accepted and kids:
                best = max(kids, key=lambda i: tree.probs[i])
                return type(verdict)([best], [tree.tokens[best]], verdict.bonus)
            return verdict

    tree = sample_tree()
    got, want = step_distribution(tree, AcceptsTheDraftsFavourite), exact_distribution(tree)
    assert sum(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want)) > 0.05


@pytest.fixture(scope="module", params=["qwen2.5-vl", "llava"])
def family(request):
    build = {"qwen2.5-vl": qwen25_pair, "llava": llava_pair}[request.param]
    pair = build("noisy", seed=0, sigma=0.05, sharpness=4.0)  # peaked enough for deep trees at T <= 1
    return pair, prepare_input(pair, "describe what you see", images=[image(10)])


@pytest.mark.parametrize("sampling", [Sampling(1.0, top_p=0.9, seed=1), Sampling(0.7, seed=2),
                                      Sampling(1.0, seed=3)])
def test_every_policy_samples_what_the_target_alone_samples_with_the_same_seed(family, sampling):
    pair, prep = family
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", 32, ignore_eos=True, sampling=sampling).token_ids
    greedy = engine.generate(prep, "ar", 32, ignore_eos=True).token_ids
    assert reference != greedy  # it samples
    accepted = 0
    for policy in ("chain", "static", "eagle2", "sage:threshold=paper", "sage"):
        res = engine.generate(prep, policy, 32, ignore_eos=True, sampling=sampling)
        assert res.token_ids == reference, policy
        accepted += sum(len(s.accepted_tokens) for s in res.steps)
    assert accepted > 0  # the draft's trees served draws


def test_the_first_token_follows_the_targets_distribution(family):
    """Over 300 seeds, the first sampled token's frequencies match the target's distribution after the prompt
    (chi-square, p > 0.001); the seeds are fixed, so the test is deterministic."""
    pair, prep = family
    engine = SpecEngine(pair)
    sampling = Sampling(1.0, top_p=0.9)
    probs = target_probs(engine.target.prefill(prep.target_inputs).logits, sampling)
    firsts = [engine.generate(prep, "ar", 1, ignore_eos=True, sampling=Sampling(1.0, 0.9, seed)).token_ids[0]
              for seed in range(300)]
    counts = torch.bincount(torch.tensor(firsts), minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0  # never outside the nucleus
    expected = probs[support] * len(firsts)
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    from scipy.stats import chi2 as chi2_dist

    assert chi2_dist.sf(chi2, dof) > 0.001, (chi2, dof)


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
    for policy in ("ar", "sage", "chain"):
        for seed in ("5", "6"):
            assert main([*base, "--policy", policy, "--seed", seed]) == 0
            ids[policy, seed] = json.loads(capsys.readouterr().out)["token_ids"]
    assert ids["ar", "5"] == ids["sage", "5"] == ids["chain", "5"] != ids["ar", "6"] == ids["sage", "6"]
    assert main(["bench", "--inputs", str(tmp_path), "--out", str(tmp_path / "r.json"), "--target", target,
                 "--draft", draft, "--policies", "ar,hf_generate", "--temperature", "0.5"]) == 2


def test_check_sampling_passes_lossless_policies_and_fails_a_broken_rule(family, monkeypatch):
    from sage_engine.check import check_sampling
    from sage_engine.sampling import SampledAcceptance

    pair, prep = family
    engine = SpecEngine(pair)
    sampling = Sampling(1.0, top_p=0.9)
    for policy in ("sage:threshold=paper", "chain"):
        ok = check_sampling(engine, prep, policy, sampling, 300)
        assert ok.p_value > 0.001 and ok.tv < 0.15 and ok.samples == 300, ok
    real = SampledAcceptance.__call__

    def favours_the_draft(self, tree, logits):
        """Wrong: the root's first child is taken whatever the target drew."""
        verdict = real(self, tree, logits)
        if tree.tokens and not verdict.accepted:
            return type(verdict)([0], [tree.tokens[0]], verdict.bonus)
        return verdict

    monkeypatch.setattr(SampledAcceptance, "__call__", favours_the_draft)
    bad = check_sampling(engine, prep, "sage:threshold=paper", sampling, 300)
    assert bad.p_value < 0.001, bad


def test_check_sampling_command(saved_qwen_pair, capsys):
    import json

    from sage_engine.cli import main

    target, draft = saved_qwen_pair
    base = ["check-sampling", "--target", target, "--draft", draft, "--samples", "60", "--json"]
    assert main([*base, "--policy", "chain"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"policy", "temperature", "top_p", "samples", "chi2", "dof", "p_value", "tv"}
    assert out["temperature"] == 1.0 and out["samples"] == 60
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
    from app.handlers import sampling_of
    from sage_engine import InputError

    with pytest.raises(InputError, match=message) as e:
        sampling_of(dict(knobs))
    assert "\n" not in str(e.value)
    assert sampling_of({"temperature": 0.7, "top_p": 0.9, "seed": 3.0}) == Sampling(0.7, 0.9, 3)
