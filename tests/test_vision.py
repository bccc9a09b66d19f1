"""The vision tower in fewer calls (vision.py): its features close to the tower's own on pictures of several windows,
several pictures and a clip; used only for Qwen2.5-VL-structured float32 towers; inside the runner, kept after the
prompt check and dropped (the fused layers kept) when it is wrong."""

import pytest
import torch
from test_prompt import _checked_runner, _forward
from test_stack import pair_for
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from sage_engine import SpecEngine, prepare_input
from sage_engine.backends import vision_tower as vision_mod
from sage_engine.backends.choose import near
from sage_engine.backends.vision_tower import FusedVision, fused_vision
from sage_engine.core.runner import ModelRunner
from sage_testing.tiny_pairs import image

PATCH = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


def _windowed_model() -> Qwen2_5_VLForConditionalGeneration:
    """A tiny Qwen2.5-VL whose tower has window attention in block 0 and full attention in block 1; windows of 2 x 2
    merged cells (56 pixels), so an 8 x 8-patch picture has 4 windows."""
    torch.manual_seed(0)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           fullatt_block_indexes=[1], window_size=56, initializer_range=0.2),
    )
    return Qwen2_5_VLForConditionalGeneration(cfg).eval()


@pytest.mark.parametrize("grid", [[[1, 8, 8]], [[1, 8, 8], [1, 4, 6]], [[2, 6, 4]]],
                         ids=["picture", "two pictures", "clip"])
def test_the_fused_tower_gives_the_towers_own_features(grid):
    model = _windowed_model()
    tower = model.model.visual
    vision = fused_vision(model)
    assert vision is not None
    grid = torch.tensor(grid)
    pixels = torch.randn(int(grid.prod(-1).sum()), PATCH)
    with torch.inference_mode():
        want = tower(pixels, grid_thw=grid).pooler_output
        got = vision(pixels, grid)
    assert got.shape == want.shape
    assert near(got, want) and (got - want).abs().max() <= 1e-5 * want.abs().max()
    plan = vision.plan(grid)
    assert plan.masks[0] is not None  # block 0 attends within windows: the input exercises them
    if grid[0].tolist() == [1, 8, 8]:  # four windows: the rows are reordered, and put back
        assert not torch.equal(plan.back, torch.arange(plan.back.shape[0]))
        assert not near(got[plan.back], want)  # the control: the rows left in window order are caught


def test_only_a_tower_of_that_structure_in_float32_is_fused():
    assert fused_vision(pair_for("llava").target) is None  # another tower (and no mm_encoder_outputs)
    assert fused_vision(pair_for("qwen2-vl").target) is None  # Qwen2-VL: LayerNorms, fc1 / fc2 MLP, no windows
    model = _windowed_model()
    assert isinstance(fused_vision(model), FusedVision)
    assert fused_vision(model.to(torch.bfloat16)) is None


def test_the_runner_prompt_goes_through_the_fused_tower(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(4)])
    runner = _checked_runner(pair.target, prep.target_inputs)
    assert runner.prompts.state is True and runner.prompts.vision is not None and runner.prompt_path == "fused+vision"
    calls = []
    monkeypatch.setattr(FusedVision, "__call__", lambda self, *a, _orig=FusedVision.__call__: (
        calls.append(1), _orig(self, *a))[1])
    got = runner.prefill(prep.target_inputs).logits
    assert calls == [1]
    ref = runner._logits(_forward(pair.target, prep.target_inputs)[0])
    assert near(got, ref, argmax=True)


def test_a_wrong_fused_tower_is_dropped_and_the_fused_layers_kept(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(5)])
    monkeypatch.setattr(FusedVision, "__call__", lambda self, *a, _orig=FusedVision.__call__: 1.5 * _orig(self, *a))
    runner = ModelRunner(pair.target, backend="auto")
    assert runner.prompts.vision is not None
    # the control is real: the slip changes the prompt's logits beyond the check's tolerance
    with torch.inference_mode():
        slipped = runner.prompts.vision.encoded(prep.target_inputs)
        ref = _forward(pair.target, prep.target_inputs)[0]
        bad = pair.target(**slipped, logits_to_keep=1).logits[0, -1]
    assert not near(bad, ref)
    runner = _checked_runner(pair.target, prep.target_inputs)
    assert runner.prompts.vision is None and runner.prompts.state is True and runner.prompt_path == "fused"
    got = runner.prefill(prep.target_inputs).logits
    assert near(got, runner._logits(ref), argmax=True)


def test_the_engine_reads_pictures_through_the_fused_tower_only_with_fused_layers():
    pair = pair_for("qwen2.5-vl")
    assert SpecEngine(pair).target.prompt_path == "fused+vision"
    assert SpecEngine(pair).draft.prompt_path == "fused+vision"
    exact = SpecEngine(pair, tree_forward="layers")  # the target on its own modules: its prompts through forward()
    assert exact.target.prompt_path == "forward" and exact.target.prompts.vision is None


def test_a_picture_of_more_patches_than_the_plans_take_goes_through_forward(monkeypatch):
    pair = pair_for("qwen2.5-vl")
    prep = prepare_input(pair, "describe what you see", images=[image(7)])
    runner = _checked_runner(pair.target, prep.target_inputs)
    assert runner.prompt_path == "fused+vision"
    monkeypatch.setattr(vision_mod, "MAX_PATCHES", 1)
    got = runner.prefill(prep.target_inputs).logits
    assert torch.equal(got, runner._logits(_forward(pair.target, prep.target_inputs)[0]))  # forward()'s own numbers
    assert runner.prompt_path == "fused+vision"  # the path stays for the pictures it takes
