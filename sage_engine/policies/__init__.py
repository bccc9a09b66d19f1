"""Decoding policies: how each step's draft tree is shaped, and how the shape learns from the last step.

Baselines are policies too (baselines.py); SAGE is sage.py; the interface is base.py. `make_policy` makes one by
name or spec (`sage:n_max=32:d_max=10`). A policy of your own subclasses one of these classes and is passed to
`SpecEngine.stream` / `generate` as an object.
"""

from __future__ import annotations

from ..config import POLICY_CONFIGS, parse_spec
from .base import Policy
from .baselines import AutoregressivePolicy, ChainPolicy, Eagle2Policy, SpecVLMPolicy, StaticTreePolicy
from .sage import SagePolicy

_CLASSES = (AutoregressivePolicy, ChainPolicy, StaticTreePolicy, Eagle2Policy, SpecVLMPolicy, SagePolicy)
_POLICIES = {cls.name: (cls, POLICY_CONFIGS[cls.name]) for cls in _CLASSES}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)  # the one list of the engine's policy names
SPECULATIVE_POLICIES: tuple[str, ...] = tuple(n for n, (cls, _) in _POLICIES.items() if cls.uses_draft)

_DEFAULT_CONFIGS: dict[type, object] = {}


def make_policy(name: str, config=None) -> Policy:
    """A fresh policy by name; `config` overrides the defaults of that policy's dataclass.

    `name` may also be a spec with overridden knobs, `sage:n_max=32:d_max=10` (see `parse_spec`)."""
    if ":" in name and config is None:
        name, config = parse_spec(name)
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(_POLICIES)}")
    cls, cfg_cls = _POLICIES[name]
    if cfg_cls is None:
        return cls()
    if config is None:  # the settings are frozen: one default object per class, shared by the policies made with it
        config = _DEFAULT_CONFIGS.get(cfg_cls) or _DEFAULT_CONFIGS.setdefault(cfg_cls, cfg_cls())
    return cls(config)


__all__ = ["POLICY_NAMES", "SPECULATIVE_POLICIES", "AutoregressivePolicy", "ChainPolicy", "Eagle2Policy", "Policy",
           "SagePolicy", "SpecVLMPolicy", "StaticTreePolicy", "make_policy"]
