"""Tree forwards through the decoder layers (sage_engine/backends/hf_layers.py): bit-identical to the model's forward()
under a real tree mask on every family, kept by the runner only when its check passes, and refused where
calling the layers in turn is not known to equal forward()."""

import dataclasses

import numpy as np
import pytest
import torch
from tiny_families import llava_ov_pair, qwen2vl_pair, smolvlm_pair

from sage_engine import SpecEngine, prepare_input
from sage_engine.backends import hf_layers as stack_mod
from sage_engine.core.runner import ModelRunner
from sage_engine.core.tree import additive_mask
from sage_engine.models import families as fam
from sage_testing.tiny_pairs import image, llava_pair, qwen25_pair

PAIRS = {"qwen2.5-vl": qwen25_pair, "qwen2-vl": qwen2vl_pair, "llava-onevision": llava_ov_pair,
         "smolvlm": smolvlm_pair, "llava": llava_pair}
_pairs: dict = {}

# a tree of 5 nodes after a 2-token pending chain: two siblings at depth 1, children under each
TREE = np.array([
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 0],
    [1, 1, 1, 0, 1, 0, 0],
    [1, 1, 0, 1, 0, 1, 0],
    [1, 1, 1, 0, 1, 0, 1],
], dtype=bool)
DEPTH = [0, 1, 2, 2, 3, 3, 4]   # position offset of each fed token


def pair_for(name):
    if name not in _pairs:
        _pairs[name] = PAIRS[name]("noisy", seed=3)
    return _pairs[name]


@pytest.mark.parametrize("name", PAIRS)
def test_layer_stack_equals_forward_under_a_tree_mask(name):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    for model in (pair.target, pair.draft):
        runner = ModelRunner(model)
        assert runner.stack is not None, f"{name}: no decoder stack found"
        runner.prefill(prep.target_inputs if model is pair.target else prep.for_draft())
        start = runner.seq_len
        ids = torch.tensor([[5, 7, 9, 11, 13, 17, 19]])
        pos = torch.tensor([[start + d for d in DEPTH]]) + runner.rope_delta
        mask = additive_mask(TREE, start, runner.dtype, runner.device)
        with torch.inference_mode():
            ref = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=runner.cache,
                        use_cache=True).logits
            ref_keys = [layer.keys.clone() for layer in runner.cache.layers]
            runner.keep(start, [])
            got = runner.stack(ids, pos, mask, runner.cache)
        assert torch.equal(got, ref), name
        assert all(torch.equal(a.keys, b) for a, b in zip(runner.cache.layers, ref_keys))   # same cache writes


@pytest.mark.parametrize("name", PAIRS)
def test_engine_keeps_the_stack_and_speculation_stays_lossless(name):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(6)])
    plain = SpecEngine(pair, tree_forward="forward")
    reference = plain.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids
    assert plain.target.stack is None and plain.draft.stack is None
    engine = SpecEngine(pair, tree_forward="layers")
    assert engine.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids == reference
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference
    assert engine.target.stack is not None and engine.draft.stack is not None   # both checks passed
    assert engine.target.stack_checked and engine.draft.stack_checked


def test_a_stack_that_differs_from_forward_is_dropped(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(8)])
    reference = SpecEngine(pair, tree_forward="forward").generate(prep, "sage", max_new_tokens=24,
                                                                   ignore_eos=True).token_ids
    real = stack_mod.DecoderStack.__call__

    def without_final_norm(self, ids, positions, mask, cache):   # a plausible slip: the final norm forgotten
        return real(dataclasses.replace(self, norm=torch.nn.Identity()), ids, positions, mask, cache)

    monkeypatch.setattr(stack_mod.DecoderStack, "__call__", without_final_norm)
    assert ModelRunner(pair.target).stack is not None   # found ...
    engine = SpecEngine(pair, tree_forward="layers")
    assert engine.target.stack_checked and engine.draft.stack_checked
    assert engine.target.stack is None and engine.draft.stack is None   # ... and dropped by the check
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference
    # the control is real: the wrong stack does change the logits
    runner = ModelRunner(pair.target)
    runner.prefill(prep.target_inputs)
    s = runner.seq_len
    ids, pos = torch.tensor([[5]]), torch.tensor([[s]]) + runner.rope_delta
    mask = additive_mask(np.ones((1, 1), bool), s, runner.dtype, runner.device)
    with torch.inference_mode():
        wrong = runner.stack(ids, pos, mask, runner.cache)
        runner.keep(s, [])
        right = pair.target(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=runner.cache,
                            use_cache=True).logits
    assert not torch.equal(wrong, right)


def test_no_stack_where_layers_in_turn_are_not_known_to_equal_forward():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    pair = pair_for("qwen2.5-vl")
    assert stack_mod.decoder_stack(pair.draft, fam.QWEN2_5_VL) is not None
    assert stack_mod.decoder_stack(pair.draft, fam.GENERIC_MROPE) is None   # an unverified family
    pair.draft.hf_device_map = {"model.language_model.layers.0": 0, "lm_head": 1}   # spread over devices
    try:
        assert stack_mod.decoder_stack(pair.draft, fam.QWEN2_5_VL) is None
    finally:
        del pair.draft.hf_device_map
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1)
    assert stack_mod.decoder_stack(Qwen2ForCausalLM(Qwen2Config(**text)), fam.TEXT) is not None   # a plain LM
    sliding = Qwen2Config(**text, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert "sliding_attention" in sliding.layer_types
    assert stack_mod.decoder_stack(Qwen2ForCausalLM(sliding), fam.TEXT) is None


@pytest.mark.parametrize("name", ["qwen2.5-vl", "llava"])
def test_rotary_table_gives_the_rotary_modules_own_numbers(name):
    model = pair_for(name).target
    stack = stack_mod.decoder_stack(model, fam.adapter_for(model))
    h = torch.zeros(1, 3, model.config.get_text_config().hidden_size)
    with torch.inference_mode():
        for pos in ([0, 1, 2], [40, 41, 41], [300, 301, 302], [5000, 5001, 5003]):   # the table grows past 256
            p = torch.tensor([pos])
            got = stack.position_embeddings(h, p)
            want = stack.rotary(h, p[None].expand(3, 1, -1) if stack.mrope else p)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), pos
    assert stack.tables["cos"].shape[1] == 8192


def test_a_model_that_cannot_be_checked_on_text_is_checked_on_its_first_forward(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    runner = ModelRunner(pair.target, backend="auto")

    def needs_images(inputs, pruning=None):
        raise ValueError("this model needs pixel_values")

    monkeypatch.setattr(runner, "prefill", needs_images)
    runner.check_layers([5, 6, 7, 8, 9])
    assert not runner.stack_checked and runner.cache is None   # nothing checked, nothing left behind
    monkeypatch.undo()
    prep = prepare_input(pair, "describe what you see", images=[image(3)])
    runner.prefill(prep.target_inputs)
    n = runner.seq_len
    runner.forward([5, 6], [n, n + 1], np.tril(np.ones((2, 2), bool)))
    assert runner.stack_checked and runner.check_ms > 0 and runner.fused is not None   # checked here, and kept
