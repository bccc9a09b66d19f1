"""The CLI contract: generate (text and --json), bench report, and the one-line error contract."""

import json
import os
import subprocess
import sys

import hostile_media as hm
import pytest

from sage_engine.cli import main
from sage_testing.tiny_pairs import write_noise_media

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    write_noise_media(d, seed=0)
    (d / "prompts.jsonl").write_text(json.dumps({"file": "a.png", "prompt": "what colour is it?"}) + "\n")
    (d / "broken.png").write_bytes(b"this is not an image")
    (d / "empty.mp4").write_bytes(b"")
    (d / "garbage.mp4").write_bytes(os.urandom(4096))
    # hostile and odd files (tests/hostile_media.py)
    hm.png_bomb(d / "bomb.png")
    (d / "zero.png").write_bytes(b"")
    hm.avi_declaring(d / "long.avi", 2_000_000_000)
    hm.video(d / "big.avi", "MJPG", frames=1, size=(4200, 4200))
    hm.video(d / "one.avi", "MJPG", frames=1)
    hm.odd_images(d)
    hm.wrong_extensions(d)
    return d


def run_main(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_matches_ar_and_reports_stats(saved_qwen_pair, media, capsys):
    target, draft = saved_qwen_pair
    common = ["generate", "--prompt", "describe", "--image", str(media / "a.png"), "--max-new-tokens", "24",
              "--target", target, "--draft", draft, "--json"]
    code, out, _ = run_main(capsys, *common, "--policy", "ar")
    assert code == 0
    ar = json.loads(out)
    code, out, _ = run_main(capsys, *common, "--policy", "sage")
    sage = json.loads(out)
    assert code == 0 and sage["policy"] == "sage"
    assert set(sage["stats"]) >= {"new_tokens", "seconds", "tokens_per_second", "target_forwards", "mean_accepted"}
    assert sage["token_ids"] == ar["token_ids"] and sage["text"] == ar["text"]
    assert ar["stats"]["mean_accepted"] == pytest.approx(1.0)
    n_decode = len(sage["token_ids"]) - 1
    assert sage["stats"]["mean_accepted"] == pytest.approx(n_decode / sage["stats"]["target_forwards"])
    assert sage["steps"][0]["kind"] == "prefill" and sage["steps"][1]["tree"]["tokens"]


def test_generate_warmup_decodes_first_and_reports_only_the_last_run(saved_qwen_pair, media, capsys, monkeypatch):
    """--warmup N: the engine decodes the input N times before the reported run (same policy, a fresh one each
    time), and only that run is printed, with the target's own tokens."""
    from sage_engine.core.engine import SpecEngine

    target, draft = saved_qwen_pair
    calls = []
    real = SpecEngine.generate

    def counted(self, prepared, policy, *args, **kwargs):
        calls.append(policy)
        return real(self, prepared, policy, *args, **kwargs)

    monkeypatch.setattr(SpecEngine, "generate", counted)
    common = ["generate", "--prompt", "describe", "--image", str(media / "a.png"), "--max-new-tokens", "16",
              "--target", target, "--draft", draft, "--json"]
    code, out, _ = run_main(capsys, *common, "--policy", "ar")
    ar = json.loads(out)
    calls.clear()
    code, out, _ = run_main(capsys, *common, "--policy", "sage", "--warmup", "2")
    assert code == 0 and len(calls) == 3 and len({id(p) for p in calls}) == 3  # two warm-ups, then the run
    lines = out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["token_ids"] == ar["token_ids"]
    code, _, err = run_main(capsys, *common, "--warmup", "-1")
    assert code == 2 and err.strip() == "error: --warmup must be at least 0 (got -1)"


def test_generate_streams_text_for_a_video(saved_qwen_pair, media, capsys):
    target, draft = saved_qwen_pair
    code, out, err = run_main(capsys, "generate", "--prompt", "what happens?", "--video", str(media / "b.mp4"),
                              "--policy", "eagle2", "--max-new-tokens", "12", "--target", target, "--draft", draft)
    assert code == 0 and "tau" in err and "12 tokens" in err


def test_bench_writes_the_report(saved_qwen_pair, media, tmp_path, capsys):
    target, draft = saved_qwen_pair
    d = tmp_path / "in"
    d.mkdir()
    for f in ("a.png", "b.mp4", "prompts.jsonl"):
        (d / f).write_bytes((media / f).read_bytes())
    out = tmp_path / "r.json"
    code, stdout, _ = run_main(capsys, "bench", "--inputs", str(d), "--policies", "sage,chain,sage:n_max=8:d_max=4",
                               "--max-new-tokens", "10", "--target", target, "--draft", draft, "--out", str(out),
                               "--draft-prune", "paper")
    assert code == 0 and "sage" in stdout
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"ar", "sage", "chain", "sage:n_max=8:d_max=4"}  # knobs: lossless too
    assert report["draft_pruning"] == {"image": 0.8, "video": 0.9}
    for p in report["policies"].values():
        assert {"mean_accepted", "tokens_per_second", "speedup_vs_ar", "exact_match_vs_ar", "target_forwards",
                "draft_forwards", "overhead_fraction", "peak_memory_mb"} <= set(p)
        assert p["exact_match_vs_ar"] == 1.0
    assert len(report["runs"]) == 2 * 4
    assert {r["input"] for r in report["runs"]} == {"a.png", "b.mp4"}
    # depth profile: level l counts steps whose tree / accepted path reached l
    assert report["policies"]["ar"]["accepted_by_depth"] == [] and report["policies"]["ar"]["tree_depth_mean"] == 0
    for r in report["runs"]:
        drafted, accepted = r["depth_drafted"], r["depth_accepted"]
        assert len(drafted) == len(accepted) and all(0 <= a <= d for a, d in zip(accepted, drafted))
        assert drafted == sorted(drafted, reverse=True) and accepted == sorted(accepted, reverse=True)
        assert len(drafted) <= {"ar": 0, "chain": 5, "sage:n_max=8:d_max=4": 8}.get(r["policy"], 16)
        assert sum(accepted) + r["target_forwards"] >= sum(r["tokens_per_step"])  # equal unless cut at EOS
    chain = report["policies"]["chain"]
    assert chain["tree_depth_mean"] <= 5 and chain["tree_nodes_mean"] == pytest.approx(chain["tree_depth_mean"])
    assert "reaches depth" in stdout and all(0 <= x <= 1 for x in report["policies"]["sage"]["accepted_by_depth"])


def test_bench_rounds_keep_each_inputs_median_run(saved_qwen_pair, media, monkeypatch):
    """--rounds N: every input is decoded by every policy N times, in rotating order each round; the report keeps
    each input and policy's run of median wall time, lists all N times, and gives the input's speedup as the median
    of its N per-round speedups."""
    import dataclasses

    from sage_engine.evaluation import bench
    from sage_engine.models.loading import load_pair

    pair = load_pair(*saved_qwen_pair)
    inputs = [bench.BenchInput(str(media / "a.png"), "image", "describe"),
              bench.BenchInput(str(media / "b.mp4"), "video", "what happens?")]
    times = iter([0.5, 0.1, 0.3, 0.2, 0.9, 0.4] * 2)  # per input: (ar, sage) in call order, 3 rounds
    order, real = [], bench._decode

    def timed(engine, prep, spec, max_new_tokens, sampling=None):
        res = real(engine, prep, spec, max_new_tokens, sampling)
        order.append(spec)
        seconds = next(times)
        res.stats = dataclasses.replace(res.stats, seconds=seconds, tokens_per_second=res.stats.new_tokens / seconds)
        return res

    monkeypatch.setattr(bench, "_decode", timed)
    report = bench.run_bench(pair, inputs, ["sage"], max_new_tokens=6, warmup=0, rounds=3)
    assert report["rounds"] == 3
    assert order == ["ar", "sage", "sage", "ar", "ar", "sage"] + ["sage", "ar", "ar", "sage", "sage", "ar"]
    by = {(r["input"], r["policy"]): r for r in report["runs"]}
    assert by[("a.png", "ar")]["round_seconds"] == [0.5, 0.2, 0.9]
    assert by[("a.png", "ar")]["seconds"] == 0.5 and by[("a.png", "sage")]["seconds"] == 0.3   # the medians
    assert by[("b.mp4", "sage")]["round_seconds"] == [0.5, 0.2, 0.9] and by[("b.mp4", "sage")]["seconds"] == 0.5
    assert all(r["exact_match_vs_ar"] in (None, True) for r in report["runs"])
    assert report["policies"]["sage"]["seconds"] == pytest.approx(0.3 + 0.5)
    # an input's own speedup pairs the runs of each round (ar 0.5 / sage 0.1, 0.2 / 0.3, 0.9 / 0.4: median 2.25),
    # not the two medians (0.5 / 0.3)
    assert by[("a.png", "sage")]["speedup_vs_ar"] == pytest.approx(0.9 / 0.4)
    assert by[("b.mp4", "sage")]["speedup_vs_ar"] == pytest.approx(0.4 / 0.9)
    assert by[("a.png", "ar")]["speedup_vs_ar"] == pytest.approx(1.0)


def test_bench_rounds_below_one_are_a_usage_error(saved_qwen_pair, media, tmp_path, capsys):
    target, draft = saved_qwen_pair
    code, _, err = run_main(capsys, "bench", "--inputs", str(media), "--policies", "sage", "--rounds", "0",
                            "--target", target, "--draft", draft, "--out", str(tmp_path / "r.json"))
    assert code == 2 and err.strip() == "error: --rounds must be at least 1 (got 0)"


@pytest.mark.parametrize("args,needle", [
    (["--image", "{media}/broken.png"], "cannot read image"),
    (["--image", "{media}/missing.png"], "not found"),
    (["--video", "{media}/empty.mp4"], "empty"),
    (["--video", "{media}/garbage.mp4"], "video"),
    (["--policy", "beam"], "unknown policy 'beam'"),
    (["--policy", "sage:d_min=9:d_max=4"], "D_min <= D_max"),
    (["--policy", "sage:theta_scale=nan"], "finite"),
    (["--prompt", "word " * 1500], "too long"),
    (["--prompt", "x" * 100_000], "the prompt is too long (100000 characters"),
    (["--image", "{media}/bomb.png"], "image is too large (its header declares 900 megapixels"),
    (["--image", "{media}/zero.png"], "image file is empty"),
    (["--image", "{media}/video-named.png"], "not an image format"),
    (["--video", "{media}/long.avi"], "video is too long"),
    (["--video", "{media}/big.avi"], "video frames are too large (4200x4200"),
])
def test_bad_input_exits_2_with_one_error_line(saved_qwen_pair, media, capsys, args, needle):
    target, draft = saved_qwen_pair
    args = [a.replace("{media}", str(media)) for a in args]
    base = ["generate", "--max-new-tokens", "4", "--target", target, "--draft", draft]
    if "--prompt" not in args:
        base += ["--prompt", "describe"]
    code, _, err = run_main(capsys, *base, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_mismatched_tokenizers_are_refused(saved_qwen_pair, tmp_path, capsys):
    from sage_testing.tiny_pairs import llava_pair

    other = llava_pair("noisy")
    other.draft.save_pretrained(tmp_path / "llava")
    other.processor.save_pretrained(tmp_path / "llava")
    code, _, err = run_main(capsys, "generate", "--prompt", "hi", "--target", saved_qwen_pair[0],
                            "--draft", str(tmp_path / "llava"))
    assert code == 2 and err.strip().splitlines() == [err.strip()]
    assert err.startswith("error:") and "tokenizers differ" in err


def test_unknown_preset_is_one_error_line(capsys):
    code, _, err = run_main(capsys, "generate", "--prompt", "hi", "--preset", "gpt-5/gpt-4")
    assert code == 2 and err.startswith("error: unknown preset") and len(err.strip().splitlines()) == 1


def test_module_entry_point_reports_a_missing_model_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sage_engine", "generate", "--prompt", "hi", "--target",
                           str(tmp_path / "nope"), "--draft", str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_loading_a_pair_freezes_the_heap_and_the_app_pool_unfreezes_it_to_drop_one(saved_qwen_pair):
    """load_pair ends with gc.collect() + gc.freeze() (models.settle_heap): a full collection then walks only what
    was made after loading, not the ~0.5M objects of the models and their libraries. The app's pool unfreezes
    before it loads another pair, so the dropped pair's reference cycles can still be collected."""
    import gc

    from app.pool import PairPool
    from sage_engine.models.loading import load_pair
    from sage_engine.models.presets import Preset

    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        pair = load_pair(*saved_qwen_pair)
        assert gc.get_freeze_count() > 1000 and gc.get_count()[2] == 0
        seen = []

        def factory(preset):  # what load_preset does, minus the checks on the preset
            seen.append(gc.get_freeze_count())
            gc.freeze()
            return pair

        presets = {n: Preset(n, "qwen2_5_vl", *saved_qwen_pair, None, None, None, None, False, "test")
                   for n in ("one", "two")}
        pool = PairPool(presets, factory, capacity=1)
        pool.get("one")
        pool.get("two")   # drops "one" first
        assert seen[0] > 0 and seen[1] == 0
    finally:
        gc.unfreeze()
