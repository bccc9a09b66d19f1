"""Tiny random-init VLMs of three more real architectures, built from configs (no download).

Same style as sage_testing/tiny_pairs.py (whose tokenizer trainer and draft helpers are reused here):
each builder returns a ModelPair with the architecture's OFFICIAL processor class over a BPE
tokenizer trained in-process, and a draft that is a noisy copy of the target, an exact copy,
or an independent smaller model of the same family.

  - qwen2vl_pair      Qwen2-VL (M-RoPE, 3D video positions), Qwen2VLProcessor
  - llava_ov_pair     LLaVA-OneVision (SigLIP + Qwen2, anyres tiles + newline tokens, pooled video),
                      LlavaOnevisionProcessor; the draft's embedding matrix is padded to more rows
                      than the target's (as llava-hf pads 0.5B and 7B/72B differently)
  - smolvlm_pair      SmolVLM2 / Idefics3 (pixel shuffle, image splitting, timestamped video frames),
                      SmolVLMProcessor; the independent draft has another image-token layout
                      (tile size and tokens per tile), so it gets its own processor, as the real
                      SmolVLM2-2.2B / 256M pair needs
"""

from __future__ import annotations

import torch

from sage_engine.models.loading import ModelPair
from sage_testing.tiny_pairs import QWEN_SPECIALS, QWEN_TEMPLATE, _draft, train_tokenizer

QWEN_EXTRA = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}

OV_TEMPLATE = (  # llava-hf's LLaVA-OneVision template: images, then videos, then text, per message
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for item in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}{% endfor %}"
    "{% for item in message['content'] | selectattr('type', 'equalto', 'text') %}{{ item['text'] }}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOL_TEMPLATE = (  # SmolVLM2's template shape: "User:<image>text<end_of_utterance>\nAssistant:"
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'image' %}<image>{% elif item['type'] == 'video' %}<video>{% endif %}{% endfor %}"
    "{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def qwen2vl_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1) -> ModelPair:
    """Tiny Qwen2-VL (M-RoPE) target and draft with the official Qwen2VLProcessor."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = train_tokenizer(QWEN_SPECIALS, QWEN_EXTRA, QWEN_TEMPLATE)
    size = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(size=size),
                            video_processor=Qwen2VLVideoProcessor(size=size), tokenizer=tok,
                            chat_template=QWEN_TEMPLATE)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in QWEN_EXTRA.items()}

    def build(layers: int, s: int):
        torch.manual_seed(s)
        cfg = Qwen2VLConfig(
            text_config=dict(
                vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
                initializer_range=0.2, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
            ),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                               initializer_range=0.2),
            image_token_id=ids["image_token"], video_token_id=ids["video_token"],
            vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"],
            eos_token_id=tok.eos_token_id,
        )
        return Qwen2VLForConditionalGeneration(cfg).eval()

    target = build(2, seed)
    draft = _draft(target, draft_kind, seed, sigma, lambda: build(1, seed + 1000))
    return ModelPair(target, draft, proc, None, "tiny-qwen2-vl", f"tiny-qwen2-vl-{draft_kind}")


def llava_ov_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1) -> ModelPair:
    """Tiny LLaVA-OneVision (SigLIP + Qwen2) with the official LlavaOnevisionProcessor.

    The independent draft's embedding matrix has 64 more rows than the target's (padding only:
    the tokenizer is shared), like llava-hf's 0.5B (152000 rows) vs 7B/72B (152128 rows).
    """
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
        Qwen2Config,
        SiglipVisionConfig,
    )

    tok = train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"],
                          {"image_token": "<image>", "video_token": "<video>"}, OV_TEMPLATE)
    pinpoints = [[28, 28], [28, 56], [56, 28], [56, 56]]
    img = LlavaOnevisionImageProcessor(size={"height": 28, "width": 28}, crop_size={"height": 28, "width": 28},
                                       image_grid_pinpoints=pinpoints)
    vid = LlavaOnevisionVideoProcessor(size={"height": 28, "width": 28}, crop_size={"height": 28, "width": 28})
    proc = LlavaOnevisionProcessor(image_processor=img, video_processor=vid, tokenizer=tok, num_image_tokens=4,
                                   vision_feature_select_strategy="full", chat_template=OV_TEMPLATE)

    def build(layers: int, s: int, pad_rows: int = 0):
        torch.manual_seed(s)
        cfg = LlavaOnevisionConfig(
            vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14,
                                             vision_use_head=False).to_dict(),
            text_config=Qwen2Config(vocab_size=len(tok) + pad_rows, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=2048, initializer_range=0.2,
                                    eos_token_id=tok.eos_token_id).to_dict(),
            image_token_index=tok.convert_tokens_to_ids("<image>"),
            video_token_index=tok.convert_tokens_to_ids("<video>"),
            vision_feature_select_strategy="full", vision_feature_layer=-1,
            image_grid_pinpoints=pinpoints, vision_aspect_ratio="anyres_max_9",
        )
        model = LlavaOnevisionForConditionalGeneration(cfg).eval()
        with torch.no_grad():  # random init leaves image_newline at zero scale; give it signal
            model.model.image_newline.normal_(0, 0.2)
        return model

    target = build(2, seed)
    draft = _draft(target, draft_kind, seed, sigma, lambda: build(1, seed + 1000, pad_rows=64))
    return ModelPair(target, draft, proc, None, "tiny-llava-onevision", f"tiny-llava-onevision-{draft_kind}")


def _smol_processor(tok, tile: int, seq_len: int, frames: int):
    from transformers import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    img = SmolVLMImageProcessor(size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile},
                                do_image_splitting=True)
    vid = SmolVLMVideoProcessor(video_sampling={"fps": 1, "max_frames": frames, "video_size": {"longest_edge": tile}},
                                max_image_size={"longest_edge": tile})
    return SmolVLMProcessor(image_processor=img, video_processor=vid, tokenizer=tok, image_seq_len=seq_len,
                            chat_template=SMOL_TEMPLATE)


def smolvlm_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1) -> ModelPair:
    """Tiny SmolVLM2 (Idefics3-style: SigLIP + pixel shuffle + Llama) with the official SmolVLMProcessor.

    Target: 28-px tiles, patch 7, scale factor 2 -> 4 image tokens per tile (like 2.2B's 384/14/3 -> 81).
    Independent draft: 32-px tiles, patch 8, scale factor 4 -> 1 token per tile (like 256M's 512/16/4 -> 64),
    so the draft gets its own processor and its own (shorter) prompt; the tokenizer is shared.
    """
    from transformers import LlamaConfig, SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMVisionConfig

    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>", "<video>"] + [f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4)]
    tok = train_tokenizer(specials, {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                                     "global_image_token": "<global-img>", "video_token": "<video>",
                                     "end_of_utterance_token": "<end_of_utterance>"}, SMOL_TEMPLATE)
    tok.eos_token = "<end_of_utterance>"  # SmolVLM2 stops on <end_of_utterance>
    proc = _smol_processor(tok, tile=28, seq_len=4, frames=4)

    def build(layers: int, s: int, tile: int, patch: int, scale: int):
        torch.manual_seed(s)
        cfg = SmolVLMConfig(
            vision_config=SmolVLMVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=tile, patch_size=patch,
                                              initializer_range=0.2).to_dict(),
            text_config=LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=2048, initializer_range=0.2,
                                    eos_token_id=tok.eos_token_id, pad_token_id=0).to_dict(),
            scale_factor=scale, image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=0,
        )
        return SmolVLMForConditionalGeneration(cfg).eval()

    target = build(2, seed, tile=28, patch=7, scale=2)
    draft_proc = None
    if draft_kind == "independent":
        draft = build(1, seed + 1000, tile=32, patch=8, scale=4)
        draft_proc = _smol_processor(tok, tile=32, seq_len=1, frames=4)
    else:
        draft = _draft(target, draft_kind, seed, sigma, None)
    return ModelPair(target, draft, proc, draft_proc, "tiny-smolvlm", f"tiny-smolvlm-{draft_kind}")
