"""Lossless on the attention kinds of current models: every policy gives the target's own greedy tokens, and its own
sampled ones under a seed, on tiny random models of Mistral (sliding window), Gemma 3 (sliding and full, text and
image), GPT-OSS (sliding + sinks, MoE), Llama 4 (chunked, MoE), Qwen3-VL and Qwen3-VL-MoE (image, video, text),
PaliGemma and PaliGemma 2 (image: a prefix that attends both ways, positions from 1), Llama 3.2 Vision (image and
text: cross-attention to the image) and a Llama text pair, over answers that run well past their 8-token windows and
chunks; Gemma 3n (text and image), whose last layers share earlier layers' keys and values; and on Qwen3.5, Qwen3-Next,
Falcon-H1, LFM2 and LFM2-VL (text and image: short convolutions), whose trees are read path by path. `ar` is
checked against transformers' generate() and against the model's own greedy decode read without any cache. Models
whose layers trees cannot reach (Nemotron-H's MLP-only layers) are refused in one line. Negative controls: a mask
that ignores the window, a window rolled a column too far, a tree pass that lets a node see its sibling, broken path
rules.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.core import cache as cache_mod
from sage_engine.core import engine as engine_mod
from sage_engine.core import runner as runner_mod
from sage_engine.core.sampling import Sampling
from sage_engine.errors import ModelError
from sage_engine.models import layer_kinds
from sage_engine.models import recurrent_paths as paths_mod
from sage_engine.models.families import adapter_for
from sage_engine.models.tree_check import tree_refusal
from sage_testing.tiny_kinds import WINDOW, kind_pair
from sage_testing.tiny_pairs import clip, image, llama_text_pair, save_pair

MAX_NEW = 40
ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("chain", "static", "eagle2", "sage", "sage:threshold=paper", "eagle2:depth=4:top_k=3:total_nodes=10")
CASES = [("mistral", "text"), ("gemma3-text", "text"), ("gpt-oss", "text"), ("llama4-text", "text"),
         ("gemma3", "image"), ("gemma3", "text"), ("qwen3-vl", "image"), ("qwen3-vl", "video"), ("qwen3-vl", "text"),
         ("qwen3-vl-moe", "image"), ("llama", "text"),
         ("qwen3.5", "image"), ("qwen3.5", "video"), ("qwen3.5", "text"), ("qwen3.5-moe", "image"),
         ("qwen3-next", "text"), ("falcon-h1", "text"), ("gemma3n-text", "text"), ("lfm2", "text"),
         ("lfm2-vl", "image"), ("lfm2-vl", "text"), ("gemma3n", "image"),
         ("paligemma", "image"), ("paligemma2", "image"), ("mllama", "image"), ("mllama", "text")]
_pairs: dict = {}


def pair_of(name: str, kind: str = "noisy"):
    if (name, kind) not in _pairs:
        _pairs[name, kind] = (llama_text_pair(kind, sigma=0.05, sharpness=8.0) if name == "llama"
                              else kind_pair(name, kind))
    return _pairs[name, kind]


def prepared(pair, media: str, seed: int = 3):
    media_kw = {"image": {"images": [image(seed, 64)]}, "video": {"video": clip(seed, size=64)}}.get(media, {})
    return prepare_input(pair, "the green triangle moves to the left while the yellow star grows", **media_kw)


def uncached_greedy(model, prep, ids: list[int]) -> list[int]:
    """The model's argmax after each of prompt + ids[:-1], read in one forward without a cache (its greedy decode,
    teacher-forced): what `ar` must emit."""
    full = dict(prep.target_inputs)
    full["input_ids"] = torch.cat([full["input_ids"][0], torch.tensor(ids)])[None]
    full["attention_mask"] = torch.ones_like(full["input_ids"])
    # Gemma 3, Qwen3.5: visual tokens typed, the answer text 0; PaliGemma: the prompt 0 (a prefix that attends both
    # ways), the answer 1 (causal)
    answer_type = 1 if model.config.model_type == "paligemma" else 0
    for key in ("token_type_ids", "mm_token_type_ids"):
        if key in full:
            full[key] = torch.cat([full[key][0], torch.full((len(ids),), answer_type, dtype=full[key].dtype)])[None]
    if "cross_attention_mask" in full:  # Mllama: an answer token sees the tiles the prompt's last token sees
        mask = full["cross_attention_mask"]
        full["cross_attention_mask"] = torch.cat([mask, mask[:, -1:].expand(-1, len(ids), -1, -1)], dim=1)
    if hasattr(getattr(model, "model", None), "rope_deltas"):
        model.model.rope_deltas = None
    with torch.no_grad():
        logits = model(**full).logits[0, prep.prompt_tokens - 1 : -1]
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize("name,media", CASES)
def test_every_policy_equals_ar_past_the_window(name, media):
    pair = pair_of(name)
    engine = SpecEngine(pair)
    assert not engine.tree_refusals, engine.tree_refusals
    prep = prepared(pair, media)
    ar = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    assert len(ar) == MAX_NEW and prep.prompt_tokens + MAX_NEW > 4 * WINDOW
    accepted = 0
    for policy in POLICIES:
        res = engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True)
        assert res.token_ids == ar, f"{name}/{media}: {policy} diverged from ar"
        accepted += sum(len(s.accepted_tokens) for s in res.steps)
    assert accepted > 0
    sampling = Sampling(0.8, seed=5)
    ar_s = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True, sampling=sampling).token_ids
    for policy in ("static", "sage"):  # the tree rule: the very draws ar makes (chain's ratio rule is checked in law)
        got = engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True, sampling=sampling).token_ids
        assert got == ar_s, f"{name}/{media}: sampled {policy} diverged from sampled ar"


@pytest.mark.parametrize("name,media", CASES)
def test_ar_is_the_models_own_greedy_decode(name, media):
    """`ar` == transformers' generate() (its end-of-sequence ids unset, so that it decodes as far), and == the argmax
    of the model's own forward over prompt + answer without a cache, at every position."""
    pair = pair_of(name)
    prep = prepared(pair, media)
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    config = copy.deepcopy(pair.target.generation_config)
    config.update(eos_token_id=None, do_sample=False, max_new_tokens=MAX_NEW,
                  pad_token_id=pair.tokenizer.pad_token_id or 0)
    hf = pair.target.generate(**prep.target_inputs, generation_config=config)[0, prep.prompt_tokens :].tolist()
    assert len(hf) >= 1 and ar[: len(hf)] == hf  # a model may stop it early on an id its config names
    visual = set(adapter_for(pair.target).visual_token_ids(pair.target.config).values())
    if media != "video" and not visual & set(ar):  # a visual placeholder id in the answer: a whole forward reads it
        assert ar == uncached_greedy(pair.target, prep, ar)  # as a picture's; video: frames the forward re-reads


@pytest.mark.parametrize("name", ["mistral", "qwen3-vl", "qwen3.5", "falcon-h1"])
def test_a_copied_draft_is_accepted_to_full_depth(name):
    pair = pair_of(name, "copy")
    engine = SpecEngine(pair)
    prep = prepared(pair, "text")
    for policy in ("chain", "static"):  # a fixed depth: every step but the budget's last accepts all of it
        res = engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True)
        depths = [len(s.accepted_tokens) for s in res.steps[1:-1]]
        assert min(depths) == max(depths) >= 4, (policy, depths)


@pytest.mark.parametrize("name", ["mistral", "gemma3n-text"])
def test_a_mask_that_ignores_the_window_fails(name):
    """Negative control: with the sliding kind seeing the whole past, the engine's decode check (ar_check.py) refuses
    the model when it is built, and with that check bypassed `ar` is no longer the model's greedy decode (Gemma 3n:
    its layer that shares the sliding layer's keys reads them under the same mask)."""
    pair = pair_of(name)
    prep = prepared(pair, "text")
    with mock.patch.object(layer_kinds.SlidingWindow, "visible", lambda self, q, kv: np.ones((len(q), len(kv)), bool)):
        assert "differ from generate()'s" in SpecEngine(pair).decode_refusal
        with mock.patch.object(engine_mod, "decode_refusal", lambda runner, media: None):
            ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    assert ar != uncached_greedy(pair.target, prep, ar)


def test_the_tree_check_refuses_a_tree_pass_that_differs_from_its_branches():
    """Negative control: a verify pattern under which a node also sees its sibling (every earlier row) makes the
    tree's rows differ from the same tokens read alone; the check refuses the model and drafting policies say so."""
    pair = pair_of("mistral")
    def sees_siblings(parents):
        return np.tril(np.ones((len(parents) + 1,) * 2, bool))

    with mock.patch.object(runner_mod, "verify_allowed", sees_siblings):
        engine = SpecEngine(pair)
        assert "differ from the same tokens read alone" in engine.tree_refusals["target"]
        with pytest.raises(ModelError, match="^policy 'sage' cannot run on this pair: in the target, its logits"):
            engine.generate(prepared(pair, "text"), "sage", max_new_tokens=4)
    assert tree_refusal(SpecEngine(pair).target, [5, 6, 7, 8]) is None  # the real pattern passes


def test_what_trees_cannot_reach_is_refused_in_one_line():
    """Nemotron-H: an MLP-only layer, which transformers types as it types a layer that shares another's cache; its
    plain decode is its own, so `ar` runs."""
    pair = pair_of("nemotron-h")
    engine = SpecEngine(pair)
    prep = prepared(pair, "text")
    ar = engine.generate(prep, "ar", max_new_tokens=8, ignore_eos=True)
    assert len(ar.token_ids) == 8  # ar alone still runs
    for policy in ("chain", "sage"):
        with pytest.raises(ModelError) as e:
            engine.generate(prep, policy, max_new_tokens=8)
        line = str(e.value)
        assert "\n" not in line and "dummy" in line and line.startswith(f"policy '{policy}' cannot run on this pair")


def test_a_recurrent_model_declared_attention_is_caught_by_the_check():
    """Were a recurrent model's layers mistaken for attention, the check still refuses it before any tree."""
    pair = pair_of("falcon-h1")
    with mock.patch.object(layer_kinds, "kinds_of", lambda m: [layer_kinds.FullAttention()] * 2):
        engine = SpecEngine(pair)
    assert set(engine.tree_refusals) == {"target", "draft"}


def _keeps_the_first_rows_state(self, model, cache, start, cols, device):
    """A commit that keeps the state after the last pass's deepest path, whatever was accepted."""
    cache = cache_mod.map_cache(self.rows.cache, lambda t: t[:1].clone()) if self.rows else cache
    self.reset(self.committed + len(self.tokens))
    return cache


def _keeps_the_state_before_the_step(self, model, cache, start, cols, device):
    """A commit that keeps the committed state as it was, the accepted tokens never read into it."""
    self.reset(start + len(cols))
    return cache


def _reads_every_node_alone(self, model, cache, tokens, positions, allowed, device):
    """Every node read from the committed state alone: its ancestors in the region never read before it."""
    return real_forward(self, model, cache, tokens, positions, np.eye(len(tokens), allowed.shape[1],
                                                                      allowed.shape[1] - len(tokens), bool), device)


real_forward = paths_mod.PathRegion.forward


@pytest.mark.parametrize("broken", [("keep", _keeps_the_first_rows_state), ("keep", _keeps_the_state_before_the_step),
                                    ("forward", _reads_every_node_alone)], ids=lambda b: b[1].__name__)
@pytest.mark.parametrize("name", ["qwen3-next", "falcon-h1", "lfm2"])
def test_a_broken_path_rule_gives_other_tokens(name, broken, monkeypatch):
    """Negative controls for recurrent layers: the engine's check refuses each broken rule, and with the check bypassed
    the run writes other tokens than `ar` or stops with one ModelError line."""
    pair = pair_of(name)
    prep = prepared(pair, "text")
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    monkeypatch.setattr(paths_mod.PathRegion, *broken)
    assert SpecEngine(pair).tree_refusals  # the check catches it when the engine is built
    monkeypatch.setattr(engine_mod, "tree_refusal", lambda runner, words, media=None: None)
    engine = SpecEngine(pair)
    try:  # the region's own guard may refuse a commit that is not one path: never other tokens in silence
        outs = [engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
                for policy in ("chain", "static")]
    except ModelError:
        return
    assert any(out != ar for out in outs)


@pytest.mark.parametrize("name", ["qwen3.5", "mamba"])
def test_cli_on_a_saved_recurrent_pair(name, tmp_path):
    """`generate --target DIR --draft DIR`: a saved Qwen3.5 pair decodes, `sage` token for token as `ar`; a saved
    Mamba-1 pair (its own cache_params) makes every policy, `ar` included, exit 2 with one `error:` line."""
    target, draft = save_pair(pair_of(name), tmp_path)

    def run(policy):
        return subprocess.run([sys.executable, "-m", "sage_engine", "generate", "--prompt", "the green triangle",
                               "--target", target, "--draft", draft, "--policy", policy,
                               "--max-new-tokens", "24", "--json"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})

    ar, sage = run("ar"), run("sage")
    for out in (ar, sage):
        assert all(line.startswith(("error:", "warning:")) for line in out.stderr.splitlines()), out.stderr
    if name == "mamba":
        for out in (ar, sage):
            errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
            assert out.returncode == 2 and len(errors) == 1 and "Mamba" in errors[0] and "cache_params" in errors[0]
    else:
        assert ar.returncode == 0, ar.stderr
        assert sage.returncode == 0
        assert json.loads(sage.stdout)["token_ids"] == json.loads(ar.stdout)["token_ids"]


@pytest.mark.parametrize("name", ["gemma3-text", "llama4-text"])
def test_windowed_layers_hold_about_their_window(name):
    """After a run, a sliding layer holds its window plus what has gathered since it last rolled (a quarter of the
    window, at least 16 columns), a chunked layer its current chunk plus as much; full layers hold every column."""
    pair = pair_of(name)
    engine = SpecEngine(pair)
    prep = prepared(pair, "text")
    res = engine.generate(prep, "sage", max_new_tokens=MAX_NEW, ignore_eos=True)
    runner = engine.target
    n = runner.seq_len
    assert n == prep.prompt_tokens + len(res.token_ids) - 1  # the last token is emitted, not yet read
    held = {kind.name: layer.keys.shape[2] for layer, kind in zip(runner.cache.layers, runner.plan.kinds)}
    assert held["full_attention"] == n
    windowed = next(k for k in held if k != "full_attention")
    assert held[windowed] <= WINDOW + 16 < n, (held, n, runner.columns.dropped)


def test_layers_that_share_keys_hold_none_and_read_their_producers_columns():
    """Gemma 3n: the last two layers are a kind of their own (their type's view of the keys and values the first two
    just updated); after a run they still hold nothing, the sliding producer holds about its window and the full one
    every column, and typing them as transformers does ("dummy", unknown) would refuse every drafting policy."""
    pair = pair_of("gemma3n-text")
    engine = SpecEngine(pair)
    kinds = engine.target.plan.kinds
    assert [type(k).__name__ for k in kinds] == ["SlidingWindow", "FullAttention", "SharedKV", "SharedKV"]
    assert [k.name for k in kinds[2:]] == ["sliding_attention", "full_attention"]
    prep = prepared(pair, "text")
    res = engine.generate(prep, "sage", max_new_tokens=MAX_NEW, ignore_eos=True)
    assert sum(len(s.accepted_tokens) for s in res.steps) > 0
    runner = engine.target
    layers, n = runner.cache.layers, runner.seq_len
    assert layers[2].keys is None and layers[3].keys is None
    assert layers[1].keys.shape[2] == n and layers[0].keys.shape[2] <= WINDOW + 16 < n
    unknown = [layer_kinds.Unsupported("dummy") if isinstance(k, layer_kinds.SharedKV) else k for k in kinds]
    assert "dummy" in (layer_kinds.LayerPlan(tuple(unknown)).refusal or "")


def test_a_window_rolled_one_column_too_far_fails():
    """Negative control: a sliding layer that drops the oldest column its window still sees parts from the model."""
    pair = pair_of("mistral")
    prep = prepared(pair, "text")
    with mock.patch.object(layer_kinds.SlidingWindow, "first_visible", lambda self, L: L - self.window + 2), \
            mock.patch.object(engine_mod, "decode_refusal", lambda runner, media: None):  # what the check may catch
        ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    assert ar != uncached_greedy(pair.target, prep, ar)


def test_the_app_refuses_a_recurrent_pair_in_one_line_and_keeps_serving(media):
    """The demo hosting a pair trees cannot reach (Mamba-1, text only): the race and the policy comparison each say in
    one line why, before either decodes anything; the same handlers then race another pair."""
    import dataclasses

    import app_server
    import gradio as gr

    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool
    from app.race import RunControl
    from app.view import View

    table = app_server.presets()
    hybrid = dataclasses.replace(table["tiny-random"], name="tiny-mamba")

    def factory(preset):
        return pair_of("mamba") if preset.name == hybrid.name else app_server.pair_factory(preset)

    h = Handlers(PairPool({"tiny-random": table["tiny-random"], hybrid.name: hybrid}, factory), RunFiles(),
                 "tiny-random")
    names = [f.name for f in dataclasses.fields(View)]
    rows = []
    with pytest.raises(gr.Error, match="Mamba"):
        for row in h.compare(None, None, media.image_prompt, 8, "sage", hybrid.name, RunControl()):
            rows.append(dict(zip(names, row)))
    assert len(rows) == 1 and "\n" not in rows[0]["status"] and "Mamba" in rows[0]["status"]
    with pytest.raises(gr.Error, match="policy 'sage' cannot run on this pair"):
        h.comparison.run(None, None, media.image_prompt, 8, hybrid.name)
    rows = [dict(zip(names, r)) for r in h.compare(media.image, None, media.image_prompt, 8, "sage", "tiny-random",
                                                   RunControl())]
    assert rows[-1]["summary"]["speculative"]["token_ids"] == rows[-1]["summary"]["ar"]["token_ids"]


def test_the_bench_reports_what_reading_paths_costs(tmp_path):
    """bench on a recurrent pair: every policy exact, and per step the tokens read in rows, the chains read again
    and a row's cache, for both models (none for `ar`, which reads no tree)."""
    from sage_engine.evaluation import bench

    pair = pair_of("qwen3.5")
    image(3, 64).save(tmp_path / "a.png")
    report = bench.run_bench(pair, [bench.BenchInput(str(tmp_path / "a.png"), "image", "describe it")],
                             ["chain", "sage:threshold=paper"], max_new_tokens=12, warmup=0)
    assert "paths" not in report["policies"]["ar"]
    for policy in ("chain", "sage:threshold=paper"):
        summary = report["policies"][policy]
        assert summary["exact_match_vs_ar"] == 1.0
        for role in ("target", "draft"):
            cost = summary["paths"][role]
            assert cost["row_tokens_per_step"] > 1 and cost["row_cache_mb"] > 0
            assert 0 <= cost["chains_read_again_per_step"] <= 1
