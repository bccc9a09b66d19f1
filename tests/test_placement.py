"""Multi-GPU placement: plans for the REAL 72B/7B pairs (meta device, no weights), and an execution test
where accelerate dispatches a tiny target over CPU + disk through its hooks and equivalence still holds.

Config values are those of the public config.json files cited in sage_engine/models/presets.py:
Qwen2.5-VL-72B-Instruct [q25-72b, q2-72b], Qwen2.5-VL-7B-Instruct [q25-7b], and the llava-hf
LLaVA-OneVision 72B/7B conversions [ov-conv] (Qwen2-72B/7B text, SigLIP-so400m minus its last layer).
"""

import copy

import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.errors import ModelError
from sage_engine.models.loading import ModelPair
from sage_engine.models.placement import GiB, meta_model, plan_placement
from sage_testing.tiny_pairs import clip, image, qwen25_pair

QWEN25_VISION = dict(depth=32, hidden_size=1280, num_heads=16, patch_size=14, spatial_merge_size=2,
                     temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}


def qwen25_vl(size: str):
    from transformers import Qwen2_5_VLConfig

    sizes = {"72b": (8192, 29568, 80, 64, 8, 3456), "7b": (3584, 18944, 28, 28, 4, 3420)}
    h, ffn, layers, heads, kv, vis_ffn = sizes[size]  # vision FFN: 3456 in 72B [q25-72b], 3420 in 7B [q25-7b]
    return Qwen2_5_VLConfig(
        text_config=dict(vocab_size=152064, hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=128000,
                         rope_parameters=MROPE, tie_word_embeddings=False),
        vision_config=dict(QWEN25_VISION, intermediate_size=vis_ffn, out_hidden_size=h),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False,
    )


def llava_onevision(size: str):
    from transformers import LlavaOnevisionConfig, Qwen2Config, SiglipVisionConfig

    h, ffn, layers, heads, kv = {"72b": (8192, 29568, 80, 64, 8), "7b": (3584, 18944, 28, 28, 4)}[size]
    return LlavaOnevisionConfig(
        text_config=Qwen2Config(vocab_size=152128, hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=32768,
                                rope_theta=1e6, tie_word_embeddings=False).to_dict(),
        vision_config=SiglipVisionConfig(hidden_size=1152, image_size=384, intermediate_size=4304,
                                         num_attention_heads=16, num_hidden_layers=26, patch_size=14,
                                         vision_use_head=False).to_dict(),
        image_token_index=151646, video_token_index=151647, vision_feature_select_strategy="full",
        vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9", tie_word_embeddings=False,
    )


FAMILIES = {"qwen2.5-vl": qwen25_vl, "llava-onevision": llava_onevision}
_configs: dict = {}


def config(family: str, size: str):
    if (family, size) not in _configs:
        _configs[family, size] = FAMILIES[family](size)
    return _configs[family, size]


def owner(name: str, device_map: dict) -> str | None:
    """The device-map key that places module/parameter `name` (itself or its nearest ancestor)."""
    for key in device_map:
        if key == "" or name == key or name.startswith(key + "."):
            return key
    return None


@pytest.mark.parametrize("family", FAMILIES)
def test_72b_target_fits_four_80gb_gpus_with_the_7b_draft_alone_on_the_last(family):
    plan = plan_placement(config(family, "72b"), config(family, "7b"), n_gpus=4, gpu_memory_gb=80,
                          dtype="bfloat16", device="multi")
    target = meta_model(config(family, "72b"), torch.bfloat16)
    params = sum(p.numel() for p in target.parameters())
    assert 70e9 < params < 76e9 and 130 * GiB < plan.target_bytes < 145 * GiB  # a real 72B in bf16
    assert 7 * GiB < plan.draft_bytes < 17 * GiB  # a real 7B
    dm = plan.target_device_map
    assert plan.mode == "multi" and plan.draft_device == "cuda:3" and not plan.draft_shares_gpu
    assert set(dm.values()) == {0, 1, 2} and plan.target_device == "cuda:0"  # the draft's GPU is its own

    # every parameter is placed, on a GPU
    assert all(owner(n, dm) is not None for n, _ in target.named_parameters())
    # no module the model declares unsplittable (decoder layers, vision blocks) is cut across devices
    whole = [n for n, m in target.named_modules() if type(m).__name__ in plan.no_split]
    assert len(whole) >= 80 and any("DecoderLayer" in c for c in plan.no_split)
    assert all(owner(n, dm) is not None and not any(k.startswith(n + ".") for k in dm) for n in whole)
    # every GPU stays under its 80 GB minus 10% headroom, and the load is balanced
    load = {g: 0 for g in range(3)}
    for name, p in target.named_parameters():
        load[dm[owner(name, dm)]] += p.numel() * 2
    assert max(load.values()) <= 0.9 * 80 * GiB
    assert min(load.values()) > 0.25 * plan.target_bytes, load


def test_planner_falls_back_to_cpu_without_a_gpu():
    plan = plan_placement(config("qwen2.5-vl", "7b"), config("qwen2.5-vl", "7b"), n_gpus=0, gpu_memory_gb=0,
                          dtype="bfloat16", device="auto")
    assert (plan.mode, plan.target_device, plan.draft_device, plan.target_device_map) == ("cpu", "cpu", "cpu", None)
    with pytest.raises(ModelError, match="needs a GPU"):
        plan_placement(config("qwen2.5-vl", "7b"), None, n_gpus=0, gpu_memory_gb=0, device="multi")


def test_auto_puts_a_7b_pair_on_one_gpu_and_refuses_a_72b_pair_that_cannot_fit():
    small = plan_placement(config("qwen2.5-vl", "7b"), config("qwen2.5-vl", "7b"), n_gpus=2, gpu_memory_gb=80)
    assert (small.mode, small.target_device, small.draft_device) == ("cuda", "cuda:0", "cuda:0")
    with pytest.raises(ModelError, match="target needs"):
        plan_placement(config("qwen2.5-vl", "72b"), config("qwen2.5-vl", "7b"), n_gpus=1, gpu_memory_gb=80)
    offloaded = plan_placement(config("qwen2.5-vl", "72b"), config("qwen2.5-vl", "7b"), n_gpus=1,
                               gpu_memory_gb=80, allow_offload=True)
    assert {0, "cpu"} <= set(offloaded.target_device_map.values()) and offloaded.draft_device == "cuda:0"


def test_two_gpus_too_small_for_the_target_alone_share_the_draft_gpu():
    plan = plan_placement(config("llava-onevision", "72b"), config("llava-onevision", "7b"), n_gpus=2,
                          gpu_memory_gb=[141, 141], device="multi")  # 2 x H200: 127 GiB usable is < 136 GiB
    assert plan.draft_shares_gpu and set(plan.target_device_map.values()) == {0, 1} and plan.draft_device == "cuda:1"


# ---------------------------------------------------------------- execution through accelerate's hooks

@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # shared machine; a tiny model gains nothing from threads
    yield
    torch.set_num_threads(before)


def test_target_dispatched_over_cpu_and_disk_still_decodes_exactly_like_ar(tmp_path, one_thread):
    from accelerate import dispatch_model
    from accelerate.utils import infer_auto_device_map

    pair = qwen25_pair("noisy", seed=4)
    reference = SpecEngine(pair)  # the undispatched target gives the reference tokens
    target = copy.deepcopy(pair.target)
    size = sum(p.numel() * p.element_size() for p in target.parameters())
    no_split = list(target._no_split_modules)
    device_map = infer_auto_device_map(target, max_memory={"cpu": size // 2}, no_split_module_classes=no_split)
    assert {"cpu", "disk"} <= set(device_map.values())  # part in RAM, part offloaded to disk
    assert device_map[owner("model.language_model.embed_tokens", device_map)] == "disk"  # the runner must cope
    dispatched = dispatch_model(target, device_map=device_map, offload_dir=str(tmp_path / "offload"))
    assert dispatched.get_input_embeddings().weight.device.type == "meta"  # weights live on disk, hooks load them
    engine = SpecEngine(ModelPair(dispatched, pair.draft, pair.processor, None, "dispatched", "draft"))
    assert engine.target.device == torch.device("cpu")
    for media in ({"images": [image(6)]}, {"video": clip(6)}):
        prep = prepare_input(pair, "describe what you see", **media)
        ar = reference.generate(prep, "ar", max_new_tokens=24, ignore_eos=True).token_ids
        for policy in ("ar", "chain", "static", "eagle2", "sage"):
            assert engine.generate(prep, policy, max_new_tokens=24, ignore_eos=True).token_ids == ar, policy
