"""Prompts through the fused layers (FusedDecoder.prefill, stack.prompt_inputs): the model's own forward up to its text
model, then the fused layers; close to forward() on every family, kept only after the runner's check on a real
prompt, dropped when wrong, and never used where the text model's call is not plain."""

import pytest
import torch
from test_stack import PAIRS, pair_for
from transformers import DynamicCache

from sage_engine import SpecEngine, prepare_input
from sage_engine.backends import prompt_path as prompt_path_mod
from sage_engine.backends.fused_torch import FusedDecoder
from sage_engine.backends.hf_layers import prompt_inputs
from sage_engine.core.runner import ModelRunner
from sage_testing.tiny_pairs import image


def _checked_runner(model, inputs: dict, row_invariant: bool = True) -> ModelRunner:
    """A runner whose layers and prompt path have been checked: prefill, one cached token, prefill again."""
    runner = ModelRunner(model, backend="auto", row_invariant=row_invariant)
    runner.prefill(inputs)
    n = runner.seq_len
    runner.forward([5], [n], torch.ones(1, 1, dtype=torch.bool).numpy())  # the layers' check (if not done yet)
    runner.prefill(inputs)  # the prompt path's check
    return runner


def _forward(model, inputs: dict) -> tuple[torch.Tensor, DynamicCache]:
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return logits, cache


@pytest.mark.parametrize("name", PAIRS)
def test_a_prompt_through_the_fused_layers_is_close_to_forward(name, monkeypatch):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    for model, inputs, invariant in ((pair.target, prep.target_inputs, True), (pair.draft, prep.for_draft(), False)):
        runner = _checked_runner(model, inputs, invariant)
        assert runner.prompts.state is True, f"{name}: the prompt path was not kept"
        calls = []
        monkeypatch.setattr(FusedDecoder, "prefill", lambda self, *a, _orig=FusedDecoder.prefill, _calls=calls: (
            _calls.append(1), _orig(self, *a))[1])
        got = runner.prefill(inputs).logits
        monkeypatch.undo()
        assert calls == [1], f"{name}: the prompt did not go through the fused layers"
        ref, ref_cache = _forward(model, inputs)
        ref = runner._logits(ref)
        assert (got - ref).abs().max() <= 1e-4 * ref.abs().max(), name
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        assert runner.seq_len == ref_cache.get_seq_length()
        for layer, want in zip(runner.cache.layers, ref_cache.layers):
            assert torch.allclose(layer.keys, want.keys, atol=1e-5) and torch.allclose(layer.values, want.values,
                                                                                        atol=1e-5)


def test_a_wrong_prompt_path_is_dropped_and_the_output_stays(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(8)])
    reference = SpecEngine(pair, tree_forward="forward").generate(prep, "sage", max_new_tokens=24,
                                                                   ignore_eos=True).token_ids

    def flat_positions(model, stack, batch, cache):  # a plausible slip: the image's 3D positions read as text ones
        embeds, positions = prompt_inputs(model, stack, batch, cache)
        return embeds, torch.arange(embeds.shape[1])[None].expand(3, 1, -1)

    # the control is real: the slip does change the prompt's logits
    good = _checked_runner(pair.target, prep.target_inputs)
    right = good.prefill(prep.target_inputs).logits
    monkeypatch.setattr(prompt_path_mod, "prompt_inputs", flat_positions)
    wrong = good.prefill(prep.target_inputs).logits
    assert (wrong - right).abs().max() > 1e-2 * right.abs().max()
    # the check drops it, and the output is forward()'s
    engine = SpecEngine(pair)
    first = engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids
    assert engine.target.prompts.state is False and engine.draft.prompts.state is False
    assert first == reference
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference


def test_a_padded_or_batched_prompt_is_not_taken_apart():
    pair = pair_for("llava")
    prep = prepare_input(pair, "describe what you see", images=[image(3)])
    runner = _checked_runner(pair.target, prep.target_inputs)
    inputs = dict(prep.target_inputs)
    with torch.inference_mode():
        assert prompt_inputs(pair.target, runner.stack, inputs, DynamicCache(config=pair.target.config)) is not None
        padded = dict(inputs, attention_mask=inputs["attention_mask"].clone())
        padded["attention_mask"][0, 0] = 0
        assert prompt_inputs(pair.target, runner.stack, padded, DynamicCache(config=pair.target.config)) is None
        batched = {k: torch.cat([v, v]) if k in ("input_ids", "attention_mask") else v for k, v in inputs.items()}
        if "pixel_values" in batched:
            batched["pixel_values"] = torch.cat([inputs["pixel_values"]] * 2)
        try:
            found = prompt_inputs(pair.target, runner.stack, batched, DynamicCache(config=pair.target.config))
        except (ValueError, RuntimeError):  # a model that refuses the batch outright is fine too
            found = None
        assert found is None
    # the runner's fallback for a prompt the path refuses: forward()'s numbers, the path still kept for others
    got = runner.prefill(padded).logits
    ref = runner._logits(_forward(pair.target, padded)[0])
    assert torch.equal(got, ref) and runner.prompts.state is True


def test_a_prompt_the_checked_path_fails_on_goes_through_forward(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(5)])
    runner = _checked_runner(pair.target, prep.target_inputs)
    assert runner.prompts.state is True

    def fails(self, *args):
        raise RuntimeError("a prompt this path cannot take")

    monkeypatch.setattr(FusedDecoder, "prefill", fails)
    got = runner.prefill(prep.target_inputs)
    ref, ref_cache = _forward(pair.target, prep.target_inputs)
    assert torch.equal(got.logits, runner._logits(ref)) and runner.seq_len == ref_cache.get_seq_length()
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(runner.cache.layers, ref_cache.layers))


@pytest.mark.parametrize("name", ["qwen2.5-vl", "llava"])
def test_the_engine_checks_the_prompt_path_when_it_is_built(name):
    """On a small picture when the engine is built, so that no run pays for the check (a CLI run is one run)."""
    pair = pair_for(name)
    engine = SpecEngine(pair)
    for runner in (engine.target, engine.draft):
        assert runner.prompts.state is True and runner.cache is None and runner.check_ms > 0
    prep = prepare_input(pair, "describe what you see", images=[image(6)])
    reference = SpecEngine(pair, tree_forward="forward").generate(prep, "ar", max_new_tokens=16,
                                                                   ignore_eos=True).token_ids
    assert engine.generate(prep, "sage", max_new_tokens=16, ignore_eos=True).token_ids == reference
