"""The SAGE paper's experiments, one command each: `python -m sage_engine experiment NAME` (also `sage experiment`).

  main      policies by suite, tau and speedup (RQ1, RQ2)          main.py
  pruning   the draft's visual-token pruning ratio, 0 to 0.95      pruning.py
  length    tau and speed against the generation budget            length.py
  shape     SAGE's D_max by W_max grid, history controller on/off  shape.py (RQ4)
  entropy   alpha against acceptance, node by node; the premise    entropy.py (RQ3)
  cost      the balance of draft and target cost, modelled         cost.py (RQ5), prices.py
  report    gather the experiments' Markdown into BENCHMARKS.md    benchmarks_sections.py

Each runs on the embedded pair by default (--preset, --target/--draft for others), on fresh tinyworld scenes and
real photos (--data FILE: a benchmark file, benchfiles.py), writes OUT/NAME.json, NAME.md and NAME.png (common.py),
resumes where an interrupted run stopped, and has a --quick version that the tests run.
"""

from __future__ import annotations

from importlib import import_module

NAMES = ("main", "pruning", "length", "shape", "entropy", "cost")


def experiment(name: str):
    """The module of experiment `name` (its `run(ctx) -> Outcome`)."""
    if name not in NAMES:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)} (or report)")
    return import_module(f"{__name__}.{name}")
