"""The run's arguments as the page and the API send them (any JSON value), read into typed settings: the
speculative policy and its knobs, SAGE's knobs, sampling, the number of new tokens. Anything else is an InputError
in one line.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from sage_engine import InputError, SageConfig
from sage_engine.config import parse_spec, spec_knobs

from .layout import MAX_NEW_TOKENS, POLICIES

if TYPE_CHECKING:  # imports torch: the app imports it after its page is served (app/__init__.py)
    from sage_engine.core.sampling import Sampling

INT_KNOBS = ("d_min", "d_max", "w_min", "w_max", "k", "n_max")


def sampling_of(knobs: dict) -> Sampling:
    """Sampling from the panel's temperature, top-p and seed (popped from `knobs`); InputError in one line."""
    from sage_engine.core.sampling import Sampling

    try:
        temperature, top_p = float(knobs.pop("temperature", 0.0)), float(knobs.pop("top_p", 1.0))
        seed = knobs.pop("seed", 0)
        seed = int(seed) if float(seed).is_integer() else seed  # a slider sends 3.0
        return Sampling(temperature, top_p, seed)
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"sampling: {e}") from None


def speculative_policy(spec: str, knobs: dict, policies: tuple[str, ...] = POLICIES):
    """(name, config) of the speculative lane from the API's `policy`: a name of `policies` (the dropdown's), or a name
    with knobs as `bench` and `generate` take them (`chain:k=3`, `sage:n_max=16`); for sage the knobs panel's
    settings, with the spec's own knobs on top. InputError (one line) for anything else."""
    name = spec.split(":")[0] if isinstance(spec, str) else spec
    if name not in policies:
        raise InputError(f"unknown policy {spec!r}; choose one of {', '.join(policies)}, optionally with knobs "
                         "(e.g. chain:k=3)")
    try:
        name, changes = spec_knobs(spec)
        if name != "sage":
            return name, parse_spec(spec)[1]
        return name, replace(sage_config(knobs), **changes)
    except ValueError as e:
        raise InputError(str(e)) from None


def sage_config(knobs: dict) -> SageConfig:
    """SageConfig from the knobs panel (missing knobs keep SageConfig's defaults); InputError if inconsistent."""
    try:
        ints = {k: int(v) for k, v in knobs.items() if k in INT_KNOBS}
        floats = {k: float(v) for k, v in knobs.items() if k == "theta_scale"}
    except (TypeError, ValueError, OverflowError):
        bad = {k: v for k, v in knobs.items() if k in (*INT_KNOBS, "theta_scale")}
        raise InputError(f"SAGE knobs: every number must be finite (got {bad})") from None
    choices = {k: str(v) for k, v in knobs.items() if k in ("alpha_source", "threshold", "draw") and v}
    try:
        return replace(SageConfig(), **ints, **floats, **choices)  # SageConfig checks its knobs (one line)
    except ValueError as e:
        raise InputError(str(e)) from None


def new_tokens(value) -> int:
    """max_new_tokens as sent to the API (any JSON number, NaN and infinities included): a whole number in
    [1, MAX_NEW_TOKENS], else InputError in one line."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if not (math.isfinite(x) and x == round(x) and 1 <= x <= MAX_NEW_TOKENS):
        raise InputError(f"max_new_tokens must be a whole number between 1 and {MAX_NEW_TOKENS} "
                         f"(got {str(value)[:40]})")
    return int(x)
