"""`ar` is checked too (ar_check.py): when the engine is built, the target's plain decode must give generate()'s
logits on each kind of input the model takes, or no policy runs on it, `ar` included, and the refusal is one line.
Models that keep their own cache (Mamba-1, Mamba-2: `cache_params`) are refused whole. Negative controls, each
refused by the engine's checks and, with the checks bypassed, shown to emit other tokens than the model's own: a model
whose `ar` ignores its cache, PaliGemma's positions off by one, Llama 3.2 Vision's cross-attention mask left off the
decode passes, and its cross-attention cache (the image's keys) cropped like text columns. The equivalence of every
policy on PaliGemma, PaliGemma 2 and Llama 3.2 Vision is in tests/test_layer_kinds.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from sage_engine import SpecEngine, prepare_input
from sage_engine.core import engine as engine_mod
from sage_engine.errors import ModelError
from sage_engine.models import ar_check, families, layer_kinds
from sage_testing.tiny_kinds import kind_pair
from sage_testing.tiny_pairs import image, llama_text_pair, save_pair

ROOT = Path(__file__).resolve().parent.parent
MAX_NEW = 16
PROMPT = "the green triangle moves to the left while the yellow star grows"
_pairs: dict = {}


def pair_of(name: str):
    if name not in _pairs:
        _pairs[name] = llama_text_pair("noisy") if name == "llama" else kind_pair(name)
    return _pairs[name]


def prepared(pair, media: str = "image"):
    return prepare_input(pair, PROMPT, **({"images": [image(3, 64)]} if media == "image" else {}))


def generated(pair, prep, n: int = MAX_NEW) -> list[int]:
    """transformers' generate(), greedy, n tokens."""
    config = copy.deepcopy(pair.target.generation_config)
    config.update(eos_token_id=None, do_sample=False, max_new_tokens=n, pad_token_id=0)
    return pair.target.generate(**prep.target_inputs, generation_config=config)[0, prep.prompt_tokens :].tolist()


def ar_unchecked(pair, prep, **patches) -> list[int]:
    """`ar`'s tokens with the engine's checks bypassed (and `patches` on the engine module besides)."""
    with mock.patch.object(engine_mod, "decode_refusal", lambda runner, media: None), \
            mock.patch.object(engine_mod, "tree_refusal", lambda runner, words, media=None: None):
        return SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_a_model_with_its_own_cache_is_refused_whole(name):
    """Mamba-1 and Mamba-2 keep their state in `cache_params`, which the engine never builds: every policy, `ar`
    included, raises one ModelError line that says so."""
    pair = pair_of(name)
    engine = SpecEngine(pair)
    prep = prepared(pair, "text")
    for policy in ("ar", "chain", "sage"):
        with pytest.raises(ModelError) as e:
            engine.generate(prep, policy, max_new_tokens=4)
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"policy '{policy}' cannot run on this pair: in the target")
        assert "cache_params" in line and line.endswith("no policy runs on it")


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_a_model_whose_ar_ignores_its_cache_is_caught(name):
    """Negative control: with the cache_params refusal bypassed, the engine reads each token without the model's
    state; the decode check refuses it on a text prompt, and with every check bypassed `ar` emits other tokens than
    generate() (on Mamba-2: the tiny Mamba-1 repeats one token, whatever its state)."""
    pair = pair_of(name)
    prep = prepared(pair, "text")
    with mock.patch.object(ar_check, "own_cache_refusal", lambda model: None):
        why = SpecEngine(pair).decode_refusal
        assert why.startswith("on a text prompt its logits after") and "differ from generate()'s" in why
        if name == "mamba2":
            assert ar_unchecked(pair, prep) != generated(pair, prep)


def test_paligemma_reads_its_prompt_as_the_model_does():
    """The processor's `labels` are dropped (a forward given them computes a loss), its token_type_ids kept (the
    prefix that attends both ways); positions count from 1, so after the prompt the runner's shift is 1."""
    pair = pair_of("paligemma")
    prep = prepared(pair)
    assert "labels" not in prep.target_inputs and "token_type_ids" in prep.target_inputs
    engine = SpecEngine(pair)
    assert engine.decode_refusal is None and not engine.tree_refusals
    engine.target.prefill(prep.target_inputs)
    assert engine.target.rope_delta == 1


@pytest.mark.parametrize("name", ["paligemma", "paligemma2"])
def test_paligemma_positions_off_by_one_are_caught(name):
    """Negative control: PaliGemma's positions counted from 0, as other families count them: the decode check refuses
    it on an image prompt, and with the checks bypassed `ar` emits other tokens than generate()."""
    pair = pair_of(name)
    prep = prepared(pair)
    from_zero = dataclasses.replace(families.PALIGEMMA, positions=families.Positions1D())
    with mock.patch.dict(families.FAMILIES, {"paligemma": from_zero}):
        why = SpecEngine(pair).decode_refusal
        assert why.startswith("on an image prompt its logits") and "differ from generate()'s" in why
        assert ar_unchecked(pair, prep) != generated(pair, prep)


def test_mllama_without_its_cross_attention_mask_is_caught():
    """Negative control: decode passes without the prompt's cross-attention mask let a new token see the padding
    tile's keys: the decode check refuses it on an image prompt, and with the checks bypassed `ar` emits other tokens
    than generate()."""
    pair = pair_of("mllama")
    prep = prepared(pair)
    uncarried = dataclasses.replace(families.MLLAMA, carried=())
    with mock.patch.dict(families.FAMILIES, {"mllama": uncarried}):
        why = SpecEngine(pair).decode_refusal
        assert why.startswith("on an image prompt its logits after its token") and "cross-attention" in why
        assert ar_unchecked(pair, prep) != generated(pair, prep)


def test_mllama_cross_attention_cache_cropped_like_text_is_caught():
    """Negative control: a compaction that cuts the cross-attention layer's cache (the image's keys) as if it held text
    columns: the tree check, run after an image prompt, refuses both models, and with the checks bypassed a drafting
    policy emits other tokens than `ar` or fails."""
    pair = pair_of("mllama")
    prep = prepared(pair)
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    with mock.patch.object(layer_kinds.LayerPlan, "whole_layers", frozenset()):
        refusals = SpecEngine(pair).tree_refusals
        assert set(refusals) == {"target", "draft"} and "after an image prompt" in refusals["target"]
        with mock.patch.object(engine_mod, "tree_refusal", lambda runner, words, media=None: None):
            engine = SpecEngine(pair)
            outs = []
            for policy in ("chain", "static", "sage"):
                try:
                    outs.append(engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True).token_ids)
                except IndexError:  # a kept node's column past the cut cache
                    outs.append(None)
    assert any(out != ar for out in outs)


def test_draft_pruning_where_images_are_not_tokens_is_one_line():
    """Llama 3.2 Vision reads its picture by cross-attention, not as tokens a draft could read fewer of: `specvlm`
    (its draft reads 20% of an image's visual tokens) stops with one ModelError line."""
    pair = pair_of("mllama")
    with pytest.raises(ModelError, match="^draft pruning cannot run on MllamaForConditionalGeneration: [^\n]*$"):
        SpecEngine(pair).generate(prepared(pair), "specvlm", max_new_tokens=4)


@pytest.mark.parametrize("name,media", [("qwen3-vl", ("a text", "an image", "a video")), ("llama", ("a text",)),
                                        ("paligemma", ("an image",)), ("mllama", ("a text", "an image"))])
def test_the_checks_read_each_kind_of_input_the_model_takes(name, media):
    """A text prompt, a picture where the processor has an image processor, a clip where the family and the processor
    take video; a kind the processor refuses (PaliGemma's text alone) is left out."""
    pair = pair_of(name)
    family = families.adapter_for(pair.target)
    assert tuple(ar_check.media_inputs(pair.processor, family)) == media


def test_a_model_generate_cannot_run_on_is_refused():
    """Where transformers' own generate() fails, the decode cannot be proved: refused in one line that says so."""
    pair = pair_of("llama")

    def fails(model, inputs, n, device=None):
        raise RuntimeError("no generate here\nsecond line")

    with mock.patch.object(ar_check, "reference", fails):
        why = SpecEngine(pair).decode_refusal
    assert why == "its decode cannot be checked: generate() fails on a text prompt (no generate here)"


@pytest.mark.parametrize("name", ["paligemma", "mllama", "mamba2"])
def test_cli_on_a_saved_pair(name, tmp_path):
    """`generate --target DIR --draft DIR --image`: saved PaliGemma and Llama 3.2 Vision pairs decode with `sage` the
    tokens the same pair's `ar` decodes here (in float32, as the CLI loads them); a saved Mamba-2 pair makes `ar` exit
    2 with one `error:` line."""
    pair = pair_of(name)
    target, draft = save_pair(pair, tmp_path)
    picture = tmp_path / "a.png"
    image(3, 64).save(picture)
    media = [] if name == "mamba2" else ["--image", str(picture)]
    policy = "ar" if name == "mamba2" else "sage"
    out = subprocess.run([sys.executable, "-m", "sage_engine", "generate", "--prompt", PROMPT, *media, "--target",
                          target, "--draft", draft, "--policy", policy, "--max-new-tokens", "16", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = out.stderr.splitlines()
    assert all(line.startswith(("error:", "warning:")) for line in lines), out.stderr
    if name == "mamba2":
        errors = [line for line in lines if line.startswith("error:")]
        assert out.returncode == 2 and len(errors) == 1 and "cache_params" in errors[0]
        return
    assert out.returncode == 0, out.stderr
    prep = prepare_input(pair, PROMPT, images=[str(picture)])
    ar = SpecEngine(pair).generate(prep, "ar", max_new_tokens=16).token_ids
    assert json.loads(out.stdout)["token_ids"] == ar
