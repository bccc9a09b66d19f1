"""The command line's model flags and what they load, and the machine a run is recorded on: a leaf module that the CLI
(cli.py), the suites report (evaluation/suites_report.py) and the experiments (evaluation/experiments/) share, so
that none of them imports another for these."""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

from .core.engine import TREE_FORWARDS
from .models.loading import DEFAULT_DRAFT, DEFAULT_TARGET
from .models.placement import DTYPES


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help="a named model pair (sage_engine/models/presets.py), e.g. tinyworld")
    p.add_argument("--target", default=None, help="target model directory or hub id (default: the embedded pair)")
    p.add_argument("--draft", default=None, help="draft model directory or hub id; none: no draft")
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: the preset's, else float32")
    p.add_argument("--device", default=None,
                   help="cpu | cuda | cuda:N | auto | multi (target over GPUs, draft on its own); default cpu")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree-forward", default="auto", choices=TREE_FORWARDS,
                   help="the backend both models' passes run on: auto = the fastest that applies and passes its "
                        "check against forward(); forward = forward(); layers = the model's own decoder layers in "
                        "turn (bit-identical); fused = its layers as fewer torch products; numpy, numba = the "
                        "draft's layers in NumPy or compiled (a target gets fused). Reports name what ran and why")
    p.add_argument("--draft-prune", default="off", type=pruning_flag,
                   help="draft-only visual-token pruning: off | paper (80%% image, 90%% video) | IMAGE,VIDEO ratios")


def policy_module_arg(p: argparse.ArgumentParser) -> None:
    """--policy-module FILE (repeatable): a Python file that registers policies (sage_engine.register_policy), run
    before the command, so that its policies run by name as the built-in ones do (cli.main loads it)."""
    p.add_argument("--policy-module", action="append", default=[], metavar="FILE",
                   help="a Python file that registers policies with sage_engine.register_policy (repeatable); its "
                        "policies then run by name like the built-in ones")


def load_policy_modules(args: argparse.Namespace) -> None:
    """Run each --policy-module file (ValueError, one line, where one cannot be loaded)."""
    from .policies import load_policy_module

    for path in getattr(args, "policy_module", None) or ():
        load_policy_module(path)


def pruning_flag(value: str):
    """--draft-prune: off (None), paper (80% image, 90% video) or two ratios."""
    from .models.pruning import VisualPruning

    if value == "off":
        return None
    if value == "paper":
        return VisualPruning()
    try:
        image, video = (float(v) for v in value.split(","))
        return VisualPruning(image, video)
    except ValueError:
        raise argparse.ArgumentTypeError("use off, paper, or two ratios in [0, 1) like 0.8,0.9") from None


def pair_names(args) -> tuple[str, str | None, str, str]:
    """(target, draft or None, dtype, device) from the flags and the preset; `--draft none` (or '') means no draft."""
    target, draft, dtype, device = DEFAULT_TARGET, DEFAULT_DRAFT, "float32", "cpu"
    if args.preset:
        from .models.presets import resolve

        p = resolve(args.preset)
        target, draft, dtype, device = p.target, p.draft, p.dtype, p.device
    target = args.target or target
    draft = draft if args.draft is None else args.draft
    if draft in ("", "none") or getattr(args, "policy", None) == "ar":
        draft = None
    return target, draft, args.dtype or dtype, args.device or device


def load_from_flags(args):
    """The model pair the flags name, transformers' own logging quieted, torch's threads set."""
    import torch
    from transformers.utils import logging as hf_logging

    from .models.loading import load_pair

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, dtype, device = pair_names(args)
    return load_pair(target, draft, dtype=dtype, device=device, attn_implementation=args.attn)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_meta(command: str) -> dict:
    import torch
    import transformers

    return {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}
