"""The SAGE Gradio demo: `build_demo()` returns the Blocks; `python app.py` serves it.

The page comes first: importing this package and building the demo does not import torch, transformers, Numba or
the engine's modules that need them (sage_engine.core.engine, models, inputs, policies, sampling, pruning). The modules
here import those inside the functions that use them, or under `typing.TYPE_CHECKING` for annotations, and the pair
loads them behind the page (pool.py); tests/test_app_background_load.py checks it. Light engine modules (config,
errors, events, media, presets, premise) are imported at the top as usual.
"""

from .demo import build_demo, launch_options
from .served import DEFAULT_PRESET, SERVED, served

__all__ = ["build_demo", "launch_options", "DEFAULT_PRESET", "SERVED", "served"]
