"""`python -m sage_engine experiment report --out DIR --benchmarks BENCHMARKS.md`: the experiments' sections in
BENCHMARKS.md, from the JSON records in DIR (each section with its figure), between two markers that the command
keeps: a rerun replaces the sections, and the rest of the file (the suites' report) is left as it is."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import SageError
from . import NAMES
from .markdown import markdown

START, END = "<!-- experiments: written by `python -m sage_engine experiment report` -->", "<!-- /experiments -->"
INTRO = ("The paper's experiments on the embedded pair, one command each (docs/EXPERIMENTS.md says what each tests "
         "and what carries over to large models on GPUs). Speedups marked modelled come from a price model, not a "
         "clock.")


def sections(out: Path, relative_to: Path) -> list[str]:
    """Each experiment's section, in NAMES order, for the records present in `out`."""
    found = []
    for name in NAMES:
        path = out / f"{name}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        figure = out / f"{name}.png"
        link = os.path.relpath(figure, relative_to) if figure.is_file() else None
        found.append(markdown(record, link, level=3))
    return found


def write_benchmarks(out: Path, benchmarks: Path) -> str:
    parts = sections(out, benchmarks.parent)
    if not parts:
        raise SageError(f"no experiment records (NAME.json) in {out}")
    block = "\n".join([START, "## The paper's experiments", INTRO, *parts, END])
    text = benchmarks.read_text() if benchmarks.is_file() else "# Benchmarks\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    benchmarks.write_text(text)
    return f"wrote {len(parts)} experiment sections into {benchmarks}"
