"""KV-cache compaction: moved columns are exact, and a compacted cache continues like sequential decoding; the fused
layers' preallocated buffers compact in one move to the same columns."""

import dataclasses

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import sage_engine.core.cache as cache_module
from sage_engine.core.cache import KVBuffers, compact, copy_cache
from sage_engine.core.runner import ModelRunner
from sage_engine.core.tree import DraftTree, verify_allowed
from sage_engine.errors import ModelError
from sage_testing.tiny_pairs import image, qwen25_pair


def test_compact_moves_kept_columns_to_the_front_of_the_region():
    cache = DynamicCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(keys.clone(), keys.clone() * 10, 0)
    compact(cache, start=4, keep=[0, 3, 5])
    layer = cache.layers[0]
    assert layer.keys.shape == (1, 2, 7, 3)
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 7, 9]
    assert layer.values[0, 1, :, 2].tolist() == [0, 10, 20, 30, 40, 70, 90]
    assert cache.get_seq_length() == 7


def test_compact_keeping_the_whole_region_in_place_touches_nothing_and_a_prefix_crops():
    cache = DynamicCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1)
    cache.update(keys.clone(), keys.clone(), 0)
    before = cache.layers[0].keys
    compact(cache, start=7, keep=[0, 1, 2])  # a plain step's column, or a tree accepted whole
    assert cache.layers[0].keys is before and cache.get_seq_length() == 10
    compact(cache, start=7, keep=[0, 1])  # a prefix of the region: the rest is dropped
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == list(range(9))
    compact(cache, start=7, keep=[1])  # moved: not a no-op even though the count fits
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 8]


def test_compact_refuses_layers_that_are_not_plain_columns_even_where_nothing_moves():
    """transformers' rolling window layer keeps the newest columns, rejected branches among them; the runner gives
    windowed layers plain ones (layer_kinds.py), and compaction refuses any other kind in one line."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = DynamicCache()
    cache.layers = [DynamicSlidingWindowLayer(sliding_window=8)]
    cache.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2), 0)
    with pytest.raises(ModelError, match="DynamicSlidingWindowLayer"):
        compact(cache, start=3, keep=[0])


def _prompt_and_tree():
    """A tiny Qwen2.5-VL pair, a picture prompt, and a five-node tree with two branches at the root."""
    pair = qwen25_pair("noisy", seed=4)
    from sage_engine import prepare_input

    prep = prepare_input(pair, "describe the picture", images=[image(4)])
    tree = DraftTree()
    for tok, parent in [(40, -1), (41, -1), (42, 0), (43, 1), (44, 1)]:
        tree.add(tok, parent, 0.5)
    return pair, prep, tree


@torch.inference_mode()
def test_compacted_cache_gives_the_same_next_logits_as_sequential_decoding():
    pair, prep, tree = _prompt_and_tree()
    root, path, nxt = 17, [1, 3], 55  # the accepted path node 1 -> node 3: a non-prefix set of columns

    spec = ModelRunner(pair.target)
    spec.prefill(prep.target_inputs)
    L = spec.seq_len
    spec.forward([root] + tree.tokens, [L] + [L + d for d in tree.depths], verify_allowed(tree.parents))
    spec.keep(L, [0] + [1 + n for n in path])
    got = spec.forward([nxt], [spec.seq_len], np.ones((1, 1), dtype=bool)).logits

    seq = ModelRunner(pair.target)
    seq.prefill(prep.target_inputs)
    for tok in [root] + [tree.tokens[n] for n in path]:
        seq.forward([tok], [seq.seq_len], np.ones((1, 1), dtype=bool))
    want = seq.forward([nxt], [seq.seq_len], np.ones((1, 1), dtype=bool)).logits
    assert spec.seq_len == seq.seq_len == L + 1 + len(path) + 1
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@torch.inference_mode()
def test_tree_logits_equal_sequential_logits_for_every_node():
    pair = qwen25_pair("noisy", seed=5)
    from sage_engine import prepare_input

    prep = prepare_input(pair, "describe the picture", images=[image(5)])
    tree = DraftTree()
    for tok, parent in [(40, -1), (41, -1), (42, 0), (43, 0), (44, 2)]:
        tree.add(tok, parent, 0.5)
    root = 17
    r = ModelRunner(pair.target)
    r.prefill(prep.target_inputs)
    L = r.seq_len
    logits = r.forward([root] + tree.tokens, [L] + [L + d for d in tree.depths], verify_allowed(tree.parents)).logits
    for node in range(len(tree)):
        s = ModelRunner(pair.target)
        s.prefill(prep.target_inputs)
        for tok in [root] + [tree.tokens[n] for n in tree.path_to(node)]:
            last = s.forward([tok], [s.seq_len], np.ones((1, 1), dtype=bool)).logits
        assert torch.allclose(logits[1 + node], last[0], atol=1e-5)


def _buffered_cache(buffers: KVBuffers, n: int, seed: int = 0) -> DynamicCache:
    """A cache of buffers.shape[0] layers whose first n columns are random and whose layers view `buffers`."""
    L, _, KV, _, hd = buffers.shape
    cache = DynamicCache()
    for i in range(L):
        cache.update(torch.zeros(1, KV, 0, hd, dtype=buffers.keys.dtype), torch.zeros(1, KV, 0, hd,
                                                                                       dtype=buffers.keys.dtype), i)
    g = torch.Generator().manual_seed(seed)
    assert buffers.reserve(cache.layers, n) == 0
    for k, v in buffers.views:
        k[:, :, :n] = torch.randn(k[:, :, :n].shape, generator=g).to(k.dtype)
        v[:, :, :n] = torch.randn(v[:, :, :n].shape, generator=g).to(v.dtype)
    buffers.publish(cache.layers, n)
    return cache


@pytest.mark.parametrize("dtype", ["float32 compiled", "float32 numpy", torch.bfloat16])  # the compiled move,
# NumPy's (no Numba) and torch's (no NumPy bf16)
@pytest.mark.parametrize("keep", [[0, 3, 5], [2], [], [0, 1, 2, 4], [4, 1, 6], [0, 1, 2]])  # [4, 1, 6]: not in order;
# [0, 1, 2]: the region's first columns (a chain accepted along its first nodes), a crop with nothing to gather
def test_a_buffered_cache_compacts_in_one_move_to_what_the_layer_by_layer_compaction_gives(dtype, keep, monkeypatch):
    if dtype == "float32 numpy":
        monkeypatch.setattr(cache_module, "_move_jit", None)
    elif dtype == "float32 compiled" and cache_module._move_jit is None:
        pytest.skip("Numba is not installed")
    gathers = []
    gather = cache_module._move_jit or cache_module._move_columns
    monkeypatch.setattr(cache_module, "_move_jit", lambda *a: gathers.append(1) or gather(*a))
    dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    buffers = KVBuffers(3, 2, 4, dtype)
    cache = _buffered_cache(buffers, 12)
    assert (buffers.arrays is not None) == (dtype == torch.float32)
    twin = copy_cache(cache)  # independent tensors: compacted layer by layer
    compact(cache, 5, keep, buffers)
    compact(twin, 5, keep)
    n = 5 + len(keep)
    assert buffers.length == twin.get_seq_length() == n
    # the layers keep the views they had (12 columns) until the next publish: their first n are the kept ones
    assert buffers.length_of(cache.layers[0].keys) == n  # the runner's seq_len reads this
    assert buffers.length_of(twin.layers[0].keys) is None  # keys that are not the published view: their own length
    for got, want, (k, _) in zip(cache.layers, twin.layers, buffers.views):
        assert torch.equal(got.keys[:, :, :n], want.keys) and torch.equal(got.values[:, :, :n], want.values)
        assert got.keys.data_ptr() == k.data_ptr()  # still the buffers' own columns: the next forward writes after them
    assert buffers.owns(cache.layers)
    buffers.publish(cache.layers, buffers.length)  # as the next forward does
    assert cache.get_seq_length() == n == buffers.length_of(cache.layers[0].keys)
    assert all(torch.equal(got.keys, want.keys) for got, want in zip(cache.layers, twin.layers))
    assert bool(gathers) == (dtype == torch.float32 and keep != list(range(len(keep))))  # a crop gathers nothing


def test_buffers_leave_a_cache_they_do_not_hold_to_the_layer_by_layer_compaction():
    buffers = KVBuffers(2, 1, 4)
    cache = _buffered_cache(buffers, 9)
    other = copy_cache(cache)
    assert not buffers.owns(other.layers) and not buffers.move(other.layers, 3, [1])
    before = buffers.keys[:, :, :, :9].clone()  # the columns in use (the rest is uninitialised memory, NaN at times)
    compact(other, 3, [1, 4], buffers)
    assert torch.equal(buffers.keys[:, :, :, :9], before) and other.get_seq_length() == 5
    assert cache.get_seq_length() == 9
    cache.layers[0].keys = cache.layers[0].keys[:, :, :8]  # changed behind the buffers' back: not theirs any more
    assert not buffers.owns(cache.layers)


@torch.inference_mode()
def test_the_fused_target_writes_its_steps_into_its_buffers_and_keeps_the_accepted_path_in_one_move():
    pair, prep, tree = _prompt_and_tree()
    runs = {}
    for name in ("buffers", "concatenation"):
        r = ModelRunner(pair.target, backend="auto")
        r.prefill(prep.target_inputs)
        r.forward([9], [r.seq_len], np.ones((1, 1), dtype=bool))  # the layers' check, on a plain step
        assert r.tree_forward == "fused" and r.fused.buffers is not None
        if name == "concatenation":
            r.fused = dataclasses.replace(r.fused, buffers=None)
        L = r.seq_len
        verify = r.forward([17] + tree.tokens, [L] + [L + d for d in tree.depths], verify_allowed(tree.parents))
        r.keep(L, [0, 2, 4])  # the root, node 1, node 3: moved
        assert r.seq_len == L + 3  # the buffers' length, where the layers keep their longer views until the next pass
        if name == "buffers":
            assert r.fused.buffers.owns(r.cache.layers)
            assert r.cache.layers[0].keys.data_ptr() == r.fused.buffers.views[0][0].data_ptr()
        after = r.forward([55], [r.seq_len], np.ones((1, 1), dtype=bool))
        runs[name] = verify.logits, after.logits, [layer.keys.clone() for layer in r.cache.layers]
    (v1, a1, k1), (v2, a2, k2) = runs.values()
    assert torch.allclose(v1, v2, atol=1e-5) and torch.allclose(a1, a2, atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(k1, k2))


@torch.inference_mode()
def test_each_prompt_gets_its_own_empty_cache_and_the_template_stays_empty():
    pair, prep, _ = _prompt_and_tree()
    runner = ModelRunner(pair.target)
    runner.prefill(prep.target_inputs)
    first, n = runner.cache, runner.seq_len
    runner.forward([17], [n], np.ones((1, 1), dtype=bool))
    runner.prefill(prep.target_inputs)  # a second prompt: a fresh copy of the template, not the first run's cache
    assert runner.cache is not first and runner.seq_len == n and first.get_seq_length() == n + 1
    template = runner._empty
    assert template is not None and template.get_seq_length() == 0
    assert not any(layer.is_initialized for layer in template.layers)
    assert len(template.layers) == len(runner.cache.layers)
