"""Configs of the tinyworld pair (Qwen2.5-VL architecture) and its processor.

Small models on a CPU are bound by per-layer framework overhead, so the draft has two text layers and one vision
block, the target six text layers and two vision blocks (`TARGET`, `DRAFT`).
"""
from __future__ import annotations

import dataclasses

from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

from .world import MODEL_FRAMES, SIZE


@dataclasses.dataclass(frozen=True)
class PairMember:
    hidden: int          # text hidden size
    layers: int          # text decoder layers
    heads: int           # attention heads (head_dim = hidden / heads)
    kv_heads: int        # key/value heads (GQA)
    ffn: int             # MLP intermediate size
    vis_hidden: int      # vision tower width
    vis_depth: int       # vision blocks
    vis_heads: int       # vision attention heads


TARGET = PairMember(hidden=256, layers=6, heads=4, kv_heads=2, ffn=768, vis_hidden=128, vis_depth=2, vis_heads=4)
DRAFT = PairMember(hidden=128, layers=2, heads=2, kv_heads=1, ffn=192, vis_hidden=64, vis_depth=1, vis_heads=2)
TINY = PairMember(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, vis_hidden=32, vis_depth=1, vis_heads=2)  # tests


def mrope_section(head_dim: int, interleaved: bool = False) -> list[int]:
    """How the head_dim / 2 rotary frequencies are shared by the (temporal, height, width) positions.

    Qwen2.5-VL gives chunk i of `mrope_section` to axis i % 3. Qwen's own split ([16, 24, 24] of 64) gives the
    width the lowest frequencies: on a 3 x 3 grid a step of one column turns a query by at most 0.003 rad
    (rope_theta 1e4), so attention in the language model can hardly tell columns apart. interleaved=True: one
    frequency per chunk, t/h/w in turn (as Qwen3-VL does), so each axis gets high and low frequencies (a column
    step: up to 0.6 rad). Text tokens (t = h = w) rotate the same either way. The shipped pair interleaves
    (TrainConfig.interleaved_rope)."""
    half = head_dim // 2
    if interleaved:
        return [1] * half
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_config(m: PairMember, tokenizer, interleaved_rope: bool = False) -> Qwen2_5_VLConfig:
    head_dim = m.hidden // m.heads
    text = dict(
        vocab_size=len(tokenizer), hidden_size=m.hidden, intermediate_size=m.ffn, num_hidden_layers=m.layers,
        num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "mrope_section": mrope_section(head_dim, interleaved_rope)},
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    vision = dict(
        depth=m.vis_depth, hidden_size=m.vis_hidden, intermediate_size=2 * m.vis_hidden, num_heads=m.vis_heads,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2, window_size=SIZE,
        out_hidden_size=m.hidden, fullatt_block_indexes=[m.vis_depth - 1],
    )
    cfg = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    return cfg


def build_model(m: PairMember, tokenizer, seed: int = 0,
                interleaved_rope: bool = False) -> Qwen2_5_VLForConditionalGeneration:
    import torch
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(build_config(m, tokenizer, interleaved_rope))
    gc = model.generation_config
    gc.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    gc.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    gc.do_sample = False
    return model


def build_processor(tokenizer) -> Qwen2_5_VLProcessor:
    """Images of SIZE x SIZE stay as they are (9 visual tokens, one per cell); videos arrive pre-decoded,
    MODEL_FRAMES frames (kept in the video processor config as `num_frames`)."""
    pix = SIZE * SIZE
    image = Qwen2VLImageProcessor(min_pixels=pix, max_pixels=pix, size={"shortest_edge": pix, "longest_edge": pix})
    video = Qwen2VLVideoProcessor(size={"shortest_edge": pix, "longest_edge": pix}, num_frames=MODEL_FRAMES,
                                  do_sample_frames=False, min_frames=MODEL_FRAMES, max_frames=MODEL_FRAMES)
    return Qwen2_5_VLProcessor(image_processor=image, video_processor=video, tokenizer=tokenizer,
                               chat_template=tokenizer.chat_template)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())
