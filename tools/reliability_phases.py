"""The three phases of `python -m tools.reliability`: load, soak, leaving mid-run. Each talks to the server child
(tools.reliability.Child) through gradio_client (the API the Run button uses) or Chromium, and returns plain
figures for tools/reliability_report.py. Correctness is the suite's own check (tests/app_server.check_summary)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from gradio_client import Client, handle_file
from gradio_client.utils import Status

from app.layout import POLICIES
from app.media import load_examples
from tools.reliability_report import pct

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import app_server  # noqa: E402
from app_server import OUT, check_summary  # noqa: E402
from test_app_load import LONG_IMAGE, LONG_PROMPT  # noqa: E402

# Where each temp dir's files end (the soak reports the growth of each).
LIMITS = {
    "gradio": "Gradio's cache (uploads and outputs): Blocks(delete_cache=(3600, 3600)) deletes files older than "
              "an hour, every hour",
    "sage-runs": "the app's run exports (app/media.RunFiles): files older than an hour are deleted at each export",
    "sage-previews": "browser previews of videos (app/media.Previews): at most 256 kept, the oldest deleted first",
    "sage-examples-cache": "lazily cached examples: one stored run per example, written once",
}


def inputs(work: Path) -> list[dict]:
    """The repository's examples (images and clips) and one generated VP8 clip (tests/app_server.write_video)."""
    rows = [{"name": Path(e.file).name, e.media: e.file, "prompt": e.prompt} for e in load_examples()]
    rows.append({"name": "generated.webm", "video": app_server.write_video(work / "generated.webm", frames=12),
                 "prompt": "What happens in the video?"})
    return rows


def submit(client: Client, item: dict, policy: str, n: int, preset: str | None = None):
    """A /compare job on `item` (an image or a video), as the Run button sends it."""
    files = {k: handle_file(item[k]) if item.get(k) else None for k in ("image", "video")}
    extra = {"preset": preset} if preset else {}
    return client.submit(**files, prompt=item["prompt"], max_new_tokens=n, policy=policy, api_name="/compare",
                         **extra)


def follow(job, t0: float, rec: dict) -> dict:
    """Poll `job` until it ends, recording (seconds after t0) the queue ranks it saw, when it started processing,
    its first update (the reset view), its first streamed text (the second update) and its end."""
    ranks = rec.setdefault("ranks", set())
    while True:
        done, st, n_out = job.done(), job.status(), len(job.outputs())
        now = time.perf_counter() - t0
        if st.code == Status.IN_QUEUE and st.rank is not None:
            ranks.add(st.rank)
        if st.code in (Status.PROCESSING, Status.ITERATING):
            rec.setdefault("processing_s", now)
        if n_out >= 1:
            rec.setdefault("first_update_s", now)
        if n_out >= 2:
            rec.setdefault("first_text_s", now)
        if done:
            rec["done_s"] = now
            return rec
        time.sleep(0.01)


def correct(job) -> tuple[bool, dict]:
    """(speculative ids == AR ids and the summary complete, the summary); False for any error."""
    try:
        final = dict(zip(OUT, job.result()))
        return check_summary(final, final["summary"]["speculative"]["policy"]) is not None, final["summary"]
    except Exception:  # noqa: BLE001 - a wrong or failed run is counted, not raised
        return False, {}


def load(child, media: list[dict], visitors: int, n: int = 48) -> dict:
    """`visitors` clients submit at once; one run at a time, all correct, ranks shown, waits and latency."""
    clients = [Client(child.url, verbose=False) for _ in range(visitors)]
    plan = [(media[i % len(media)], POLICIES[i % len(POLICIES)]) for i in range(visitors)]
    child.peak()
    t0 = time.perf_counter()
    jobs = [submit(c, item, policy, n) for c, (item, policy) in zip(clients, plan)]
    recs = [{} for _ in jobs]
    watchers = [threading.Thread(target=follow, args=(j, t0, r)) for j, r in zip(jobs, recs)]
    for w in watchers:
        w.start()
    for w in watchers:
        w.join(600)
    wall = time.perf_counter() - t0
    checks = [correct(j) for j in jobs]
    waits, totals = [r["first_update_s"] for r in recs], [r["done_s"] for r in recs]
    lane_s = sum(s[lane]["stats"]["seconds"] for _, s in checks if s for lane in ("ar", "speculative"))
    return dict(visitors=visitors, inputs=", ".join(sorted({i['name'] for i, _ in plan})),
                policies=", ".join(POLICIES), max_new_tokens=n, correct=sum(ok for ok, _ in checks),
                peak_races=child.peak(), lane_s=lane_s, wall_s=wall,
                saw_rank=sum(bool(r["ranks"]) for r in recs), ranks=[sorted(r["ranks"]) for r in recs],
                wait_p50=pct(waits, 0.5), wait_p95=pct(waits, 0.95), total_p50=pct(totals, 0.5),
                total_p95=pct(totals, 0.95))


def soak_plan(media: list[dict], period: int = 90) -> list[tuple[dict, str, int]]:
    """`period` runs covering every input with every policy (budgets 24/32/48); the soak repeats it, so runs
    90-99 are runs 0-9 again and their tokens/s compare like with like."""
    return [(media[(k // len(POLICIES)) % len(media)], POLICIES[k % len(POLICIES)], (24, 32, 48)[k % 3])
            for k in range(period)]


def rate(summaries: list[dict], lane: str) -> float:
    """Tokens per second of `lane` over several runs (all tokens / all decoding seconds)."""
    stats = [s[lane]["stats"] for s in summaries if s]
    return sum(x["new_tokens"] for x in stats) / max(1e-9, sum(x["seconds"] for x in stats))


def soak(child, media: list[dict], runs: int, warmup: int = 4) -> dict:
    """`runs` consecutive runs by one visitor; the server's RSS, threads and temp files before and after."""
    client, plan = Client(child.url, verbose=False), soak_plan(media)
    for k in range(warmup):  # one run per policy first: first-call allocations are not growth
        submit(client, media[k % len(media)], POLICIES[k % len(POLICIES)], 32).result()
    rss0, threads0, files0, bytes0 = child.status("VmRSS"), child.status("Threads"), child.files(), child.disk_bytes()
    summaries, rss_series = [], []
    for i in range(runs):
        item, policy, n = plan[i % len(plan)]
        summaries.append(correct(submit(client, item, policy, n))[1])
        if (i + 1) % 10 == 0:
            rss_series.append(child.status("VmRSS") / 1024)
    rss1, threads1, files1, bytes1 = child.status("VmRSS"), child.status("Threads"), child.files(), child.disk_bytes()
    growth = {k: files1.get(k, 0) - files0.get(k, 0) for k in sorted(set(files0) | set(files1))}
    note = "Growth by directory over the soak: " + "; ".join(
        f"{k} {v:+d} ({LIMITS.get(k, 'no known limit')})" for k, v in growth.items()) + (
        f". On disk: {(bytes1 - bytes0) / runs / 1024:.0f} KB more per run. Each run's JSON export is written by "
        "the app and copied by Gradio into its cache for the download button; the same files uploaded again are "
        "not stored again (Gradio's cache names files by content hash).")
    first, last = summaries[:10], summaries[-10:]
    tps, ar_tps = (rate(first, "speculative"), rate(last, "speculative")), (rate(first, "ar"), rate(last, "ar"))
    return dict(runs=runs, warmup=warmup, inputs=", ".join(m["name"] for m in media), policies=", ".join(POLICIES),
                max_new_tokens="24, 32 and 48 in turn", correct=sum(bool(s) for s in summaries),
                rss_start_mb=rss0 / 1024, rss_end_mb=rss1 / 1024, rss_growth_pct=100 * (rss1 - rss0) / rss0,
                rss_series_mb=rss_series, tps_first=tps[0], tps_last=tps[1],
                tps_change_pct=100 * (tps[1] - tps[0]) / tps[0], ar_tps_first=ar_tps[0], ar_tps_last=ar_tps[1],
                ar_tps_change_pct=100 * (ar_tps[1] - ar_tps[0]) / ar_tps[0], threads_start=threads0,
                threads_end=threads1, files_start=files0, files_end=files1, files_start_total=sum(files0.values()),
                files_end_total=sum(files1.values()), files_per_run=(sum(files1.values()) - sum(files0.values()))
                / runs, files_note=note)


def leave_by_cancel(child, media: list[dict], long_preset: str) -> dict | None:
    """A gradio_client visitor cancels a long run after its first streamed text; None if it ended first."""
    leaver = submit(Client(child.url, verbose=False), {"image": str(LONG_IMAGE), "prompt": LONG_PROMPT}, "sage",
                    512, preset=long_preset)
    deadline = time.perf_counter() + 60
    while len(leaver.outputs()) < 2 and not leaver.done() and time.perf_counter() < deadline:
        time.sleep(0.01)
    if leaver.done():
        return None
    nxt = Client(child.url, verbose=False)  # ready before the leave: its set-up is not the device's delay
    child.peak()
    t_leave = time.perf_counter()
    leaver.cancel()
    return after_leaving(child, nxt, media, t_leave, cancelled=lambda: leaver.status().code == Status.CANCELLED)


def after_leaving(child, nxt: Client, media: list[dict], t_leave: float, cancelled=lambda: True) -> dict:
    """The next visitor's (a tinyworld run) after a leave at `t_leave`: its timings from then, correctness, and the
    most races decoding meanwhile (1: the leaver's run had stopped, or ran alone)."""
    job = submit(nxt, media[0], "sage", 16)
    rec = follow(job, t_leave, {})
    ok, _ = correct(job)
    return dict(processing_s=rec.get("processing_s", float("nan")), first_text_s=rec.get("first_text_s",
                float("nan")), peak_races=child.peak(), correct=ok and cancelled())


def leave_in_tab(child, media: list[dict], browser, long_preset: str, how: str) -> dict | None:
    """A Chromium tab starts a long run and, after its first streamed text, is closed (`how` "close") or presses
    Stop (`how` "stop"); the next visitor's run is timed from then. None if the run ended first."""
    from test_browser import pick_preset

    page = browser.new_page()
    page.goto(child.url)
    page.wait_for_selector("#run")
    pick_preset(page, long_preset)
    page.set_input_files("#image input[type=file]", str(LONG_IMAGE))
    page.fill("#prompt textarea", LONG_PROMPT)
    page.locator("#max-new-tokens input[type=number]").fill("512")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.click("#run")
    page.wait_for_function("document.querySelector('#ar-text textarea').value.length > 0", timeout=60_000)
    if "Done" in page.inner_text("#status"):
        page.close()
        return None
    nxt = Client(child.url, verbose=False)
    child.peak()
    t_leave = time.perf_counter()
    if how == "stop":
        page.click("#stop")
        row = after_leaving(child, nxt, media, t_leave)
        page.wait_for_function("/Stopped after|Done/.test(document.querySelector('#status').innerText)",
                               timeout=60_000)
        row["correct"] = row["correct"] and "Stopped after" in page.inner_text("#status")
        page.close()
        return row
    page.close()
    return after_leaving(child, nxt, media, t_leave)


def leave(child, media: list[dict], reps: int, browser: bool) -> dict:
    """`reps` leaves of each kind, each followed by the next visitor's run."""
    long_preset = app_server.TINY.name
    modes: dict[str, list[dict]] = {"gradio_client job cancelled": [], "Chromium tab closed": [],
                                    "Stop pressed in the page": []}
    notes = []
    for _ in range(reps):
        row = leave_by_cancel(child, media, long_preset)
        if row:
            modes["gradio_client job cancelled"].append(row)
        else:
            notes.append("a long run ended before it could be cancelled (repetition dropped)")
    if browser:
        from playwright.sync_api import sync_playwright
        from test_browser import ARGS, CHROMIUM

        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                for mode, how in (("Chromium tab closed", "close"), ("Stop pressed in the page", "stop")):
                    for _ in range(reps):
                        row = leave_in_tab(child, media, chromium, long_preset, how)
                        if row:
                            modes[mode].append(row)
                        else:
                            notes.append(f"a tab's run ended before it could leave ({mode}; repetition dropped)")
            finally:
                chromium.close()
    else:
        notes.append("the closed-tab check was skipped (--no-browser)")
    return dict(modes=modes, notes=notes, long_tokens=512)
