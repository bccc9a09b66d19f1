"""tools/reliability_report.py renders RELIABILITY.md from made-up figures (fast: no server; the measurement
itself is `python -m tools.reliability`, not part of the suite)."""

from __future__ import annotations

from tools.reliability_report import pct, render  # the repository root is on sys.path (conftest.py)


def result() -> dict:
    leave_row = dict(processing_s=0.3, first_text_s=0.35, peak_races=1, correct=True)
    return dict(
        command="python -m tools.reliability --out RELIABILITY.md", date="today", machine="a CPU, 2 cores",
        server="a child", elapsed_s=90.0, tracebacks=0, errors=0, not_measured=["a real Space"],
        load=dict(visitors=8, inputs="a.png", policies="sage", max_new_tokens=48, correct=8, peak_races=1,
                  lane_s=1.3, wall_s=3.4, saw_rank=7, ranks=[[0], [], [1, 0]], wait_p50=1.68, wait_p95=3.03,
                  total_p50=2.06, total_p95=3.40),
        soak=dict(runs=100, warmup=4, inputs="a.png", policies="sage", max_new_tokens="24", correct=100,
                  rss_start_mb=1000.0, rss_end_mb=1070.0, rss_growth_pct=7.0, rss_series_mb=[1000.0, 1070.0],
                  tps_first=400.0, tps_last=410.0, tps_change_pct=2.5, ar_tps_first=300.0, ar_tps_last=300.0,
                  ar_tps_change_pct=0.0, threads_start=12, threads_end=11, files_start={"gradio": 3},
                  files_end={"gradio": 103}, files_start_total=3, files_end_total=103, files_per_run=1.0,
                  files_note="Growth: gradio +100."),
        leave=dict(long_tokens=512, notes=["one note"], modes={"cancelled": [leave_row, leave_row], "tab": []}),
    )


def test_render_states_each_figure_and_its_verdict():
    md = render(result())
    assert "    python -m tools.reliability --out RELIABILITY.md" in md and "a CPU, 2 cores" in md
    assert "| correct results (speculative ids == AR ids) | 8/8 |" in md
    assert "1.68 s / 3.03 s" in md and "2.06 s / 3.40 s" in md
    assert "growth +7.0% (< 5%: **NO**)" in md  # a failed bound is said plainly
    assert "+2.5% (within 10%: yes)" in md
    assert "ranks seen, per visitor: 0; -; 1,0" in md
    assert "| cancelled | 2 | 0.30, 0.30 s | 0.35, 0.35 s | 1 | 2/2 |" in md and "| tab |" not in md
    assert "## Not measured" in md and "- a real Space" in md


def test_pct_is_nearest_rank():
    waits = [0.1 * i for i in range(1, 9)]
    assert pct(waits, 0.5) == waits[3] and pct(waits, 0.95) == waits[-1]
