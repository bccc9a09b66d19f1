"""Model-pair presets: the ONLY pairs the app will load. Named data, never a user-typed path or repo.

The UI offers the names below; a preset maps to a target/draft pair and how to load it.
Add a preset here (or pass `presets=` to `build_demo`) to offer another pair; hub presets
(e.g. Qwen2.5-VL 7B target with a 3B draft) go in HUB_PRESETS once their issue lands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

from sage_engine import DEFAULT_DRAFT, DEFAULT_TARGET


@dataclass(frozen=True)
class Preset:
    """One model pair the app may serve."""

    name: str  # what the UI shows and `--preset` / SAGE_PRESET select
    target: str  # local directory (source "local") or hub repo id (source "hub")
    draft: str | None  # same kind as target; None = autoregressive only
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"  # "cpu", "cuda", "auto"
    source: Literal["local", "hub", "builtin"] = "local"  # builtin: made in code by the pair factory
    description: str = ""  # one line shown under the model picker

    def missing(self) -> str | None:
        """Why this preset cannot load right now (a one-line reason), or None."""
        if self.source != "local":
            return None
        for role, path in (("target", self.target), ("draft", self.draft)):
            if path is not None and not os.path.isdir(path):
                return f"the {role} model directory {path} does not exist"
        return None


TINYWORLD = Preset(
    name="tinyworld",
    target=DEFAULT_TARGET,
    draft=DEFAULT_DRAFT,
    dtype="float32",
    device="cpu",
    source="local",
    description="the embedded tiny Qwen2.5-VL pair trained on the tinyworld shapes (CPU, fp32)",
)

# Hub presets (large VLM pairs) are added by their own issue; keep them as data like TINYWORLD.
HUB_PRESETS: tuple[Preset, ...] = ()

PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (TINYWORLD, *HUB_PRESETS)})
DEFAULT_PRESET = TINYWORLD.name


def pick(presets: Mapping[str, Preset], name: str | None) -> Preset:
    """The preset called `name` (default: the first one); ValueError names the choices."""
    if not presets:
        raise ValueError("no model presets are configured")
    if name is None:
        return next(iter(presets.values()))
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; configured: {', '.join(presets)}")
    return presets[name]
