"""tools/slow_machine.py: one busy neighbour per usable core, pinned to it, for as long as the command runs; the
command's exit code comes back (fast: no bench, the `--ar` measure is not run here)."""

from __future__ import annotations

import os
import sys

from tools.slow_machine import main, neighbours  # the repository root is on sys.path (conftest.py)


def test_one_pinned_neighbour_per_core_while_the_block_runs():
    cores = sorted(os.sched_getaffinity(0))
    with neighbours(nice=19) as procs:
        assert len(procs) == len(cores)
        assert [os.sched_getaffinity(p.pid) for p in procs] == [{c} for c in cores]
        assert all(os.getpriority(os.PRIO_PROCESS, p.pid) == 19 and p.poll() is None for p in procs)
    assert all(p.returncode is not None for p in procs)  # ended and reaped


def test_the_command_runs_under_the_load_and_its_exit_code_comes_back():
    assert main(["--nice", "19", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert main(["--nice", "19"]) == 0
