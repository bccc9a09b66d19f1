"""Family adapters (sage_engine/models/families.py): each config maps to its adapter, token ids and position rule;
unknown model types fall back to a stated default; the adapters drive pruning on the tiny families."""

import warnings

import pytest
import torch

from sage_engine.errors import ModelError
from sage_engine.models import families as fam
from sage_engine.models.families import adapter_for, shared_vocab
from sage_engine.models.loading import check_same_visual_tokens

IMG, VID = 91, 92  # token ids given to the tiny configs (any ids: the adapters must read them back)


def _configs():
    """Tiny configs of every registered family, built the way tests/tiny_families.py builds them."""
    from transformers import (
        Gemma3Config,
        Gemma3nConfig,
        Gemma3TextConfig,
        Idefics3Config,
        Lfm2VlConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaOnevisionConfig,
        MllamaConfig,
        PaliGemmaConfig,
        Qwen2_5_VLConfig,
        Qwen2Config,
        Qwen2VLConfig,
        Qwen3_5Config,
        Qwen3_5MoeConfig,
        Qwen3VLConfig,
        Qwen3VLMoeConfig,
        SmolVLMConfig,
    )

    text = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2)
    mrope = dict(text, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})
    return {
        "qwen2_5_vl": Qwen2_5_VLConfig(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        "qwen2_vl": Qwen2VLConfig(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        # llava-hf configs on the hub still say image_token_index / video_token_index
        "llava_onevision": LlavaOnevisionConfig(text_config=Qwen2Config(**text).to_dict(),
                                                image_token_index=IMG, video_token_index=VID),
        "llava": LlavaConfig(text_config=LlamaConfig(**text).to_dict(), image_token_index=IMG),
        "smolvlm": SmolVLMConfig(text_config=LlamaConfig(**text).to_dict(), image_token_id=IMG),
        "idefics3": Idefics3Config(text_config=LlamaConfig(**text).to_dict(), image_token_id=IMG),
        "qwen3_vl": Qwen3VLConfig(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        "qwen3_vl_moe": Qwen3VLMoeConfig(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        "gemma3": Gemma3Config(text_config=Gemma3TextConfig(**text).to_dict(), image_token_index=IMG),
        "qwen3_5": Qwen3_5Config(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        "qwen3_5_moe": Qwen3_5MoeConfig(text_config=mrope, image_token_id=IMG, video_token_id=VID),
        "paligemma": PaliGemmaConfig(text_config=dict(text, model_type="gemma"), image_token_index=IMG),
        "mllama": MllamaConfig(text_config=dict(text, cross_attention_layers=[0]), image_token_index=IMG),
        # the model reads image_token_id (a hub config's image_token_index stays beside it, unread)
        "gemma3n": Gemma3nConfig(text_config=dict(text, model_type="gemma3n_text", num_kv_shared_layers=0),
                                 vision_config={"architecture": "test_resnet"}, image_token_id=IMG),
        "lfm2_vl": Lfm2VlConfig(text_config=dict(text, model_type="lfm2"), image_token_id=IMG),
    }


EXPECTED = {  # model_type: (adapter, position rule, visual token ids, takes video, LM submodule)
    "qwen2_5_vl": (fam.QWEN2_5_VL, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "qwen2_vl": (fam.QWEN2_VL, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "llava_onevision": (fam.LLAVA_ONEVISION, "1d", {"image": IMG, "video": VID}, True, "language_model"),
    "llava": (fam.LLAVA, "1d", {"image": IMG}, False, "language_model"),
    "smolvlm": (fam.SMOLVLM, "1d", {"image": IMG}, True, "text_model"),  # video frames are <image> tokens
    "idefics3": (fam.IDEFICS3, "1d", {"image": IMG}, False, "text_model"),
    "qwen3_vl": (fam.QWEN3_VL, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "qwen3_vl_moe": (fam.QWEN3_VL, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "gemma3": (fam.GEMMA3, "1d", {"image": IMG}, False, "language_model"),  # hub configs: image_token_index
    "qwen3_5": (fam.QWEN3_5, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "qwen3_5_moe": (fam.QWEN3_5, "mrope", {"image": IMG, "video": VID}, True, "language_model"),
    "paligemma": (fam.PALIGEMMA, "1d", {"image": IMG}, False, "language_model"),  # positions from 1
    "mllama": (fam.MLLAMA, "1d", {"image": IMG}, False, "language_model"),  # one token an image, cross-attention
    "gemma3n": (fam.GEMMA3N, "1d", {"image": IMG}, False, "language_model"),  # audio ids: not visual, not pruned
    "lfm2_vl": (fam.LFM2_VL, "1d", {"image": IMG}, False, "language_model"),  # short convolutions: read as paths
}


@pytest.mark.parametrize("model_type", EXPECTED)
def test_each_family_config_maps_to_its_adapter(model_type):
    cfg = _configs()[model_type]
    assert cfg.model_type == model_type
    adapter, rule, ids, video, lm = EXPECTED[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a registered family never warns
        got = adapter_for(cfg)
    assert got is adapter and got.verified
    assert got.positions.name == rule
    assert got.visual_token_ids(cfg) == ids
    assert got.supports_video is video
    assert got.lm_attrs[0] == lm


def test_every_registered_family_is_in_the_table_above():
    assert set(fam.FAMILIES) == set(EXPECTED)


def test_unknown_vlm_falls_back_to_the_generic_1d_adapter_with_a_warning():
    from transformers import LlavaNextConfig

    cfg = LlavaNextConfig(image_token_index=IMG)
    fam._warned.discard(cfg.model_type)
    with pytest.warns(UserWarning, match="no family adapter; using generic"):
        got = adapter_for(cfg)
    assert got is fam.GENERIC and not got.verified
    assert got.positions.name == "1d" and got.visual_token_ids(cfg) == {"image": IMG}
    assert got.supports_video  # the processor decides (process() checks for a video processor)


def test_unknown_mrope_model_falls_back_to_generic_mrope():
    class Inner(torch.nn.Module):
        rope_deltas = None  # what transformers' M-RoPE models (Qwen3-VL, GLM-4V, ...) cache

    class Mystery(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Cfg", (), {"model_type": "mystery_vl", "vision_config": {}, "image_token_id": IMG})()
            self.model = Inner()

    with pytest.warns(UserWarning, match="generic-mrope"):
        got = adapter_for(Mystery())
    assert got is fam.GENERIC_MROPE and got.positions.name == "mrope"
    from transformers import Glm4vConfig  # config only: an mrope_section in the rope parameters says so

    cfg = Glm4vConfig()
    cfg.text_config.rope_parameters = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 12, 12]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert adapter_for(cfg) is fam.GENERIC_MROPE


def test_a_plain_text_lm_gets_the_text_adapter_silently():
    from transformers import Qwen2Config

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = adapter_for(Qwen2Config())
    assert got is fam.TEXT and got.positions.name == "1d" and got.visual_token_ids(Qwen2Config()) == {}


def test_position_rules_read_and_reset_the_model_state():
    class Inner(torch.nn.Module):
        rope_deltas = torch.tensor([[-7]])

    model = torch.nn.Module()
    model.model = Inner()
    assert fam.MRoPE().shift_after_prefill(model) == -7 and fam.Positions1D().shift_after_prefill(model) == 0
    fam.MRoPE().reset(model)
    assert model.model.rope_deltas is None and fam.MRoPE().shift_after_prefill(model) == 0
    four = torch.arange(4 * 5).view(4, 1, 5)  # text row + 3 rotary rows
    assert torch.equal(fam.MRoPE().prompt_positions(four, 5, "cpu"), four[1:])
    assert fam.MRoPE().prompt_positions(None, 5, "cpu").shape == (3, 1, 5)
    assert fam.Positions1D().prompt_positions(None, 5, "cpu").tolist() == [[0, 1, 2, 3, 4]]


def test_processor_kwargs_pass_the_sampled_frames_with_their_metadata():
    from sage_testing.tiny_pairs import clip

    c = clip(0)
    kw = fam.QWEN2_5_VL.processor_kwargs(c)
    assert kw["do_sample_frames"] is False and kw["video_metadata"][0]["fps"] == c.fps
    assert kw["videos"][0] is c.frames and fam.SMOLVLM.processor_kwargs(None) == {}


def test_pairs_with_different_visual_token_ids_are_refused():
    cfgs = _configs()
    check_same_visual_tokens(cfgs["qwen2_5_vl"], cfgs["qwen2_vl"])  # same ids: fine
    check_same_visual_tokens(cfgs["llava"], cfgs["llava_onevision"])  # only the image kind in common
    other = _configs()["qwen2_vl"]
    other.video_token_id = VID + 1
    with pytest.raises(ModelError, match="different video token ids"):
        check_same_visual_tokens(cfgs["qwen2_5_vl"], other)


# ---------------------------------------------------------------- the adapters on the tiny families' models
_pairs: dict = {}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pair(name):
    from tiny_families import llava_ov_pair, qwen2vl_pair, smolvlm_pair

    if name == "smolvlm":
        pytest.importorskip("num2words", reason="SmolVLMProcessor needs num2words")
    if name not in _pairs:
        _pairs[name] = {"qwen2-vl": qwen2vl_pair, "llava-onevision": llava_ov_pair,
                        "smolvlm": smolvlm_pair}[name]("independent", seed=0)
    return _pairs[name]


@pytest.mark.parametrize("name,adapter", [("qwen2-vl", fam.QWEN2_VL), ("llava-onevision", fam.LLAVA_ONEVISION),
                                          ("smolvlm", fam.SMOLVLM)])
@pytest.mark.parametrize("medium", ["image", "video"])
def test_zero_pruning_through_each_family_adapter_equals_a_normal_prefill(name, adapter, medium):
    """The adapter's LM submodule, token ids and position rows reproduce the normal prefill exactly."""
    from sage_engine import prepare_input
    from sage_engine.core.runner import ModelRunner
    from sage_engine.models.pruning import VisualPruning
    from sage_testing.tiny_pairs import clip, image

    pair = _pair(name)
    assert adapter_for(pair.target) is adapter and adapter_for(pair.draft) is adapter
    media = {"images": [image(5)]} if medium == "image" else {"video": clip(5)}
    prep = prepare_input(pair, "describe", **media)
    inputs = prep.for_draft()
    ids = set(inputs["input_ids"][0].tolist())
    assert set(adapter.visual_token_ids(pair.draft.config).values()) & ids  # the prompt has its visual tokens
    plain, pruned = ModelRunner(pair.draft), ModelRunner(pair.draft)
    a = plain.prefill(inputs).logits
    b = pruned.prefill(inputs, VisualPruning(image=0.0, video=0.0)).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert plain.rope_delta == pruned.rope_delta and plain.seq_len == pruned.seq_len
    if adapter.positions.name == "mrope":
        assert plain.rope_delta != 0  # the visual prefix shifts the text: the rule read a real delta
    few = ModelRunner(pair.draft)
    few.prefill(inputs, VisualPruning(image=0.5, video=0.5))
    assert few.seq_len < plain.seq_len and few.rope_delta > plain.rope_delta


def test_shared_vocab_cuts_only_the_padding_rows():
    pair = _pair("llava-onevision")  # the independent draft has 64 more (padding) rows
    rows = fam.vocab_rows
    assert rows(pair.draft) == rows(pair.target) + 64
    assert shared_vocab(pair.target, pair.draft) == rows(pair.target) == len(pair.tokenizer)
