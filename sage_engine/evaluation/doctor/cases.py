"""The pairs the doctor checks, each built from what the repository holds (the shipped pair in assets/) or from
configs on the spot (tiny random Qwen2.5-VL and LLaVA, their heads sharpened so that SAGE drafts deep trees, as the
equivalence tests build them; tiny Gemma 3 with its sliding windows, Qwen3-VL, Qwen3.5 and Llama 3.2 Vision,
tiny_kinds.py), and where each goes:
one device, or the target spread over several with an accelerate device map and the draft on the last.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...core.tree import verify_allowed
from ...models.inputs import PreparedInput, prepare_input
from ...models.loading import ModelPair
from ...models.placement import quiet_accelerate
from ...models.presets import ASSETS

PROMPT = "describe what you see"


@dataclass(frozen=True)
class Case:
    """A pair and an input to decode, made when asked (`make(dtype)`), and how many tokens to decode."""

    name: str
    make: Callable[[torch.dtype], tuple[ModelPair, PreparedInput]]
    budget: int
    short: str = ""  # for the summary's first table


def _shipped(dtype: torch.dtype) -> tuple[ModelPair, PreparedInput]:
    from ...models.loading import load_pair

    pair = load_pair(dtype=str(dtype).removeprefix("torch."))
    return pair, prepare_input(pair, "Describe it in detail.", images=[str(ASSETS / "examples" / "shapes_1.png")])


def _tiny(family: str, media: str, kind: str) -> Callable:
    def make(dtype: torch.dtype) -> tuple[ModelPair, PreparedInput]:
        from sage_testing.tiny_pairs import clip, image, sharp_pair

        pair = sharp_pair(family, kind)
        pair.target.to(dtype)
        pair.draft.to(dtype)
        prep = prepare_input(pair, PROMPT, **({"images": [image(10)]} if media == "image" else {"video": clip(10)}))
        return pair, prep
    return make


def _kind(name: str, media: str) -> Callable:
    """A tiny pair of a current architecture (tiny_kinds.py), its draft a noisy copy, on `media`."""
    def make(dtype: torch.dtype) -> tuple[ModelPair, PreparedInput]:
        from sage_testing.tiny_kinds import kind_pair
        from sage_testing.tiny_pairs import image

        pair = kind_pair(name, "noisy")
        pair.target.to(dtype)
        pair.draft.to(dtype)
        return pair, prepare_input(pair, PROMPT, **({"images": [image(10, 64)]} if media == "image" else {}))
    return make


def checked_cases(quick: bool) -> list[Case]:
    """The shipped pair on an example scene (where assets/ has it), tiny Qwen2.5-VL on an image (a noisy draft) and a
    video (an exact copy), tiny LLaVA on an image (an exact copy); and in both modes, tiny Gemma 3 on text (sliding
    windows of 8 beside full layers, decoded well past the window), tiny Qwen3-VL on an image, tiny Qwen3.5 (its
    gated-delta-rule layers read path by path) on an image and tiny Llama 3.2 Vision (cross-attention layers that read
    the image's tiles) on an image."""
    budget = 24 if quick else 40
    out = []
    if (ASSETS / "models").is_dir():
        out.append(Case("shipped pair (image)", _shipped, 2 * budget, "shipped"))
    out += [Case("tiny Qwen2.5-VL (image, noisy draft)", _tiny("qwen2.5-vl", "image", "noisy"), budget,
                 "Qwen image"),
            Case("tiny Qwen2.5-VL (video, copied draft)", _tiny("qwen2.5-vl", "video", "copy"), budget,
                 "Qwen video"),
            Case("tiny LLaVA (image, copied draft)", _tiny("llava", "image", "copy"), budget, "LLaVA")]
    kinds = [Case("tiny Gemma 3 (text, sliding window 8 + full layers, noisy draft)", _kind("gemma3-text", "text"),
                  budget, "Gemma 3 window"),
             Case("tiny Qwen3-VL (image, noisy draft)", _kind("qwen3-vl", "image"), budget, "Qwen3-VL"),
             Case("tiny Qwen3.5 (image, gated delta rule beside full attention, noisy draft)",
                  _kind("qwen3.5", "image"), budget, "Qwen3.5"),
             Case("tiny Llama 3.2 Vision (image, cross-attention to it beside full attention, noisy draft)",
                  _kind("mllama", "image"), budget, "Llama 3.2 Vision")]
    return (out[:2] if quick else out) + kinds


def scratch_pass(runner, start: int, n: int, token: int = 7):
    """The model's pass over a root at sequence position `start` (its cache's length) and an n-node tree under it,
    four children a node, filled level by level (n = 0: the root alone, a one-token pass); the pass's columns are
    dropped after it. The trees the doctor times and compares passes on.  # -> Pass"""
    parents = [-1 if i < 4 else (i - 4) // 4 for i in range(n)]
    depths: list[int] = []
    for p in parents:  # a parent comes before its children
        depths.append(1 if p < 0 else depths[p] + 1)
    out = runner.forward([token] * (1 + n), [start] + [start + d for d in depths], verify_allowed(parents))
    runner.keep(start, [])
    return out


def to_device(pair: ModelPair, device: str) -> ModelPair:
    pair.target.to(device)
    if pair.draft is not None:
        pair.draft.to(device)
    return pair


def layer_map(model: torch.nn.Module, shards: int) -> dict[str, int]:
    """A device map (module name -> shard) that splits the decoder layers (the largest ModuleList) evenly over
    `shards`, in order; what comes before them (the vision tower, the embeddings) goes with the first layer, what
    comes after (the final norm, the head) with the last. Every parameter is in exactly one named module."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if not lists:
        raise RuntimeError("no decoder layers to split")
    name, layers = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    out: dict[str, int] = {}
    seen_layers = False

    def place(prefix: str, module: torch.nn.Module) -> None:
        nonlocal seen_layers
        for child, sub in module.named_children():
            full = f"{prefix}{child}"
            if full == name:
                for i in range(len(layers)):
                    out[f"{full}.{i}"] = i * shards // len(layers)
                seen_layers = True
            elif name.startswith(full + "."):
                place(full + ".", sub)
            else:
                out[full] = shards - 1 if seen_layers else 0
        if prefix == "":  # parameters held directly by the model itself (none in transformers' VLMs)
            for pname, _ in module.named_parameters(recurse=False):
                out[pname] = 0

    place("", model)
    return out


def spread(pair: ModelPair, devices: list[str], draft_device: str) -> tuple[ModelPair, dict]:
    """The target spread over `devices` by a device map (layer_map: its decoder layers split evenly, in order), the
    draft whole on `draft_device`: the `--device multi` placement for a pair built in memory. The devices may repeat
    ("cpu", "cpu"): accelerate's hooks then move nothing, and the engine runs the very path a multi-GPU target takes
    (its passes through forward(), ids fed to the first shard). Returns the pair and the map (module -> device)."""
    from accelerate import dispatch_model

    target = pair.target
    device_map = {name: devices[i] for name, i in layer_map(target, len(devices)).items()}
    with quiet_accelerate():  # it says that shards kept on the CPU are "offloaded" there: they stay in memory
        dispatched = dispatch_model(target, device_map=device_map, main_device=devices[0], force_hooks=True)
    draft = copy.deepcopy(pair.draft).to(draft_device) if pair.draft is not None else None
    placed = ModelPair(dispatched, draft, pair.processor, pair.draft_processor, pair.target_name, pair.draft_name)
    return placed, {name: str(d) for name, d in device_map.items()}
