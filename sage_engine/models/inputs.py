"""One multimodal prompt, prepared through the model's own chat template and processor.

The same PreparedInput feeds the target and the draft. When the draft's processor
differs (or its visual tokens are pruned), the draft gets its own tensors. A text-only pair's processor is its
tokenizer: the prompt goes through the tokenizer's chat template (the plain prompt where it has none), and an
image or a video is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from PIL import Image

from ..errors import InputError, first_line
from .families import GENERIC, Family, adapter_for, is_tokenizer
from .loading import ModelPair
from .media import VideoClip, load_image, on_canvas, sample_video, square_canvas, video_frames_for

MAX_PROMPT_CHARS = 8000
# what a processor returns for training alone: PaliGemma's returns `labels` for every prompt, and a forward given
# labels computes a loss against them (which fails on a prompt's pass)
TRAINING_ONLY = ("labels",)


@dataclass
class PreparedInput:
    """Processor outputs for one request (batch of one)."""

    target_inputs: dict[str, torch.Tensor]  # input_ids, attention_mask, pixel_values, *_grid_thw, ...
    draft_inputs: dict[str, torch.Tensor] | None  # None: the draft reads target_inputs
    prompt: str
    images: list[Image.Image] = field(default_factory=list)
    video: VideoClip | None = None

    @property
    def prompt_tokens(self) -> int:
        return int(self.target_inputs["input_ids"].shape[1])

    def for_draft(self) -> dict[str, torch.Tensor]:
        return self.target_inputs if self.draft_inputs is None else self.draft_inputs


def _messages(prompt: str, n_images: int, has_video: bool) -> list[dict]:
    content = [{"type": "image"} for _ in range(n_images)]
    if has_video:
        content.append({"type": "video"})
    content.append({"type": "text", "text": prompt})
    return [{"role": "user", "content": content}]


def _uncapped(video_processor) -> dict:
    """`cap_pixels_per_frame=False` for a video processor that takes it and leaves it unset (transformers 5.23's
    Qwen2-VL and Qwen2.5-VL ones): unset, it keeps the same uncapped frame sizes and logs, on each process's first
    video, that a later version will cap them; said explicitly, a video's visual tokens stay what they are here
    whichever default a transformers version has, until the option is gone."""
    valid = getattr(getattr(video_processor, "valid_kwargs", None), "__annotations__", {})
    if "cap_pixels_per_frame" in valid and getattr(video_processor, "cap_pixels_per_frame", None) is None:
        return {"cap_pixels_per_frame": False}
    return {}


def refuse_media_for_text(processor, images, video) -> None:
    """InputError (one line) when a text-only model (its processor a tokenizer) is given an image or a video."""
    if is_tokenizer(processor) and (images or video is not None):
        raise InputError(f"this model pair is text-only: it takes no {'image' if images else 'video'}")


def process_text(tokenizer, prompt: str) -> dict[str, torch.Tensor]:
    """A text-only model's prompt: the tokenizer's chat template (one user turn, then the assistant's turn) when it
    has one, the plain prompt otherwise; input_ids and attention_mask."""
    try:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=False)
            out = tokenizer([text], add_special_tokens=False, return_tensors="pt")  # the template wrote BOS
        else:
            out = tokenizer([prompt], return_tensors="pt")
    except (ValueError, RuntimeError, TypeError) as e:
        raise InputError(f"the tokenizer rejected this input: {first_line(e)}") from None
    return {k: out[k] for k in ("input_ids", "attention_mask")}


def process(processor, prompt: str, images: list[Image.Image], video: VideoClip | None,
            family: Family | None = None) -> dict[str, torch.Tensor]:
    """Chat template + processor call for one model of `family` (families.py; default: the generic one); a
    text-only model's processor is its tokenizer (process_text)."""
    refuse_media_for_text(processor, images, video)
    if is_tokenizer(processor):
        return process_text(processor, prompt)
    family = family or GENERIC
    if video is not None and (not family.supports_video or getattr(processor, "video_processor", None) is None):
        raise InputError("this model does not take video input")
    if images and getattr(processor, "image_processor", None) is None:
        raise InputError("this model does not take image input")
    text = processor.apply_chat_template(_messages(prompt, len(images), video is not None), add_generation_prompt=True)
    kwargs = dict(family.processor_kwargs(video))  # videos with the metadata / sampling kwargs it takes
    if video is not None:
        kwargs.update(_uncapped(processor.video_processor))
    if images:
        kwargs["images"] = images
    try:
        out = processor(text=[text], return_tensors="pt", **kwargs)
    except (ValueError, RuntimeError) as e:
        raise InputError(f"the processor rejected this input: {first_line(e)}") from None
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor) and k not in TRAINING_ONLY}


def prepare_input(
    pair: ModelPair,
    prompt: str,
    images: list | tuple = (),
    video: str | VideoClip | None = None,
    num_frames: int | None = None,
) -> PreparedInput:
    """Load media, apply the chat template and run the processor(s)."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise InputError("the prompt is empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"the prompt is too long ({len(prompt)} characters; the limit is {MAX_PROMPT_CHARS})")
    refuse_media_for_text(pair.processor, images, video)  # before any file is read
    pil = [load_image(im) for im in images]
    clip = video
    if isinstance(video, str):
        clip = sample_video(video, num_frames or video_frames_for(pair.processor))
    side = square_canvas(pair.target)
    if side is not None:   # a pair that reads every picture on one square canvas (the embedded tinyworld pair)
        pil, clip = on_canvas(pil, clip, side)
    target_inputs = process(pair.processor, prompt, pil, clip, adapter_for(pair.target))
    draft_inputs = None
    if pair.draft is not None and pair.draft_processor is not None:
        draft_inputs = process(pair.draft_processor, prompt, pil, clip, adapter_for(pair.draft))
    elif pair.draft is not None and clip is not None and not adapter_for(pair.draft).supports_video:
        raise InputError("the draft model does not take video input")
    return PreparedInput(target_inputs, draft_inputs, prompt, pil, clip)
