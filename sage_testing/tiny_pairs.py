"""Tiny random-init VLMs of real transformers architectures, built from configs (no download): what the tests and
`sage doctor` check the engine on, on any machine, with no model hub.

Each builder returns a ModelPair whose processor is the architecture's official processor
class over a BPE tokenizer trained here. Drafts are either an exact copy of the target
(everything accepted), a noisy copy (partial agreement) or an independent smaller model.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sage_engine.models.loading import ModelPair
from sage_engine.models.media import VideoClip

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'video' %}<video>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
LLAMA_TEXT_TEMPLATE = (  # a Llama-3-like chat template over plain string messages (a text LM's own template)
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA_TEXT_SPECIALS = ["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
CORPUS = [
    "a red circle and a blue square on a white background",
    "describe the image in detail please",
    "the green triangle moves to the left while the yellow star grows",
    "how many shapes are there? there are three shapes.",
    "what happens in the video? the circle changes colour from red to purple",
] * 20


def train_tokenizer(specials: list[str], extra: dict[str, str], template: str, vocab: int = 300):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, extra_special_tokens=extra, eos_token=specials[0],
                                   pad_token=specials[0])
    fast.chat_template = template
    return fast


def _noisy_copy(model, sigma: float, seed: int):
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * sigma * (p.std() if p.numel() > 1 else 1.0))
    return draft


def sharpen(model, factor: float):
    """Scale the model's output head by `factor`: its next-token distributions become as peaked as a trained
    model's (random init gives near-uniform ones, on which SAGE never drafts deep). The head gets its own
    weight (untied from the input embeddings)."""
    if factor != 1.0:
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone() * factor)
    return model


def qwen25_processor():
    """The official Qwen2_5_VLProcessor over a tokenizer trained here, small images (56-112 px) and videos."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tok = train_tokenizer(QWEN_SPECIALS, {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                          "vision_start_token": "<|vision_start|>",
                                          "vision_end_token": "<|vision_end|>"}, QWEN_TEMPLATE)
    size = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
    return Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(size=size),
                               video_processor=Qwen2VLVideoProcessor(size=size), tokenizer=tok,
                               chat_template=QWEN_TEMPLATE)


def qwen25_model(tok, layers: int, hidden: int, seed: int, heads: int = 4, kv_heads: int = 2,
                 intermediate: int | None = None, init: float = 0.2):
    """A random-init Qwen2.5-VL (M-RoPE, a one-block vision tower) of the given text size, for `tok`'s ids."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    half = hidden // heads // 2  # M-RoPE splits a head's rotary pairs over time, height and width
    t = half // 4
    torch.manual_seed(seed)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
            max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                             "mrope_section": [t, (half - t) // 2, half - t - (half - t) // 2]},
            initializer_range=init, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
        ),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           fullatt_block_indexes=[0], initializer_range=0.2),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
        eos_token_id=tok.eos_token_id,
    )
    return Qwen2_5_VLForConditionalGeneration(cfg).eval()


def qwen25_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1, sharpness: float = 1.0) -> ModelPair:
    """Tiny Qwen2.5-VL (M-RoPE) target and draft with the official Qwen2_5_VLProcessor."""
    proc = qwen25_processor()
    tok = proc.tokenizer
    target = sharpen(qwen25_model(tok, 2, 64, seed), sharpness)
    draft = _draft(target, draft_kind, seed, sigma, lambda: sharpen(qwen25_model(tok, 1, 64, seed + 1000), sharpness))
    return ModelPair(target, draft, proc, None, "tiny-qwen2.5-vl", f"tiny-qwen2.5-vl-{draft_kind}")


def llava_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1, sharpness: float = 1.0) -> ModelPair:
    """Tiny LLaVA (CLIP vision tower + Llama text) with the official LlavaProcessor."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = train_tokenizer(["</s>", "<image>"], {"image_token": "<image>"}, LLAVA_TEMPLATE)
    proc = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}),
        tokenizer=tok, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE,
    )

    def build(layers: int, s: int):
        torch.manual_seed(s)
        cfg = LlavaConfig(
            vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=56, patch_size=14,
                                           initializer_range=0.2).to_dict(),
            text_config=LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=2048, initializer_range=0.2,
                                    eos_token_id=tok.eos_token_id).to_dict(),
            image_token_id=tok.convert_tokens_to_ids("<image>"),
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
        )
        return LlavaForConditionalGeneration(cfg).eval()

    target = sharpen(build(2, seed), sharpness)
    draft = _draft(target, draft_kind, seed, sigma, lambda: sharpen(build(1, seed + 1000), sharpness))
    return ModelPair(target, draft, proc, None, "tiny-llava", f"tiny-llava-{draft_kind}")


def llama_text_tokenizer():
    """A BPE tokenizer trained here with a Llama-3-like chat template: eos <|eot_id|>, bos <|begin_of_text|>."""
    tok = train_tokenizer(LLAMA_TEXT_SPECIALS, {}, LLAMA_TEXT_TEMPLATE)
    tok.bos_token = "<|begin_of_text|>"
    return tok


def llama_text_pair(draft_kind: str = "noisy", seed: int = 0, sigma: float = 0.1,
                    sharpness: float = 1.0) -> ModelPair:
    """Tiny text-only Llama target and draft (LlamaForCausalLM, no vision tower); the processor is the tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = llama_text_tokenizer()

    def build(layers: int, s: int):
        torch.manual_seed(s)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          initializer_range=0.2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          tie_word_embeddings=False)
        return LlamaForCausalLM(cfg).eval()

    target = sharpen(build(2, seed), sharpness)
    draft = _draft(target, draft_kind, seed, sigma, lambda: sharpen(build(1, seed + 1000), sharpness))
    return ModelPair(target, draft, tok, None, "tiny-llama-text", f"tiny-llama-text-{draft_kind}")


def save_pair(pair: ModelPair, root) -> tuple[str, str]:
    """Save `pair` like real checkpoints (safetensors and the processor) in `root`/target and `root`/draft, for the
    loaders and the CLI's --target/--draft; returns the two folders."""
    folders = []
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        model.save_pretrained(f"{root}/{role}")
        pair.processor.save_pretrained(f"{root}/{role}")
        folders.append(f"{root}/{role}")
    return folders[0], folders[1]


def sharp_pair(family: str, kind: str) -> ModelPair:
    """The pair the equivalence tests and `sage doctor` check every policy on: tiny Qwen2.5-VL ("qwen2.5-vl") or LLaVA
    ("llava"), its draft a close noisy copy ("noisy") or an exact one ("copy"), their heads sharpened so that SAGE
    drafts deep trees."""
    build = {"qwen2.5-vl": qwen25_pair, "llava": llava_pair}[family]
    return build(kind, seed=0, sigma=0.05, sharpness=8.0)


def _draft(target, kind: str, seed: int, sigma: float, independent):
    if kind == "copy":
        return copy.deepcopy(target)
    if kind == "noisy":
        return _noisy_copy(target, sigma, seed + 1)
    if kind == "independent":
        return independent()
    raise ValueError(kind)


def image(seed: int, size: int = 56) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def clip(seed: int, frames: int = 4, size: int = 56) -> VideoClip:
    rng = np.random.default_rng(seed)
    arr = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(frames)]
    return VideoClip(arr, frames, 4.0, frames / 4.0, list(range(frames)), size, size)


def write_noise_media(folder, seed: int = 0) -> None:
    """`a.png` (a 56 px noise image) and `b.mp4` (8 noise frames, mp4v, 4 fps) in `folder`: inputs the CLI reads."""
    import cv2

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)).save(f"{folder}/a.png")
    writer = cv2.VideoWriter(f"{folder}/b.mp4", cv2.VideoWriter_fourcc(*"mp4v"), 4, (56, 56))
    for _ in range(8):
        writer.write(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8))
    writer.release()
