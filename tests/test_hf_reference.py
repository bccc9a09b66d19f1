"""transformers' own generate() as outside references (sage_engine/evaluation/hf_reference.py) and in the bench CLI."""

import json

import pytest

from sage_engine.cli import main
from sage_engine.core.engine import SpecEngine
from sage_engine.evaluation.hf_reference import _Hooks, assistant_inputs, parse_hf_spec, run_hf
from sage_engine.models.inputs import prepare_input
from sage_testing.tiny_pairs import write_noise_media


@pytest.fixture(scope="module")
def tiny():
    from sage_testing.tiny_pairs import image, qwen25_pair

    pair = qwen25_pair("noisy", seed=5)
    return pair, prepare_input(pair, "describe the image", images=[image(11)])


def test_hf_generate_and_hf_assisted_give_the_engines_ar_ids(tiny):
    pair, prep = tiny
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=24)
    gen = run_hf(pair, prep, "hf_generate", 24)
    assert gen.policy == "hf_generate" and gen.token_ids == ar.token_ids and gen.text == ar.text
    # the forward hooks count what the engine counts: one target forward per token after the prefill
    assert gen.stats.target_forwards == ar.stats.target_forwards and gen.stats.mean_accepted == pytest.approx(1.0)
    assert gen.stats.draft_forwards == 0 and gen.stats.finish_reason == ar.stats.finish_reason
    for spec in ("hf_assisted", "hf_assisted:schedule=heuristic"):
        res = run_hf(pair, prep, spec, 24)
        assert res.policy == spec and res.token_ids == ar.token_ids
        assert res.stats.draft_forwards > 0 and 1 <= res.stats.target_forwards <= ar.stats.target_forwards
        assert res.stats.mean_accepted >= 1.0 and 0 < res.stats.prefill_seconds < res.stats.seconds
    assert pair.draft.generation_config.num_assistant_tokens_schedule is None  # restored after every run


def test_hf_assisted_counts_forwards_right_with_an_identical_draft():
    """A copy of the target as assistant on a text prompt: every candidate is accepted, so each round adds its
    candidates (one draft forward each) plus one bonus token (one target forward)."""
    from sage_testing.tiny_pairs import qwen25_pair

    pair = qwen25_pair("copy", seed=2)
    prep = prepare_input(pair, "how many shapes are there?")
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=20)
    res = run_hf(pair, prep, "hf_assisted", 20)
    assert res.token_ids == ar.token_ids and res.stats.finish_reason == "length"  # no EOS cut a round short
    assert res.stats.new_tokens == res.stats.draft_forwards + res.stats.target_forwards + 1
    assert res.stats.mean_accepted > 1.0


def test_hf_assistant_gets_no_image_and_the_probe_would_see_one(tiny):
    pair, prep = tiny
    seen = assistant_inputs(pair, prep, max_new_tokens=6)
    assert seen["draft_forwards"] > 0
    assert seen["draft_forwards_with_image_inputs"] == 0 and seen["draft_vision_tower_runs"] == 0
    assert seen["sees_image"] is False
    with _Hooks(pair.target, pair.draft) as hooks:  # positive control: the draft called with the pixels
        pair.draft(**prep.target_inputs)
    assert hooks.draft_with_image == 1


@pytest.mark.parametrize("spec,error", [
    ("hf_assisted:foo=1", "'foo' is not a knob of hf_assisted"),
    ("hf_assisted:schedule=fast", "schedule must be one of constant, heuristic, heuristic_transient"),
    ("hf_generate:schedule=constant", "has no knobs"),
    ("hf_beam", "unknown policy"),
])
def test_bad_hf_specs_are_refused(spec, error):
    with pytest.raises(ValueError, match=error):
        parse_hf_spec(spec)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_inputs")
    write_noise_media(d, seed=1)
    return d


def test_bench_runs_the_hf_references_against_ar(saved_qwen_pair, inputs, tmp_path, capsys):
    target, draft = saved_qwen_pair
    out = tmp_path / "r.json"
    specs = ["hf_generate", "hf_assisted", "hf_assisted:schedule=heuristic"]
    code = main(["bench", "--inputs", str(inputs), "--policies", ",".join(["sage", *specs]), "--max-new-tokens", "10",
                 "--target", target, "--draft", draft, "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0 and all(s in stdout for s in specs)
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"ar", "sage", *specs}
    for p in report["policies"].values():
        assert p["exact_match_vs_ar"] == 1.0 and p["tokens_per_second"] > 0
    pol = report["policies"]
    assert pol["hf_generate"]["target_forwards"] == pol["ar"]["target_forwards"]
    assert pol["hf_generate"]["mean_accepted"] == pytest.approx(1.0) and pol["hf_assisted"]["draft_forwards"] > 0
    note = report["notes"]["hf_assisted"]
    assert note["assistant_sees_image"] is False and set(note["measured"]) == {"image", "video"}
    assert "NOT see" in note["summary"]

    # without a draft, ar and hf_generate still run
    code = main(["bench", "--inputs", str(inputs), "--policies", "hf_generate", "--max-new-tokens", "6",
                 "--target", target, "--draft", "none", "--out", str(out), "--limit", "1"])
    capsys.readouterr()
    report = json.loads(out.read_text())
    assert code == 0 and report["models"]["draft"] is None and report["policies"]["hf_generate"]["exact_match_vs_ar"]


@pytest.mark.parametrize("policies,draft,needle", [
    ("sage,beam", None,
     "unknown policy 'beam'; choose one of ar, chain, static, eagle2, specvlm, sage, svip, ddd, hf_generate"),
    ("hf_assisted:foo=1", None, "'foo' is not a knob of hf_assisted"),
    ("hf_assisted:schedule=fast", None, "schedule must be one of"),
    ("sage:n_max=many", None, "n_max must be an integer"),
    ("hf_generate,hf_assisted", "none", "policy 'hf_assisted' needs a draft model"),
    ("hf_assisted:schedule=heuristic", "", "needs a draft model"),
])
def test_bench_usage_errors_exit_2_with_one_error_line(inputs, tmp_path, capsys, policies, draft, needle):
    args = ["bench", "--inputs", str(inputs), "--policies", policies, "--out", str(tmp_path / "r.json")]
    code = main(args + ([] if draft is None else ["--draft", draft]))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
