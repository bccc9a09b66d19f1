"""A newcomer's first start, timed: `python -m tools.first_start [--runs 3] [--port 7871]`.

Each run starts `python app.py` as a fresh process with an empty Numba cache (a cold start: nothing compiled yet),
then measures
- page: seconds from the start until the server answers GET / (the page a visitor sees);
- first race: seconds from the page until the first /compare run on the first example (its own image and prompt,
  the default token budget and policy) has finished, counted from the page as a visitor who clicks at once would;
- next race: the same run again, pressed as soon as the first is done: what a race takes once the pair is loaded,
  Numba still compiling in the background (it takes longer than these runs);
and, beside them, the machine's speed: `ar` tokens/s of that same first race (so a time can be read against the
machine it was taken on). Prints one Markdown row per run.

Each run ends its whole process group: app.py's background Numba compile (sage_engine.backends.warmup) too, which would
otherwise go on compiling beside the next run's start and slow it. On a slower machine: `python -m
tools.slow_machine --ar -- python -m tools.first_start`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _wait_page(url: str, proc: subprocess.Popen, limit: float = 180.0) -> None:
    t_end = time.monotonic() + limit
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise SystemExit(f"error: app.py exited with code {proc.returncode} before serving the page")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"error: no page at {url} within {limit:.0f} s")


def one_start(port: int, example) -> dict:
    """One cold start, its first race on `example` (app.media.Example); returns its times (seconds) and the first
    race's `ar` tokens/s."""
    from gradio_client import Client, handle_file

    cache = tempfile.mkdtemp(prefix="sage-cold-numba-")
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "GRADIO_EXAMPLES_CACHE": tempfile.mkdtemp(prefix="sage-cold-examples-")}
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_page(url, proc)
        page = time.monotonic() - t0
        client = Client(url, verbose=False)
        t1 = time.monotonic()
        final = client.predict(image=handle_file(example.file), video=None, prompt=example.prompt, api_name="/compare")
        race = time.monotonic() - t1
        client.predict(image=handle_file(example.file), video=None, prompt=example.prompt, api_name="/compare")
        again = time.monotonic() - t1 - race
        summary = final[-1]  # the JSON summary is the endpoint's last output
        return {"page": page, "race": race, "again": again, "ar_tps": summary["ar"]["stats"]["tokens_per_second"],
                "identical": summary["identical"]}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the app and its background compile
        proc.wait(timeout=30)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, default=7871)
    args = p.parse_args(argv)
    from app.media import load_examples  # run from the repository root: `python -m tools.first_start`

    example = next(e for e in load_examples() if e.media == "image")
    print("| run | page (s) | first race done, from the page (s) | next race (s) | `ar` tok/s in the first race "
          "| lanes identical |")
    print("|---|---|---|---|---|---|")
    for i in range(args.runs):
        r = one_start(args.port, example)
        print(f"| {i + 1} | {r['page']:.1f} | {r['race']:.1f} | {r['again']:.1f} | {r['ar_tps']:.0f} "
              f"| {r['identical']} |", flush=True)


if __name__ == "__main__":
    main()
