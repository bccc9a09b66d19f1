"""Measure the demo as a user meets it, against the CLI on the same input:

  python -m app.measure [--image assets/examples/shapes_1.png] [--prompt ...] [--rounds 15] [--threads 1]

1. start time: `python app.py` launched as a subprocess until its page answers (imports, model load, launch);
2. Run -> first streamed token: a /compare request (gradio_client, the API the Run button uses) until the
   first update whose autoregressive text is non-empty;
3. speculative tokens/s in the app (the run's own stats) versus `python -m sage_engine generate --warmup 3` on the
   same input, policy and budget (warm against warm: the app's engine has decoded before, the measurement's own
   warm-up race at least, and a fresh process's first run is slower; `sage`'s cost meter, which the app's engine
   keeps across races, settles over a few runs: with the shipped pair a CLI run after one warm-up decode was ~10%
   slower than after four), rounds interleaved (app, CLI, app, CLI, ...)
   so both see the same machine load:
   the ratio of the medians, and the median of each round's ratio (`app_over_cli_paired`, which a machine whose
   speed drifts between rounds disturbs less). Without --threads each runs at its own default (the app one
   thread per core but one, the CLI one per core), and where those differ the CLI also runs at the app's thread
   count (`same_threads`): what the web server costs the decoding, apart from the core it keeps;
4. the speedup each shows: the app's speculative lane over its own autoregressive lane, and the CLI's policy over
   `generate --policy ar` run right after it in the same round.
Prints one JSON object (medians and every round).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, threads: int | None, timeout: float = 300.0) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "app.py", "--port", str(port)] + (["--threads", str(threads)] if threads else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"error: app.py exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("error: app.py did not answer in time")


def app_run(client, image: str, prompt: str, n: int, policy: str) -> dict:
    from gradio_client import handle_file

    t0 = time.perf_counter()
    job = client.submit(image=handle_file(image), video=None, prompt=prompt, max_new_tokens=n, policy=policy,
                        api_name="/compare")
    first = None
    for out in job:  # every streamed update, as it arrives
        if first is None and out[1]:  # ar_text (the autoregressive lane runs first)
            first = time.perf_counter() - t0
    summary = job.result()[-1]
    return {"first_token_s": first, "total_s": time.perf_counter() - t0,
            "spec_tokens_per_s": summary["speculative"]["stats"]["tokens_per_second"],
            "ar_tokens_per_s": summary["ar"]["stats"]["tokens_per_second"],
            "speedup": (summary["speculative"]["stats"]["tokens_per_second"]
                        / summary["ar"]["stats"]["tokens_per_second"]),
            "identical": summary["speculative"]["token_ids"] == summary["ar"]["token_ids"],
            "new_tokens": summary["speculative"]["stats"]["new_tokens"]}


def cli_tokens_per_s(image: str, prompt: str, n: int, policy: str, threads: int | None) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "sage_engine", "generate", "--image", image, "--prompt", prompt, "--policy", policy,
           "--max-new-tokens", str(n), "--warmup", "3", "--json"] + (["--threads", str(threads)] if threads else [])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    stats = json.loads(out.stdout)["stats"]
    return stats["tokens_per_second"], stats["new_tokens"]


def cli_run(image: str, prompt: str, n: int, policy: str, threads: int | None) -> dict:
    spec, new_tokens = cli_tokens_per_s(image, prompt, n, policy, threads)
    ar, _ = cli_tokens_per_s(image, prompt, n, "ar", threads)
    return {"spec_tokens_per_s": spec, "ar_tokens_per_s": ar, "speedup": spec / ar, "new_tokens": new_tokens}


def _paired(apps: list[dict], clis: list[dict], key: str) -> float:
    """The median of each round's app / CLI ratio of `key`."""
    return round(statistics.median(a[key] / c[key] for a, c in zip(apps, clis)), 3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=str(ROOT / "assets/examples/shapes_1.png"))
    p.add_argument("--prompt", default="Describe the image in detail.")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--policy", default="sage")
    # the CLI's two lanes are two processes, so its speedup scatters more than the race's: seven rounds left about
    # +-10% on the ratio of medians, fifteen about +-3%
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="torch threads for the app and the CLI alike")
    a = p.parse_args(argv)
    from gradio_client import Client

    from app.device import default_threads, usable_cpus

    app_threads = a.threads or default_threads()
    same = a.threads is None and app_threads != usable_cpus()  # the CLI's default (one per core) differs from it

    port = free_port()
    proc, start_s = start_app(port, a.threads)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        app_run(client, a.image, a.prompt, 8, a.policy)  # warm-up (first-call allocations), not counted
        apps, clis, sames = [], [], []
        for _ in range(a.rounds):
            apps.append(app_run(client, a.image, a.prompt, a.max_new_tokens, a.policy))
            clis.append(cli_run(a.image, a.prompt, a.max_new_tokens, a.policy, a.threads))
            if same:
                sames.append(cli_run(a.image, a.prompt, a.max_new_tokens, a.policy, app_threads))
    finally:
        proc.terminate()
        proc.wait(30)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    app_tps, cli_tps = med(apps, "spec_tokens_per_s"), med(clis, "spec_tokens_per_s")
    same_threads = None if not sames else {
        "threads": app_threads, "cli_spec_tokens_per_s": round(med(sames, "spec_tokens_per_s"), 1),
        "cli_ar_tokens_per_s": round(med(sames, "ar_tokens_per_s"), 1),
        "app_over_cli_paired": _paired(apps, sames, "spec_tokens_per_s"),
        "app_ar_over_cli_ar_paired": _paired(apps, sames, "ar_tokens_per_s"), "rounds": sames}
    print(json.dumps({
        "start_s": round(start_s, 2), "first_token_s": round(med(apps, "first_token_s"), 3),
        "app_spec_tokens_per_s": round(app_tps, 1), "cli_spec_tokens_per_s": round(cli_tps, 1),
        "app_over_cli": round(app_tps / cli_tps, 3), "app_ar_tokens_per_s": round(med(apps, "ar_tokens_per_s"), 1),
        "cli_ar_tokens_per_s": round(med(clis, "ar_tokens_per_s"), 1),
        "app_over_cli_paired": _paired(apps, clis, "spec_tokens_per_s"),
        "app_speedup": round(med(apps, "speedup"), 3), "cli_speedup": round(med(clis, "speedup"), 3),
        "app_speedup_over_cli": round(med(apps, "speedup") / med(clis, "speedup"), 3),
        "identical": all(r["identical"] for r in apps), "threads": a.threads, "app_threads": app_threads,
        "same_threads": same_threads, "policy": a.policy,
        "image": a.image, "max_new_tokens": a.max_new_tokens, "rounds": {"app": apps, "cli": clis},
    }, indent=1))


if __name__ == "__main__":
    main()
