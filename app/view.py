"""What a run handler yields: one View per update, turned into Gradio's output tuple in one place.

Field names are the names of the output components in `layout.Ui`, in output order; the summary
is last because the `compare` API promises its JSON summary as the last output. A field left at
SKIP is not updated (gr.skip()), so an update never erases what is already on screen.

gr.skip() and gr.Component(...) updates are not free in Gradio 6: each one rebuilds the component
and its config (server CPU per output per update, taken from decoding on a small CPU).
Streamed updates therefore carry plain values for every output (the unchanged ones again; Gradio
sends only the difference to the browser) and keep updates for the first and last view of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr


class _Skip:
    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()  # "leave this output as it is"


@dataclass
class View:
    status: Any = SKIP
    ar_text: Any = SKIP
    spec_text: Any = SKIP
    scoreboard: Any = SKIP
    replay: Any = SKIP
    fig_alpha: Any = SKIP
    fig_accepted: Any = SKIP
    fig_tree: Any = SKIP
    fig_mapping: Any = SKIP
    fig_time: Any = SKIP
    step: Any = SKIP  # a number, or a gr.Slider update
    export: Any = SKIP  # a file path or None, or a gr.DownloadButton update
    run_state: Any = SKIP
    summary: Any = SKIP

    def row(self) -> tuple:
        return tuple(gr.skip() if v is SKIP else v for v in (getattr(self, f.name) for f in fields(self)))

    @classmethod
    def outputs(cls, ui) -> list:
        """The output components, in the order `row()` fills them."""
        return [getattr(ui, f.name) for f in fields(cls)]
