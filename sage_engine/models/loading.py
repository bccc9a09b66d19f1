"""Loading a target/draft pair through the transformers Auto classes: a VLM with its official processor, or a
text-only LM (a config with no vision_config) with its tokenizer as the processor.

Security defaults: trust_remote_code is never enabled, weights load from safetensors only.
A pair whose tokenizers or visual token ids disagree is refused (padding of the embedding matrix is
fine: the engine compares only the logit rows both have, families.shared_vocab). A VLM target with a text-only
draft is refused (the draft could not read the target's images); a text-only target with a VLM draft is used, the
draft reading the target's text prompt (a text-only pair takes no images, and a VLM reads text alone).
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass

import torch

from ..errors import ModelError, first_line
from .families import adapter_for, is_text_only, is_tokenizer
from .placement import DTYPES, place_pair
from .presets import DEFAULT_DRAFT, DEFAULT_TARGET, PRESETS, require_hub


@dataclass
class ModelPair:
    """A target model, an optional draft sharing its tokenizer, and the processor(s) that feed them: VLMs with their
    processors, or a text-only target whose processor is its tokenizer (the draft then reads the target's ids)."""

    target: torch.nn.Module
    draft: torch.nn.Module | None
    processor: object  # the target's processor (chat template, image and video processors, tokenizer), or tokenizer
    draft_processor: object | None  # the draft's, when its visual preprocessing differs; else None
    target_name: str = "target"
    draft_name: str | None = None

    @property
    def tokenizer(self):
        return getattr(self.processor, "tokenizer", self.processor)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.target.generation_config, self.target.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        return ids

    def describe(self) -> dict:
        def count(m):
            return None if m is None else sum(p.numel() for p in m.parameters())

        return {
            "target": self.target_name,
            "draft": self.draft_name,
            "target_params": count(self.target),
            "draft_params": count(self.draft),
            "dtype": str(self.target.dtype).replace("torch.", ""),
        }


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError("CUDA was requested but no GPU is available; use --device cpu")
    return device


def _text_only(name: str) -> bool:
    """Is the checkpoint `name` a text-only LM? Read from its config alone (no weights)."""
    from transformers import AutoConfig

    require_hub(name)  # a hub id with no reachable hub fails in ~2 s with one line, never hangs
    try:
        return is_text_only(AutoConfig.from_pretrained(name, trust_remote_code=False))
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot load model {name!r}: {first_line(e)}") from None


def _load_one(name: str, dtype: torch.dtype, device: str, attn: str, device_map=None, text_only: bool | None = None):
    """(model, processor) for one checkpoint: a VLM with its processor, or a text-only LM with its tokenizer
    (`text_only`: where the caller has read its config already)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    text_only = _text_only(name) if text_only is None else text_only
    try:
        loader, auto_model = (AutoTokenizer, AutoModelForCausalLM) if text_only else \
            (AutoProcessor, AutoModelForImageTextToText)
        processor = loader.from_pretrained(name, trust_remote_code=False)
        kwargs = dict(dtype=dtype, trust_remote_code=False, use_safetensors=True, device_map=device_map)
        try:
            model = auto_model.from_pretrained(name, attn_implementation=attn, **kwargs)
        except ValueError as e:  # an architecture without it (GPT-OSS, Mamba: sdpa): its own default, said once
            if "does not support an attention implementation" not in str(e):
                raise
            warnings.warn(f"{name}: no {attn} attention in this architecture; loaded with its default", stacklevel=2)
            model = auto_model.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model {name!r}: {first_line(e)}") from None
    if device_map is None:
        model.to(device)
    model.eval()
    return model, processor


def check_same_tokenizer(target_tok, draft_tok) -> None:
    """Refuse a pair whose tokenizers map the same text to different ids.

    Every token both vocabularies know must have the same id, and the smaller vocabulary
    must be a prefix of the larger one (extra ids are padding or added tokens of one side).
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    small, large = (tv, dv) if len(tv) <= len(dv) else (dv, tv)
    bad = [t for t, i in small.items() if large.get(t) != i]
    if bad:
        raise ModelError(
            f"target and draft tokenizers differ ({len(bad)} of {len(small)} tokens map to other ids, "
            f"e.g. {bad[0]!r}); speculative decoding needs a shared tokenizer"
        )
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        raise ModelError("target and draft tokenizers have different end-of-sequence tokens")


def check_modalities(target_text_only: bool, draft_text_only: bool, target: str = "target",
                     draft: str = "draft") -> None:
    """Refuse a VLM target with a text-only draft: the draft could not read the images or video the target takes.
    The other way round is fine: a text-only target takes text alone, which a VLM draft reads through its ids."""
    if draft_text_only and not target_text_only:
        raise ModelError(f"the target {target!r} is a vision-language model but the draft {draft!r} is text-only "
                         "(it could not read the target's images or video); use a VLM draft")


def check_same_visual_tokens(target_config, draft_config) -> None:
    """Refuse a pair whose configs give one visual token kind different ids (families.py reads them):
    both read the same tokenizer's ids, and the draft may read the target's prompt."""
    t = adapter_for(target_config).visual_token_ids(target_config)
    d = adapter_for(draft_config).visual_token_ids(draft_config)
    bad = {k: (t[k], d[k]) for k in t.keys() & d.keys() if t[k] != d[k]}
    if bad:
        kind, (a, b) = sorted(bad.items())[0]
        raise ModelError(f"target and draft use different {kind} token ids ({a} vs {b}); "
                         "speculative decoding needs a shared tokenizer")


def load_pair(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str = "sdpa",
    target_device_map=None,
    draft_device: str | None = None,
) -> ModelPair:
    """Load target (and draft) with their processors; `target_device_map` spreads the target (accelerate).

    `target` may be a preset name (presets.py): its pair is loaded (an explicit non-default draft wins).
    `device` auto|multi plans the placement (placement.py: balanced map over GPUs, draft on its own GPU).
    """
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if target in PRESETS:
        preset = PRESETS[target]
        target, draft = preset.target, (preset.draft if draft == DEFAULT_DRAFT else draft)
    if device in ("auto", "multi") and target_device_map is None:
        require_hub(target)
        plan = place_pair(target, draft, dtype, device)
        device, target_device_map, draft_device = plan.target_device, plan.target_device_map, plan.draft_device
    device = resolve_device(device)
    t_model, t_proc = _load_one(target, DTYPES[dtype], device, attn_implementation, target_device_map)
    d_model = d_proc = None
    if draft:
        draft_text_only = _text_only(draft)
        check_modalities(is_tokenizer(t_proc), draft_text_only, target, draft)  # before the draft's weights load
        d_model, d_proc = _load_one(draft, DTYPES[dtype], draft_device or device, attn_implementation,
                                    text_only=draft_text_only)
        check_same_tokenizer(getattr(t_proc, "tokenizer", t_proc), getattr(d_proc, "tokenizer", d_proc))
        check_same_visual_tokens(t_model.config, d_model.config)
    settle_heap()
    own = d_proc is not None and not is_tokenizer(t_proc) and not _same_preprocessing(t_proc, d_proc)
    return ModelPair(
        target=t_model,
        draft=d_model,
        processor=t_proc,
        draft_processor=d_proc if own else None,  # a text-only target: the draft reads its ids (one tokenizer)
        target_name=target,
        draft_name=draft,
    )


def settle_heap() -> None:
    """Collect once, then freeze (`gc.freeze`) every object alive: the loaded models', transformers', an app's.

    A full garbage collection walks every tracked object, ~0.5M once a pair and its libraries are loaded: 200-300 ms
    on a 2-core CPU, a stall in whichever decode step triggers it (one in a `bench` run of 240 decodes: 234 ms; 1 ms
    with the heap frozen). Frozen objects are never walked again. Whoever drops a loaded pair calls `gc.unfreeze()`
    first, so that the next settle_heap() collects what the pair leaves in reference cycles."""
    gc.collect()
    gc.freeze()


def _same_preprocessing(a, b) -> bool:
    """True when both processors turn the same input into the same ids and pixels."""
    try:
        return a.to_dict() == b.to_dict()
    except (AttributeError, TypeError):  # processors without to_dict: prepare separately
        return False
