"""The proof, once per model, that the engine's plain decode (`ar`) is the model's own greedy decode: every other
policy is checked against `ar`, so `ar` itself must be the model's.

The check (`decode_refusal`), on the target when the engine is built:
  1. the model's cache is one the engine builds: its forward takes `past_key_values` (Mamba-1 and Mamba-2 keep
     their own `cache_params`, which the engine never writes);
  2. on each kind of input the model takes (a text prompt; a small picture where its processor has an image
     processor; a short clip where its family and processor take video), transformers' own `generate()` decodes
     CHECK_TOKENS greedy tokens and keeps its raw logits; the engine's runner then reads the same prompt and tokens
     as `ar` reads them (a prefill, then one plain step a token, on the backend its steps run on), and its logits
     must equal generate()'s, row by row, within the tree check's tolerance (tree_check.tolerance).
The tokens are generate()'s own, fed to both (teacher forcing), so a near-tie cannot make the two walk apart; the
logits compared are what `ar` takes its argmax of, or samples from. A model that fails is refused for every policy,
`ar` included, in one line naming the input and the token where the logits part.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import torch
from PIL import Image

from ..core.tree import DraftTree
from ..errors import SageError, first_line
from .families import is_tokenizer
from .inputs import process
from .media import VideoClip
from .tree_check import tolerance

CHECK_TOKENS = 4  # generate()'s tokens the check compares: the prompt's logits and three plain steps'
PROMPT = "Describe the picture."


def _picture() -> Image.Image:
    """A small picture with some structure (a flat one leaves a vision tower little to read)."""
    ramp = np.linspace(0, 255, 64, dtype=np.uint8)
    return Image.fromarray(np.stack([ramp[None, :].repeat(64, 0), ramp[:, None].repeat(64, 1),
                                     np.full((64, 64), 90, np.uint8)], -1))


def _clip() -> VideoClip:
    frames = [np.asarray(_picture().rotate(90 * i)) for i in range(4)]
    return VideoClip(frames, 4, 4.0, 1.0, list(range(4)), 64, 64)


def own_cache_refusal(model: torch.nn.Module) -> str | None:
    """Why the model's forward does not read the cache the engine builds, in a few words; None where it does."""
    params = inspect.signature(model.forward).parameters
    if "past_key_values" in params:
        return None
    own = "its own cache_params" if "cache_params" in params else "no past_key_values"
    return f"its forward takes {own}, not the key/value cache the engine builds and compacts"


def media_inputs(processor, family) -> dict[str, dict[str, torch.Tensor]]:
    """The model's inputs for each kind of input it takes: {"a text": ..., "an image": ..., "a video": ...}, each
    made by the processor a run uses; a kind its processor refuses (a model that needs its picture) is left out."""
    kinds = {"a text": ([], None)}
    if not is_tokenizer(processor) and getattr(processor, "image_processor", None) is not None:
        kinds["an image"] = ([_picture()], None)
    if family.supports_video and getattr(processor, "video_processor", None) is not None:
        kinds["a video"] = ([], _clip())
    out = {}
    for name, (images, video) in kinds.items():
        try:
            out[name] = process(processor, PROMPT, images, video, family)
        except (SageError, ValueError, TypeError, RuntimeError):
            continue  # not an input this model serves
    return out


def reference(model: torch.nn.Module, inputs: dict[str, torch.Tensor], n: int,
              device: torch.device | None = None) -> tuple[list[int], torch.Tensor]:
    """transformers' generate(), greedy, n tokens whatever ids end a sequence: its tokens and the raw logits it
    chose them from (before any of the checkpoint's logits processors). device: where the inputs go (default: the
    input embedding's; an offloaded model's embedding is on `meta`, its runner knows where it runs).  # [n], [n, V]"""
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=None, eos_token_id=None,
                  output_logits=True, return_dict_in_generate=True)
    if config.pad_token_id is None:
        config.pad_token_id = 0
    device = device if device is not None else model.get_input_embeddings().weight.device
    batch = {k: v.to(device) for k, v in inputs.items()}
    with torch.inference_mode():
        out = model.generate(**batch, generation_config=config)
    tokens = out.sequences[0, batch["input_ids"].shape[1]:].tolist()
    return tokens, torch.cat([row[:1] for row in out.logits]).float().cpu()


def decode_logits(runner, inputs: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """The logits `ar` decodes from, reading the prompt and then `tokens` but the last, one plain step a token.
    # [len(tokens), V]"""
    rows = [runner.prefill(inputs).logits[None]]
    for token in tokens[:-1]:
        rows.append(runner.forward_tree(token, DraftTree()).logits)
    return torch.cat(rows).float().cpu()


def _differs(medium: str, got: torch.Tensor, want: torch.Tensor, tokens: list[int], tol: float) -> str | None:
    for i in range(want.shape[0]):
        g, w = got[i, : want.shape[1]], want[i]
        scale = max(1.0, float(w.abs().max()))
        gap = float((g - w).abs().max()) if g.shape == w.shape else float("inf")
        if not gap <= tol * scale:  # NaN fails too
            where = "after the prompt" if i == 0 else f"after its token {i} (id {tokens[i - 1]})"
            return (f"on {medium} prompt its logits {where} differ from generate()'s by {gap:.3g} "
                    f"({gap / scale:.1%} of their scale; its argmax {int(g.argmax())}, generate()'s "
                    f"{int(w.argmax())})")
    return None


def decode_refusal(runner, media: dict[str, dict[str, torch.Tensor]]) -> str | None:
    """Why `runner`'s model cannot be decoded exactly by the engine, `ar` included, in one line; None where its plain
    decode equals generate()'s on every kind of input it takes (`media`: `media_inputs`). Runs in the runner's
    scratch state: nothing of it stays in the runner."""
    why = own_cache_refusal(runner.model)
    if why is not None:
        return f"{why} (layers: {runner.plan.describe()})"
    tol = tolerance(runner.dtype)
    for medium, inputs in media.items():
        try:
            tokens, want = reference(runner.model, inputs, CHECK_TOKENS, runner.device)
        except Exception as e:  # noqa: BLE001 - a model generate() cannot run: its decode cannot be checked
            return f"its decode cannot be checked: generate() fails on {medium} prompt ({first_line(e)})"
        with runner._scratch_check():
            try:
                got = decode_logits(runner, inputs, tokens)
            except Exception as e:  # noqa: BLE001 - the engine's own passes fail on it
                return f"its plain decode fails on {medium} prompt ({first_line(e)}; layers: {runner.plan.describe()})"
        differs = _differs(medium, got, want, tokens, tol)
        if differs is not None:
            return f"{differs}; layers: {runner.plan.describe()}"
    return None
