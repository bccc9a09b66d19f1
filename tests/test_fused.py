"""Fused layers (sage_engine/backends/fused_torch.py): close to the model's forward() under a real tree mask on every
family, with and without oneDNN-packed products, used for both models by default and for the draft alone with
tree_forward="layers", dropped by the runner's check when they are not close, and refused where a layer is not
exactly the block they compute."""

import numpy as np
import pytest
import torch
from test_stack import DEPTH, PAIRS, TREE, pair_for

from sage_engine import SpecEngine, prepare_input
from sage_engine.backends import choose
from sage_engine.backends import fused_torch as fused_mod
from sage_engine.backends import padding as rows_mod
from sage_engine.backends.hf_layers import decoder_stack
from sage_engine.backends.padding import NO_PADDING, padded
from sage_engine.core.runner import ModelRunner
from sage_engine.core.tree import additive_mask
from sage_engine.models import families as fam
from sage_testing.tiny_pairs import image


def _tree_inputs(runner: ModelRunner):
    start = runner.seq_len
    ids = torch.tensor([[5, 7, 9, 11, 13, 17, 19]])
    pos = torch.tensor([[start + d for d in DEPTH]]) + runner.rope_delta
    return start, ids, pos, additive_mask(TREE, start, runner.dtype, runner.device)


@pytest.mark.parametrize("name", PAIRS)
def test_fused_layers_are_close_to_forward_under_a_tree_mask(name):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    runner = ModelRunner(pair.draft, backend="auto")
    assert runner.fused is not None, f"{name}: the draft's layers were not fused"
    runner.prefill(prep.for_draft())
    start, ids, pos, mask = _tree_inputs(runner)
    with torch.inference_mode():
        ref = pair.draft(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=runner.cache,
                         use_cache=True).logits  # [1, 7, V]
        ref_kv = [(layer.keys[:, :, start:].clone(), layer.values[:, :, start:].clone())
                  for layer in runner.cache.layers]
        runner.keep(start, [])
        got = runner.fused(ids, pos, mask, runner.cache)
    assert runner.seq_len == start + ids.shape[1]
    scale = ref.abs().max()
    assert (got - ref).abs().max() <= 1e-4 * scale, name
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    for layer, (keys, values) in zip(runner.cache.layers, ref_kv):
        assert torch.allclose(layer.keys[:, :, start:], keys, atol=1e-5)
        assert torch.allclose(layer.values[:, :, start:], values, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2.5-vl", "smolvlm"])
def test_the_engine_fuses_both_models_and_layers_mode_keeps_their_own(name):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(6)])
    exact = SpecEngine(pair, tree_forward="layers")
    reference = exact.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids
    assert exact.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference
    assert exact.target.tree_forward == "layers" and exact.target.fused is None   # the target's own layers
    assert exact.draft.tree_forward == "layers" and exact.draft.stack_checked   # --tree-forward applies to both
    engine = SpecEngine(pair)
    assert engine.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids == reference
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference
    assert engine.target.tree_forward == "fused"   # narrow: not packed
    assert engine.draft.tree_forward in ("fused", "fused+numpy", "fused+numba")
    assert engine.target.stack_checked
    plain = SpecEngine(pair, tree_forward="forward")
    assert plain.draft.tree_forward == "forward" and plain.draft.fused is None
    with pytest.raises(ValueError, match="tree_forward"):
        SpecEngine(pair, tree_forward="fast")


def test_fused_layers_that_are_not_close_are_dropped_and_the_output_stays(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(8)])
    reference = SpecEngine(pair, tree_forward="forward").generate(prep, "sage", max_new_tokens=24,
                                                                   ignore_eos=True).token_ids

    def interleaved(x, cos, sin):   # a plausible slip: the other rotary convention (pairs, not halves)
        pairs = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return x * cos + pairs * sin

    monkeypatch.setattr(fused_mod, "_rotate", interleaved)
    assert ModelRunner(pair.draft, backend="auto").fused is not None   # built ...
    assert ModelRunner(pair.target, backend="auto").fused is not None
    engine = SpecEngine(pair)
    for runner in (engine.target, engine.draft):   # ... and dropped by the check (when the engine was built); the
        # draft's NumPy layers (host.py) rotate on their own and may stay
        assert runner.stack_checked and not isinstance(runner.fused, fused_mod.FusedDecoder)
        assert runner.stack is not None
    assert engine.target.fused is None
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference
    # the control is real: the slip does change the draft's logits
    runner = ModelRunner(pair.draft, backend="auto")
    runner.prefill(prep.for_draft())
    start, ids, pos, mask = _tree_inputs(runner)
    with torch.inference_mode():
        wrong = runner.fused(ids, pos, mask, runner.cache)
        runner.keep(start, [])
        runner.sync_cache()  # the model's own layers read the cache's layers as they are
        right = runner.stack(ids, pos, mask, runner.cache)
    assert (wrong - right).abs().max() > 1e-2 * right.abs().max()


def test_layers_that_are_not_the_plain_block_are_not_fused(monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16)

    def fusable(model):
        stack = decoder_stack(model, fam.TEXT)
        assert stack is not None   # the layers can be called in turn: only the fusing is refused
        return fused_mod.fused_decoder(stack) is not None

    assert fusable(Qwen2ForCausalLM(Qwen2Config(**text)))
    assert not fusable(Qwen3ForCausalLM(Qwen3Config(**text)))   # q/k norms inside the attention
    assert not fusable(Qwen2ForCausalLM(Qwen2Config(**text, hidden_act="gelu")))   # not SwiGLU
    odd = Qwen2ForCausalLM(Qwen2Config(**text))
    odd.model.layers[1].mlp.down_proj = torch.nn.Sequential(odd.model.layers[1].mlp.down_proj)   # not a Linear
    assert not fusable(odd)

    class Scaled(torch.nn.Linear):   # a Linear whose forward is not F.linear on its weights (e.g. an adapter)
        def forward(self, x):
            return 2 * super().forward(x)

    adapted = Qwen2ForCausalLM(Qwen2Config(**text))
    adapted.model.layers[0].self_attn.o_proj = Scaled(32, 32, bias=False)
    assert not fusable(adapted)
    monkeypatch.setattr(fused_mod, "MAX_FUSED_PARAMS", 1000)   # a draft whose copies would be too big
    assert not fusable(Qwen2ForCausalLM(Qwen2Config(**text)))


def _prefilled(model):
    """A fused runner of `model` after the prompt 1..5."""
    runner = ModelRunner(model, backend="auto")
    runner.prefill({"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)})
    return runner


def _chain_close_to_forward(runner, model):
    """Feed 6, 7, 8 after the prompt as one cached forward: kept by the runner's check, and close to the model's
    forward() over the whole sequence. Returns (the runner's logits, forward()'s)."""
    out = runner.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool)))
    assert runner.fused is not None   # the check on this first cached forward kept it
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])).logits[0, 5:]
    assert torch.allclose(out.logits, full, atol=1e-4 * float(full.abs().max()))
    return out.logits, full


def test_a_fused_text_model_drafts_losslessly():
    """A plain decoder-only LM (TEXT family), Llama-style blocks without q/k/v biases."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)
    draft = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    runner = _prefilled(draft)
    assert runner.fused is not None and runner.fused.layers[0].qkv.bias is None
    _chain_close_to_forward(runner, draft)


def test_a_bf16_draft_keeps_its_fused_layers():
    """RMSNorm normalises in float32 and scales in the input's dtype, as the model's own norm does: the embedded
    draft in bf16 keeps its fused layers (with the norm computed in bf16 throughout, the check dropped them)."""
    from pathlib import Path

    from sage_engine.models.loading import load_pair

    pair = load_pair(dtype="bfloat16")
    example = Path(__file__).resolve().parents[1] / "assets" / "examples" / "shapes_1.png"
    prep = prepare_input(pair, "Describe the image.", images=[str(example)])
    runner = ModelRunner(pair.draft, backend="auto")
    runner.prefill(prep.for_draft())
    start = runner.seq_len
    runner.forward([5, 7, 9], [start, start + 1, start + 2], np.tril(np.ones((3, 3), bool)))
    assert runner.stack_checked and runner.fused is not None


def _wide_text_model(**over):
    """A Qwen2 LM wide enough for packed products (hidden fused_mod.PACK_MIN_HIDDEN)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(1)
    cfg = dict(vocab_size=96, hidden_size=fused_mod.PACK_MIN_HIDDEN, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2) | over
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)).eval()
    with torch.no_grad():   # q/k/v biases that matter (the initialisation leaves them at zero)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


def _prefer(monkeypatch, packed: bool) -> None:
    """Make the runner's timed choice between the fused candidates pick the packed one (or the other)."""
    monkeypatch.setattr(choose, "fastest", lambda candidates, *_: next(
        (c for c in candidates if c.packed == packed), candidates[0]))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("packed", [True, False])
def test_packed_and_transposed_products_are_close_to_forward(monkeypatch, packed):
    _prefer(monkeypatch, packed)
    model = _wide_text_model()
    runner = _prefilled(model)
    kinds = sorted(c.packed for c in runner.offered.candidates)
    assert kinds == [False, True]   # a wide float32 model on the CPU: both ways are candidates
    got, full = _chain_close_to_forward(runner, model)
    assert runner.tree_forward == ("fused+packed" if packed else "fused")
    layer = runner.fused.layers[0]
    products = runner.fused.products
    assert all((p.packed is not None) == packed and (p.transposed is not None) != packed for p in products)
    x = torch.randn(1, 7, fused_mod.PACK_MIN_HIDDEN)
    assert torch.allclose(layer.gate_up(x), torch.nn.functional.linear(x, layer.gate_up.weight), atol=1e-4)
    assert torch.equal(got.argmax(-1), full.argmax(-1))
    one = runner.forward([9], [8], np.ones((1, 1), bool))   # a one-token step goes the same way
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]])).logits[0, -1:]
    assert torch.allclose(one.logits, full, atol=1e-4 * float(full.abs().max()))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("slow", ["packed", "transposed"])
def test_the_runner_keeps_the_faster_way_to_compute_the_products(monkeypatch, slow):
    import time
    real = fused_mod.Product.__call__

    def slowed(self, x):   # one way made slower by 0.2 ms a product
        if getattr(self, slow) is not None:
            time.sleep(2e-4)
        return real(self, x)

    monkeypatch.setattr(fused_mod.Product, "__call__", slowed)
    model = _wide_text_model()
    runner = _prefilled(model)
    _chain_close_to_forward(runner, model)
    assert runner.fused.packed == (slow == "transposed")


def test_products_are_packed_only_for_wide_float32_models_with_onednn(monkeypatch):
    def kinds(model):   # per candidate: (packed, transposed)
        stack = decoder_stack(model, fam.TEXT)
        return [(c.layers[0].qkv.packed is not None, c.layers[0].qkv.transposed is not None)
                for c in fused_mod.fused_decoders(stack)]

    if torch.backends.mkldnn.is_available():
        assert kinds(_wide_text_model()) == [(False, True), (True, False)]
    assert kinds(_wide_text_model(hidden_size=128)) == [(False, True)]   # narrow: oneDNN's fixed cost dominates
    assert kinds(_wide_text_model().to(torch.bfloat16)) == [(False, False)]   # F.linear: one rounding with the bias
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert kinds(_wide_text_model()) == [(False, True)]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("packed", [True, False])
def test_a_product_that_loses_its_bias_is_dropped_by_the_check(monkeypatch, packed):
    model = _wide_text_model()
    real = fused_mod.Product.__call__

    def biasless(self, x):   # a plausible slip in one way of computing the products: the projection's bias is lost
        if (self.packed is not None) == packed:
            return real(fused_mod.Product(self.weight, None, self.packed, self.transposed), x)
        return real(self, x)

    runner = _prefilled(model)
    assert runner.fused is not None   # built ...
    monkeypatch.setattr(fused_mod.Product, "__call__", biasless)
    out = runner.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool)))
    assert runner.fused is not None and runner.fused.packed != packed   # ... and only the other way kept
    own = ModelRunner(model)   # the model's own layers, checked bit-identical to forward()
    own.prefill({"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)})
    ref = own.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool))).logits
    assert torch.allclose(out.logits, ref, atol=1e-4 * float(ref.abs().max()))
    monkeypatch.setattr(fused_mod.Product, "__call__", lambda self, x: real(   # every product slips: none is kept
        fused_mod.Product(self.weight, None, self.packed, self.transposed), x))
    runner = _prefilled(model)
    out = runner.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool)))
    assert runner.fused is None and runner.stack is not None
    assert torch.equal(out.logits, ref)


def test_a_rows_product_does_not_depend_on_how_many_rows_share_it():
    """Every product of the embedded pair's fused layers (each way, packed or transposed) gives a row the same numbers,
    bit for bit, alone (an `ar` step) or among others (a verify pass): fused.Product computes one row as two, since
    BLAS's one-row path sums in another order. (Attention does not: logits may differ by ~1e-5 between the two.)"""
    from sage_engine.models.loading import load_pair

    pair = load_pair()
    for model in (pair.target, pair.draft):
        for decoder in fused_mod.fused_decoders(decoder_stack(model, fam.adapter_for(model))):
            for p in decoder.products:
                x = torch.randn(1, 13, p.weight.shape[1])
                with torch.inference_mode():
                    many = p(x)
                    assert all(torch.equal(p(x[:, i : i + 1]), many[:, i : i + 1]) for i in range(13))


def test_the_targets_products_pad_their_rows_by_this_machines_rule_and_the_drafts_take_the_one_row_path():
    """Only the target's numbers must not depend on the row count (its `ar` steps against its verify passes): whichever
    way the runner kept, a row alone gets the numbers it gets among others, and on transposed copies a single row is
    never computed alone (BLAS's one-row path sums in another order on every CPU measured). The draft's numbers only
    shape its guesses: its one-row products take BLAS's one-row path, about half the cost."""
    from sage_engine.models.loading import load_pair

    engine = SpecEngine(load_pair())
    for p in engine.target.fused.products:
        x = torch.randn(1, 7, p.weight.shape[1])
        with torch.inference_mode():
            assert all(torch.equal(p(x[:, i : i + 1]), p(x)[:, i : i + 1]) for i in range(7))
    transposed = fused_mod.fused_decoder(engine.target.stack, pack=False)
    assert transposed is not None and padded(1, transposed.rows) >= 2
    assert all(p.rows == transposed.rows for p in transposed.products)
    draft = getattr(engine.draft.fused, "fused", engine.draft.fused)   # the NumPy layers (host.py): the torch ones
    p = next(p for p in draft.products if p.transposed is not None)
    x = torch.randn(1, 1, p.weight.shape[1])
    with torch.inference_mode():
        assert p.rows == NO_PADDING and torch.equal(p(x), x @ p.transposed + (0 if p.bias is None else p.bias))


def test_a_row_rule_pads_to_the_counts_a_kernel_keeps_and_a_way_no_rule_fixes_is_not_offered(monkeypatch):
    """rows.row_rule finds the cheapest padding under which a product gives every row the same numbers: none for a
    row-wise product, four rows for one whose numbers change unless the count is a multiple of four (as MKL's on an
    AMD EPYC), None for one that changes with every count; a way of computing the target's products that no rule
    fixes is not offered for a row-invariant model (the runner then keeps another, or the model's own layers), while
    a draft keeps it."""
    def rowwise(w):
        return lambda x: (x[..., None, :] * w).sum(-1)

    def blocked(w):   # another kernel, other last bits, unless the count is a multiple of four
        return lambda x: rowwise(w)(x) * (1.0 + 1e-6 * (x.shape[-2] % 4 != 0))

    def counted(w):
        return lambda x: rowwise(w)(x) * (1.0 + 1e-6 * x.shape[-2])

    like = torch.zeros(1, dtype=torch.float64)
    assert rows_mod.row_rule(rowwise, [(6, 5), (3, 5)], like) == NO_PADDING
    assert rows_mod.row_rule(blocked, [(6, 5)], like) == (4, 4)
    assert rows_mod.row_rule(counted, [(6, 5)], like) is None
    assert [padded(q, (4, 4)) for q in (1, 4, 5, 13)] == [4, 4, 8, 16] and padded(1, (2, 1)) == 2
    model = _wide_text_model()
    stack = decoder_stack(model, fam.TEXT)
    monkeypatch.setattr(fused_mod, "row_rule", lambda make, shapes, like: None)
    assert fused_mod.fused_decoders(stack) == [] and fused_mod.fused_decoders(stack, row_invariant=False)
    runner = _prefilled(model)
    runner.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool)))
    assert runner.tree_forward == "layers"


def test_a_one_token_step_carries_its_row_padded_through_the_layers_with_the_padded_products_numbers(monkeypatch):
    """The target's one-token step on transposed copies carries its row, repeated to the count its products pad to,
    through the layers (`FusedDecoder._layers`) instead of padding at each product: the same logits and the same
    cached keys and values, bit for bit, over a run of steps, as through the products' own padding; and no product
    sees a single row on that path (one would mean the carried rows were dropped on the way)."""
    from sage_engine.models.loading import load_pair

    engine = SpecEngine(load_pair())
    runner = engine.target
    decoder = runner.fused = fused_mod.fused_decoder(runner.stack, pack=False)   # transposed: its rule pads one row
    rule = decoder.rows
    m = padded(1, rule)
    assert m >= 2
    runner.prefill(prepare_input(engine.pair, "Describe the image.", images=[image(3)]).target_inputs)
    rows = []
    real_call = fused_mod.Product.__call__
    monkeypatch.setattr(fused_mod.Product, "__call__", lambda p, x: rows.append(x.shape[-2]) or real_call(p, x))
    start = runner.seq_len
    for step, token in enumerate([5, 9, 33, 7, 12]):
        got = {}
        for carried in (True, False):
            decoder.__dict__["rows"] = rule if carried else NO_PADDING   # NO_PADDING: each product pads its row
            rows.clear()
            logits = runner.forward([token], [start + step], np.ones((1, 1), bool)).logits
            got[carried] = logits, [(layer.keys[:, :, -1:].clone(), layer.values[:, :, -1:].clone())
                                    for layer in runner.cache.layers]
            if carried:
                assert rows == [m] * len(decoder.products)
            else:   # each call with the one row, then its padded call
                assert rows == [1, m] * len(decoder.products)
            runner.keep(start + step, [])
        assert torch.equal(got[True][0], got[False][0])
        assert all(torch.equal(a, b) for pair in zip(got[True][1], got[False][1]) for a, b in zip(*pair))
        runner.forward([token], [start + step], np.ones((1, 1), bool))   # the prefix grows
    decoder.__dict__["rows"] = rule


@pytest.mark.parametrize("name", ["qwen2.5-vl", "llava"])
def test_the_fused_rotary_table_gives_the_rotary_modules_own_numbers_as_it_grows(name):
    model = pair_for(name).target
    decoder = fused_mod.fused_decoders(decoder_stack(model, fam.adapter_for(model)))[0]
    stack = decoder.stack
    h = torch.zeros(1, 3, model.config.get_text_config().hidden_size)
    with torch.inference_mode():
        for pos in ([0, 1, 2], [40, 41, 41], [300, 301, 302], [5000, 5001, 5003]):   # past 256: the table grows
            p = torch.tensor([pos])
            cos, signed_sin = decoder.rotary(h, p, max(pos))
            want_cos, want_sin = stack.rotary(h, p[None].expand(3, 1, -1) if stack.mrope else p)
            assert torch.equal(cos[:, 0], want_cos) and torch.equal(signed_sin[:, 0], want_sin * decoder.sign), pos
    assert decoder.rope["table"].shape[0] == 8192


def test_a_runner_call_from_outside_inference_mode_runs_in_it():
    """The engine enters inference mode once per step; a runner called on its own enters it itself."""
    runner = _prefilled(_wide_text_model())
    assert not torch.is_inference_mode_enabled()
    out = runner.forward([6, 7, 8], [5, 6, 7], np.tril(np.ones((3, 3), bool)))
    assert out.logits.is_inference() and runner.cache.layers[0].keys.is_inference()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_a_runner_asked_for_a_backend_by_name_is_offered_that_one_alone():
    """ModelRunner(named=...): the one backend of that name (what SpecEngine.twin pins), nothing to time; a name not
    offered to this model leaves a note and runs the layers, never another fused backend in silence."""
    model = _wide_text_model()
    both = ModelRunner(model, backend="auto")
    assert sorted(c.name for c in both.offered.candidates) == ["fused", "fused+packed"]
    for name in ("fused", "fused+packed"):
        assert [c.name for c in ModelRunner(model, backend="auto", named=name).offered.candidates] == [name]
    target_numba = ModelRunner(model, backend="auto", named="fused+numba")  # never offered to a target
    assert target_numba.offered.candidates == [] and any("fused+numba asked for" in n for n in target_numba.notes)
    assert ModelRunner(model, backend="auto", named="forward").offered.stack is None
