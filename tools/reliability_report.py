"""RELIABILITY.md from the figures `python -m tools.reliability` measured: pure functions, no server here
(tests/test_reliability_report.py renders a made-up result)."""

from __future__ import annotations

import math
import os
import platform


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank: with 8 visitors p95 is the slowest one, not an interpolation."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else math.nan


def machine() -> str:
    """CPU model, cores, OS and Python, in one line."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{model}, {os.cpu_count()} cores, {system}, Python {platform.python_version()}"


def verdict(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def fmt_files(files: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(files.items())) or "none"


def load_section(r: dict) -> list[str]:
    return [
        f"## Load: {r['visitors']} visitors at once", "",
        f"Each submits one /compare job (gradio_client) at the same moment: inputs {r['inputs']}, policies "
        f"{r['policies']}, max_new_tokens {r['max_new_tokens']}.", "",
        "| figure | value |", "|---|---|",
        f"| correct results (speculative ids == AR ids) | {r['correct']}/{r['visitors']} |",
        f"| races decoding at once (server, sampled every 5 ms) | max {r['peak_races']} |",
        f"| all lanes' decoding time (sum) <= wall time | {r['lane_s']:.2f} s <= {r['wall_s']:.2f} s: "
        f"{verdict(r['lane_s'] <= r['wall_s'])} |",
        f"| visitors that saw a queue position | {r['saw_rank']} of the {r['visitors'] - 1} who had to wait "
        f"(ranks seen, per visitor: {'; '.join(','.join(map(str, x)) or '-' for x in r['ranks'])}) |",
        f"| wait, submit -> first update: p50 / p95 | {r['wait_p50']:.2f} s / {r['wait_p95']:.2f} s |",
        f"| total latency, submit -> result (files downloaded): p50 / p95 | {r['total_p50']:.2f} s / "
        f"{r['total_p95']:.2f} s |",
        "",
    ]


def soak_section(r: dict) -> list[str]:
    return [
        f"## Soak: {r['runs']} consecutive runs", "",
        f"One visitor, runs back to back: inputs {r['inputs']}, policies {r['policies']}, max_new_tokens "
        f"{r['max_new_tokens']}; the last 10 runs repeat the first 10 exactly (same inputs, policies, budgets). "
        f"Baseline taken after the load phase and {r['warmup']} warm-up runs.", "",
        "| figure | start | end | verdict |", "|---|---|---|---|",
        f"| correct results | | {r['correct']}/{r['runs']} | {verdict(r['correct'] == r['runs'])} |",
        f"| server RSS (VmRSS) | {r['rss_start_mb']:.1f} MB | {r['rss_end_mb']:.1f} MB | growth "
        f"{r['rss_growth_pct']:+.1f}% (< 5%: {verdict(r['rss_growth_pct'] < 5)}) |",
        f"| speculative tokens/s, first 10 vs last 10 | {r['tps_first']:.0f} | {r['tps_last']:.0f} | "
        f"{r['tps_change_pct']:+.1f}% (within 10%: {verdict(abs(r['tps_change_pct']) <= 10)}) |",
        f"| AR tokens/s, first 10 vs last 10 | {r['ar_tps_first']:.0f} | {r['ar_tps_last']:.0f} | "
        f"{r['ar_tps_change_pct']:+.1f}% |",
        # the machine's own drift moves both lanes alike; their ratio is what a slowing server would change
        f"| speculative / AR tokens/s, first 10 vs last 10 | {r['tps_first'] / r['ar_tps_first']:.2f} | "
        f"{r['tps_last'] / r['ar_tps_last']:.2f} | "
        f"{100 * (r['tps_last'] * r['ar_tps_first'] / (r['tps_first'] * r['ar_tps_last']) - 1):+.1f}% |",
        f"| server threads | {r['threads_start']} | {r['threads_end']} | "
        f"{verdict(r['threads_end'] <= r['threads_start'])} (no growth) |",
        f"| files in the server's temp dirs | {r['files_start_total']} | {r['files_end_total']} | "
        f"{r['files_per_run']:.2f} per run |", "",
        f"RSS every 10 runs (MB): {', '.join(f'{x:.1f}' for x in r['rss_series_mb'])}.", "",
        f"Files by directory, start: {fmt_files(r['files_start'])}; end: {fmt_files(r['files_end'])}.", "",
        r["files_note"], "",
    ]


def seconds(rows: list[dict], key: str) -> str:
    return ", ".join(f"{x[key]:.2f}" for x in rows) + " s"


def leave_section(r: dict) -> list[str]:
    lines = [
        "## Leaving mid-run", "",
        f"A visitor starts a long run (tiny random pair, {r['long_tokens']} tokens without EOS) and leaves after "
        "its first streamed text; then a next visitor submits a tinyworld run. Times from the moment of leaving.",
        "", "| how the visitor left | repetitions | -> next run processing (each) | -> next run's first text "
        "(each) | max races decoding during the next run | next run correct |", "|---|---|---|---|---|---|",
    ]
    for name, rows in r["modes"].items():
        if not rows:
            continue
        lines.append(
            f"| {name} | {len(rows)} | {seconds(rows, 'processing_s')} | {seconds(rows, 'first_text_s')} | "
            f"{max(x['peak_races'] for x in rows)} | "
            f"{sum(x['correct'] for x in rows)}/{len(rows)} |")
    return lines + [""] + [f"- {n}" for n in r.get("notes", [])] + [""]


def render(result: dict) -> str:
    """The whole RELIABILITY.md."""
    head = [
        "# Reliability of the demo as a public Space", "",
        "Measured by one command (not part of the test suite; the suite keeps a 3-visitor load test and a "
        "cancel test, tests/test_app_load.py):", "", f"    {result['command']}", "",
        f"- Date: {result['date']}", f"- Machine: {result['machine']}",
        f"- Server: {result['server']}", f"- Wall time of the whole command: {result['elapsed_s']:.0f} s",
        f"- Server log: {result['tracebacks']} tracebacks, {result['errors']} runs ended in an error message", "",
    ]
    tail = ["## Not measured", ""] + [f"- {n}" for n in result["not_measured"]] + [""]
    return "\n".join(head + load_section(result["load"]) + soak_section(result["soak"])
                     + leave_section(result["leave"]) + tail)
