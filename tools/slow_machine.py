"""Run a command on this machine slowed by busy neighbours: `python -m tools.slow_machine [--nice N] [--ar] -- CMD`.

A 2-core machine of the same kind can be several times slower than another (a shared host, an older CPU, a CPU Space
beside other tenants). To measure on such a machine without having one, this starts one neighbour per usable core: a
shell loop that never sleeps, pinned to that core, at niceness N (default 0). Linux's scheduler then shares each core
between the neighbour and the command's threads, so the command runs on cores that behave as if they were slower
(about half speed at N=0; a larger N leaves the command more). The neighbours end with the command.

`--ar` first measures the slowed machine's speed the way the project quotes it everywhere: `ar` tokens/s of the
bench on the shipped pair, printed on one line (`slow machine: ar N tok/s`), so a figure taken under the load can be
read against the machine it was taken on. The command's exit code is returned.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ["-m", "sage_engine", "bench", "--inputs", "assets/examples", "--policies", "ar,sage", "--limit", "4",
         "--rounds", "1"]


@contextmanager
def neighbours(nice: int = 0):
    """One busy process per usable core, pinned to it at niceness `nice`, for the duration of the block."""
    procs = []

    def pin(cpu: int):
        def pre() -> None:
            os.sched_setaffinity(0, {cpu})
            os.nice(nice)
        return pre

    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            procs.append(subprocess.Popen(["sh", "-c", "while :; do :; done"], preexec_fn=pin(cpu)))
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def ar_tokens_per_second() -> float:
    """`ar` tokens/s of the bench on the shipped pair (the project's machine-speed figure)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        subprocess.run([sys.executable, *BENCH, "--out", str(out)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    return report["policies"]["ar"]["tokens_per_second"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nice", type=int, default=0, help="the neighbours' niceness (0-19; higher leaves the command "
                                                       "more of each core)")
    p.add_argument("--ar", action="store_true", help="first print the slowed machine's `ar` tokens/s")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    with neighbours(args.nice) as n:
        print(f"slow machine: {n} busy neighbours at nice {args.nice}", file=sys.stderr, flush=True)
        if args.ar:
            print(f"slow machine: ar {ar_tokens_per_second():.0f} tok/s", flush=True)
        return subprocess.run(cmd).returncode if cmd else 0


if __name__ == "__main__":
    sys.exit(main())
