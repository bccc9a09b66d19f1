"""The slow reliability checks of the demo (issue 24), as one command; the figures go to RELIABILITY.md.

  python -m tools.reliability [--out RELIABILITY.md] [--visitors 8] [--runs 100] [--leaves 5] [--no-browser]

The demo runs in a child process (`python -m tools.reliability --serve`): tests/app_server.launch(), the suite's
server (the tinyworld pair and the tiny random pair, whose long runs are needed to leave mid-run), with one
torch thread per core but one as `python app.py` uses, its temp files under a fresh TMPDIR. Against it:
1. load: N visitors submit /compare at once (tools/reliability_phases.py);
2. soak: consecutive runs; server RSS, threads and temp files before/after, tokens/s first vs last 10;
3. leaving mid-run: a gradio_client job cancelled, a Chromium tab closed, and Stop pressed in the page, mid-stream;
   time to the next run.
The child reports how many races were decoding at once (tests/test_app_load.races_alive, sampled).
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TAG = "RELIABILITY "  # prefix of the child's protocol lines on stdout (anything else there is ignored)


def serve() -> None:
    """Child mode: launch the suite's demo, print its URL, then answer 'peak' (the most races decoding at once
    since the last 'peak') until stdin closes."""
    sys.path.insert(0, str(TESTS))
    import torch

    from app.device import default_threads

    torch.set_num_threads(default_threads())  # as app.py: the web server keeps a core
    import app_server
    from test_app_load import races_alive

    server = app_server.launch()
    peak = [0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], races_alive())
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    print(f"{TAG}{server.url} {','.join(server.presets)} {torch.get_num_threads()}", flush=True)
    for line in sys.stdin:
        if line.strip() == "peak":
            print(f"{TAG}{peak[0]}", flush=True)
            peak[0] = races_alive()


class Child:
    """The server process: its URL, pid, temp dir, and the 'peak' question."""

    def __init__(self, log_path: Path, timeout: float = 300.0):
        self.tmp = Path(tempfile.mkdtemp(prefix="sage-reliability-"))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        env.pop("GRADIO_TEMP_DIR", None)  # Gradio's cache then lives in TMPDIR/gradio: counted with the rest
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.reliability", "--serve"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        url, presets, threads = self._line(timeout).split()
        self.url, self.presets, self.threads = url, presets.split(","), int(threads)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(TAG):
                self.lines.put(line[len(TAG):].strip())

    def _line(self, timeout: float = 30.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise SystemExit(f"error: the server did not answer (log: {self.log.name})") from None

    def peak(self) -> int:
        """Most races decoding at once since the last call."""
        self.proc.stdin.write("peak\n")
        self.proc.stdin.flush()
        return int(self._line())

    def status(self, key: str) -> int:
        """A number from /proc/PID/status, e.g. VmRSS (kB) or Threads."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(key + ":"))

    def files(self) -> dict[str, int]:
        """Files under the server's TMPDIR, by top-level directory (Gradio's cache, the app's own dirs)."""
        counts: dict[str, int] = {}
        for path in self.tmp.rglob("*"):
            if path.is_file():
                top = path.relative_to(self.tmp).parts[0]
                key = top.rsplit("-", 1)[0] if top.startswith("sage-") else top  # mkdtemp's random suffix
                counts[key] = counts.get(key, 0) + 1
        return counts

    def disk_bytes(self) -> int:
        """Bytes of all files under the server's TMPDIR."""
        return sum(p.stat().st_size for p in self.tmp.rglob("*") if p.is_file())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def server_log_counts(path: Path) -> tuple[int, int]:
    """(tracebacks, runs that ended in an error) in the server's log."""
    text = path.read_text(errors="replace")
    return text.count("Traceback (most recent call last)"), text.count("run failed")


NOT_MEASURED = [
    "A real Space (network latency, Hugging Face's proxy, CPU basic's 2 vCPUs shared with other tenants): "
    "all figures are from a server on this machine with the clients on the same machine (loopback), which also "
    "share its 2 cores with the server.",
    "Gradio's own cache clean-up (Blocks(delete_cache=(3600, 3600)): files older than an hour, checked hourly) "
    "never fires in a run this short; that files stop accumulating is inferred from it and the app's own limits, "
    "not observed.",
    "More than 8 visitors at once, hours-long soaks, memory on GPU or ZeroGPU.",
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="RELIABILITY.md")
    p.add_argument("--visitors", type=int, default=8)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--leaves", type=int, default=5, help="repetitions of leaving mid-run, per way of leaving")
    p.add_argument("--no-browser", action="store_true", help="skip the closed-tab check (needs /usr/bin/chromium)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        return serve()
    from tools import reliability_phases as phases
    from tools.reliability_report import machine, render

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="sage-reliability-work-"))
    log_path = work / "server.log"
    child = Child(log_path)
    try:
        media = phases.inputs(work)
        result = {"load": phases.load(child, media, a.visitors)}
        print("load:", {k: v for k, v in result["load"].items() if not isinstance(v, list)}, flush=True)
        result["soak"] = phases.soak(child, media, a.runs)
        print("soak:", {k: v for k, v in result["soak"].items() if not isinstance(v, (list, dict))}, flush=True)
        result["leave"] = phases.leave(child, media, a.leaves, browser=not a.no_browser)
        print("leave:", result["leave"], flush=True)
        threads = child.threads
    finally:
        child.stop()
    result["tracebacks"], result["errors"] = server_log_counts(log_path)
    argv_shown = " ".join(argv if argv is not None else sys.argv[1:])
    result.update(command=f"python -m tools.reliability {argv_shown}".strip(), date=date.today().isoformat(),
                  machine=machine(), elapsed_s=time.perf_counter() - t0, not_measured=NOT_MEASURED,
                  server=f"tests/app_server.launch() in a child process (presets {', '.join(child.presets)}; "
                         f"torch threads: {threads}; queue: one run at a time per device)")
    Path(a.out).write_text(render(result))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {a.out} in {result['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
