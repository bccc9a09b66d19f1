"""The doctor's Markdown summary: the same figures as its JSON report, as a few short tables."""

from __future__ import annotations

from . import exactness

README_START, README_END = "<!-- doctor: written from docs/doctor/cpu.json -->", "<!-- /doctor -->"


def _cell(row: dict) -> str:
    if row["exact"]:
        return "exact" + (f", tau {row['tau']:.2f}" if row.get("tau") and row["policy"] != "ar" else "")
    return f"**parts at {row['parted_at']}**"


def _gap(case: dict) -> str:
    return f" | {case['pass_gap']:.1e}" if "pass_gap" in case else ""


def _exact_table(cases: list[dict]) -> list[str]:
    names = [r["policy"] for r in cases[0]["rows"]]
    cols = ["generate()" if n == "generate() vs ar" else f"`{n}`" for n in names]
    gap = " | tree vs one-token logits" if "pass_gap" in cases[0] else ""
    lines = ["| case | backends (target / draft) | " + " | ".join(cols) + gap + " | s |",
             "|---" * (len(cols) + 3 + bool(gap)) + "|"]
    for case in cases:
        rows = {r["policy"]: r for r in case["rows"]}
        b = case["backends"]
        backends = f"{b['target']['cached']} / {b['draft']['cached']}"
        lines.append(f"| {case['case']} | {backends} | " + " | ".join(_cell(rows[n]) for n in names)
                     + _gap(case) + f" | {case['seconds']} |")
    return lines


def headline(report: dict) -> list[str]:
    """The summary's first table (the README's GPU section shows it from a CPU run): one row per check."""
    def exact(section: str) -> str:
        runs = [r for c in report[section] for r in c["rows"]]
        bad = [r for r in runs if not r["exact"]]
        pairs = len(report[section])
        return (f"{len(runs) - len(bad)} of {len(runs)} runs exact ({pairs} pair{'s' * (pairs > 1)}, "
                f"{len(exactness.POLICIES)} policies + " + ("generate()" if section == "fp32" else "`ar`") + ")")
    s, v = report["speed"], report["speed"]["verify"]
    rows = [("fp32, every policy against `ar`", exact("fp32"))]
    if report.get("multi"):
        m = report["multi"][0]
        rows.append((f"the same, target over {' + '.join(m['devices'])}, draft on {m['draft_device']}",
                     exact("multi")))
    if report.get("bf16"):
        rows.append(("bf16, runs equal to bf16 `ar`", ", ".join(f"{c.get('short', c['case'])} {c['agreement']:.0%}"
                                                               for c in report["bf16"])))
    rows += [(f"{s['target_params_m']:.0f}M target, {s['dtype']}: `ar` / `sage`",
              f"{s['ar']['tokens_per_second']} / {s['sage']['tokens_per_second']} tokens/s: {s['speedup']}x, "
              f"tau {s['sage']['tau']:.2f}"),
             ("verify of 1 / 8 / 32 / 64 draft nodes", " / ".join(f"{x}x" for x in v["relative"].values())
              + f" one token ({v['one_token_ms']} ms)"),
             ("engine time per step, `ar` / `sage`",
              f"{s['ar']['engine_ms_per_step']} / {s['sage']['engine_ms_per_step']} ms")]
    reads = s["host_reads"]["sage"]
    rows.append(("host reads in a `sage` step (most)", ", ".join(
        f"{stage} {c['most']}" for stage, c in reads["stages"].items() if stage != "prefill")
        + f"; {reads['synchronize']} synchronize"))
    return ["| check | result |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]


def markdown(report: dict) -> str:
    m = report["machine"]
    devs = ", ".join(f"{d['device']} ({d['name']}, {d['memory_gib']} GiB"
                     + (f", {d['cores']} cores, {d['threads']} threads" if "cores" in d else
                        f", compute capability {d['capability']}")
                     + f"; bf16 {'yes' if d['bf16'] else 'no'}, fp16 {'yes' if d['fp16'] else 'no'})"
                     for d in m["devices"])
    out = [f"# sage doctor: `--device {report['device']}`" + (" (quick)" if report["quick"] else ""), "",
           f"{devs}; Python {m['python']}, torch {m['torch']} (CUDA {m['cuda'] or 'none'}), transformers "
           f"{m['packages']['transformers']['installed']}, accelerate {m['packages']['accelerate']['installed']}; "
           f"Numba: {m['numba']}. {report['seconds']} s in all" + (f": `{report['command']}`." if report.get("command")
                                                                   else "."), ""]
    out += [f"- warning: {w}" for w in m["warnings"]] + ([""] if m["warnings"] else [])
    verdict = ("**fp32: every policy wrote exactly `ar`'s tokens.**" if not report["mismatches"] else
               "**fp32 MISMATCH:** " + "; ".join(report["mismatches"]))
    out += [verdict, ""] + headline(report) + ["", "## fp32 (TF32 and reduced-precision reductions off)", ""]
    out += _exact_table(report["fp32"]) + [""]
    notes = sorted({f"{section}, {role} of {c['case']}: {n}" for section in ("fp32", "multi")
                    for c in report.get(section) or [] for role, b in c["backends"].items() for n in b["notes"]})
    out += ["Backends: `cached` runs the decode steps, `prompt` the prompt; what was turned down, and why:", ""]
    out += [f"- {n}" for n in notes] or ["- nothing: every model runs on the fastest backend that applies to it"]
    out.append("")
    if report.get("multi"):
        out += [f"## Multi-device placement ({report['multi_note']})", ""] + _exact_table(report["multi"]) + [""]
    if report.get("bf16"):
        out += ["## bf16: each policy against bf16 `ar`", "",
                "| case | agreement | bf16 `ar` parts from fp32 `ar` at | "
                + " | ".join(f"`{p}`" for p in exactness.POLICIES)
                + " | tree vs one-token logits |", "|---" * (len(exactness.POLICIES) + 4) + "|"]
        for case in report["bf16"]:
            rows = {r["policy"]: r for r in case["rows"]}
            parts = case["ar_vs_fp32_parted_at"]
            out.append(f"| {case['case']} | {case['agreement']:.0%} | {'never' if parts is None else parts} | "
                       + " | ".join(_cell(rows[p]) for p in exactness.POLICIES) + _gap(case) + " |")
        out += ["", "The last column: the largest difference between a token's logits computed alone and as a tree's "
                "root, over their largest magnitude; a pair of tokens nearer than that may swap places."]
        out.append("")
    s = report["speed"]
    out += [f"## Speed: {s['target']} ({s['target_params_m']}M parameters; draft {s['draft_params_m']}M), "
            f"{s['dtype']}, {s['new_tokens']} new tokens", "",
            "| policy | tokens/s | tau | target ms / step | draft ms / step | engine ms / step |",
            "|---|---|---|---|---|---|"]
    for p in ("ar", "sage"):
        r = s[p]
        out.append(f"| `{p}` | {r['tokens_per_second']} | {r['tau']:.2f} | {r['target_ms_per_step']} | "
                   f"{r['draft_ms_per_step']} | {r['engine_ms_per_step']} |")
    v = s["verify"]
    out += ["", f"`sage` is {s['speedup']}x `ar`. A verify pass against a one-token pass ({v['one_token_ms']} ms):", "",
            "| draft nodes | " + " | ".join(v["relative"]) + " |", "|---" * (len(v["relative"]) + 1) + "|",
            "| cost | " + " | ".join(f"{x}x" for x in v["relative"].values()) + " |", ""]
    out += ["## Host reads per decode step (each is a sync on a GPU)", "",
            "| policy | stage | steps reading | reads per such step (mean / most) |", "|---|---|---|---|"]
    for p, census in s["host_reads"].items():
        for stage, c in census["stages"].items():
            if stage != "prefill":
                out.append(f"| `{p}` | {stage} | {c['steps']} of {census['decode_steps']} | "
                           f"{c['mean']} / {c['most']} |")
    out.append("")
    for p, census in s["host_reads"].items():
        sites = [x for x in census["sites"] if x["stage"] != "prefill"]
        out.append(f"`{p}` reads at: " + "; ".join(f"{x['stage']} {x['site']} `{x['op']}` x{x['reads']}"
                                                   for x in sites) + ".")
        extra = [f"{census['synchronize']} explicit synchronize calls"]
        if census.get("cuda_sync_warnings") is not None:
            extra.append(f"{census['cuda_sync_warnings']} syncs flagged by torch's sync debug mode")
        out.append(f"  Over {census['decode_steps']} steps: " + ", ".join(extra) + "; stages reading more than once "
                   f"in a step: {', '.join(census['stages_over_one']) or 'none'}.")
    return "\n".join(out) + "\n"


def with_readme_table(readme: str, report: dict) -> str:
    """`readme` with the block between README_START and README_END replaced by the report's first table."""
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return head + README_START + "\n" + "\n".join(headline(report)) + "\n" + README_END + tail
