"""BENCHMARKS.md's text from the suites' bench reports: `write_markdown(reports, meta)` and its sections.

Pure (no models, no files): `python -m sage_engine.evaluation.suites_report` (suites_report.py) measures the suites
and calls it; the tests feed it a synthetic report. Each suite gets one row per policy with tau, tokens/s, speedup
vs ar, exact match vs ar, ms per step split into verify / draft / engine, tree nodes and depth, and the worst input;
then the sampling table (when the run decoded at temperatures above 0), the sources of the real suite, and a notes
section with every report field this module does not know, so that fields added to bench later show up without an
edit here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    def cell(policy: str, agg: dict, report: dict) -> str:
        shape = ("" if not agg.get("tree_nodes_mean") else
                 f" / α {_num(agg.get('alpha_mean'), '.2f')} / W {agg.get('root_width_mean') or 0:.1f}, "
                 f"{agg['tree_nodes_mean']:.1f} nodes, depth {agg.get('tree_depth_mean') or 0:.1f}")
        return f"{agg['mean_accepted']:.2f} / {_num(agg.get('speedup_vs_ar'), '.2f', 'x')}{shape}"

    return lines + _policy_rows([runs[t] for t in temps], cell) + [""]


def _policy_rows(reports: list[dict], cell) -> list[str]:
    """A markdown row per policy of `reports` (in the order first met): `cell(policy, aggregate, report)` in each
    report's column, "-" where a report lacks the policy."""
    rows = []
    for policy in dict.fromkeys(p for r in reports for p in r["policies"]):
        cells = [cell(policy, r["policies"][policy], r) if policy in r["policies"] else "-" for r in reports]
        rows.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    return rows


def write_markdown(reports: dict[str, dict], meta: dict, figures: list[tuple[str, str]] = ()) -> str:
    """BENCHMARKS.md from the suites' bench reports (insertion order) and `meta`: command, date, cpu, cores,
    python, torch, transformers, seed, n, keep, suites {name: {"title", "about"}}, sources [...], json_dir."""
    first = next(iter(reports.values()))
    lines = ["# Benchmarks", "", "Written by `python -m sage_engine.evaluation.suites_report`; regenerate it with the "
             "command below rather than editing it.", "", *header_markdown(first, meta), READING, ""]
    for title, path in figures:  # (title, path relative to the markdown file), drawn by suites_figures.py
        lines += [f"**{title}**", "", f"![{title}]({path})", ""]
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


README_SUITES = ("tinyworld-images", "tinyworld-clips", "real")  # the README's three columns
README_LEAVES_OUT = ("svip", "ddd")  # the related-work policies written as a user would: BENCHMARKS.md has their rows
README_START, README_END = "<!-- results: written by sage_engine.evaluation.suites_report -->", "<!-- /results -->"


def readme_table(reports: dict[str, dict]) -> str:
    """The README's one results table, from the greedy suites' reports: per policy, tau and speedup vs `ar` on each
    suite, with the worst input of the real one; `ar`'s row gives its tokens/s."""
    suites = [s for s in README_SUITES if s in reports]
    shown = [{**reports[s], "policies": {p: a for p, a in reports[s]["policies"].items() if p not in README_LEAVES_OUT}}
             for s in suites]
    real = shown[suites.index("real")] if "real" in suites else None

    def cell(policy: str, agg: dict, report: dict) -> str:
        if policy == "ar":
            return f"1.00 / {agg['tokens_per_second']:.0f} tok/s"
        worst = worst_input(report, policy) if report is real else None
        return f"{agg['mean_accepted']:.2f} / {agg['speedup_vs_ar'] or 0:.2f}x" + (
            f" (worst {worst[0]:.2f}x)" if worst else "")

    head = ["| policy | " + " | ".join(f"{s}: tau / speedup" for s in suites) + " |", "|---" * (len(suites) + 1) + "|"]
    return "\n".join(head + _policy_rows(shown, cell))


def with_readme_table(readme: str, reports: dict[str, dict]) -> str:
    """`readme` with the block between README_START and README_END replaced by `readme_table(reports)`."""
    start, end = readme.index(README_START) + len(README_START), readme.index(README_END)
    return readme[:start] + "\n" + readme_table(reports) + "\n" + readme[end:]
