"""Gradio component variants the app needs.

Gradio writes a typing stub (components.pyi) next to any module that defines a component
subclass; that is why this module holds only components (and why *.pyi is git-ignored here).
"""

from __future__ import annotations

import gradio as gr


class UploadedImage(gr.Image):
    """gr.Image that passes the uploaded file's path through untouched.

    gr.Image would open the file with PIL before our handler runs and fail with a raw PIL error on a
    broken upload; the engine's loader gives a clear message instead (and checks size limits first).
    """

    is_template = True  # rendered by the frontend as a plain gr.Image

    def preprocess(self, payload):
        if payload is not None and payload.path and not (payload.url or "").startswith("data:"):
            return str(payload.path)
        return super().preprocess(payload)


class StepSlider(gr.Slider):
    """The step slider: a number typed past either end reaches the handler (which shows the nearest step) instead
    of being refused by gr.Slider with an error toast and a server traceback."""

    is_template = True  # rendered by the frontend as a plain gr.Slider

    def preprocess(self, payload: float) -> float:
        return payload
