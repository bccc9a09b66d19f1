"""`python -m sage_engine.evaluation.suites_report --out BENCHMARKS.md`: the benchmark suites, measured and written up.

Contract: materialise the three suites of `suites.py` (fresh tinyworld images, fresh tinyworld clips, real
photos and videos shipped by Python packages) under --work-dir, load the model pair once (the same model flags
as `python -m sage_engine bench`), run `bench.run_bench` on each suite with the same policies (default: every
policy bench runs by default), then write
- OUT, markdown: a header (command, date, machine, versions, seed), per suite one row per policy with tau,
  tokens/s, speedup vs ar, exact match vs ar, ms per step split into verify / draft / engine, tree nodes and
  depth, and the worst input (lowest speedup vs ar on one input, with its answer length); the sources and
  licences of the real suite; and a notes section with every report field this module does not know, so that
  fields added to bench later show up without an edit here;
  with --temperatures, the fresh images again at each temperature above 0, and a table of tau, speedup, alpha and
  tree shape per policy and temperature;
- --json-dir (default docs/bench beside OUT): each suite's raw bench report, SUITE.json (SUITE@TT.json for the
  sampled runs), and meta.json.
This module runs the suites and the command line; the markdown comes from report_markdown.py, whose
`write_markdown(reports, meta)` is pure (no models, no files): the tests feed it a synthetic report.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from ..run_flags import load_from_flags, machine_meta, model_args
from .suites import DEFAULT_N, DEFAULT_SEED, QUICK_TINYWORLD, REAL, Suite, materialise, package_version
from .suites_markdown import (  # noqa: F401  (the writer's public names, importable from here as before)
    KNOWN_POLICY_KEYS,
    KNOWN_REPORT_KEYS,
    READING,
    SAMPLED_SUITE,
    TABLE_HEAD,
    header_markdown,
    notes_markdown,
    policy_row,
    sampled_name,
    sampling_markdown,
    sources_markdown,
    suite_markdown,
    with_readme_table,
    worst_input,
    write_markdown,
)

QUICK_POLICIES = ("ar", "chain", "sage")  # --quick: the reference, the classic baseline, the default SAGE


def default_policies() -> list[str]:
    """Every policy bench runs by default: the CLI's `bench --policies` default, plus the names of any policy
    list bench.py exports (an upper-case name ending in POLICIES), so that policies added there appear here."""
    from ..cli import build_parser
    from . import bench

    names = build_parser().parse_args(["bench", "--inputs", ".", "--out", "-"]).policies.split(",")
    for attr, value in vars(bench).items():
        if attr.isupper() and attr.endswith("POLICIES") and isinstance(value, (tuple, list, dict)):
            names += [v for v in value if isinstance(v, str)]
    return list(dict.fromkeys(n.strip() for n in names if n.strip()))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sage_engine.evaluation.suites_report",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="markdown file to write, e.g. BENCHMARKS.md")
    p.add_argument("--from-json", action="store_true", help="measure nothing: write OUT, the figures and the README's "
                   "table from the reports already in --json-dir")
    p.add_argument("--readme", default=None, help="also rewrite the results table of this README (between its "
                   "'results' markers), e.g. README.md")
    p.add_argument("--json-dir", default=None, help="raw bench reports (default: docs/bench beside --out)")
    p.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "sage-report"),
                   help="where the suites are materialised (rewritten on every run)")
    p.add_argument("--policies", default=None,
                   help="comma-separated (default: every policy bench runs by default; --quick: ar,chain,sage)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {len(QUICK_POLICIES)} policies, a few inputs per suite")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="tinyworld render seed of the fresh suites")
    p.add_argument("--n", type=int, default=DEFAULT_N, help="fresh tinyworld images (and as many clips)")
    p.add_argument("--warmup", type=int, default=1, help="inputs decoded once per suite before timing")
    p.add_argument("--rounds", type=int, default=1,
                   help="decode every input with every policy this many times; keep each one's median-time run")
    p.add_argument("--temperatures", default="0",
                   help=f"comma-separated; each value above 0 decodes the {SAMPLED_SUITE} suite again with that "
                        "temperature (seed 0) and adds a sampling section, e.g. 0,0.7,1.0")
    p.add_argument("--sampled-policies", default="",
                   help="comma-separated policies decoded only at the temperatures above 0 (settings that greedy "
                        "decoding ignores, e.g. sage:draw=sample)")
    model_args(p)  # the bench's model flags: --threads, --dtype, --device, --preset, --max-new-tokens, ...
    p.set_defaults(max_new_tokens=96)
    return p


def temperatures(text: str) -> list[float]:
    """--temperatures: finite numbers >= 0 (SageError otherwise)."""
    from ..core.sampling import Sampling
    from ..errors import SageError

    try:
        values = [float(t) for t in text.split(",") if t.strip()]
        for t in values:
            Sampling(t)
    except ValueError as e:
        raise SageError(f"--temperatures: {e}") from None
    return sorted(set(values))


def run_suites(args: argparse.Namespace, suites: list[Suite], policies: list[str]) -> dict[str, dict]:
    """The pair loaded once, then bench's interleaved run on every suite (and on the sampled suite again at every
    temperature above 0; policies transformers runs only greedy are left out there)."""
    from tqdm import tqdm

    from ..core.sampling import Sampling
    from .bench import find_inputs, run_bench
    from .hf_reference import is_hf_spec

    temps = [t for t in temperatures(args.temperatures) if t > 0]
    pair = load_from_flags(args)
    reports = {}
    runs = [(suite, suite.name, None, policies) for suite in suites]
    extra = [p.strip() for p in args.sampled_policies.split(",") if p.strip()]
    sampled = [p for p in policies if not is_hf_spec(p)] + [p for p in extra if p not in policies]
    runs += [(suite, sampled_name(suite.name, t), Sampling(t), sampled)
             for t in temps for suite in suites if suite.name == SAMPLED_SUITE]
    for suite, name, sampling, chosen in runs:
        inputs = find_inputs(str(suite.folder))
        total = len(inputs) * len(set(chosen) | {"ar"}) * args.rounds
        with tqdm(total=total, desc=name, unit="run", file=sys.stderr) as bar:
            reports[name] = run_bench(pair, inputs, chosen, args.max_new_tokens, args.warmup, bar,
                                      args.draft_prune, tree_forward=args.tree_forward, sampling=sampling,
                                      rounds=args.rounds)
    return reports


def _sources(folder: Path) -> list[dict]:
    return [{"file": it.file, "prompt": it.prompt, "package": it.package, "version": package_version(it.package),
             "path": it.path, "licence": it.licence} for it in REAL if (folder / it.file).is_file()]


def main(argv: list[str] | None = None) -> int:
    from ..errors import SageError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return write_report(args, argv)
    except (SageError, FileNotFoundError) as e:  # a bad flag or a missing package: one line, status 2
        print(f"error: {e}", file=sys.stderr)
        return 2


def write_report(args: argparse.Namespace, argv: list[str]) -> int:
    """Materialise, measure, write the JSON reports, the figures and OUT (with --from-json: the last two from the
    reports already written); the command is recorded as it was typed."""
    out = Path(args.out)
    json_dir = Path(args.json_dir) if args.json_dir else out.parent / "docs" / "bench"
    if args.from_json:
        reports = {p.stem: json.loads(p.read_text()) for p in sorted(json_dir.glob("*.json")) if p.stem != "meta"}
        meta = json.loads((json_dir / "meta.json").read_text())
        order = [*meta.get("suites", {}), *sorted(reports)]  # the suites first, in their order, then sampled runs
        reports = {name: reports[name] for name in dict.fromkeys(order) if name in reports}
    else:
        reports, meta = _measure(args, argv, out, json_dir)
    from .suites_figures import render

    drawn = render(reports, json_dir.parent / "figures")
    figures = [(title, os.path.relpath(path, out.parent)) for title, path in drawn]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(write_markdown(reports, meta, figures))
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(with_readme_table(readme.read_text(), reports))
    print(f"wrote {out}, {len(figures)} figures and {len(reports)} reports in {json_dir}")
    return 0


def _measure(args: argparse.Namespace, argv: list[str], out: Path, json_dir: Path) -> tuple[dict, dict]:
    """The suites materialised and benched; their reports and the run's meta, written to `json_dir`."""
    temperatures(args.temperatures)  # a bad value fails before any work
    from .bench import check_rounds

    check_rounds(args.rounds)
    chosen = args.policies.split(",") if args.policies else QUICK_POLICIES if args.quick else default_policies()
    policies = [p.strip() for p in chosen if p.strip()]
    work = Path(args.work_dir)
    suites = materialise(work, args.seed, args.n, args.quick)
    reports = run_suites(args, suites, policies)
    offline = "HF_HUB_OFFLINE=1 " if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    meta = machine_meta(f"{offline}python -m sage_engine.evaluation.suites_report {shlex.join(argv)}")
    meta.update(seed=args.seed, n=args.n, keep=QUICK_TINYWORLD if args.quick else None,
                sources=_sources(work / "real"), json_dir=os.path.relpath(json_dir, out.parent),
                suites={s.name: {"title": s.title, "about": s.about} for s in suites})
    json_dir.mkdir(parents=True, exist_ok=True)
    for name, report in reports.items():
        (json_dir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (json_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return reports, meta


if __name__ == "__main__":
    raise SystemExit(main())
