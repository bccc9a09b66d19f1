"""The SAGE Gradio demo: `build_demo()` returns the Blocks; `python app.py` serves it."""

from .demo import build_demo, launch_options
from .served import DEFAULT_PRESET, SERVED, served

__all__ = ["build_demo", "launch_options", "DEFAULT_PRESET", "SERVED", "served"]
