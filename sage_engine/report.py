"""`python -m sage_engine.report --out BENCHMARKS.md`: the benchmark suites, measured and written up.

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
`write_markdown(reports, meta)` is pure (no models, no files): the tests feed it a synthetic report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .suites import DEFAULT_N, DEFAULT_SEED, QUICK_TINYWORLD, REAL, Suite, materialise, package_version

QUICK_POLICIES = ("ar", "chain", "sage")  # --quick: the reference, the classic baseline, the default SAGE
# Fields bench reports today; anything else a report carries is printed under "Notes" as it is.
KNOWN_REPORT_KEYS = {"device", "dtype", "threads", "models", "max_new_tokens", "draft_pruning", "tree_forward",
                     "prompt_path", "inputs", "policies", "runs", "sampling", "rounds"}
SAMPLED_SUITE = "tinyworld-images"  # the suite decoded again at every --temperatures value above 0
KNOWN_POLICY_KEYS = {"mean_accepted", "tokens_per_second", "speedup_vs_ar", "exact_match_vs_ar", "target_forwards",
                     "draft_forwards", "overhead_fraction", "overhead_ms_per_step", "time_split",
                     "alpha_std_within_run", "alpha_mean", "root_width_mean", "tree_nodes_mean", "tree_depth_mean",
                     "accepted_by_depth", "new_tokens",
                     "seconds", "peak_memory_mb"}
TABLE_HEAD = ("| policy | tau | tok/s | speedup vs ar | exact vs ar | verify ms/step | draft ms/step "
              "| engine ms/step | prefill share | nodes / depth | worst input: speedup, answer tokens |")


def default_policies() -> list[str]:
    """Every policy bench runs by default: the CLI's `bench --policies` default, plus the names of any policy
    list bench.py exports (an upper-case name ending in POLICIES), so that policies added there appear here."""
    from . import bench
    from .cli import build_parser

    names = build_parser().parse_args(["bench", "--inputs", ".", "--out", "-"]).policies.split(",")
    for attr, value in vars(bench).items():
        if attr.isupper() and attr.endswith("POLICIES") and isinstance(value, (tuple, list, dict)):
            names += [v for v in value if isinstance(v, str)]
    return list(dict.fromkeys(n.strip() for n in names if n.strip()))


def worst_input(report: dict, policy: str) -> tuple[float, str, int] | None:
    """(speedup vs ar, input, answer tokens) of the input where `policy` gained least over ar in this run: the run's
    paired speedup (bench.paired_speedup), else, in a report without it, the ratio of the kept runs' tokens/s."""
    ar = {r["input"]: r for r in report["runs"] if r["policy"] == "ar"}
    found = []
    for r in report["runs"]:
        base = ar.get(r["input"])
        if r["policy"] == policy and policy != "ar" and base and base.get("tokens_per_second"):
            speedup = r.get("speedup_vs_ar") or r["tokens_per_second"] / base["tokens_per_second"]
            found.append((speedup, r["input"], r["new_tokens"]))
    return min(found) if found else None


def policy_row(report: dict, policy: str) -> dict:
    """One table row: the aggregate's figures, ms per target forward from the runs, the worst input."""
    agg = report["policies"][policy]
    runs = [r for r in report["runs"] if r["policy"] == policy]
    steps = sum(r.get("target_forwards") or 0 for r in runs)

    def per_step(key: str) -> float | None:  # seconds summed over runs, per decode step, in ms
        return 1e3 * sum(r.get(key) or 0.0 for r in runs) / steps if steps else None

    return {"policy": policy, "tau": agg.get("mean_accepted"), "tps": agg.get("tokens_per_second"),
            "speedup": agg.get("speedup_vs_ar"), "exact": agg.get("exact_match_vs_ar"),
            "verify_ms": per_step("target_seconds"), "draft_ms": per_step("draft_seconds"),
            "engine_ms": per_step("other_seconds"), "prefill": (agg.get("time_split") or {}).get("prefill"),
            "nodes": agg.get("tree_nodes_mean"),
            "depth": agg.get("tree_depth_mean"), "worst": worst_input(report, policy)}


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _row_markdown(row: dict) -> str:
    worst = row["worst"]
    worst_text = "-" if worst is None else f"`{worst[1]}`: {worst[0]:.2f}x, {worst[2]} tokens"
    tree = "-" if not row["nodes"] else f"{row['nodes']:.1f} / {row['depth']:.1f}"
    cells = [f"`{row['policy']}`", _num(row["tau"], ".2f"), _num(row["tps"], ".1f"),
             _num(row["speedup"], ".2f", "x"), _num(row["exact"], ".2f"), _num(row["verify_ms"], ".2f"),
             _num(row["draft_ms"], ".2f"), _num(row["engine_ms"], ".2f"),
             _num(None if row["prefill"] is None else 100 * row["prefill"], ".0f", "%"), tree, worst_text]
    return "| " + " | ".join(cells) + " |"


def suite_markdown(title: str, about: str, report: dict, json_link: str | None = None) -> list[str]:
    """A suite's section: what it is, the table, and how deep the accepted path got per tree policy."""
    media = [r["media"] for r in report["runs"] if r["policy"] == "ar"]
    counts = ", ".join(f"{media.count(m)} {m}{'s' if media.count(m) > 1 else ''}" for m in ("image", "video")
                       if m in media)
    raw = f"; raw report: [{json_link}]({json_link})" if json_link else ""
    lines = [f"## {title}", "", about, "", f"{report.get('inputs', len(media))} inputs ({counts}){raw}.", "",
             TABLE_HEAD, "|" + "---|" * (TABLE_HEAD.count("|") - 1)]
    lines += [_row_markdown(policy_row(report, p)) for p in report["policies"]]
    depth = [(p, a["accepted_by_depth"]) for p, a in report["policies"].items() if a.get("accepted_by_depth")]
    if depth:
        lines += ["", "Accepted path reaches depth l = 1, 2, ... (given the tree does):", "", "```"]
        width = max(len(p) for p, _ in depth)
        lines += [f"{p:{width}}  " + " ".join(f"{x:.2f}" for x in rates) for p, rates in depth]
        lines.append("```")
    return lines + [""]


def _value_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def _note_lines(label: str, value, indent: int = 0) -> list[str]:
    """A bullet per note; a dict of notes becomes nested bullets, one per key."""
    pad = "  " * indent
    if isinstance(value, dict) and value:
        return [f"{pad}- {label}:"] + [line for k, v in value.items() for line in _note_lines(k, v, indent + 1)]
    return [f"{pad}- {label}: {_value_text(value)}"]


def notes_markdown(reports: dict[str, dict]) -> list[str]:
    """Every report field, top-level or per policy, that the tables do not know (bench's `notes`, `premise`,
    statistics added later, ...), labelled `suite / key` or `suite / policy / key`."""
    lines = []
    for suite, report in reports.items():
        for key in sorted(set(report) - KNOWN_REPORT_KEYS):
            lines += _note_lines(f"{suite} / {key}", report[key])
        for policy, agg in report["policies"].items():
            for key in sorted(set(agg) - KNOWN_POLICY_KEYS):
                lines += _note_lines(f"{suite} / `{policy}` / {key}", agg[key])
    return ["## Notes", "", *lines, ""] if lines else []


def _seed_text(meta: dict) -> str:
    kept = f", the first {meta['keep']} of each kind" if meta.get("keep") else ""
    return f"{meta.get('seed', '-')} (`tinyworld render --seed {meta.get('seed')} --n {meta.get('n')}`{kept})"


def _model_text(models: dict, role: str) -> str:
    """`name` (N params), a local path shown relative to the working directory (the repo root, usually)."""
    name, params = str(models.get(role)), models.get(f"{role}_params")
    if os.path.isabs(name) and Path(name).is_relative_to(Path.cwd()):
        name = os.path.relpath(name)
    return f"`{name}`" + (f" ({params:,} params)" if isinstance(params, int) else "")


def header_markdown(first: dict, meta: dict) -> list[str]:
    models = first.get("models", {})
    rows = [
        ("command", f"`{meta.get('command', '')}`"),
        ("date", meta.get("date", "-")),
        ("device / dtype / threads", f"{first.get('device')} / {first.get('dtype')} / {first.get('threads')}"),
        ("CPU", f"{meta.get('cpu', '-')} ({meta.get('cores', '-')} cores)"),
        ("python / torch / transformers",
         f"{meta.get('python', '-')} / {meta.get('torch', '-')} / {meta.get('transformers', '-')}"),
        ("target / draft", f"{_model_text(models, 'target')} / {_model_text(models, 'draft')}"),
        ("max new tokens", str(first.get("max_new_tokens"))),
        ("rounds", f"{first.get('rounds', 1)} (each input and policy: the run of median wall time)"),
        ("tinyworld seed", _seed_text(meta)),
        ("draft pruning / tree forward",
         f"{_value_text(first.get('draft_pruning') or 'off')} / {_value_text(first.get('tree_forward'))}"),
        ("prompt path", _value_text(first.get("prompt_path") or "-")),
    ]
    return ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]


def sources_markdown(sources: list[dict]) -> list[str]:
    if not sources:
        return []
    lines = ["## Sources of the real suite", "",
             "Each file ships inside the installed package (pinned in requirements-test.txt); nothing is downloaded.",
             "", "| file | prompt | package | path in the package | licence |", "|---|---|---|---|---|"]
    lines += [f"| `{s['file']}` | {s['prompt']} | {s['package']}=={s['version']} | `{s['path']}` | {s['licence']} |"
              for s in sources]
    return lines + [""]


READING = ("tau: tokens per target forward (1 for `ar`). Speedup and exact match are against `ar` in the same "
           "run: every input is decoded by every policy back to back, in rotating order (with several rounds, each "
           "input and policy counts its run of median wall time). ms/step: time per target "
           "forward after the prefill, split into the target's verification, the draft's forwards (its reads and tree "
           "levels) and the engine's own work (policy, tree, masks, acceptance, cache). Prefill share: the part of "
           "the policy's wall time spent reading the prompt, the target's and (when a step drafts) the draft's; it "
           "bounds what any tree can gain (the shorter the answer, the larger it is). Worst input: the input "
           "with the lowest speedup vs `ar`, its name, the policy's answer length in tokens, and that speedup (with "
           "several rounds, the median of the input's per-round speedups: in each round the policy and `ar` ran back "
           "to back). "
           "Timings on a shared machine drift: compare ratios within one suite.")


def sampled_name(suite: str, temperature: float) -> str:
    return f"{suite}@T{temperature:g}"


def sampling_markdown(reports: dict[str, dict]) -> list[str]:
    """Per policy, tau and speedup vs ar at each temperature the suite was decoded at (ar at the same
    temperature and seed), with the draft's mean confidence alpha and the verified tree (root width, nodes,
    depth): hotter sampling flattens the draft's distribution, so SAGE plans wider, shallower trees."""
    runs = {0.0: reports.get(SAMPLED_SUITE)} if SAMPLED_SUITE in reports else {}
    for name, report in reports.items():
        if name.startswith(f"{SAMPLED_SUITE}@T") and report.get("sampling"):
            runs[report["sampling"]["temperature"]] = report
    if len(runs) < 2:
        return []
    temps = sorted(runs)
    lines = ["## Sampling: temperature 0 (greedy) and above", "",
             f"The `{SAMPLED_SUITE}` suite decoded at each temperature (top-p 1, seed 0; each speedup against `ar` "
             "at the same temperature in the same run). Each cell: tau / speedup / mean alpha / root width, nodes, "
             "depth of the verified tree. `chain` and `sage:draw=sample` sample their draft and test min(1, p/q) "
             "(same distribution as `ar`, a different draw, so their exact match is low); the other tree policies "
             "draw exactly `ar`'s tokens.", "",
             "| policy | " + " | ".join(f"T = {t:g}" for t in temps) + " |", "|---|" + "---|" * len(temps)]
    for policy in dict.fromkeys(p for t in temps for p in runs[t]["policies"]):
        cells = []
        for t in temps:
            agg = runs[t]["policies"].get(policy)
            if agg is None:
                cells.append("-")
                continue
            shape = ("" if not agg.get("tree_nodes_mean") else
                     f" / α {_num(agg.get('alpha_mean'), '.2f')} / W {agg.get('root_width_mean') or 0:.1f}, "
                     f"{agg['tree_nodes_mean']:.1f} nodes, depth {agg.get('tree_depth_mean') or 0:.1f}")
            cells.append(f"{agg['mean_accepted']:.2f} / {_num(agg.get('speedup_vs_ar'), '.2f', 'x')}{shape}")
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(reports: dict[str, dict], meta: dict) -> str:
    """BENCHMARKS.md from the suites' bench reports (insertion order) and `meta`: command, date, cpu, cores,
    python, torch, transformers, seed, n, keep, suites {name: {"title", "about"}}, sources [...], json_dir."""
    first = next(iter(reports.values()))
    lines = ["# Benchmarks", "", "Written by `python -m sage_engine.report`; regenerate it with the command below "
             "rather than editing it.", "", *header_markdown(first, meta), READING, ""]
    for name, report in reports.items():
        about = dict(meta.get("suites", {}).get(name.split("@")[0], {}))
        if report.get("sampling"):
            about["title"] = f"{about.get('title', name)}, sampled at temperature {report['sampling']['temperature']:g}"
        link = f"{meta['json_dir']}/{name}.json" if meta.get("json_dir") else None
        lines += suite_markdown(about.get("title", name), about.get("about", ""), report, link)
    lines += sampling_markdown(reports)
    lines += sources_markdown(meta.get("sources", []))
    lines += notes_markdown(reports)
    return "\n".join(lines).rstrip() + "\n"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_meta(command: str) -> dict:
    import torch
    import transformers

    return {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def build_parser() -> argparse.ArgumentParser:
    from .cli import _model_args

    p = argparse.ArgumentParser(prog="python -m sage_engine.report", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="markdown file to write, e.g. BENCHMARKS.md")
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
    _model_args(p)  # the bench's model flags: --threads, --dtype, --device, --preset, --max-new-tokens, ...
    p.set_defaults(max_new_tokens=96)
    return p


def temperatures(text: str) -> list[float]:
    """--temperatures: finite numbers >= 0 (SageError otherwise)."""
    from .errors import SageError
    from .sampling import Sampling

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

    from .bench import find_inputs, run_bench
    from .cli import _load
    from .hf_reference import is_hf_spec
    from .sampling import Sampling

    temps = [t for t in temperatures(args.temperatures) if t > 0]
    pair = _load(args)
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
    from .errors import SageError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return write_report(args, argv)
    except (SageError, FileNotFoundError) as e:  # a bad flag or a missing package: one line, status 2
        print(f"error: {e}", file=sys.stderr)
        return 2


def write_report(args: argparse.Namespace, argv: list[str]) -> int:
    """Materialise, measure, write OUT and the JSON reports; the command is recorded as it was typed."""
    temperatures(args.temperatures)  # a bad value fails before any work
    from .bench import check_rounds

    check_rounds(args.rounds)
    chosen = args.policies.split(",") if args.policies else QUICK_POLICIES if args.quick else default_policies()
    policies = [p.strip() for p in chosen if p.strip()]
    out, work = Path(args.out), Path(args.work_dir)
    json_dir = Path(args.json_dir) if args.json_dir else out.parent / "docs" / "bench"
    suites = materialise(work, args.seed, args.n, args.quick)
    reports = run_suites(args, suites, policies)
    offline = "HF_HUB_OFFLINE=1 " if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    meta = machine_meta(f"{offline}python -m sage_engine.report {shlex.join(argv)}")
    meta.update(seed=args.seed, n=args.n, keep=QUICK_TINYWORLD if args.quick else None,
                sources=_sources(work / "real"), json_dir=os.path.relpath(json_dir, out.parent),
                suites={s.name: {"title": s.title, "about": s.about} for s in suites})
    json_dir.mkdir(parents=True, exist_ok=True)
    for name, report in reports.items():
        (json_dir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (json_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(write_markdown(reports, meta))
    print(f"wrote {out} and {len(reports)} reports in {json_dir}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
