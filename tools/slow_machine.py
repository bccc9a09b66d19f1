"""Run a command on this machine slowed by busy neighbours: `python -m tools.slow_machine [--nice N] [--ar] -- CMD`.

A 2-core machine of the same kind can be several times slower than another (a shared host, an older CPU, a CPU Space
beside other tenants). To measure on such a machine without having one, this starts one neighbour per usable core: a
shell loop that never sleeps, pinned to that core, at niceness N (default 0). Linux's scheduler then shares each core
between the neighbour and the command's threads: at N=0 each core gives each of them half its time, so one thread of
the command runs at about half speed (a larger N leaves the command more). Work that spreads over both cores with
OpenMP (torch with two threads) loses more than half: its threads wait for each other at every parallel region, and
one of them is often off its core. The neighbours end with the command.

`--ar` first measures the slowed machine's speed the way the project quotes it everywhere, `ar` tokens/s of the bench
on the shipped pair, with the bench's two threads and with one (the app's decoding thread count on 2 cores, and
each test worker's), printed on one line, so a figure taken under the load can be read against the machine it was
taken on. The command's exit code is returned.
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
def neighbours(nice: int = 0, command=None):
    """One busy process per usable core, pinned to it at niceness `nice`, for the duration of the block (which gets
    the list of them). command(cpu): the argv each one runs (default: a shell loop that never rests)."""
    procs = []

    def pin(cpu: int):
        def pre() -> None:
            os.sched_setaffinity(0, {cpu})
            os.nice(nice)
        return pre

    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            argv = command(cpu) if command else ["sh", "-c", "while :; do :; done"]
            procs.append(subprocess.Popen(argv, preexec_fn=pin(cpu)))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def ar_tokens_per_second(threads: int | None = None) -> float:
    """`ar` tokens/s of the bench on the shipped pair (the project's machine-speed figure), with the bench's default
    threads or `threads`."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        more = [] if threads is None else ["--threads", str(threads)]
        subprocess.run([sys.executable, *BENCH, *more, "--out", str(out)], cwd=ROOT, check=True,
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
    with neighbours(args.nice) as procs:
        print(f"slow machine: {len(procs)} busy neighbours at nice {args.nice}", file=sys.stderr, flush=True)
        if args.ar:
            print(f"slow machine: ar {ar_tokens_per_second():.0f} tok/s (one thread: {ar_tokens_per_second(1):.0f})",
                  flush=True)
        return subprocess.run(cmd).returncode if cmd else 0


if __name__ == "__main__":
    sys.exit(main())
