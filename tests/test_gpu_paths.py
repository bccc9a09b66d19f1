"""The engine's GPU paths, run on the CPU: each branch a GPU takes is driven here with the same logic, so that no
CUDA-only line goes untested. A GPU's draft takes the top-k in torch (one copy to the host per level), its verify
pass reads the rows' argmax to the host in the pass (which also waits for it, so no synchronize of its own), and a
pass without a read is followed by one torch.cuda.synchronize."""

import numpy as np
import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.backends import numba_layers
from sage_engine.core.passes import rows_argmax
from sage_engine.core.tree import chain_allowed, verify_allowed
from sage_engine.evaluation.doctor import syncs
from sage_testing.tiny_pairs import image, sharp_pair


@pytest.fixture(scope="module")
def case():
    pair = sharp_pair("qwen2.5-vl", "noisy")
    return pair, prepare_input(pair, "describe what you see", images=[image(10)])


def test_rows_argmax_off_the_cpu_is_the_same_host_array():
    logits = torch.randn(5, 40)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: the first index, as torch's argmax
    on, off = rows_argmax(logits, on_cpu=True), rows_argmax(logits, on_cpu=False)
    assert isinstance(off, np.ndarray) and off.tolist() == on.tolist() == logits.argmax(-1).tolist()
    assert off[2] == 7


def test_the_drafts_torch_top_k_equals_ar_and_copies_once_per_level(case, monkeypatch):
    """Without the compiled top-k (a GPU's logits are not on the CPU), the draft ranks in torch: every policy still
    writes ar's tokens, and each level reads its top-k to the host once."""
    pair, prep = case
    monkeypatch.setattr(numba_layers, "top_candidates", lambda logits, k: None)
    engine = SpecEngine(pair, tree_forward="layers")
    reference = engine.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids
    for policy in ("chain", "eagle2", "sage", "sage:threshold=paper:d_max=8"):
        assert engine.generate(prep, policy, max_new_tokens=24, ignore_eos=True).token_ids == reference, policy
    with syncs.watch("cpu") as census:
        res = engine.generate(prep, "chain", max_new_tokens=24, ignore_eos=True)
    drafted = [s for s in res.steps if s.kind == "decode" and s.draft_forwards]
    draft_reads = {step: n for (stage, step), n in census.by_step.items() if stage == "draft"}
    assert drafted and all(draft_reads[s.step] == s.draft_forwards for s in drafted)
    assert {op for (stage, site, op) in census.by_site if stage == "draft"} == {"tolist"}


def test_a_pass_on_a_gpu_synchronises_once_unless_its_argmax_read_waited(case, monkeypatch):
    """The runner's CUDA branch with the CPU's tensors: a draft pass (no read in it) calls torch.cuda.synchronize
    once, so that its time is the pass's; a verify pass that reads its argmax calls none."""
    pair, prep = case
    engine = SpecEngine(pair, tree_forward="layers")
    runner = engine.target
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    runner.prefill(prep.target_inputs)
    runner._cuda = True  # the branch a GPU takes; the tensors stay on the CPU
    start = runner.seq_len
    runner.forward([5], [start], chain_allowed(1))
    runner.keep(start, [])
    assert len(calls) == 1
    verified = runner.forward([5, 6, 7], [start, start + 1, start + 1], verify_allowed([-1, -1]), argmax=True)
    assert len(calls) == 1 and isinstance(verified.argmax, np.ndarray) and verified.argmax.shape == (3,)
