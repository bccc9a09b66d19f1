"""Tiny random models of current architectures and their layer kinds (layer_kinds.py), built from transformers 5.23
configs with no download: what the equivalence tests and `sage doctor` check windows, chunks, sinks and the families
of today on, and what they check the engine refuses.

  name             transformers class                       layer kinds (2 layers; windows and chunks of 8)
  ---------------  ---------------------------------------  -------------------------------------------------
  mistral          MistralForCausalLM                       sliding, sliding
  gemma3-text      Gemma3ForCausalLM                        sliding, full
  gpt-oss          GptOssForCausalLM (eager: sinks, MoE)    sliding + sinks, full + sinks
  llama4-text      Llama4ForCausalLM (MoE)                  chunked, full
  gemma3           Gemma3ForConditionalGeneration           sliding, full; SigLIP, 4 tokens an image
  qwen3-vl         Qwen3VLForConditionalGeneration          full, full; interleaved M-RoPE, DeepStack
  qwen3-vl-moe     Qwen3VLMoeForConditionalGeneration       full, full; MoE
  qwen3.5          Qwen3_5ForConditionalGeneration          gated delta rule, full; interleaved M-RoPE, partial rotary
  qwen3.5-moe      Qwen3_5MoeForConditionalGeneration       the same, MoE
  qwen3-next       Qwen3NextForCausalLM (MoE)               gated delta rule, full
  falcon-h1        FalconH1ForCausalLM                      Mamba-2 beside attention
  paligemma        PaliGemmaForConditionalGeneration        full, full (Gemma); SigLIP, 16 tokens an image, a prefix
                                                            that attends both ways, positions from 1
  paligemma2       the same over Gemma 2                    sliding, full
  mamba            MambaForCausalLM                         Mamba-1 (refused whole: its own cache_params)
  mamba2           Mamba2ForCausalLM                        Mamba-2 (refused whole: its own cache_params)
  nemotron-h       NemotronHForCausalLM                     Mamba-2, full, MLP-only (refused: a "dummy" layer type)
  gemma3n-text     Gemma3nForCausalLM (AltUp, LAuReL,       sliding, full, then both again reading the first two's
                   per-layer inputs, activation sparsity)   keys and values (num_kv_shared_layers=2)
  lfm2             Lfm2ForCausalLM                          short convolution, full, short convolution, full
  gemma3n          Gemma3nForConditionalGeneration          as gemma3n-text; a tiny timm ResNet tower, 4 soft tokens an
                                                            image; image and audio ids in their own vocabulary ranges
  lfm2-vl          Lfm2VlForConditionalGeneration           short convolution, full (LFM2); SigLIP2 NaFlex, 16 px
                                                            patches merged 2x2, 4 to 16 tokens an image
  mllama           MllamaForConditionalGeneration           full, cross-attention to the image, full; up to two 28 px
                                                            tiles an image (a square one: one, and padding)

Text models take their tokenizer as the processor. Windows and chunks are 8 wide so that a test's prompt plus answer
(about 60 tokens) runs well past them. Heads are sharpened (tiny_pairs.sharpen) where the pair is to draft deep trees.
"""

from __future__ import annotations

import torch

from sage_engine.models.loading import ModelPair

from .tiny_pairs import QWEN_SPECIALS, QWEN_TEMPLATE, _draft, sharpen, train_tokenizer

WINDOW = 8
# Gemma 3 scales its embeddings by sqrt(hidden): at the others' 0.2 a random one repeats one token forever
GEMMA_INIT = 0.02
# PaliGemma 2 (Gemma 2 text): at 0.02 its attention is so flat that positions off by one barely move its logits; from
# 0.07 up it repeats one token. (PaliGemma over Gemma 1 takes the others' 0.2: below it, it repeats one token.)
PALIGEMMA2_INIT = 0.04
GEMMA3N_INIT = 0.03  # Gemma 3n: from 0.05 up its greedy answer settles on one token within 20
TEXT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT_KINDS = ("mistral", "gemma3-text", "gpt-oss", "llama4-text", "qwen3-next", "falcon-h1", "mamba", "mamba2",
              "nemotron-h", "gemma3n-text", "lfm2")
VLM_KINDS = ("gemma3", "qwen3-vl", "qwen3-vl-moe", "qwen3.5", "qwen3.5-moe", "paligemma", "paligemma2", "mllama",
             "lfm2-vl", "gemma3n")
# trees read path by path (recurrent_paths.py)
RECURRENT = ("qwen3.5", "qwen3.5-moe", "qwen3-next", "falcon-h1", "lfm2", "lfm2-vl")
REFUSED = ("nemotron-h",)  # trees refused in one line; `ar` runs
REFUSED_WHOLE = ("mamba", "mamba2")  # every policy refused in one line, `ar` included (ar_check.py)
QWEN_EXTRA = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}


def text_tokenizer():
    return train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], {}, TEXT_TEMPLATE)


def _text_common(tok, layers: int, init: float = 0.2) -> dict:
    return dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=init,
                eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)


def _pattern(kind: str, layers: int) -> list[str]:
    return [kind if i % 2 == 0 else "full_attention" for i in range(layers)]


def _gemma3n_text(common: dict, text_rows: int):
    """Gemma 3n's text model as both its builders make it: 4 layers, the last two sharing the first two's keys and
    values (num_kv_shared_layers=2), AltUp with 4 inputs (at GEMMA3N_INIT its greedy answer still varies past token
    20), LAuReL, per-layer inputs for the ids below `text_rows`, the first layer's activation sparsity."""
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(**dict(common, num_hidden_layers=4), head_dim=16, sliding_window=WINDOW,
                             num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2,
                             hidden_size_per_layer_input=8, vocab_size_per_layer_input=text_rows, laurel_rank=8,
                             altup_num_inputs=4, activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0])


def text_model(arch: str, tok, layers: int = 2, seed: int = 0):
    """A random-init text LM of `arch` (TEXT_KINDS) for `tok`'s ids."""
    import transformers as T

    torch.manual_seed(seed)
    c = _text_common(tok, layers, {"gemma3-text": GEMMA_INIT, "gemma3n-text": GEMMA3N_INIT}.get(arch, 0.2))
    if arch == "mistral":
        model = T.MistralForCausalLM(T.MistralConfig(**c, sliding_window=WINDOW))
    elif arch == "gemma3-text":
        model = T.Gemma3ForCausalLM(T.Gemma3TextConfig(**c, head_dim=16, sliding_window=WINDOW,
                                                        query_pre_attn_scalar=16,
                                                        layer_types=_pattern("sliding_attention", layers)))
    elif arch == "gpt-oss":
        c.update(intermediate_size=64)
        model = T.GptOssForCausalLM(T.GptOssConfig(**c, head_dim=16, sliding_window=WINDOW, num_local_experts=4,
                                                   num_experts_per_tok=2, attn_implementation="eager",
                                                   layer_types=_pattern("sliding_attention", layers)))
    elif arch == "llama4-text":
        model = T.Llama4ForCausalLM(T.Llama4TextConfig(**c, head_dim=16, intermediate_size_mlp=128,
                                                       attention_chunk_size=WINDOW, num_local_experts=4,
                                                       num_experts_per_tok=1, interleave_moe_layer_step=1,
                                                       no_rope_layers=[int(i % 2 == 0) for i in range(layers)],
                                                       layer_types=_pattern("chunked_attention", layers)))
    elif arch == "qwen3-next":
        model = T.Qwen3NextForCausalLM(T.Qwen3NextConfig(
            **c, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, layer_types=["linear_attention"] * (layers - 1) + ["full_attention"]))
    elif arch == "mamba":  # Mamba-1: its several-token passes do not continue its state, so trees are refused
        model = T.MambaForCausalLM(T.MambaConfig(vocab_size=len(tok), hidden_size=64, state_size=8,
                                                 num_hidden_layers=layers, eos_token_id=tok.eos_token_id,
                                                 pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    elif arch == "mamba2":  # keeps its own cache (cache_params): refused whole
        model = T.Mamba2ForCausalLM(T.Mamba2Config(vocab_size=len(tok), hidden_size=64, num_heads=4, head_dim=32,
                                                   state_size=16, n_groups=1, expand=2, chunk_size=16,
                                                   num_hidden_layers=layers, eos_token_id=tok.eos_token_id,
                                                   pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    elif arch == "nemotron-h":  # Mamba-2, attention and an MLP-only layer ("dummy" in transformers: refused)
        model = T.NemotronHForCausalLM(T.NemotronHConfig(
            **dict(c, num_hidden_layers=3), head_dim=16, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16,
            n_groups=1, mamba_chunk_size=16, hybrid_override_pattern="M*-"))
    elif arch == "gemma3n-text":
        model = T.Gemma3nForCausalLM(_gemma3n_text(c, len(tok)))
    elif arch == "lfm2":  # short convolutions (a state of the last conv_L_cache inputs) beside attention
        model = T.Lfm2ForCausalLM(T.Lfm2Config(**dict(c, num_hidden_layers=4), conv_L_cache=3,
                                               block_auto_adjust_ff_dim=False,
                                               layer_types=["conv", "full_attention"] * 2))
    elif arch == "falcon-h1":
        model = T.FalconH1ForCausalLM(T.FalconH1Config(**c, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
                                                       mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                                                       mamba_chunk_size=16))
    else:
        raise ValueError(f"unknown text architecture {arch!r}; choose one of {', '.join(TEXT_KINDS)}")
    return model.eval()


def text_pair(arch: str, draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.05,
              sharpness: float = 8.0) -> ModelPair:
    """A tiny text-LM pair of `arch` with its tokenizer as the processor; the draft a noisy copy ("noisy"), an exact
    one ("copy") or a one-layer model of the same architecture ("independent")."""
    tok = text_tokenizer()
    target = sharpen(text_model(arch, tok, 2, seed), sharpness)
    draft = _draft(target, draft_kind, seed, sigma, lambda: sharpen(text_model(arch, tok, 2, seed + 1000), sharpness))
    return ModelPair(target, draft, tok, None, f"tiny-{arch}", f"tiny-{arch}-{draft_kind}")


def qwen3_processor():
    """The official Qwen3VLProcessor over a tokenizer trained here (16 px patches, 2x2 merge), small images."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = train_tokenizer(QWEN_SPECIALS, QWEN_EXTRA, QWEN_TEMPLATE)
    size = {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(size=size, patch_size=16, merge_size=2),
                            video_processor=Qwen3VLVideoProcessor(size=size, patch_size=16, merge_size=2),
                            tokenizer=tok, chat_template=QWEN_TEMPLATE)


def _qwen3_ids(tok) -> dict:
    return dict(image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
                video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
                vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
                vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))


def vlm_model(arch: str, tok, layers: int = 2, seed: int = 0):
    """A random-init VLM of `arch` (VLM_KINDS) for `tok`'s ids (its processor's tokenizer)."""
    import transformers as T

    torch.manual_seed(seed)
    c = _text_common(tok, layers, {"gemma3": GEMMA_INIT, "paligemma2": PALIGEMMA2_INIT,
                                   "gemma3n": GEMMA3N_INIT}.get(arch, 0.2))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                  deepstack_visual_indexes=[0], initializer_range=0.2)
    mrope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    if arch == "qwen3-vl":
        cfg = T.Qwen3VLConfig(text_config=dict(**c, head_dim=16, rope_parameters=mrope), vision_config=vision,
                              **_qwen3_ids(tok))
        model = T.Qwen3VLForConditionalGeneration(cfg)
    elif arch == "qwen3-vl-moe":
        cfg = T.Qwen3VLMoeConfig(text_config=dict(**c, head_dim=16, rope_parameters=mrope, num_experts=4,
                                                  num_experts_per_tok=2, moe_intermediate_size=32),
                                 vision_config=vision, **_qwen3_ids(tok))
        model = T.Qwen3VLMoeForConditionalGeneration(cfg)
    elif arch in ("qwen3.5", "qwen3.5-moe"):
        rope = dict(mrope, partial_rotary_factor=0.5, mrope_section=[1, 1, 2])
        text = dict(**c, head_dim=16, rope_parameters=rope, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16,
                    layer_types=["linear_attention"] * (layers - 1) + ["full_attention"])
        vision = {k: v for k, v in vision.items() if k != "deepstack_visual_indexes"}
        if arch == "qwen3.5":
            model = T.Qwen3_5ForConditionalGeneration(T.Qwen3_5Config(text_config=text, vision_config=vision,
                                                                      **_qwen3_ids(tok)))
        else:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32)
            model = T.Qwen3_5MoeForConditionalGeneration(T.Qwen3_5MoeConfig(text_config=text, vision_config=vision,
                                                                            **_qwen3_ids(tok)))
    elif arch == "gemma3":
        cfg = T.Gemma3Config(
            text_config=T.Gemma3TextConfig(**c, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                           layer_types=_pattern("sliding_attention", layers)).to_dict(),
            vision_config=T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=28, patch_size=7,
                                               vision_use_head=False).to_dict(),
            mm_tokens_per_image=4, boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
            eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
            image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"))
        model = T.Gemma3ForConditionalGeneration(cfg)
    elif arch in ("paligemma", "paligemma2"):
        text = dict(**c, model_type="gemma" if arch == "paligemma" else "gemma2", head_dim=16)
        if arch == "paligemma2":
            text.update(sliding_window=WINDOW, query_pre_attn_scalar=16)
        cfg = T.PaliGemmaConfig(
            text_config=text, vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                                                 intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                 image_size=28, patch_size=7, projection_dim=64),
            image_token_index=tok.convert_tokens_to_ids("<image>"), projection_dim=64, hidden_size=64,
            vocab_size=len(tok))
        model = T.PaliGemmaForConditionalGeneration(cfg)
    elif arch == "mllama":  # layer 1 of 3 attends to the image's keys and values (cross_attention_layers)
        cfg = T.MllamaConfig(
            text_config=dict(**dict(c, num_hidden_layers=layers + 1), cross_attention_layers=[1],
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                               attention_heads=2, image_size=28, patch_size=14, max_num_tiles=2,
                               intermediate_layers_indices=[0], vision_output_dim=64,
                               supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]]),
            image_token_index=tok.convert_tokens_to_ids("<|image|>"))
        model = T.MllamaForConditionalGeneration(cfg)
        with torch.no_grad():  # random init leaves the cross-attention's gates at zero: the image would not count
            for layer in model.model.language_model.layers:
                for gate in ("cross_attn_attn_gate", "cross_attn_mlp_gate"):
                    if hasattr(layer, gate):
                        getattr(layer, gate).fill_(1.0)
    elif arch == "gemma3n":  # gemma3n-text's text model; the vision and audio vocabularies follow the text's
        text_rows = tok.convert_tokens_to_ids(GEMMA3N_TAIL[0])  # the tokenizer's text part: its ids below this
        text = _gemma3n_text(c, text_rows)
        vision = T.Gemma3nVisionConfig(architecture="test_resnet", hidden_size=96, vocab_size=4, vocab_offset=text_rows)
        audio = T.Gemma3nAudioConfig(hidden_size=32, conf_num_attention_heads=2, conf_num_hidden_layers=1,
                                     sscp_conv_channel_size=(8, 4), vocab_size=4, vocab_offset=text_rows + 4)
        ids = {name: tok.convert_tokens_to_ids(t) for name, t in GEMMA3N_SPECIALS.items()}
        cfg = T.Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio,
                              vision_soft_tokens_per_image=4, audio_soft_tokens_per_image=4,
                              **{f"{name.removesuffix('_token')}_token_id": i for name, i in ids.items()})
        model = T.Gemma3nForConditionalGeneration(cfg)
    elif arch == "lfm2-vl":
        cfg = T.Lfm2VlConfig(
            text_config=dict(**c, model_type="lfm2", conv_L_cache=3, block_auto_adjust_ff_dim=False,
                             layer_types=["conv", "full_attention"] * (layers // 2)),
            vision_config=dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, patch_size=16, num_patches=64,
                               vision_use_head=False),
            image_token_id=tok.convert_tokens_to_ids("<image>"), projector_hidden_size=64, downsample_factor=2)
        model = T.Lfm2VlForConditionalGeneration(cfg)
    else:
        raise ValueError(f"unknown VLM architecture {arch!r}; choose one of {', '.join(VLM_KINDS)}")
    return model.eval()


PALIGEMMA_TEMPLATE = (  # the picture first, then the prompt: PaliGemma's processor adds BOS and the closing newline
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def paligemma_processor():
    """The official PaliGemmaProcessor over a tokenizer trained here: 28 px images, 16 tokens each."""
    from transformers import PaliGemmaProcessor, SiglipImageProcessor

    tok = train_tokenizer(["<eos>", "<bos>", "<pad>", "<image>"], {"image_token": "<image>"}, PALIGEMMA_TEMPLATE)
    tok.bos_token = "<bos>"
    img = SiglipImageProcessor(size={"height": 28, "width": 28})
    img.image_seq_length = 16  # (28 / 7) ** 2 patches, each one token
    return PaliGemmaProcessor(image_processor=img, tokenizer=tok, chat_template=PALIGEMMA_TEMPLATE)


MLLAMA_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<|image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def mllama_processor():
    """The official MllamaProcessor over a tokenizer trained here: up to two 28 px tiles an image (a square picture
    takes one, and the other is padding its text must not see: the cross-attention mask says so)."""
    from transformers import MllamaImageProcessor, MllamaProcessor

    tok = train_tokenizer(["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|image|>", "<|python_tag|>"], {"image_token": "<|image|>"}, MLLAMA_TEMPLATE)
    tok.bos_token = "<|begin_of_text|>"
    img = MllamaImageProcessor(size={"height": 28, "width": 28}, max_image_tiles=2)
    return MllamaProcessor(image_processor=img, tokenizer=tok, chat_template=MLLAMA_TEMPLATE)


LFM2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Gemma 3n's image and audio tokens sit in vocabulary ranges of their own after the text's (the vision tower's
# `vocab_offset`, then the audio's): the tokenizer's last 8 ids, 4 for images and 4 for audio
GEMMA3N_TAIL = ("<end_of_image>", "<image_soft_token>", "<vision_2>", "<vision_3>",
                "<end_of_audio>", "<audio_soft_token>", "<audio_2>", "<audio_3>")
GEMMA3N_SPECIALS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>",
                    "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"}


def gemma3n_processor():
    """The official Gemma3nProcessor over a tokenizer trained here (its image and audio ids last, as the model's
    vocabulary ranges want), 64 px images of 4 soft tokens each."""
    from transformers import (
        Gemma3nAudioFeatureExtractor,
        Gemma3nProcessor,
        PreTrainedTokenizerFast,
        SiglipImageProcessor,
    )

    template = GEMMA_TEMPLATE.replace("<start_of_image>", "<image_soft_token>")  # Gemma 3n's template: the soft token
    base = train_tokenizer(["<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<start_of_audio>"], {},
                           template)
    raw = base.backend_tokenizer
    raw.add_special_tokens(list(GEMMA3N_TAIL))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", pad_token="<eos>",
                                  extra_special_tokens=GEMMA3N_SPECIALS)
    tok.chat_template = template
    img = SiglipImageProcessor(size={"height": 64, "width": 64})
    return Gemma3nProcessor(feature_extractor=Gemma3nAudioFeatureExtractor(), image_processor=img, tokenizer=tok,
                            chat_template=template, image_seq_length=4, audio_seq_length=4)


def lfm2_vl_processor():
    """The official Lfm2VlProcessor over a tokenizer trained here: one tile an image (no splitting), 4 to 16 tokens."""
    from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

    specials = {"image_token": "<image>", "image_start_token": "<|image_start|>", "image_end_token": "<|image_end|>",
                "image_thumbnail": "<|img_thumbnail|>"}
    tok = train_tokenizer(["<|im_end|>", "<|im_start|>", *specials.values()], specials, LFM2_VL_TEMPLATE)
    img = Lfm2VlImageProcessor(do_image_splitting=False, min_image_tokens=4, max_image_tokens=16,
                               encoder_patch_size=16, downsample_factor=2, max_num_patches=64, use_thumbnail=False)
    return Lfm2VlProcessor(image_processor=img, tokenizer=tok, chat_template=LFM2_VL_TEMPLATE)


GEMMA_TEMPLATE = (
    "{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def gemma3_processor():
    """The official Gemma3Processor over a tokenizer trained here: 28 px images, 4 soft tokens each."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    tok = train_tokenizer(["<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                           "<image_soft_token>"],
                          {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                           "image_token": "<image_soft_token>"}, GEMMA_TEMPLATE)
    img = Gemma3ImageProcessor(size={"height": 28, "width": 28}, do_pan_and_scan=False)
    return Gemma3Processor(image_processor=img, tokenizer=tok, image_seq_length=4, chat_template=GEMMA_TEMPLATE)


def vlm_pair(arch: str, draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.05,
             sharpness: float = 8.0) -> ModelPair:
    """A tiny VLM pair of `arch` with its official processor; drafts as in `text_pair`."""
    proc = {"gemma3": gemma3_processor, "paligemma": paligemma_processor, "paligemma2": paligemma_processor,
            "mllama": mllama_processor, "lfm2-vl": lfm2_vl_processor,
            "gemma3n": gemma3n_processor}.get(arch, qwen3_processor)()
    tok = proc.tokenizer
    target = sharpen(vlm_model(arch, tok, 2, seed), sharpness)
    draft = _draft(target, draft_kind, seed, sigma, lambda: sharpen(vlm_model(arch, tok, 2, seed + 1000), sharpness))
    return ModelPair(target, draft, proc, None, f"tiny-{arch}", f"tiny-{arch}-{draft_kind}")


def kind_pair(name: str, draft_kind: str = "noisy", seed: int = 0, **kw) -> ModelPair:
    """Any pair of this module by name (TEXT_KINDS + VLM_KINDS)."""
    return (text_pair if name in TEXT_KINDS else vlm_pair)(name, draft_kind, seed, **kw)
