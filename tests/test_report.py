"""BENCHMARKS.md writer (`sage_engine.evaluation.suites_report`) on a synthetic bench report, and the real-media suite
built from the files installed packages ship. No model is loaded: seconds."""

import json

import pytest

from sage_engine.errors import SageError
from sage_engine.evaluation.bench import find_inputs
from sage_engine.evaluation.suites import REAL, materialise_real, packaged_file
from sage_engine.evaluation.suites_report import TABLE_HEAD, default_policies, policy_row, write_markdown
from sage_engine.policies import POLICY_NAMES

POLICIES = ("ar", "chain", "sage")
SUITES = {"tinyworld-images": "Fresh tinyworld images", "tinyworld-clips": "Fresh tinyworld clips",
          "real": "Real photos and videos"}


def _run(inp: str, media: str, policy: str, tps: float, tokens: int) -> dict:
    steps = tokens if policy == "ar" else tokens // 4
    return {"input": inp, "media": media, "policy": policy, "new_tokens": tokens, "seconds": tokens / tps,
            "tokens_per_second": tps, "target_forwards": steps, "mean_accepted": tokens / steps,
            "draft_forwards": 0 if policy == "ar" else 5 * steps, "prefill_seconds": 0.01,
            "target_seconds": 0.004 * steps, "draft_seconds": 0.0 if policy == "ar" else 0.002 * steps,
            "other_seconds": 0.001 * steps}


def synthetic_report(media: str) -> dict:
    """Two inputs; on `slow.*` sage gains only 1.10x, on `fast.*` 2x; chain 1.5x and 1.6x."""
    speed = {"ar": (100.0, 100.0), "chain": (150.0, 160.0), "sage": (110.0, 200.0)}
    ext = "png" if media == "image" else "mp4"
    runs = [_run(f"{name}.{ext}", media, pol, speed[pol][i], 40 if name == "slow" else 96)
            for i, name in enumerate(("slow", "fast")) for pol in POLICIES]
    policies = {p: {"mean_accepted": 1.0 if p == "ar" else 4.0, "tokens_per_second": sum(speed[p]) / 2,
                    "speedup_vs_ar": sum(speed[p]) / 200, "exact_match_vs_ar": 1.0,
                    "tree_nodes_mean": 0.0 if p == "ar" else 16.5, "tree_depth_mean": 0.0 if p == "ar" else 5.2,
                    "accepted_by_depth": [] if p == "ar" else [0.9, 0.7]} for p in POLICIES}
    policies["sage"]["alpha_corr_tau"] = 0.42  # a per-policy statistic this writer does not know
    policies["sage"]["time_split"] = {"prefill": 0.236, "verify": 0.41, "draft": 0.17, "other": 0.184}
    return {"device": "cpu", "dtype": "float32", "threads": 1, "max_new_tokens": 96, "inputs": 2,
            "prompt_path": {"target": "fused+vision", "draft": "fused"},
            "models": {"target": "t", "draft": "d", "target_params": 10, "draft_params": 5},
            "policies": policies, "runs": runs, "notes": {"hf_assisted": {"summary": "the assistant is blind"}}}


def test_markdown_has_every_suite_policy_row_and_worst_input():
    reports = {name: synthetic_report("video" if name == "tinyworld-clips" else "image") for name in SUITES}
    meta = {"command": "python -m sage_engine.evaluation.suites_report --out X", "seed": 9001, "n": 10,
            "json_dir": "docs/bench",
            "suites": {name: {"title": title, "about": "about it"} for name, title in SUITES.items()}}
    md = write_markdown(reports, meta)
    sections = md.split("\n## ")
    for name, title in SUITES.items():
        section = next(s for s in sections if s.startswith(title))
        assert TABLE_HEAD in section and f"docs/bench/{name}.json" in section
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [r.split("`")[1] for r in rows] == list(POLICIES)
        assert all(r.count("|") == TABLE_HEAD.count("|") for r in rows)
        ext = "mp4" if name == "tinyworld-clips" else "png"
        sage_row = next(r for r in rows if r.startswith("| `sage`"))
        assert f"`slow.{ext}`: 1.10x, 40 tokens" in sage_row
        assert "| 24% |" in sage_row  # the prefill share of its wall time; "-" where a report has none
        assert "| - |" in next(r for r in rows if r.startswith("| `chain`"))
        assert f"`slow.{ext}`: 1.50x" in next(r for r in rows if r.startswith("| `chain`"))
    assert "worst input" in TABLE_HEAD and "`python -m sage_engine.evaluation.suites_report --out X`" in md
    paired = synthetic_report("image")  # a run's paired per-round speedup (bench) is the input's speedup
    next(r for r in paired["runs"] if r["policy"] == "sage" and r["input"] == "fast.png")["speedup_vs_ar"] = 0.95
    assert policy_row(paired, "sage")["worst"] == (0.95, "fast.png", 96)
    assert "alpha_corr_tau: 0.42" in md and "the assistant is blind" in md  # unknown fields reach Notes
    assert '| prompt path | {"target": "fused+vision", "draft": "fused"} |' in md and "prompt_path" not in md


def test_the_sampling_section_shows_each_temperature_side_by_side():
    from sage_engine.evaluation.suites_report import sampled_name, temperatures

    reports = {"tinyworld-images": synthetic_report("image")}
    for t, tau in ((0.7, 3.0), (1.0, 2.5)):
        hot = synthetic_report("image")
        hot["sampling"] = {"temperature": t, "top_p": 1.0, "seed": 0}
        hot["policies"]["sage"].update(mean_accepted=tau, alpha_mean=0.9 - t / 2, root_width_mean=2 + t)
        reports[sampled_name("tinyworld-images", t)] = hot
    md = write_markdown(reports, {"suites": {"tinyworld-images": {"title": "Fresh tinyworld images"}}})
    section = md.split("## Sampling")[1].split("\n## ")[0]
    assert "| policy | T = 0 | T = 0.7 | T = 1 |" in section
    sage = next(line for line in section.splitlines() if line.startswith("| `sage`"))
    assert "3.00 / 1.55x / α 0.55 / W 2.7" in sage and "2.50 / " in sage and "α 0.40 / W 3.0" in sage
    assert "## Fresh tinyworld images, sampled at temperature 0.7" in md
    assert temperatures("1.0,0,0.7") == [0.0, 0.7, 1.0]
    for bad in ("-1", "warm", "nan"):
        with pytest.raises(SageError):
            temperatures(bad)


def test_ms_per_step_split_comes_from_the_runs():
    row = policy_row(synthetic_report("image"), "sage")
    assert (round(row["verify_ms"], 6), round(row["draft_ms"], 6), round(row["engine_ms"], 6)) == (4.0, 2.0, 1.0)
    assert policy_row(synthetic_report("image"), "ar")["worst"] is None


def test_default_policies_are_what_bench_runs():
    names = default_policies()
    assert names[: len(POLICY_NAMES)] == list(POLICY_NAMES) and len(set(names)) == len(names)


def test_real_suite_materialises_from_the_installed_packages(tmp_path):
    items = materialise_real(tmp_path / "real")
    assert items == list(REAL)
    rows = [json.loads(line) for line in (tmp_path / "real" / "prompts.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == [it.file for it in REAL] and all(r["prompt"].strip() for r in rows)
    for it in REAL:
        copied = tmp_path / "real" / it.file
        assert copied.stat().st_size == packaged_file(it).stat().st_size > 0
    inputs = find_inputs(str(tmp_path / "real"))
    assert {i.media for i in inputs} == {"image", "video"} and len(inputs) == len(REAL)
    by_file = {i.path.rsplit("/", 1)[-1]: i.prompt for i in inputs}
    assert by_file["chelsea_cat.png"] == "What animal is this?"  # each file keeps its own question
    quick = materialise_real(tmp_path / "quick", quick=True)
    assert {it.file.rsplit(".", 1)[-1] for it in quick} >= {"png", "mp4"}
