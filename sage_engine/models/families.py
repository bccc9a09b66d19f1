"""One small adapter per VLM family: what tree verification must know about an architecture.

What differs per family (transformers 5.23 names), and why it matters to lossless tree verification:

  family (model_type)   positions  text shift after prefill   visual ids (config)          video  video kwargs     LM module
  --------------------  ---------  -------------------------  ---------------------------  -----  ---------------  --------------
  qwen2_5_vl            M-RoPE     model.model.rope_deltas    image_token_id,              yes    metadata NEEDED  language_model
                                                              video_token_id                      (fps -> second_per_grid_ts)
  qwen2_vl              M-RoPE     model.model.rope_deltas    image_token_id,              yes    metadata taken,  language_model
                                                              video_token_id                      unused
  qwen3_vl, qwen3_vl_moe M-RoPE    model.model.rope_deltas    image_token_id,              yes    metadata NEEDED  language_model
  qwen3_5, qwen3_5_moe  (interleaved)                         video_token_id                      (timestamps in text)
  paligemma             1D from 1  1 (positions count from 1)  image_token_id (alias        no     -                language_model
                                                              image_token_index)
  mllama                1D         0                          image_token_index (one an    no     -                language_model
                                                              image; cross-attention)
  gemma3                1D         0                          image_token_id (alias        no     -                language_model
                                                              image_token_index)
  gemma3n               1D         0                          image_token_id (audio ids    no     -                language_model
                                                              not pruned)
  lfm2_vl               1D         0                          image_token_id (alias        no     -                language_model
                                                              image_token_index)
  llava_onevision       1D         0                          image_token_id (alias        yes    metadata taken,  language_model
                                                              image_token_index), video_..        unused
  llava                 1D         0                          image_token_id (alias        no     -                language_model
                                                              image_token_index)
  smolvlm               1D         0                          image_token_id (video frames yes    metadata NEEDED  text_model
                                                              are image tokens too)               (fps, duration: timestamps in text)
  idefics3              1D         0                          image_token_id               no     -                text_model
  text LM (no vision)   1D         0                          none                         no     -                -
  any other VLM         1D, or M-RoPE when the model keeps rope_deltas; usual id names (a warning names the guess)

Why each column matters:
  - positions / shift: a tree node at depth d is verified at position (prompt length + d) + shift. M-RoPE
    families give visual tokens 3D positions, so text after an image continues at max vision position + 1,
    not at the sequence index; the model computes that shift during prefill (rope_deltas) and we must add it
    to every node we verify. A wrong shift gives wrong logits (tests/test_equivalence.py's negative control).
  - visual ids: draft-only pruning (pruning.py) keeps a share of each kind of visual token, found by id.
  - video kwargs: target and draft must read the very frames we sampled (do_sample_frames=False); Qwen2.5-VL
    spaces video positions by the frame rate and SmolVLM writes frame timestamps into the prompt, so both
    need the clip's metadata (without it they assume 24 fps: other positions, other prompt).
  - LM module: where pruning captures the merged text+visual embeddings (and M-RoPE rows) with a pre-hook;
    M-RoPE rows arrive as [3, B, S] or [4, B, S] (a text row first), 1D families pass none.
  - vocabulary (the same rule for every family, so not a column): logits have one entry per LM-head row and
    checkpoints pad those rows differently (e.g. 151936 vs 152064 for Qwen2.5-VL 3B/7B, 152000 vs 152128 for
    LLaVA-OneVision 0.5B/7B). The draft's logits are cut to the rows both models have, so every draft token
    is a target id; the target's are never cut (its greedy argmax is the reference output).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Positions1D:
    """Positions are sequence indices counted from `start` (PaliGemma counts from 1, the others from 0); nothing is
    cached in the model between requests."""

    name: str = "1d"
    start: int = 0  # the position of the prompt's first token

    def reset(self, model) -> None:
        pass

    def shift_after_prefill(self, model) -> int:
        return self.start

    def prompt_positions(self, captured: torch.Tensor | None, seq_len: int, device) -> torch.Tensor:
        """Positions of the prompt tokens as the language model reads them (None captured: the
        model would count them itself).  # [1, S]"""
        if captured is not None:
            return captured
        return torch.arange(self.start, self.start + seq_len, device=device).view(1, seq_len)


@dataclass(frozen=True)
class MRoPE:
    """Multimodal RoPE (Qwen2-VL style): three rotary axes; the model caches the text shift in `rope_deltas`.

    Text-only prompts leave rope_deltas None (shift 0). Tree nodes are passed as [1, q] positions, which
    the text model broadcasts to its three axes (all equal for text tokens).
    """

    name: str = "mrope"
    state: str = "rope_deltas"  # attribute of model.model written during prefill

    def _inner(self, model):
        return getattr(model, "model", model)

    def reset(self, model) -> None:
        """Forget the previous request's shift (the model reuses a cached one when it is set)."""
        setattr(self._inner(model), self.state, None)

    def shift_after_prefill(self, model) -> int:
        deltas = getattr(self._inner(model), self.state, None)
        return 0 if deltas is None else int(deltas.reshape(-1)[0])

    def prompt_positions(self, captured: torch.Tensor | None, seq_len: int, device) -> torch.Tensor:
        """The rotary rows of the captured positions.  # [3, 1, S]"""
        if captured is None:  # text-only prompt: the model inferred plain positions
            return torch.arange(seq_len, device=device).view(1, 1, seq_len).expand(3, 1, seq_len)
        if captured.dim() == 3 and captured.shape[0] == 4:  # text row + 3 rotary rows: keep the rotary rows
            return captured[1:]
        return captured


@dataclass(frozen=True)
class Family:
    """What the engine needs to know about one architecture family (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]
    positions: Positions1D | MRoPE
    token_attrs: tuple[tuple[str, tuple[str, ...]], ...]  # (kind, config attributes to try, in order)
    supports_video: bool  # False: refuse video input; True: the processor must also have a video processor
    lm_attrs: tuple[str, ...]  # name of the language model submodule of model.model (first found)
    verified: bool = True  # covered by the lossless-equivalence tests
    # does the outer forward take a mask per layer type (a mapping), as it hands it to the language model? False: it
    # builds one mask from the one it is given (backends/hf_forward.py hands the mapping to the language model)
    masks_by_type: bool = True
    # prompt inputs with a row per token whose last row every later pass carries, one row a token (Mllama's
    # cross_attention_mask [1, S, images, tiles]: which tiles a token sees, the prompt's last token's for a new one)
    carried: tuple[str, ...] = ()

    def visual_token_ids(self, config) -> dict[str, int]:
        """{"image": id, "video": id} for the visual token kinds this config defines."""
        out = {}
        for kind, attrs in self.token_attrs:
            for attr in attrs:
                tok = getattr(config, attr, None)
                if tok is not None:
                    out[kind] = int(tok)
                    break
        return out

    def processor_kwargs(self, clip) -> dict:
        """Video kwargs for this family's processor call: pre-sampled frames, with their metadata.

        Every transformers 5.23 video processor (BaseVideoProcessor) takes `do_sample_frames` and
        `video_metadata`; qwen2.5-vl and smolvlm need the metadata (see the table), the others ignore it,
        so all get both: the frames we sampled are the frames read, at their true frame rate.
        """
        if clip is None:
            return {}
        return {"videos": [clip.frames], "video_metadata": [clip.metadata()], "do_sample_frames": False}

    def carry(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What every pass after the prompt `inputs` carries: the last row of each `carried` input it has."""
        return {k: inputs[k][:, -1:] for k in self.carried if k in inputs}

    def language_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The submodule that receives the merged text + visual embeddings (pruning hooks it)."""
        inner = getattr(model, "model", model)
        for attr in self.lm_attrs:
            lm = getattr(inner, attr, None)
            if lm is not None:
                return lm
        names = " or ".join(self.lm_attrs) or "language model"
        raise NotImplementedError(f"{type(model).__name__}: no {names} submodule to prune for")


_IMAGE_VIDEO = (("image", ("image_token_id",)), ("video", ("video_token_id",)))
_LLAVA_IMAGE_VIDEO = (("image", ("image_token_id", "image_token_index")),  # *_index: pre-5.x config name
                      ("video", ("video_token_id", "video_token_index")))
_LM, _TEXT_MODEL = ("language_model",), ("text_model",)

QWEN2_5_VL = Family("qwen2.5-vl", ("qwen2_5_vl",), MRoPE(), _IMAGE_VIDEO, supports_video=True, lm_attrs=_LM)
QWEN2_VL = Family("qwen2-vl", ("qwen2_vl",), MRoPE(), _IMAGE_VIDEO, supports_video=True, lm_attrs=_LM)
LLAVA_ONEVISION = Family("llava-onevision", ("llava_onevision",), Positions1D(), _LLAVA_IMAGE_VIDEO,
                         supports_video=True, lm_attrs=_LM)
LLAVA = Family("llava", ("llava",), Positions1D(), _LLAVA_IMAGE_VIDEO[:1], supports_video=False, lm_attrs=_LM)
SMOLVLM = Family("smolvlm", ("smolvlm",), Positions1D(), _IMAGE_VIDEO[:1], supports_video=True,
                 lm_attrs=_TEXT_MODEL)  # video frames are <image> tokens: no video token id
IDEFICS3 = Family("idefics3", ("idefics3",), Positions1D(), _IMAGE_VIDEO[:1], supports_video=False,
                  lm_attrs=_TEXT_MODEL)
# Qwen3-VL and its MoE: interleaved M-RoPE (the rotary's axes interleaved, the shift still model.model.rope_deltas),
# DeepStack (visual features added to the first LM layers' hidden states: in the prompt only, none in a text step)
QWEN3_VL = Family("qwen3-vl", ("qwen3_vl", "qwen3_vl_moe"), MRoPE(), _IMAGE_VIDEO, supports_video=True, lm_attrs=_LM)
# Qwen3.5 and its MoE: Qwen3-VL's interleaved M-RoPE with a partial rotary, and gated-delta-rule layers beside full
# attention (layer_kinds.py: read path by path, recurrent_paths.py)
QWEN3_5 = Family("qwen3.5", ("qwen3_5", "qwen3_5_moe"), MRoPE(), _IMAGE_VIDEO, supports_video=True, lm_attrs=_LM)
# Gemma 3 VLMs: 1D positions, image soft tokens (image_token_id, alias image_token_index) that attend to each other
# both ways in the prompt, sliding-window and full layers (layer_kinds.py)
GEMMA3 = Family("gemma3", ("gemma3",), Positions1D(), _LLAVA_IMAGE_VIDEO[:1], supports_video=False, lm_attrs=_LM)
# PaliGemma and PaliGemma 2: 1D positions counted from 1, the image and the prompt one prefix that attends both ways
# (the processor's token_type_ids, 0 there, read by the prompt's pass; a decoded token is causal), Gemma or Gemma 2
# text (sliding-window and full layers: layer_kinds.py)
PALIGEMMA = Family("paligemma", ("paligemma",), Positions1D(start=1), _LLAVA_IMAGE_VIDEO[:1], supports_video=False,
                   lm_attrs=_LM, masks_by_type=False)
# Llama 3.2 Vision: 1D positions; one <|image|> token an image, whose tiles' keys and values the cross-attention layers
# read (layer_kinds.CrossAttention), under the prompt's cross-attention mask, its last row carried on every later pass
MLLAMA = Family("mllama", ("mllama",), Positions1D(), _LLAVA_IMAGE_VIDEO[:1], supports_video=False, lm_attrs=_LM,
                carried=("cross_attention_mask",))
# Gemma 3n: 1D positions, image soft tokens (image_token_id) and audio soft tokens in their own vocabulary ranges (the
# processor's token_type_ids say which), a timm vision tower; its last layers share earlier layers' keys and values
# (layer_kinds.SharedKV)
GEMMA3N = Family("gemma3n", ("gemma3n",), Positions1D(), _LLAVA_IMAGE_VIDEO[:1], supports_video=False, lm_attrs=_LM)
# LFM2-VL: 1D positions, SigLIP2 image tokens (image_token_id, alias image_token_index) in tiles, an LFM2 text model
# whose short-convolution layers are read path by path (layer_kinds.py, recurrent_paths.py)
LFM2_VL = Family("lfm2-vl", ("lfm2_vl",), Positions1D(), _LLAVA_IMAGE_VIDEO[:1], supports_video=False, lm_attrs=_LM)
# A text-only LM (no vision_config): 1D positions, nothing visual; exact for any decoder-only LM.
TEXT = Family("text", (), Positions1D(), (), supports_video=False, lm_attrs=(), verified=True)
# Unknown VLM families: every usual attribute name; the processor decides about video.
GENERIC = Family("generic", (), Positions1D(), _LLAVA_IMAGE_VIDEO, supports_video=True,
                 lm_attrs=_LM + _TEXT_MODEL, verified=False)
GENERIC_MROPE = Family("generic-mrope", (), MRoPE(), _LLAVA_IMAGE_VIDEO, supports_video=True,
                       lm_attrs=_LM + _TEXT_MODEL, verified=False)

FAMILIES: dict[str, Family] = {t: f for f in (QWEN2_5_VL, QWEN2_VL, QWEN3_VL, QWEN3_5, GEMMA3, GEMMA3N, PALIGEMMA,
                                              MLLAMA, LFM2_VL, LLAVA_ONEVISION, LLAVA, SMOLVLM, IDEFICS3)
                               for t in f.model_types}
_warned: set[str] = set()


def register_family(family: Family) -> None:
    """Make `family` the adapter of every model type it names (a family of your own; docs/ARCHITECTURE.md)."""
    for model_type in family.model_types:
        FAMILIES[model_type] = family


def _config(model_or_config):
    return model_or_config.config if isinstance(model_or_config, torch.nn.Module) else model_or_config


def _keeps_mrope_state(model_or_config) -> bool:
    """An unknown model with M-RoPE: its inner model caches rope_deltas, or its config has an mrope_section."""
    if isinstance(model_or_config, torch.nn.Module):
        return hasattr(getattr(model_or_config, "model", model_or_config), "rope_deltas")
    cfg = model_or_config
    text = getattr(cfg, "text_config", None) or cfg
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return isinstance(rope, dict) and "mrope_section" in rope


def adapter_for(model_or_config) -> Family:
    """The family adapter for a model (or its config), by config.model_type.

    Unknown model_type: TEXT when the config has no vision_config (a plain LM); otherwise GENERIC (1D
    positions, the usual token-id attribute names, the processor decides about video), or GENERIC_MROPE
    when the model keeps M-RoPE state (model.model.rope_deltas, or an mrope_section in its rope
    parameters). A VLM fallback warns once per model_type that its lossless equivalence is untested.
    """
    cfg = _config(model_or_config)
    model_type = getattr(cfg, "model_type", None) or "?"
    family = FAMILIES.get(model_type)
    if family is not None:
        return family
    if (getattr(cfg, "model_type", None) and getattr(cfg, "vision_config", None) is None
            and not _keeps_mrope_state(model_or_config)):
        return TEXT
    family = GENERIC_MROPE if _keeps_mrope_state(model_or_config) else GENERIC
    if model_type not in _warned:
        _warned.add(model_type)
        warnings.warn(f"model_type {model_type!r} has no family adapter; using {family.name} "
                      f"({family.positions.name} positions); speculative output is untested for it", stacklevel=2)
    return family


def is_text_only(config) -> bool:
    """A text-only LM: no vision_config, and a model type transformers does not list as image-text-to-text
    (gemma3_text, llama and qwen3 are text-only; gemma3, llava and qwen3_vl are not)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return (getattr(config, "vision_config", None) is None
            and getattr(config, "model_type", None) not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def is_tokenizer(processor) -> bool:
    """Is this processor a bare tokenizer (a text-only model's), not a multimodal processor?"""
    from transformers import PreTrainedTokenizerBase

    return isinstance(processor, PreTrainedTokenizerBase)


def vocab_rows(model: torch.nn.Module) -> int:
    """Logit rows of a model: its LM head's output rows (the padded vocabulary)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    cfg = model.config
    return int((getattr(cfg, "text_config", None) or cfg).vocab_size)


def shared_vocab(target: torch.nn.Module, draft: torch.nn.Module) -> int:
    """Logit rows both models have: the draft's logits are cut to these, so its tokens are target ids."""
    return min(vocab_rows(target), vocab_rows(draft))
