"""Which model pairs the app serves: a configured subset of the engine's named pairs, never a typed path.

The pairs themselves (paths or hub ids, dtype, device, why the tokenizers match) are data in
`sage_engine/models/presets.py`, shared with the CLI. The app offers only the names configured here
(default: the embedded tinyworld pair, which runs on a CPU Space) or chosen at start with
`--presets` / SAGE_PRESETS; the UI can pick among those and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from sage_engine.models.presets import PRESETS as ENGINE_PRESETS
from sage_engine.models.presets import Preset

DEFAULT_PRESET = "tinyworld"
SERVED: tuple[str, ...] = (DEFAULT_PRESET,)  # what `python app.py` offers unless told otherwise


# What a visitor should know about a pair, shown beside it (the model info line): one sentence per preset.
NOTES: Mapping[str, str] = MappingProxyType({
    "tinyworld": "A small pair trained here on scenes of coloured shapes; in any other picture or clip it sees 3 x 3 "
                 "regions and says only what it can see there: colours, light and dark, and what changes, never "
                 "objects.",
})


def served(names: Iterable[str] = SERVED) -> Mapping[str, Preset]:
    """The engine presets called `names`, in that order; ValueError names the known ones."""
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in ENGINE_PRESETS]
    if unknown or not names:
        raise ValueError(f"unknown model preset {unknown[0] if unknown else '(none)'!r}; "
                         f"known: {', '.join(ENGINE_PRESETS)}")
    return MappingProxyType({n: ENGINE_PRESETS[n] for n in names})


def unavailable(preset: Preset) -> str | None:
    """Why a local preset cannot load right now (one line), or None (hub presets are checked when loaded)."""
    if not preset.local:
        return None
    for role, path in (("target", preset.target), ("draft", preset.draft)):
        if path and not os.path.isdir(path):
            return f"the {role} model directory {path} does not exist"
    return None


def pick(presets: Mapping[str, Preset], name: str | None) -> Preset:
    """The preset called `name` (default: the first one); ValueError names the choices."""
    if not presets:
        raise ValueError("no model presets are configured")
    if name is None:
        return next(iter(presets.values()))
    if name not in presets:
        raise ValueError(f"preset {name!r} is not served; this app serves: {', '.join(presets)}")
    return presets[name]
