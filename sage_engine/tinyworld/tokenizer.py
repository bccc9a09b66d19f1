"""The tinyworld tokenizer: byte-level BPE trained on the world's own corpus.

Byte-level pre-tokenisation means any text (any language, emoji, code) encodes;
words of the world become single tokens. The special tokens are the ones the
Qwen2.5-VL processor reads (image_token, video_token, ...), and the chat
template is Qwen-style (content lists of {"type": "image"|"video"|"text"}).
"""
from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' or 'video' in item %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def user_turn(media: str, prompt: str) -> str:
    """The exact string CHAT_TEMPLATE renders for one user turn with one media item,
    plus the generation prompt (checked against the template in the tests)."""
    pad = "<|image_pad|>" if media == "image" else "<|video_pad|>"
    return f"<|im_start|>user\n<|vision_start|>{pad}<|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n"


def build_tokenizer(corpus: list[str], vocab_size: int = 640) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
        model_max_length=4096, padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def world_corpus(n: int, seed: int) -> list[str]:
    """Prompts and answers of every kind, plus a little generic text, for BPE training."""
    from .language import IMAGE_KINDS, VIDEO_KINDS, image_example, video_example
    from .world import sample_clip, sample_scene

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sc, cl = sample_scene(rng), sample_clip(rng)
        for k in IMAGE_KINDS:
            ex = image_example(sc, rng, k)
            out += [ex.prompt, ex.answer]
        for k in VIDEO_KINDS:
            ex = video_example(cl, rng, k)
            out += [ex.prompt, ex.answer]
    out += ["user", "assistant", "system", "\n", "Hello! What is this? Please tell me more about it. 0123456789"]
    return out
