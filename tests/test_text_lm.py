"""Text-only LMs: a checkpoint with no vision_config loads as a causal LM with its tokenizer as the processor, decodes
losslessly through every policy, refuses images and video in one line, and runs from the CLI; a VLM target with a
text-only draft is refused, a text-only target with a VLM draft (same tokenizer) is used on text."""

import os
import subprocess
import sys

import pytest
import torch

from sage_engine.cli import main
from sage_engine.core.engine import SpecEngine
from sage_engine.errors import InputError, ModelError
from sage_engine.models.inputs import prepare_input
from sage_engine.models.loading import is_text_only, is_tokenizer, load_pair
from sage_testing.tiny_pairs import LLAVA_TEMPLATE, image, llama_text_pair, llama_text_tokenizer

ROOT = os.path.dirname(os.path.dirname(__file__))
PROMPT = "describe the image in detail please"


def save(model, processor, path) -> str:
    model.save_pretrained(path)  # safetensors
    processor.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def text_dirs(tmp_path_factory):
    """A tiny Llama text target and its noisy copy, saved like hub checkpoints (safetensors + tokenizer)."""
    pair = llama_text_pair("noisy", seed=3, sigma=0.05, sharpness=8.0)
    root = tmp_path_factory.mktemp("tiny_llama_text")
    return save(pair.target, pair.processor, root / "target"), save(pair.draft, pair.processor, root / "draft")


@pytest.fixture(scope="module")
def text_pair(text_dirs):
    return load_pair(*text_dirs)


def test_a_text_checkpoint_loads_as_a_causal_lm_with_its_tokenizer(text_pair):
    from transformers import LlamaForCausalLM

    assert isinstance(text_pair.target, LlamaForCausalLM) and isinstance(text_pair.draft, LlamaForCausalLM)
    assert is_tokenizer(text_pair.processor) and text_pair.tokenizer is text_pair.processor
    assert text_pair.draft_processor is None  # one tokenizer: the draft reads the target's ids
    assert is_text_only(text_pair.target.config)


def test_the_prompt_goes_through_the_tokenizers_chat_template(text_pair):
    prep = prepare_input(text_pair, PROMPT)
    assert set(prep.target_inputs) == {"input_ids", "attention_mask"} and prep.draft_inputs is None
    tok = text_pair.tokenizer
    text = tok.decode(prep.target_inputs["input_ids"][0])
    assert text.startswith("<|begin_of_text|><|start_header_id|>user") and PROMPT in text  # one BOS, the template's
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    tok_plain = llama_text_tokenizer()
    tok_plain.chat_template = None  # no template: the plain prompt
    from sage_engine.models.inputs import process

    plain = process(tok_plain, PROMPT, [], None)["input_ids"][0].tolist()
    assert tok_plain.decode(plain, skip_special_tokens=True) == PROMPT


@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_every_policy_writes_the_targets_own_tokens(text_pair, policy):
    engine = SpecEngine(text_pair)
    prep = prepare_input(text_pair, PROMPT)
    ar = engine.generate(prep, "ar", max_new_tokens=24)
    res = engine.generate(prep, policy, max_new_tokens=24)
    assert res.token_ids == ar.token_ids and len(ar.token_ids) > 1
    assert res.stats.mean_accepted > 1.0  # the noisy copy agrees often: the tree path really ran


def test_an_image_or_a_video_for_a_text_pair_is_one_line(text_pair):
    with pytest.raises(InputError, match=r"^this model pair is text-only: it takes no image$"):
        prepare_input(text_pair, PROMPT, images=[image(0)])
    with pytest.raises(InputError, match=r"^this model pair is text-only: it takes no video$"):
        prepare_input(text_pair, PROMPT, video="/no/such/clip.mp4")  # refused before the file is read


def tiny_llava_on(text_target, tok):
    """A tiny LLaVA whose language model is `text_target`'s (its vocabulary plus <image>), with the official
    LlavaProcessor over `tok`."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    proc = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 56},
                                                             crop_size={"height": 56, "width": 56}),
                          tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)
    text_cfg = text_target.config.to_dict() | {"vocab_size": len(tok)}
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                     num_attention_heads=2, image_size=56, patch_size=14).to_dict(),
                      text_config=text_cfg, image_token_id=tok.convert_tokens_to_ids("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(7)
    vlm = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # the text model's weights; the extra <image> row stays random
        for name, p in text_target.model.state_dict().items():
            dst = vlm.model.language_model.state_dict()[name]
            dst[: p.shape[0]].copy_(p)
        vlm.lm_head.weight[: text_target.lm_head.weight.shape[0]].copy_(text_target.lm_head.weight)
    return vlm, proc


def test_mixed_pairs_a_vlm_target_with_a_text_draft_is_refused_the_other_way_runs(text_dirs, tmp_path):
    text_target = load_pair(text_dirs[0], None).target
    tok = llama_text_tokenizer()
    tok.add_tokens(["<image>"], special_tokens=True)  # the text tokenizer's ids, plus one
    tok.image_token = "<image>"
    vlm_dir = save(*tiny_llava_on(text_target, tok), tmp_path / "vlm")
    with pytest.raises(ModelError) as err:
        load_pair(vlm_dir, text_dirs[1])
    assert "\n" not in str(err.value) and "text-only" in str(err.value)

    pair = load_pair(text_dirs[0], vlm_dir)  # a text target: text prompts only, which the VLM draft reads
    assert is_tokenizer(pair.processor) and pair.draft_processor is None
    engine = SpecEngine(pair)
    prep = prepare_input(pair, PROMPT)
    ar = engine.generate(prep, "ar", max_new_tokens=16)
    res = engine.generate(prep, "sage", max_new_tokens=16)
    assert res.token_ids == ar.token_ids and res.stats.mean_accepted > 1.0
    with pytest.raises(InputError, match="text-only"):
        prepare_input(pair, PROMPT, images=[image(0)])


def test_a_qwen3_text_pair_is_exact_too(tmp_path):
    """Qwen3's text LM (q/k norms: no fused layers, its own layers run) through every drafting policy."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sage_testing.tiny_pairs import _draft, sharpen

    tok = llama_text_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    target = sharpen(Qwen3ForCausalLM(cfg).eval(), 8.0)
    dirs = [save(m, tok, tmp_path / n) for n, m in (("t", target), ("d", _draft(target, "noisy", 0, 0.05, None)))]
    pair = load_pair(*dirs)
    engine = SpecEngine(pair)
    prep = prepare_input(pair, PROMPT)
    ar = engine.generate(prep, "ar", max_new_tokens=16)
    for policy in ("chain", "static", "eagle2", "sage"):
        assert engine.generate(prep, policy, max_new_tokens=16).token_ids == ar.token_ids, policy


def test_a_text_preset_without_a_hub_fails_fast_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        load_pair("llama-3.1-8b/3.2-1b", device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and "meta-llama/Llama-3.1-8B-Instruct" in msg and "unreachable" in msg


def test_text_presets_plan_their_placement_from_the_configs():
    """--device auto|multi plans from the configs on the meta device: a text LM's config builds its causal LM."""
    from transformers import LlamaConfig

    from sage_engine.models.placement import plan_placement

    target = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
    draft = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True)
    plan = plan_placement(target, draft, 1, 80.0)
    assert plan.mode == "cuda" and plan.no_split == ("LlamaDecoderLayer",)
    assert 15e9 < plan.target_bytes < 17e9  # Llama-3.1-8B in bf16: 8.03B parameters


def run_main(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_generate_decodes_a_text_pair(text_dirs, capsys):
    import json

    common = ["generate", "--prompt", PROMPT, "--max-new-tokens", "16", "--target", text_dirs[0],
              "--draft", text_dirs[1], "--json"]
    code, out, _ = run_main(capsys, *common, "--policy", "ar")
    ar = json.loads(out)
    code2, out, _ = run_main(capsys, *common, "--policy", "sage")
    assert code == code2 == 0 and json.loads(out)["token_ids"] == ar["token_ids"] and ar["token_ids"]


def test_cli_image_for_a_text_pair_exits_2_with_one_line(text_dirs, tmp_path):
    image(0).save(tmp_path / "a.png")
    proc = subprocess.run([sys.executable, "-m", "sage_engine", "generate", "--prompt", PROMPT, "--image",
                           str(tmp_path / "a.png"), "--target", text_dirs[0], "--draft", text_dirs[1]],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: this model pair is text-only: it takes no image"
