"""Draft-only visual-token pruning: exact when nothing is pruned, lossless when something is."""

import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.core.runner import ModelRunner
from sage_engine.models.pruning import VisualPruning, keep_indices
from sage_testing.tiny_pairs import clip, image, llava_pair, qwen25_pair


def test_keep_indices_keeps_text_and_an_even_share_of_each_visual_kind():
    ids = torch.tensor([1, 2] + [9] * 10 + [3] + [8] * 20 + [4])
    keep = keep_indices(ids, {9: 0.8, 8: 0.9})
    kept = ids[keep].tolist()
    assert kept.count(9) == 2 and kept.count(8) == 2
    assert [t for t in kept if t not in (8, 9)] == [1, 2, 3, 4]
    assert keep.tolist() == sorted(keep.tolist())
    nines = [i for i in keep.tolist() if ids[i] == 9]
    assert nines == [2, 11]  # first and last of the run: evenly spaced


def _cases():
    return [(qwen25_pair, {"images": [image(1, 112)]}), (qwen25_pair, {"video": clip(2, 8, 112)}),
            (llava_pair, {"images": [image(3)]})]


@pytest.mark.parametrize("builder,media", _cases())
def test_zero_pruning_through_the_capture_path_equals_a_normal_prefill(builder, media):
    pair = builder("copy", seed=0)
    prep = prepare_input(pair, "describe", **media)
    plain, pruned = ModelRunner(pair.draft), ModelRunner(pair.draft)
    a = plain.prefill(prep.target_inputs).logits
    b = pruned.prefill(prep.target_inputs, VisualPruning(image=0.0, video=0.0)).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert plain.rope_delta == pruned.rope_delta and plain.seq_len == pruned.seq_len


@pytest.mark.parametrize("builder,media", _cases())
def test_pruned_draft_reads_fewer_tokens_and_output_is_unchanged(builder, media):
    pair = builder("noisy", seed=1)
    prep = prepare_input(pair, "describe", **media)
    ar = SpecEngine(pair).generate(prep, "ar", 24, ignore_eos=True).token_ids
    engine = SpecEngine(pair, draft_pruning=VisualPruning())
    for policy in ("chain", "sage", "eagle2"):
        assert engine.generate(prep, policy, 24, ignore_eos=True).token_ids == ar, policy
    r = ModelRunner(pair.draft)
    r.prefill(prep.target_inputs, VisualPruning())
    assert r.seq_len < prep.prompt_tokens


def test_specvlm_prunes_its_own_draft_the_engine_setting_wins_and_text_reads_whole():
    """`specvlm`'s draft reads 20% of an image's visual tokens (its own VisualPruning); an engine's draft_pruning
    replaces it, (0, 0) reads the whole prompt, and a prompt without media is never pruned; the output is ar's."""
    from sage_engine.policies import make_policy

    pair = qwen25_pair("noisy", seed=1)
    prep = prepare_input(pair, "describe", images=[image(1, 112)])
    engine = SpecEngine(pair)
    ar = engine.generate(prep, "ar", 24, ignore_eos=True).token_ids
    policy = make_policy("specvlm")
    assert engine.pruning_for(policy, prep) == VisualPruning(0.8, 0.9)
    assert engine.generate(prep, policy, 24, ignore_eos=True).token_ids == ar
    assert engine.draft.seq_len < engine.target.seq_len  # the draft's cache holds fewer prompt columns
    assert engine.pruning_for(make_policy("specvlm:image_prune=0.5"), prep) == VisualPruning(0.5, 0.9)
    assert engine.pruning_for(make_policy("eagle2"), prep) is None
    engine.draft_pruning = VisualPruning(0.0, 0.0)
    assert engine.pruning_for(policy, prep) is None  # the engine's setting wins, and (0, 0) prunes nothing
    assert engine.generate(prep, policy, 24, ignore_eos=True).token_ids == ar
    engine.draft_pruning = None
    text = prepare_input(pair, "describe")
    assert engine.pruning_for(policy, text) is None
