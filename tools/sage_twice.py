"""`sage` twice on a photo, quiet and beside busy neighbours: the same trees step for step. Then `priced:sage` the same
way: its trees follow the machine's load, and the prices a run recorded replay it exactly without a meter.

`python tools/sage_twice.py` (from the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]  # the repository's packages and slow_machine beside this file

from slow_machine import neighbours  # noqa: E402


def main() -> int:
    import torch

    from sage_engine import SpecEngine, make_policy, prepare_input
    from sage_engine.models.loading import load_pair
    from sage_engine.models.media import load_image
    from sage_engine.policies import PricedPolicy, replay_of

    torch.set_num_threads(1)
    models = ROOT / "assets" / "models"
    pair = load_pair(str(models / "tinyworld-target"), str(models / "tinyworld-draft"), device="cpu", dtype="float32")
    image = load_image(str(ROOT / "assets" / "examples" / "photo_1.jpg"))
    prep = prepare_input(pair, "Describe the image in detail.", images=[image])
    engine = SpecEngine(pair)

    def trees(result):
        return [(e.tree.tokens, e.tree.parents) if e.tree else None for e in result.steps]

    engine.generate(prep, "sage", 96)  # untimed: warm
    for policy in ("sage", "priced:sage"):
        quiet = engine.generate(prep, policy, 96)
        with neighbours():
            busy = engine.generate(prep, policy, 96)
        print(f"{policy}: quiet {quiet.stats.tokens_per_second:.0f} tok/s (tau {quiet.stats.mean_accepted:.2f}), "
              f"beside busy neighbours {busy.stats.tokens_per_second:.0f} tok/s (tau {busy.stats.mean_accepted:.2f}); "
              f"the same trees step for step: {trees(quiet) == trees(busy)}; "
              f"the same tokens: {quiet.token_ids == busy.token_ids}")
    recorded = replay_of(busy.steps)
    print("the busy priced run's recorded prices, first 2 steps:", list(recorded)[:2])
    again = engine.generate(prep, PricedPolicy(make_policy("sage"), replay=recorded), 96)
    print(f"replayed from them without a meter: the same trees {trees(again) == trees(busy)}, "
          f"the same tokens {again.token_ids == busy.token_ids}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
