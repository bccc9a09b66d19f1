"""SAGE: entropy-guided adaptive tree speculative decoding for vision-language models.

Public entry points:
    load_pair(target, draft, dtype, device)      -> ModelPair
    prepare_input(pair, prompt, images, video)   -> PreparedInput
    SpecEngine(pair).stream(prepared, policy)    -> iterator of StepEvent
    SpecEngine(pair).generate(prepared, policy)  -> GenerationResult
    make_policy("sage:d_max=8") or a policy object: SagePolicy(SageConfig(...)), or a subclass of your own
"""

from .config import ChainConfig, Eagle2Config, SageConfig, SpecVLMConfig, StaticConfig
from .engine import SpecEngine
from .errors import InputError, ModelError, SageError
from .events import GenerationResult, RunStats, StepEvent
from .inputs import PreparedInput, prepare_input
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelPair, load_pair
from .policies import (
    POLICY_NAMES,
    AutoregressivePolicy,
    ChainPolicy,
    Eagle2Policy,
    Policy,
    SagePolicy,
    SpecVLMPolicy,
    StaticTreePolicy,
    make_policy,
)

__all__ = [
    "POLICY_NAMES", "ChainConfig", "Eagle2Config", "SageConfig", "SpecVLMConfig", "StaticConfig", "SpecEngine",
    "InputError", "ModelError", "SageError", "GenerationResult", "RunStats", "StepEvent",
    "PreparedInput", "prepare_input", "DEFAULT_DRAFT", "DEFAULT_TARGET", "ModelPair", "load_pair", "make_policy",
    "Policy", "AutoregressivePolicy", "ChainPolicy", "StaticTreePolicy", "Eagle2Policy", "SpecVLMPolicy", "SagePolicy",
]
