"""A draft's fused layers on the host: in NumPy (sage_engine/backends/numpy_host.py) and compiled with Numba
(sage_engine/backends/numba_layers.py), each close to the model's forward() under a real tree mask on every family,
its keys and values in a buffer that the cache's own compaction and copies handle, offered for drafts only (float32),
dropped by the runner's check when wrong, and drafting the same trees as the torch layers."""

import numpy as np
import pytest
import torch
from test_equivalence import MAX_NEW, sharp_case
from test_fused import _tree_inputs
from test_stack import PAIRS, TREE, pair_for

from sage_engine import SpecEngine, make_policy, prepare_input
from sage_engine.backends import choose
from sage_engine.backends import numba_layers as compiled_mod
from sage_engine.backends import numpy_host as host_mod
from sage_engine.backends.numba_layers import CompiledDecoder
from sage_engine.backends.numpy_host import HostDecoder, pick
from sage_engine.core.cache import copy_cache
from sage_engine.core.runner import ModelRunner
from sage_engine.core.tree import additive_mask
from sage_testing.tiny_pairs import image


def _draft_runner(model) -> ModelRunner:
    return ModelRunner(model, backend="auto", row_invariant=False)


KINDS = {"numpy": HostDecoder, "numba": CompiledDecoder}  # the host layers' two implementations
FORWARD_NAMES = {"numpy": "fused+numpy", "numba": "fused+numba", None: "fused"}  # ModelRunner.tree_forward


def _host(runner: ModelRunner, kind: str = "numpy") -> HostDecoder:
    hosts = [c for c in runner.offered.candidates if type(c) is KINDS[kind]]
    assert len(hosts) == 1, f"no {kind} candidate for a float32 draft"
    return hosts[0]


def _prefer(monkeypatch, kind: str | None) -> None:
    """Make the runner's timed choice between the fused candidates pick the `kind` host layers (None: torch's)."""
    want = KINDS.get(kind)
    monkeypatch.setattr(choose, "fastest", lambda candidates, *_: next(
        (c for c in candidates if (type(c) is want if want else not isinstance(c, HostDecoder))), candidates[0]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PAIRS)
def test_host_layers_are_close_to_forward_under_a_tree_mask(name, kind):
    pair = pair_for(name)
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    runner = _draft_runner(pair.draft)
    host = _host(runner, kind)
    runner.prefill(prep.for_draft())
    start, ids, pos, mask = _tree_inputs(runner)
    with torch.inference_mode():
        ref = pair.draft(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=runner.cache,
                         use_cache=True).logits[0]  # [7, V]
        ref_kv = [(layer.keys[:, :, start:].clone(), layer.values[:, :, start:].clone())
                  for layer in runner.cache.layers]
        runner.keep(start, [])
        # the runner's own path: token and position lists and the boolean pattern, no tensors
        got = host.run(ids[0].tolist(), pos[0].tolist(), ~TREE, runner.cache)
    assert runner.seq_len == start + ids.shape[1]
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max(), name
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    for layer, (keys, values) in zip(runner.cache.layers, ref_kv):
        assert torch.allclose(layer.keys[:, :, start:], keys, atol=1e-5)
        assert torch.allclose(layer.values[:, :, start:], values, atol=1e-5)
    # the contract of the other fused candidates (what the runner's check calls) gives the same numbers
    runner.keep(start, [])
    with torch.inference_mode():
        assert torch.allclose(host(ids, pos, mask, runner.cache)[0], got, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_the_buffer_survives_compaction_copies_and_growth(kind):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(5)])
    runner = _draft_runner(pair.draft)
    host = _host(runner, kind)
    torch_fused = next(c for c in runner.offered.candidates if not isinstance(c, HostDecoder))
    runner.prefill(prep.for_draft())
    start, ids, pos, mask = _tree_inputs(runner)

    def after(net, keep, cache):  # the tree, then keep `keep` of it, then one more token: its logits and keys
        with torch.inference_mode():
            net(ids, pos, mask, cache)
            runner.cache = cache
            runner.keep(start, keep)
            n = start + len(keep)
            out = net(torch.tensor([[21]]), torch.tensor([[n]]) + runner.rope_delta, None, cache)
        return out[0], [layer.keys.clone() for layer in cache.layers]

    prompt = copy_cache(runner.cache)
    for keep in ([0, 2, 4, 6], [0, 1], []):  # a moved path, a prefix, nothing
        want, want_keys = after(torch_fused, keep, copy_cache(prompt))
        got, got_keys = after(host, keep, copy_cache(prompt))
        assert torch.allclose(got, want, atol=1e-4 * float(want.abs().max())), keep
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got_keys, want_keys))
    # the cache's layers view the buffer; a copy is independent of it (a forward on the copy leaves the original)
    cache = copy_cache(prompt)
    with torch.inference_mode():
        host(ids, pos, mask, cache)
    assert cache.layers[0].keys.data_ptr() == host.buffers.keys[0].data_ptr()
    before = cache.layers[0].keys.clone()
    twin = copy_cache(cache)
    with torch.inference_mode():
        for n in (start + 7, start + 14):
            host(ids, pos + n - start, additive_mask(TREE, n, runner.dtype, runner.device), twin)
    assert torch.equal(cache.layers[0].keys, before)
    # a sequence longer than the buffer: it grows, keeping what was there
    capacity = host.buffers.keys[0].shape[2]
    long = torch.arange(capacity).view(1, -1) % 50 + 3
    with torch.inference_mode():
        host(long, torch.arange(capacity).view(1, -1) + twin.get_seq_length(), None, twin)
    assert host.buffers.keys[0].shape[2] > capacity and twin.get_seq_length() == start + 21 + capacity
    assert torch.equal(twin.layers[0].keys[:, :, : start], prompt.layers[0].keys)


def test_host_layers_are_offered_for_float32_drafts_only():
    pair = pair_for("qwen2.5-vl")
    assert not any(isinstance(c, HostDecoder) for c in ModelRunner(pair.target, backend="auto").offered.candidates)
    assert {type(c) for c in _draft_runner(pair.draft).offered.candidates} >= {HostDecoder, CompiledDecoder}
    bf16 = _draft_runner(pair_for("llava").draft.to(torch.bfloat16))
    assert bf16.offered.candidates and not any(isinstance(c, HostDecoder) for c in bf16.offered.candidates)
    pair_for("llava").draft.to(torch.float32)
    assert host_mod.host_decoder(None) is None and compiled_mod.compiled_decoder(None) is None


def test_without_numba_the_numpy_layers_and_torchs_top_k_are_used(monkeypatch):
    """A platform without Numba: the compiled functions are None, and the draft runs as before (NumPy layers, the
    candidates ranked by torch), still lossless."""
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(8)])
    monkeypatch.setattr(compiled_mod, "_forward_jit", None)
    monkeypatch.setattr(compiled_mod, "_top_jit", None)
    assert {type(c) for c in _draft_runner(pair.draft).offered.candidates} & set(KINDS.values()) == {HostDecoder}
    assert compiled_mod.top_candidates(torch.zeros(1, 8), 2) is None
    _prefer(monkeypatch, "numpy")
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference


def _ignore_the_tree_mask(monkeypatch, kind: str) -> None:
    """A plausible slip in the `kind` host layers: the tree mask is ignored (every token sees every column)."""
    if kind == "numpy":
        monkeypatch.setattr(host_mod, "_attend", lambda q, keys, values, scaling, blocked: host_mod._attend(
            q, keys, values, scaling, None))
    else:
        jit = compiled_mod._forward_jit
        monkeypatch.setattr(compiled_mod, "_forward_jit", lambda tokens, positions, blocked, *rest: jit(
            tokens, positions, np.zeros((1, 0), dtype=bool), *rest))


@pytest.mark.parametrize("kind", KINDS)
def test_host_layers_that_are_not_close_are_dropped_and_the_output_stays(monkeypatch, kind):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(8)])
    reference = SpecEngine(pair, tree_forward="forward").generate(prep, "sage", max_new_tokens=24,
                                                                   ignore_eos=True).token_ids
    _prefer(monkeypatch, kind)
    right = SpecEngine(pair)
    assert right.draft.tree_forward == FORWARD_NAMES[kind]   # checked and kept when right
    _ignore_the_tree_mask(monkeypatch, kind)
    kept = []
    monkeypatch.setattr(choose, "fastest", lambda candidates, *_: kept.extend(candidates) or next(
        (c for c in candidates if type(c) is not KINDS[kind]), candidates[0]))
    engine = SpecEngine(pair)
    assert engine.draft.stack_checked and kept and not any(type(c) is KINDS[kind] for c in kept)  # dropped
    assert engine.generate(prep, "sage", max_new_tokens=24, ignore_eos=True).token_ids == reference


@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "copy"), ("qwen2.5-vl", "video", "noisy"),
                                               ("llava", "image", "noisy")])
def test_host_drafts_are_lossless_and_draft_the_same_trees(monkeypatch, family, media, kind):
    pair, prep = sharp_case(family, media, kind)
    trees = {}
    for host in (*KINDS, None):
        _prefer(monkeypatch, host)
        engine = SpecEngine(pair)
        assert engine.draft.tree_forward == FORWARD_NAMES[host]
        reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
        for policy in ("chain", "static", "eagle2", "sage"):
            res = engine.generate(prep, make_policy(policy), max_new_tokens=MAX_NEW, ignore_eos=True)
            assert res.token_ids == reference, (host, policy)
            if policy in ("static", "eagle2"):  # fixed shapes: the drafted tokens depend on the draft's numbers only
                trees[host, policy] = [s.tree.tokens for s in res.steps[1:]]
    for policy in ("static", "eagle2"):
        assert trees["numpy", policy] == trees[None, policy] == trees["numba", policy], policy
    assert np.mean([len(t) for t in trees["numba", "eagle2"]]) > 3   # real trees were drafted


@pytest.mark.parametrize("kind", KINDS)
def test_host_layers_start_from_an_empty_cache_with_grouped_heads(kind):
    """A Llama-style LM with two key heads of two query heads each, fed from an empty cache: one token, then a
    causal chain of three, against forward() over the whole sequence."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    host = _host(_draft_runner(model), kind)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        first = host.run([5], [0], None, cache)
        chain = host.run([6, 7, 8], [1, 2, 3], ~np.tril(np.ones((3, 3), bool)), cache)
        full = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[0]
    got = torch.cat([first, chain])
    assert cache.get_seq_length() == 4
    assert torch.allclose(got, full, atol=1e-4 * float(full.abs().max()))


def test_numpys_and_scipys_own_blas_are_held_to_one_thread_and_torchs_threads_are_left():
    """NumPy's BLAS (the NumPy layers' products) and SciPy's (which Numba's products call) busy-wait on the core that
    torch's threads use when they have threads of their own."""
    from threadpoolctl import threadpool_info
    threads = torch.get_num_threads()
    _host(_draft_runner(pair_for("qwen2.5-vl").draft), "numba")
    own = [i for i in threadpool_info() if i["user_api"] == "blas" and ("numpy" in i["filepath"]
                                                                         or "scipy" in i["filepath"])]
    assert {"numpy", "scipy"} <= {p for i in own for p in ("numpy", "scipy") if p in i["filepath"]}
    assert all(i["num_threads"] == 1 for i in own)
    assert torch.get_num_threads() == threads


def test_the_numpy_layers_are_kept_unless_the_others_time_clearly_faster():
    """Timed back to back at build the torch layers come close to the NumPy ones; in a run they cost 1.5x (host.py)."""
    from types import SimpleNamespace

    torch_layers, numpy_layers = SimpleNamespace(takes_lists=False), HostDecoder.__new__(HostDecoder)
    assert pick([1.0, 1.1], [torch_layers, numpy_layers]) == 1  # 10% slower when timed: the NumPy layers kept
    assert pick([1.0, 1.3], [torch_layers, numpy_layers]) == 0  # 30% slower: the torch layers
    assert pick([1.2, 1.0], [torch_layers, torch_layers]) == 1  # no NumPy candidate: the fastest


def test_the_compiled_top_k_is_torchs_softmax_top_k():
    torch.manual_seed(0)
    logits = torch.randn(5, 640) * 4
    logits[3, 200] = logits[3, 100] = logits[3].max() + 1  # a tie at the top: the lower token first
    probs, tokens = compiled_mod.top_candidates(logits, 10)
    want_p, want_t = torch.topk(torch.softmax(logits, -1), 10, dim=-1)
    assert [row for i, row in enumerate(tokens) if i != 3] == [row for i, row in enumerate(want_t.tolist()) if i != 3]
    assert tokens[3][:2] == [100, 200] and tokens[3][2:] == want_t[3, 2:].tolist()
    assert np.allclose(probs, want_p.numpy(), rtol=2e-6, atol=1e-9)
    assert compiled_mod.top_candidates(logits.to(torch.bfloat16), 10) is None  # not float32: torch ranks them


def test_the_compiled_exp_is_exp_to_float32_precision():
    x = np.linspace(-87, 88, 20001, dtype=np.float32)
    got = np.array([compiled_mod._exp(np.float32(v)) for v in x[::50]], dtype=np.float64)
    want = np.exp(x[::50].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 5e-7
    assert 0 < compiled_mod._exp(np.float32(-np.inf)) < 2e-38  # clamped: a masked score's weight, then set to 0


def test_the_engine_loads_the_compiled_top_k_when_it_is_built(monkeypatch):
    """Its first call in a process takes ~0.4 s even from Numba's disk cache: in a run's first drafted step the cost
    meter took it for the price of drafting and turned the run (and the next ones) to plain steps."""
    calls = []
    jit = compiled_mod._top_jit
    monkeypatch.setattr(compiled_mod, "_top_jit", lambda logits, k: calls.append(k) or jit(logits, k))
    SpecEngine(pair_for("qwen2.5-vl"))
    assert calls


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_on_the_compiled_layers_gives_its_last_rows_top_k_from_the_same_call(kind):
    """forward(top=k): the compiled layers rank the last row's candidates (over the shared vocabulary) in the call that
    computes the logits, the same candidates the separate compiled top-k gives; the NumPy layers leave it to it."""
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    runner = _draft_runner(pair.draft)
    runner.fused, runner.stack_checked, runner.vocab_limit = _host(runner, kind), True, 250
    runner.prefill(prep.for_draft())
    n = runner.seq_len
    read = runner.forward([5, 9, 11], [n, n + 1, n + 2], np.tril(np.ones((3, 3), bool)), top=10)
    assert read.logits.shape[-1] == 250
    if kind == "numpy":
        assert read.top is None
        return
    assert read.top == compiled_mod.top_candidates(read.logits[-1:], 10)
    n += 3
    assert runner.forward([7], [n], np.ones((1, 1), bool)).top is None  # not asked for
    assert runner.forward([7], [n + 1], np.ones((1, 1), bool), top=251).top is None  # more than the shared tokens


def test_the_engine_loads_the_compiled_read_when_it_is_built(monkeypatch):
    """Built, the engine has loaded the compiled read in the specialisation a run calls (warm's toy arguments have the
    real types): a run's first drafted step does not compile or load it."""
    if compiled_mod._read_jit is None:
        pytest.skip("Numba is not installed")
    _prefer(monkeypatch, "numba")
    pair = pair_for("qwen2.5-vl")
    engine = SpecEngine(pair)
    loaded = list(compiled_mod._read_jit.jitted.signatures)
    assert loaded and engine.draft.tree_forward == "fused+numba"
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    res = engine.generate(prep, "sage", max_new_tokens=12, ignore_eos=True)
    assert any(s.draft_forwards for s in res.steps)  # it drafted: the draft read with its top-k
    assert list(compiled_mod._read_jit.jitted.signatures) == loaded
