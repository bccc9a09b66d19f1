"""tinyworld evaluation: scoring, the shipped pair (accuracy, descriptions, pooled eval, lossless speculation),
the attention probe and the model card."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from sage_engine.tinyworld import language as L
from sage_engine.tinyworld import world as W

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "models"
SHIPPED = (ASSETS / "tinyworld-target" / "model.safetensors").exists() and (ASSETS / "tinyworld-draft").exists()


def test_score_all_splits_out_the_images_with_an_occluding_pair():
    from sage_engine.tinyworld.evaluate import Item, score_all
    rng = random.Random(2)
    occluded = W.sample_scene(rng, 3, 4, occlusion=1.0)
    plain = W.sample_scene(rng, 2, 2)
    items = [Item("image", None, None, L.image_example(sc, rng, "describe"), list(sc.objects))
             for sc in (occluded, occluded, plain)]
    res = score_all(items, [items[0].example.answer, "There is nothing.", items[2].example.answer])
    assert res["by_kind"] == {"describe": pytest.approx(2 / 3)}
    assert res["occluded"] == {"describe": 0.5} and res["n_occluded"] == 2


def _shipped_scores(n: int, seed: int, roles=("target", "draft")) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from sage_engine.tinyworld.evaluate import generate, make_items, score_all
    processor = AutoProcessor.from_pretrained(ASSETS / "tinyworld-target")
    items = make_items(seed=seed, n=n, image_kinds=("count", "colour", "shape", "size", "position", "yesno"),
                       video_kinds=("motion", "count"))
    out = {}
    for role in roles:
        model = AutoModelForImageTextToText.from_pretrained(ASSETS / f"tinyworld-{role}", dtype=torch.float32)
        out[role] = score_all(items, generate(model, processor, items))
        out[role]["params"] = sum(p.numel() for p in model.parameters())
    return out


@pytest.mark.skipif(not SHIPPED, reason="the pair is not in assets/models yet")
def test_shipped_pair_answers_from_the_picture(monkeypatch):
    """Fresh scenes, every attribute question: the target answers from the picture; the draft, a tenth of its size,
    answers worse, on what happens over a clip most (its QA accuracy on the card: 0.91 against 0.99, motion 0.37)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = _shipped_scores(n=8, seed=123)
    target, draft = res["target"], res["draft"]
    assert target["params"] >= 10 * draft["params"]
    assert target["accuracy"] >= 0.8, target
    assert min(target["by_kind"].values()) >= 0.5, target    # chance is 1/6 (colour, shape), 1/9 (position)
    assert draft["accuracy"] < target["accuracy"] and draft["by_kind"]["motion"] < target["by_kind"]["motion"], (
        target, draft)


@pytest.mark.skipif(not SHIPPED, reason="the pair is not in assets/models yet")
def test_shipped_pair_meets_the_accuracy_bar(monkeypatch):
    """Every attribute >= 95% on the scenes of one fresh seed (earlier pairs failed it on motion or position).
    One seed of 60 per kind is a regression check, not the whole claim: RUNS.md and the model card pool larger
    evaluations (with 20 per kind one miss moves a kind 5 points)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    by_kind = _shipped_scores(n=60, seed=321, roles=("target",))["target"]["by_kind"]
    assert all(v >= 0.95 for v in by_kind.values()), by_kind


@pytest.mark.skipif(not SHIPPED, reason="the pair is not in assets/models yet")
def test_shipped_pair_describes_what_it_sees(monkeypatch):
    """Descriptions of 40 fresh images and 40 fresh clips name exactly the objects shown in at least 95% of them
    (the project's bar is 90% pooled; this sample allows two misses of 40). The pair before this one (run D1,
    0.86 / 0.96 pooled) scores 0.925 / 0.925 here and fails it. A regression check; the model card pools 460 of
    each."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from sage_engine.tinyworld.evaluate import generate, make_items, score_all
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    processor = AutoProcessor.from_pretrained(ASSETS / "tinyworld-target")
    model = AutoModelForImageTextToText.from_pretrained(ASSETS / "tinyworld-target", dtype=torch.float32)
    items = make_items(seed=321, n=40, image_kinds=("describe",), video_kinds=("describe_video",))
    by_kind = score_all(items, generate(model.eval(), processor, items))["by_kind"]
    assert by_kind["describe"] >= 0.95 and by_kind["describe_video"] >= 0.95, by_kind


@pytest.mark.skipif(not SHIPPED, reason="the pair is not in assets/models yet")
def test_eval_pools_seeds_and_scores_each_seed_as_its_own_eval_would(monkeypatch, capsys):
    """`eval --seeds S:N,...` pools the seeds into one table and keeps each seed's own: a seed's entry equals what
    `eval --seed S --n N` reports, and the pooled accuracy per kind is the n-weighted mean of the seeds'."""
    from sage_engine.tinyworld.__main__ import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(*args):
        main(["eval", "--threads", "1", "--json", *args])
        return json.loads(capsys.readouterr().out)

    pooled = run("--seeds", "41:1,42:2")
    single = run("--seed", "42", "--n", "2")
    assert pooled["n"] == 3 and pooled["seed"] == [41, 42] and set(pooled["per_seed"]) == {"41", "42"}
    for role in ("target", "draft"):
        assert pooled["per_seed"]["42"][role] == single[role]
        for kind, acc in pooled[role]["by_kind"].items():
            seeds = pooled["per_seed"]
            by_seed = (seeds["41"][role]["by_kind"][kind], seeds["42"][role]["by_kind"][kind])
            assert acc == pytest.approx((by_seed[0] + 2 * by_seed[1]) / 3)
    for bad in ("1:0", "1:2,1:3", "x"):
        with pytest.raises(SystemExit):
            main(["eval", "--seeds", bad])


@pytest.mark.skipif(not SHIPPED, reason="the pair is not in assets/models yet")
def test_shipped_pair_loads_through_the_engine_and_speculation_is_lossless():
    from sage_engine import SpecEngine, load_pair, prepare_input

    pair = load_pair()  # the embedded default, offline, through the engine's loader and the official processor
    engine = SpecEngine(pair)
    examples = ASSETS.parent / "examples"
    for media in ({"images": [str(examples / "shapes_1.png")]}, {"video": str(examples / "clip_1.webm")}):
        prep = prepare_input(pair, "Describe it in detail.", **media)
        ar = engine.generate(prep, "ar", max_new_tokens=48)
        assert ar.text.strip() and ar.stats.finish_reason in ("eos", "length")
        for policy in ("sage", "sage:threshold=paper", "static"):
            res = engine.generate(prep, policy, max_new_tokens=48)
            assert res.token_ids == ar.token_ids, policy
            if policy != "sage":  # the default's trees also depend on this machine's timings (plain steps)
                assert res.stats.mean_accepted > 2.0, (policy, res.stats.mean_accepted)


def test_attention_probe_finds_the_asked_object_and_measures_each_head(tok):
    from sage_engine.tinyworld.architecture import TINY, build_model, build_processor
    from sage_engine.tinyworld.evaluate import make_items
    from tools.attention_probe import asked_object, probe
    items = [it for it in make_items(3, 12, video_kinds=()) if it.example.kind in ("colour", "shape", "size")]
    for it in items:
        obj = asked_object(it)
        assert it.example.facts[it.example.kind] == getattr(obj, it.example.kind), it.example
    model = build_model(TINY, tok)
    model.config._attn_implementation = "eager"   # output_attentions needs the eager kernel
    res = probe(model.eval(), build_processor(tok), "colour", 3, 12)
    assert len(res.right) == sum(it.example.kind == "colour" for it in items) and res.asked
    heads = (TINY.layers, TINY.heads)
    for a, o in zip(res.asked, res.other):
        assert a.shape == o.shape == heads and bool(((a >= 0) & (a <= 1) & (o >= 0) & (o <= 1)).all())
    assert len(res.wrong) == res.right.count(False) and "layer 0" in res.table()


def test_card_status_reads_the_pooled_table_and_names_each_seed_below_the_bar():
    from sage_engine.tinyworld.training.card import _status
    kinds = ("colour", "shape", "size", "position", "count", "yesno", "motion", "describe", "describe_video")

    def res(**low):
        return {"accuracy": 0.9, "by_kind": {k: low.get(k, 1.0) for k in kinds}}

    pooled = {"n": 140, "target": res(position=0.975, describe=0.91), "draft": res(),
              "per_seed": {"1": {"n": 40, "target": res(position=0.925, describe=0.4), "draft": res()},
                           "2": {"n": 100, "target": res(position=0.97), "draft": res()}}}
    status = _status(pooled)
    assert "meets the project's accuracy bar" in status and "not meet" not in status
    assert "position 0.925 on seed 1 (n 40)" in status and "seed 2" not in status   # a seed's description: no note
    pooled["per_seed"]["1"]["target"]["by_kind"]["position"] = 0.95
    assert "every seed alone has every attribute" in _status(pooled)
    pooled["target"]["by_kind"]["motion"] = 0.965   # an attribute below 97% pooled
    assert "does not meet" in _status(pooled) and "motion 0.965" in _status(pooled)
    pooled["target"]["by_kind"]["motion"] = 0.98
    pooled["target"]["by_kind"]["describe_video"] = 0.85   # a description below 90% pooled
    assert "does not meet" in _status(pooled) and "describe_video 0.850" in _status(pooled)
    assert "seed" not in _status({"n": 20, "target": res(), "draft": res()})   # one seed's result: no seed notes


@pytest.mark.skipif(not (ASSETS / "tinyworld-target" / "README.md").exists(), reason="no model card")
def test_card_writes_the_shipped_training_section_from_a_summary():
    """The shipped card's training section (the run the shipped pair was fine-tuned from), written again from a
    summary.json of its run (TrainConfig's defaults, 2 threads, the seconds behind the minutes on the card: the draft
    re-distilled alone from the target of an earlier run, with that run's cache), is the card's text word for word."""
    import dataclasses

    from sage_engine.tinyworld.training.card import _training_text
    from sage_engine.tinyworld.training.config import TrainConfig
    card = (ASSETS / "tinyworld-target" / "README.md").read_text()
    section = card[card.index("## Training"):card.index("## Fine-tuned on pictures")].rstrip("\n")
    note = re.search(r"2 thread\(s\), (.*): cache reused", section).group(1)
    summary = {"config": dataclasses.asdict(TrainConfig()), "labels_version": 3, "threads": 2, "only_draft": True,
               "seconds": {"cache": None, "target": 64.1 * 60, "draft": 36.9 * 60, "total": 36.9 * 60}}
    assert _training_text(json.loads(json.dumps(summary)), 2, note) == section
    # the shipped run drew more occluding pairs than the world and says so; a run at the world's share does not
    assert "; 50% of the training scenes of 3 or 4 objects have an occluding pair" in section
    summary["config"]["occlusion"] = W.OCCLUSION
    assert "training scenes of 3 or 4 objects have an occluding pair" not in _training_text(summary, 2, note)


@pytest.mark.skipif(not (ASSETS / "tinyworld-target" / "README.md").exists(), reason="no model card")
def test_a_second_fine_tune_adds_its_section_and_keeps_the_first(tmp_path):
    """`card --train-summary` of a fine-tune run: the cards keep their training section and every earlier fine-tune's,
    add this one's (its command, seed, steps and minutes) before the evaluation, and take the new status line."""
    import shutil

    from sage_engine.tinyworld.training.card import finetune_card
    kinds = ("colour", "shape", "size", "position", "count", "yesno", "motion", "describe", "describe_video")
    res = {"accuracy": 0.95, "by_kind": {k: 0.99 for k in kinds}}
    result = {"n": 20, "target": res, "draft": res}
    for role in ("target", "draft"):
        shutil.copytree(ASSETS / f"tinyworld-{role}", tmp_path / f"tinyworld-{role}",
                        ignore=shutil.ignore_patterns("*.safetensors"))
    before = (tmp_path / "tinyworld-target" / "README.md").read_text()
    first = before[before.index("## Training"):before.index("## Evaluation")]
    ft = {"seed": 7, "world_images": 10, "world_videos": 4, "pictures": 9, "picture_clips": 3, "target_steps": 30,
          "target_lr": 3e-4, "draft_steps": 25, "draft_lr": 3e-4, "warmup": 1, "picture_weight": 2.5,
          "describe_weight": 3.5, "pixel_weight": 0.0}
    summary = {"finetune": ft, "threads": 2, "seconds": {"cache": 60, "target": 600, "draft": 300, "total": 960}}
    finetune_card(tmp_path, result, summary, "EVAL CMD", "FT CMD --seed 7")
    after = (tmp_path / "tinyworld-target" / "README.md").read_text()
    assert first in after and after.count("## Fine-tuned") == before.count("## Fine-tuned") + 1
    new = after[after.rindex("## Fine-tuned"):after.index("## Evaluation")]
    assert "`FT CMD --seed 7` (2 threads, cache 1.0 min, target 10.0 min, draft 5.0 min, total 16.0 min)" in new
    assert "(seed 7)" in new and "descriptions drawn 3.5x" in new and "30 steps" in new and "`picture_spans`" in new
    assert "EVAL CMD" in after and "## Per-forward cost" in after
    finetune_card(tmp_path, result, summary, "EVAL CMD", "FT CMD --seed 8", title="Fine-tuned a third time")
    third = (tmp_path / "tinyworld-target" / "README.md").read_text()
    assert new in third and third.count("## Fine-tuned") == after.count("## Fine-tuned") + 1
    assert "## Fine-tuned a third time\n\n`FT CMD --seed 8`" in third
