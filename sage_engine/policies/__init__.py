"""Decoding policies: how each step's draft tree is shaped, and how the shape learns from the last step.

Baselines are policies too (baselines.py); SAGE is sage.py; the interface is base.py; `priced:NAME` prices any of
them by this machine's measured costs (priced.py); svip.py and ddd.py are two related-work policies written as a
user would. `make_policy` makes one by name or spec (`sage:n_max=32:d_max=10`, `priced:sage`); `register_policy`
adds a name, after which the CLI (`--policy-module FILE`), the benchmark and the experiments run it like a built-in.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from ..config import POLICY_CONFIGS, parse_spec
from .base import Policy
from .baselines import AutoregressivePolicy, ChainPolicy, Eagle2Policy, SpecVLMPolicy, StaticTreePolicy
from .ddd import DDD_NAME, DddConfig, DddPolicy
from .priced import PRICED, PricedPolicy, PricedStep, replay_of
from .sage import SagePolicy
from .svip import SVIP_NAME, SvipConfig, SvipPolicy

_CLASSES = (AutoregressivePolicy, ChainPolicy, StaticTreePolicy, Eagle2Policy, SpecVLMPolicy, SagePolicy)
# name -> (factory, its config dataclass or None): factory(config) makes a policy, factory() where it has none
_POLICIES: dict[str, tuple[Callable, type | None]] = {cls.name: (cls, POLICY_CONFIGS[cls.name]) for cls in _CLASSES}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)  # the engine's own policies (the paper's baselines and SAGE)
SPECULATIVE_POLICIES: tuple[str, ...] = tuple(n for n, (cls, _) in _POLICIES.items() if cls.uses_draft)

_DEFAULT_CONFIGS: dict[type, object] = {}
MODULE_POLICIES: list[str] = []  # the names the loaded --policy-module files registered, in order
_registering: list[str] | None = None  # while a policy module runs: the names it registers


def register_policy(name: str, factory: Callable, config: type | None = None) -> None:
    """Make a policy runnable by `name` wherever a built-in one is: `make_policy`, `SpecEngine.generate(prep, name)`,
    `generate --policy`, `bench --policies`, `check-sampling`, the experiments and the doctor (the CLI loads a file
    that calls this with `--policy-module FILE`).

    factory: `factory(cfg)` returns a fresh Policy, cfg an instance of `config` (a frozen dataclass: its scalar fields
    are the spec's knobs, `NAME:knob=value`); `factory()` where `config` is None. A name may be registered again (a
    module loaded twice); the engine's own names and `priced` may not be taken."""
    if not name or ":" in name or "," in name or name == PRICED or name in POLICY_NAMES:
        raise ValueError(f"cannot register a policy named {name!r}: a name without ':' or ',', not {PRICED!r} and "
                         f"none of the engine's own ({', '.join(POLICY_NAMES)})")
    if config is not None and not dataclasses.is_dataclass(config):
        raise ValueError(f"policy {name!r}: config must be a dataclass (got {config!r})")
    _POLICIES[name] = (factory, config)
    POLICY_CONFIGS[name] = config  # where a spec's knobs are read (config.spec_knobs)
    if _registering is not None and name not in _registering:
        _registering.append(name)


def policy_names() -> tuple[str, ...]:
    """Every policy name make_policy knows: the engine's own, then the registered ones."""
    return tuple(_POLICIES)


def make_policy(name: str, config=None) -> Policy:
    """A fresh policy by name; `config` overrides the defaults of that policy's dataclass.

    `name` may also be a spec with overridden knobs, `sage:n_max=32:d_max=10` (see `parse_spec`), and
    `priced:SPEC` prices SPEC by this machine (priced.py; so does `sage` with threshold "cost")."""
    if name.startswith(PRICED + ":"):
        return PricedPolicy(make_policy(name[len(PRICED) + 1:], config))
    if ":" in name and config is None:
        name, config = parse_spec(name)
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(_POLICIES)} (or priced:NAME)")
    factory, cfg_cls = _POLICIES[name]
    if cfg_cls is None:
        return factory()
    if config is None:  # the settings are frozen: one default object per class, shared by the policies made with it
        config = _DEFAULT_CONFIGS.get(cfg_cls) or _DEFAULT_CONFIGS.setdefault(cfg_cls, cfg_cls())
    if getattr(config, "threshold", None) == "cost":  # SAGE's knob for this machine's prices: `priced:sage`
        return PricedPolicy(factory(dataclasses.replace(config, threshold="paper")))
    return factory(config)


def load_policy_module(path: str) -> list[str]:
    """Run the Python file `path`, which registers its policies (`register_policy`): the names it registered (also
    added to MODULE_POLICIES); ValueError in one line where it cannot be read or fails."""
    global _registering
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--policy-module: no such file {path!r}")
    name = f"sage_policy_module_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    _registering = []
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: one line, whatever it raised
        del sys.modules[name]
        raise ValueError(f"--policy-module {path}: {type(e).__name__}: {e}") from None
    finally:
        names, _registering = _registering, None
    MODULE_POLICIES.extend(n for n in names if n not in MODULE_POLICIES)
    return names


register_policy(SVIP_NAME, SvipPolicy, SvipConfig)
register_policy(DDD_NAME, DddPolicy, DddConfig)

__all__ = ["MODULE_POLICIES", "POLICY_NAMES", "PRICED", "SPECULATIVE_POLICIES", "AutoregressivePolicy",
           "ChainPolicy", "DddPolicy", "Eagle2Policy", "Policy", "PricedPolicy", "PricedStep", "SagePolicy",
           "SpecVLMPolicy", "StaticTreePolicy", "SvipPolicy", "load_policy_module", "make_policy", "policy_names",
           "register_policy", "replay_of"]
