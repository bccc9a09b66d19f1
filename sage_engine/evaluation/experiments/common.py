"""What every experiment shares: its inputs, its model pair and engine, its resumable cells, and its three outputs.

An experiment is a function `run(ctx) -> Outcome`. It does its work in cells, `ctx.cell(key, fn)`: a cell's result
(plain JSON) is written to OUT/NAME.cells.json as soon as it is done, so an interrupted run started again with the
same settings skips the cells it has (a run with other settings starts afresh and says so). The Outcome is written
as OUT/NAME.json (settings, machine, every figure), OUT/NAME.md (the table, the finding, the figure) and OUT/NAME.png.

Inputs: the benchmark file of --data (benchfiles.py reads the formats), else the suites of `suites.py` (fresh
tinyworld images and clips the pair never saw, real photos and videos that packages ship), the ones the
experiment asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import SageError
from ..bench import BenchInput, find_inputs

MODELLED = "modelled"  # the label of every figure computed from a price model rather than a clock


@dataclass
class Outcome:
    """What an experiment found: a table (Markdown-ready rows), a one-line finding, the data behind both, a figure."""

    title: str
    claim: str  # the paper's claim the experiment tests, one sentence
    columns: list[str]
    rows: list[list]
    finding: str  # one line: what this pair shows
    data: dict = field(default_factory=dict)
    draw: Callable | None = None  # draw(data, path): the figure as PNG
    notes: list[str] = field(default_factory=list)  # what the reader must know to read the table


@dataclass(frozen=True)
class Suite:
    name: str
    inputs: tuple[BenchInput, ...]


class Context:
    """One experiment's settings, pair, engine and cells."""

    def __init__(self, name: str, args: argparse.Namespace, pair=None):
        """pair: an already loaded pair of the flags' models (`experiment all` loads it once), else loaded when
        first asked for."""
        self.name, self.args = name, args
        self.quick = bool(args.quick)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._pair, self._engine = pair, None
        self._work: tempfile.TemporaryDirectory | None = None  # where the suites are written, unless --work-dir
        self.settings = {"experiment": name, "quick": self.quick, "data": args.data, "policies": args.policies,
                         "max_new_tokens": args.max_new_tokens, "seed": args.seed, "n": args.n,
                         "models": [args.preset, args.target, args.draft], "rounds": args.rounds,
                         "draft_prune": None if args.draft_prune is None else [args.draft_prune.image,
                                                                               args.draft_prune.video]}
        self._cells_path = self.out / f"{name}.cells.json"
        self.cells: dict[str, object] = {}
        self.resumed = 0
        if self._cells_path.is_file() and not args.fresh:
            held = json.loads(self._cells_path.read_text())
            if held.get("settings") == self.settings:
                self.cells = held["cells"]
                self.resumed = len(self.cells)
            else:
                print(f"{name}: the cells in {self._cells_path} were made with other settings; starting afresh",
                      file=sys.stderr)

    def close(self) -> None:
        """Remove the suites this run wrote into a temporary folder."""
        if self._work is not None:
            self._work.cleanup()
            self._work = None

    # ------------------------------------------------------------------ work
    def cell(self, key: str, fn: Callable[[], object]):
        """fn()'s result, computed once per settings and kept in NAME.cells.json as soon as it is done."""
        if key in self.cells:
            return self.cells[key]
        value = fn()
        self.cells[key] = value
        tmp = self._cells_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"settings": self.settings, "cells": self.cells}))
        os.replace(tmp, self._cells_path)  # whole or not at all, even when interrupted mid-write
        return value

    def progress(self, total: int, desc: str):
        from tqdm import tqdm

        return tqdm(total=total, desc=f"{self.name}: {desc}", unit="cell", file=sys.stderr, leave=False)

    @property
    def pair(self):
        if self._pair is None:
            from ...run_flags import load_from_flags

            self._pair = load_from_flags(self.args)
        return self._pair

    @property
    def engine(self):
        """One engine for the whole experiment: its models' layers are checked once."""
        if self._engine is None:
            from ...core.engine import SpecEngine

            self._engine = SpecEngine(self.pair, draft_pruning=self.args.draft_prune,
                                      tree_forward=self.args.tree_forward)
        return self._engine

    @property
    def text_only(self) -> bool:
        from ...models.inputs import is_tokenizer

        return is_tokenizer(self.pair.processor)

    # ------------------------------------------------------------------ inputs
    def suites(self, names: tuple[str, ...], full_n: int | None = None) -> list[Suite]:
        """The --data file as one suite, else the named suites of suites.py (`full_n` inputs each on a full run,
        2 with --quick; the real suite keeps its own list)."""
        if self.args.data:
            from ..benchfiles import read_benchmark

            limit = 2 if self.quick else self.args.limit
            bf = read_benchmark(self.args.data, self.args.format, limit, self.args.media_root)
            items = tuple(BenchInput(i.path or f"{bf.name}#{i.id}", i.media, i.prompt) for i in bf.items)
            return [Suite(bf.name, items)]
        need(not self.text_only, "a text-only pair needs --data (a GSM8K or HumanEval file)")
        from ..suites import materialise

        if self.args.work_dir:
            work = Path(self.args.work_dir) / self.name
        else:  # this run's own folder (two runs at once must not rewrite each other's), removed by `close`
            self._work = self._work or tempfile.TemporaryDirectory(prefix=f"sage-{self.name}-")
            work = Path(self._work.name)
        n = 2 if self.quick else (self.args.n or full_n or 8)
        built = {s.name: s for s in materialise(work, self.args.seed, max(n, 2), quick=self.quick)}
        out = []
        for name in names:
            inputs = find_inputs(str(built[name].folder))
            out.append(Suite(name, tuple(inputs if name == "real" else inputs[:n])))
        return out

    def policies(self, default: tuple[str, ...], quick: tuple[str, ...]) -> list[str]:
        """--policies, else the experiment's own (`quick` with --quick). On a text-only pair `specvlm` is left out:
        a text prompt has no visual token to prune, so it would run `eagle2` a second time."""
        chosen = self.args.policies.split(",") if self.args.policies else quick if self.quick else default
        names = [p.strip() for p in chosen if p.strip()]
        return [p for p in names if self._reads_the_prompt_whole(p)] if self.text_only else names

    @staticmethod
    def _reads_the_prompt_whole(spec: str) -> bool:
        """Does the policy's draft read the whole prompt (no visual pruning of its own)? An unknown name is kept, for
        the bench to refuse in one line."""
        from ...policies import make_policy

        try:
            return make_policy(spec).draft_pruning is None
        except ValueError:
            return True

    @property
    def rounds(self) -> int:
        """Rounds of every timed bench (bench --rounds: an input's speedup is its rounds' median); 1 with --quick."""
        return 1 if self.quick else self.args.rounds

    def max_new_tokens(self, full: int, quick: int = 32) -> int:
        return self.args.max_new_tokens or (quick if self.quick else full)


def summary(report: dict) -> dict:
    """The figures an experiment keeps of a bench report: per policy tau, tokens/s, speedup, exactness, tree size,
    and per input each policy's speedup (its worst input)."""
    from ..suites_markdown import worst_input

    pols = {}
    for pol, agg in report["policies"].items():
        worst = worst_input(report, pol)  # (speedup, input, tokens); None for ar
        pols[pol] = {"tau": agg.get("mean_accepted"), "tokens_per_second": agg.get("tokens_per_second"),
                     "speedup": agg.get("speedup_vs_ar"), "exact": agg.get("exact_match_vs_ar"),
                     "tree_nodes": agg.get("tree_nodes_mean"),
                     "new_tokens": agg.get("new_tokens"),
                     "worst": None if worst is None else [worst[1], worst[0]]}
    return {"policies": pols, "inputs": report["inputs"], "max_new_tokens": report["max_new_tokens"]}


def ar_rate(summaries: list[dict]) -> float | None:
    """The machine's speed beside the figures: `ar` tokens/s, the median over the given bench summaries."""
    rates = [s["policies"]["ar"]["tokens_per_second"] for s in summaries if "ar" in s["policies"]]
    return statistics.median(rates) if rates else None


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def check_exact(summaries: dict[str, dict]) -> str:
    """'every run equal to ar' or the cells where a policy's tokens differ (never silent: the finding says it)."""
    wrong = [f"{cell}: {pol}" for cell, s in summaries.items() for pol, p in s["policies"].items()
             if p["exact"] is not None and p["exact"] < 1.0]
    return "every run equal to `ar`" if not wrong else "NOT EXACT in " + "; ".join(wrong)


def need(condition: bool, message: str) -> None:
    if not condition:
        raise SageError(message)
