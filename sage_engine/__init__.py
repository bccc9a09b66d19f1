"""SAGE: entropy-guided adaptive tree speculative decoding for vision-language models.

Public entry points:
    load_pair(target, draft, dtype, device)      -> ModelPair
    prepare_input(pair, prompt, images, video)   -> PreparedInput
    SpecEngine(pair).stream(prepared, policy)    -> iterator of StepEvent
    SpecEngine(pair).generate(prepared, policy)  -> GenerationResult
    make_policy("sage:d_max=8") or a policy object: SagePolicy(SageConfig(...)), or a subclass of your own
    register_policy(name, factory, config)       -> the policy runs by name everywhere (CLI: --policy-module FILE)
    make_policy("priced:sage") / PricedPolicy(p) -> a policy priced by this machine's measured costs

What a policy author reads and writes (core/policy_io.py, core/tree.py): TreeShape (the answer to shape()),
Frontier (what expand() reads), DraftTree (what expand() adds to), StepOutcome (what observe() learns from), Probe.
reference.py is the whole loop in one file, for reading.

`from sage_engine import SpecEngine` imports the submodule that defines the name when it is first asked for (PEP 562
`__getattr__`), not with the package: importing a light module such as `sage_engine.config` or `sage_engine.errors`
then does not import torch, transformers or Numba, which lets the demo serve its page before they load (app/).
"""

from __future__ import annotations

import importlib

# submodule -> the public names it defines
_EXPORTS: dict[str, tuple[str, ...]] = {
    "config": ("ChainConfig", "Eagle2Config", "PricedConfig", "SageConfig", "SpecVLMConfig", "StaticConfig"),
    "core.engine": ("SpecEngine",),
    "errors": ("InputError", "ModelError", "SageError"),
    "core.events": ("GenerationResult", "RunStats", "StepEvent"),
    "models.inputs": ("PreparedInput", "prepare_input"),
    "models.loading": ("DEFAULT_DRAFT", "DEFAULT_TARGET", "ModelPair", "load_pair"),
    "policies": ("POLICY_NAMES", "AutoregressivePolicy", "ChainPolicy", "DddPolicy", "Eagle2Policy", "Policy",
                 "PricedPolicy", "SagePolicy", "SpecVLMPolicy", "StaticTreePolicy", "SvipPolicy", "make_policy",
                 "policy_names", "register_policy"),
    "core.policy_io": ("Frontier", "Probe", "StepOutcome", "TreeShape"),
    "core.sampling": ("Sampling",),
    "core.tree": ("DraftTree",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups find it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
