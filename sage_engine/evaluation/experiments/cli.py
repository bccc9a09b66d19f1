"""`python -m sage_engine experiment NAME`: its flags, its run, and its three outputs (JSON, Markdown, PNG)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ...errors import SageError
from ...run_flags import load_from_flags, machine_meta, model_args, policy_module_arg
from . import NAMES, experiment


def add_parser(sub) -> None:
    """The `experiment` subcommand on the CLI's subparsers, with the CLI's model flags."""
    p = sub.add_parser("experiment", help="one of the paper's experiments on this pair: " + ", ".join(NAMES)
                       + "; report: gather their Markdown into BENCHMARKS.md")
    p.add_argument("name", choices=[*NAMES, "all", "report"])
    p.add_argument("--out", default="experiments", help="folder of NAME.json, NAME.md, NAME.png and the resume file")
    p.add_argument("--quick", action="store_true", help="a small version (fewer inputs, tokens, cells): the tests'")
    p.add_argument("--fresh", action="store_true", help="ignore the cells an earlier run of these settings left")
    p.add_argument("--data", default=None, help="a benchmark file (.jsonl/.json: image QA, video QA or captions, "
                                                "GSM8K, HumanEval) instead of the built-in suites")
    p.add_argument("--format", default=None, help="the --data file's format when its keys do not say it")
    p.add_argument("--media-root", default=None, help="folder the --data file's media paths are relative to")
    p.add_argument("--limit", type=int, default=None, help="use only the first N rows of --data")
    p.add_argument("--policies", default=None, help="comma-separated policies instead of the experiment's own")
    p.add_argument("--seed", type=int, default=9001, help="tinyworld render seed of the fresh suites")
    p.add_argument("--n", type=int, default=None, help="fresh tinyworld images (and clips) per suite (default: the "
                                                        "experiment's own, 6 to 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every input and policy in the timed benches "
                                                         "(bench --rounds; --quick: 1)")
    p.add_argument("--work-dir", default=None, help="where the suites are materialised and kept (default: a "
                                                    "temporary folder of the run's own, removed at its end)")
    p.add_argument("--benchmarks", default="BENCHMARKS.md", help="report: the Markdown file to write the "
                                                                 "experiments' sections into")
    model_args(p)
    policy_module_arg(p)
    p.set_defaults(max_new_tokens=None)


def cmd_experiment(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if args.name == "report":
        from .benchmarks_sections import write_benchmarks

        print(write_benchmarks(Path(args.out), Path(args.benchmarks)))
        return 0
    names = NAMES if args.name == "all" else (args.name,)
    if args.data and not Path(args.data).is_file():
        raise SageError(f"--data is not a file: {args.data}")
    pair = load_from_flags(args) if len(names) > 1 else None  # `all`: one load, an engine per experiment
    for name in names:
        run_one(name, args, argv, pair)
    return 0


def run_one(name: str, args: argparse.Namespace, argv: list[str], pair=None) -> dict:
    """Run experiment `name` (on `pair`, else the pair the flags name) and write its outputs; returns what NAME.json
    holds."""
    from .common import Context
    from .markdown import markdown

    ctx = Context(name, args, pair)
    if ctx.resumed:
        print(f"{name}: resuming, {ctx.resumed} cells already done", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        outcome = experiment(name).run(ctx)
    finally:
        ctx.close()
    seconds = time.perf_counter() - t0
    meta = machine_meta("python -m sage_engine " + shlex.join(argv))
    record = {"name": name, "title": outcome.title, "claim": outcome.claim, "finding": outcome.finding,
              "columns": outcome.columns, "rows": outcome.rows, "notes": outcome.notes, "data": outcome.data,
              "settings": ctx.settings, "meta": meta, "seconds": round(seconds, 1), "resumed_cells": ctx.resumed,
              "models": ctx.pair.describe()}
    out = ctx.out
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    figure = None
    if outcome.draw is not None:
        figure = out / f"{name}.png"
        outcome.draw(outcome.data, figure)
    (out / f"{name}.md").write_text(markdown(record, figure.name if figure else None))
    print(f"{name}: {outcome.finding}")
    print(f"{name}: wrote {out / name}.json, .md{', .png' if figure else ''} in {seconds:.0f} s")
    return record
