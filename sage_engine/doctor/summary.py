"""The doctor's Markdown summary: the same figures as its JSON report, as a few short tables."""

from __future__ import annotations

from .exactness import POLICIES


def _cell(row: dict) -> str:
    if row["exact"]:
        return "exact" + (f", tau {row['tau']:.2f}" if row.get("tau") and row["policy"] != "ar" else "")
    return f"**parts at {row['parted_at']}**"


def _exact_table(cases: list[dict], with_generate: bool) -> list[str]:
    cols = (["generate()"] if with_generate else []) + [f"`{p}`" for p in POLICIES]
    lines = ["| case | backends (target / draft) | " + " | ".join(cols) + " | s |",
             "|---" * (len(cols) + 3) + "|"]
    for case in cases:
        rows = {r["policy"]: r for r in case["rows"]}
        names = (["generate() vs ar"] if with_generate else []) + list(POLICIES)
        b = case["backends"]
        backends = f"{b['target']['cached']} / {b['draft']['cached']}"
        lines.append(f"| {case['case']} | {backends} | " + " | ".join(_cell(rows[n]) for n in names)
                     + f" | {case['seconds']} |")
    return lines


def markdown(report: dict) -> str:
    m = report["machine"]
    devs = ", ".join(f"{d['device']} ({d['name']}" + (f", {d['memory_gib']} GiB" if "memory_gib" in d else
                                                      f", {d['cores']} cores, {d['threads']} threads") + ")"
                     for d in m["devices"])
    out = [f"# sage doctor: `--device {report['device']}`" + (" (quick)" if report["quick"] else ""), "",
           f"{devs}; Python {m['python']}, torch {m['torch']} (CUDA {m['cuda'] or 'none'}), transformers "
           f"{m['packages']['transformers']['installed']}, accelerate {m['packages']['accelerate']['installed']}; "
           f"Numba: {m['numba']}. {report['seconds']} s in all.", ""]
    out += [f"- warning: {w}" for w in m["warnings"]] + ([""] if m["warnings"] else [])
    verdict = ("**fp32: every policy wrote exactly `ar`'s tokens.**" if not report["mismatches"] else
               "**fp32 MISMATCH:** " + "; ".join(report["mismatches"]))
    out += [verdict, "", "## fp32 (TF32 and reduced-precision reductions off)", ""]
    out += _exact_table(report["fp32"], True) + [""]
    if report.get("multi"):
        out += [f"## Multi-device placement ({report['multi_note']})", ""] + _exact_table(report["multi"], False) + [""]
    if report.get("bf16"):
        out += ["## bf16: each policy against bf16 `ar`", "",
                "| case | agreement | bf16 `ar` parts from fp32 `ar` at | " + " | ".join(f"`{p}`" for p in POLICIES)
                + " |", "|---" * (len(POLICIES) + 3) + "|"]
        for case in report["bf16"]:
            rows = {r["policy"]: r for r in case["rows"]}
            parts = case["ar_vs_fp32_parted_at"]
            out.append(f"| {case['case']} | {case['agreement']:.0%} | {'never' if parts is None else parts} | "
                       + " | ".join(_cell(rows[p]) for p in POLICIES) + " |")
        out.append("")
    s = report["speed"]
    out += [f"## Speed: {s['target']} ({s['target_params_m']}M parameters; draft {s['draft_params_m']}M), "
            f"{s['dtype']}, {s['new_tokens']} new tokens", "",
            "| policy | tokens/s | tau | target ms / step | draft ms / step | engine ms / step |", "|---|---|---|---|---|---|"]
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
                out.append(f"| `{p}` | {stage} | {c['steps']} of {census['decode_steps']} | {c['mean']} / {c['most']} |")
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
