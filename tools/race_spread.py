"""How much the demo's speedup moves from race to race on a shared CPU: `python tools/race_spread.py [--races 5]`.

Races one input (an example image, its prompt, 96 new tokens, `sage`) through the app's own handler
(`Handlers.compare`, no server) `--races` times after one untimed race, while neighbours that are busy one moment and
idle the next run on every usable core (`--neighbours bursty`; `none`: no neighbours of ours, the machine as it is).
Prints each race's speedup, lane seconds (the mean of the rounds it was timed over: app/race.py), target forwards
and rounds, then the median and the largest distance from it.

The app code comes from the first `app` package on the path: run it with `PYTHONPATH=<an older checkout>` to measure
that checkout's race the same way (issue 81 measured the race before and after the lanes took turns).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # its sibling in tools/, run as a script or with -m
from slow_machine import neighbours  # noqa: E402

# one neighbour: busy for 50-600 ms, then idle for 50-600 ms, forever (seeded per core: the same pattern every time)
BURSTY = """
import random, time
rng = random.Random({seed})
while True:
    end = time.perf_counter() + rng.uniform(0.05, 0.6)
    while time.perf_counter() < end:
        pass
    time.sleep(rng.uniform(0.05, 0.6))
"""


SETTLE_S = 1.0  # seconds the neighbours run before the first timed race


def bursty_neighbours():
    """slow_machine's neighbours, each busy and idle in turn (BURSTY, seeded by its core)."""
    return neighbours(command=lambda cpu: [sys.executable, "-c", BURSTY.format(seed=cpu)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=5)
    ap.add_argument("--neighbours", choices=("bursty", "none"), default="bursty")
    ap.add_argument("--image", default=None, help="default: the first example image")
    ap.add_argument("--prompt", default="Describe the image in detail.")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--policy", default="sage")
    args = ap.parse_args(argv)

    import torch

    from app.handlers import Handlers
    from app.media import RunFiles, load_examples
    from app.pool import PairPool, load_preset
    from app.served import served

    torch.set_num_threads(1)  # the app's decoding threads on 2 cores (app/device.py)
    image = args.image or next(e.file for e in load_examples() if e.media == "image")
    presets = served()
    name = next(iter(presets))
    handlers = Handlers(PairPool(presets, load_preset), RunFiles(), name)
    import app

    print(f"app from {Path(app.__file__).parent}; input {image}; {args.max_new_tokens} tokens; {args.policy}; "
          f"neighbours {args.neighbours}", flush=True)

    def race() -> dict:
        rows = list(handlers.compare(image, None, args.prompt, args.max_new_tokens, args.policy, name))
        s = rows[-1][-1]
        assert s["identical"], "the lanes' outputs differ"
        return s

    race()  # untimed: engines built, caches warm
    speedups, cpu = [], []
    with bursty_neighbours() if args.neighbours == "bursty" else _nothing():
        time.sleep(SETTLE_S)  # the neighbours' own start-up is not the pattern: the first race waits it out
        for i in range(args.races):
            s = race()
            a, b = s["ar"]["stats"], s["speculative"]["stats"]
            speedups.append(s["speedup"])
            cpu.append(s.get("cpu_speedup"))
            print(f"race {i + 1}: speedup {s['speedup']:.2f}x  ar {a['seconds']:.3f} s  spec {b['seconds']:.3f} s  "
                  f"target forwards ar {a['target_forwards']} spec {b['target_forwards']}  "
                  f"tau {b['mean_accepted']:.2f}  rounds {s.get('timed_rounds')}"
                  + (f"  CPU-time speedup {cpu[-1]:.2f}x" if cpu[-1] else ""),
                  flush=True)
    for what, xs in (("speedup (clock)", speedups), ("speedup (CPU time)", cpu)):
        if None in xs:
            continue
        med = statistics.median(xs)
        worst = max(abs(x / med - 1) for x in xs)
        print(f"{what}: median {med:.2f}x; {', '.join(f'{x:.2f}' for x in xs)}; largest distance from the median "
              f"{100 * worst:.1f}% ({'within' if worst <= 0.15 else 'outside'} +-15%)")
    return 0


@contextmanager
def _nothing():
    yield


if __name__ == "__main__":
    random.seed(0)
    raise SystemExit(main())
