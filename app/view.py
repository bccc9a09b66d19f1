"""What a run handler yields: one View per update, turned into Gradio's output tuple in one place.

Field names are the names of the output components in `layout.Ui`, in output order; the summary
is last because the `compare` API promises its JSON summary as the last output. A field left
None is not updated (gr.skip()), so an update never erases what is already on screen.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr


@dataclass
class View:
    status: str | None = None
    frames: list | None = None
    ar_text: str | None = None
    spec_text: list | None = None
    scoreboard: str | None = None
    replay: str | None = None
    fig_alpha: Any = None
    fig_accepted: Any = None
    fig_tree: Any = None
    fig_mapping: Any = None
    fig_time: Any = None
    step: Any = None  # a gr.Slider update
    export: Any = None  # a gr.DownloadButton update
    run_state: Any = None
    summary: dict | None = None

    def row(self) -> tuple:
        return tuple(gr.skip() if v is None else v for v in (getattr(self, f.name) for f in fields(self)))

    @classmethod
    def outputs(cls, ui) -> list:
        """The output components, in the order `row()` fills them."""
        return [getattr(ui, f.name) for f in fields(cls)]

