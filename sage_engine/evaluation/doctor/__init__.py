"""`sage doctor`: one command that proves the engine on the device it is given, in a few minutes, with no model hub.

  1. the machine: devices, memory, versions (pins are not enforced: a difference is a warning), bf16 support;
  2. exactness: every policy against `ar` in fp32 with TF32 and reduced-precision reductions off (exact, and `ar`
     as transformers' generate()), on the shipped pair and on tiny Qwen2.5-VL and LLaVA pairs built on the spot;
     in bf16 the agreement with bf16 `ar` and where runs part (cases.py, exactness.py);
  3. the multi-device placement: the target spread by an accelerate device map, the draft on the last device, the
     same equality (over every GPU; on one device, two shards on it through the same hooks);
  4. speed on a target of a few hundred million parameters: `ar` and `sage` tokens/s, a verify pass of 1, 8, 32 and
     64 draft nodes against one token, the engine's own time per step, and the host reads per step and stage
     (speed.py, syncs.py);
  5. one JSON report and a Markdown summary beside it (summary.py); exit status 1 on any fp32 mismatch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .cases import checked_cases
from .exactness import check_bf16, check_fp32, check_spread
from .machine import describe, devices, exact_fp32
from .speed import measure
from .summary import markdown


def _mismatches(report: dict) -> list[str]:
    """Every fp32 row that is not exact, as "<case>: <policy> parts at <i>"."""
    out = []
    for section in ("fp32", "multi"):
        for case in report.get(section) or []:
            for row in case["rows"]:
                if not row["exact"]:
                    out.append(f"{section} {case['case']}: {row['policy']} parts at {row['parted_at']}")
    speed = report.get("speed") or {}
    if speed.get("dtype") == "float32" and not speed["sage"]["exact"]:
        out.append("speed pair: sage parts from ar")
    return out


def multi_layout(found: list[str]) -> tuple[list[str], str]:
    """Where the multi check puts the pair: the target over every GPU but the last and the draft alone on it
    (placement.py's multi); with two GPUs the target over both (so that it is spread), the draft on the second; on
    one device, the target in two shards on it and the draft beside them."""
    if len(found) > 2:
        return found[:-1], found[-1]
    return (found if len(found) == 2 else [found[0], found[0]]), found[-1]


def run(device: str = "cpu", quick: bool = False, log=print) -> dict:
    """The whole check on `device` (cpu | cuda | cuda:N | multi); `log` gets one line per stage as it ends."""
    t0 = time.perf_counter()
    found = devices(device)
    report: dict = {"device": device, "devices": found, "quick": quick, "machine": describe(found)}
    for warning in report["machine"]["warnings"]:
        log(f"warning: {warning}")
    first = found[0]
    with exact_fp32() as settings:
        report["fp32_settings"] = settings
        report["fp32"] = []
        for case in checked_cases(quick):
            report["fp32"].append(check_fp32(case, first))
            log(f"fp32 {case.name}: {_verdict(report['fp32'][-1])}")
        shards, draft_device = multi_layout(found)
        report["multi"] = []
        every = checked_cases(quick)
        for case in [c for c in every if "tiny" in c.name][:1] + [c for c in every if "shipped" in c.name]:
            report["multi"].append(check_spread(case, shards, draft_device))
            log(f"multi ({' + '.join(shards)}, draft on {draft_device}) {case.name}: {_verdict(report['multi'][-1])}")
        report["multi_note"] = (f"the target over {' + '.join(shards)}, the draft on {draft_device}" if len(found) > 1
                                else "one device: the target in two shards on it through accelerate's hooks, the "
                                     "path a multi-GPU target takes")
    bf16 = all(d["bf16"] for d in report["machine"]["devices"])
    report["bf16"] = []
    if bf16:
        for case, fp32 in zip(checked_cases(quick), report["fp32"]):
            report["bf16"].append(check_bf16(case, first, fp32["ar_ids"]))
            log(f"bf16 {case.name}: agreement {report['bf16'][-1]['agreement']:.0%}")
    speed_dtype = torch.bfloat16 if first != "cpu" and bf16 else torch.float32
    with exact_fp32():
        report["speed"] = measure(first, speed_dtype, "quick" if quick else "full", 24 if quick else 64)
    s = report["speed"]
    log(f"speed ({s['target_params_m']}M target, {s['dtype']}): ar {s['ar']['tokens_per_second']} tok/s, "
        f"sage {s['sage']['tokens_per_second']} tok/s ({s['speedup']}x, tau {s['sage']['tau']})")
    report["mismatches"] = _mismatches(report)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def _verdict(case: dict) -> str:
    bad = [r["policy"] for r in case["rows"] if not r["exact"]]
    return f"{'PARTS: ' + ', '.join(bad) if bad else 'every policy exact'} ({case['seconds']} s)"


def write(report: dict, out: str) -> tuple[Path, Path]:
    """The JSON report at `out` and its Markdown summary beside it (same name, .md)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for case in report.get("fp32", []) + report.get("bf16", []) + report.get("multi", []):
        case.pop("ar_ids", None)  # the rows say where runs part; the ids are not needed to read it
    path.write_text(json.dumps(report, indent=1))
    md = path.with_suffix(".md")
    md.write_text(markdown(report))
    return path, md
