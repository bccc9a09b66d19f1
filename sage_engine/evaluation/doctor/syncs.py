"""Where a decode step reads tensor values back to the host: the census behind the doctor's "host syncs per step".

On a GPU, reading a device tensor's values on the host (`.tolist()`, `.item()`, `int(t)`, `.cpu()`, `.numpy()`, a
tensor in an `if`) waits for every kernel queued before it: a host sync. The census runs steps under a
`TorchFunctionMode` that sees every such read, keeps those of tensors on the watched device, and files each under

  - its stage, read off the line of `SpecEngine._step` that was running (draft, verify, accept, compact, observe,
    emit), or "prefill" for a model's prompt pass (the draft reads the prompt inside its first drafted step);
  - its site: the innermost engine frame (module:line, function) and the operation.

It also counts explicit `torch.cuda.synchronize` calls (the runner times each pass with one). The same code runs on
the CPU, where the watched device is the CPU and every read of a tensor's values counts: there a read costs nothing,
and the census says where a GPU run would stop to wait. Counting costs a stack walk per torch call: census runs are
never the timed ones.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ENGINE = Path(__file__).resolve().parents[2]  # sage_engine/
ENGINE_DIR = str(ENGINE)
# tensor methods that hand the host a tensor's values
READS = {"tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__", "equal"}
MOVES = {"cpu", "to"}  # a read where the result lands on the CPU
# the call in SpecEngine._step that each stage is, as its source line says it
STAGES = (("drafter.grow", "draft"), ("plain_shape", "draft"), ("skip_draft", "draft"), ("verify_tree", "verify"),
          ("accept(", "accept"), ("target.keep", "compact"), ("drafter.settle", "compact"), ("observe", "observe"),
          ("costs.", "observe"), ("out.extend", "emit"), ("telemetry", "emit"))


@dataclass
class Census:
    """Reads of tensor values on the host, per stage and per site, over the steps run under `watch`."""

    device: str  # the device type whose tensors count ("cuda"; "cpu" on the CPU)
    by_step: Counter = field(default_factory=Counter)  # (stage, step) -> reads; step 0: prefill
    by_site: Counter = field(default_factory=Counter)  # (stage, "module:line function", op) -> reads
    synchronize: int = 0  # explicit torch.cuda.synchronize calls

    def summary(self) -> dict:
        """JSON-ready: per stage, the steps that read anything and the reads in such a step (mean and most); each
        site's reads; the stages some step read more than once."""
        stages: dict[str, list[int]] = {}
        for (stage, _), n in self.by_step.items():
            stages.setdefault(stage, []).append(n)
        steps = len({step for _, step in self.by_step if step > 0})
        return {
            "device": self.device,
            "stages": {s: {"steps": len(c), "mean": round(sum(c) / len(c), 2), "most": max(c)}
                       for s, c in sorted(stages.items())},
            "sites": [{"stage": st, "site": site, "op": op, "reads": n}
                      for (st, site, op), n in sorted(self.by_site.items(), key=lambda kv: (kv[0][0], -kv[1]))],
            "synchronize": self.synchronize,
            "decode_steps": steps,
            "stages_over_one": sorted(s for s, c in stages.items() if max(c) > 1 and s != "prefill"),
        }


def _stage_and_site() -> tuple[str, int, str]:
    """The running stage of SpecEngine._step and its step number, and the innermost engine frame, from the caller's
    stack; a model's prompt pass (the target's, or the draft's inside its first drafted step) is "prefill"."""
    frame, site, stage, step = sys._getframe(2), None, "prefill", 0
    prompt = False
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(ENGINE_DIR) and "/doctor/" not in path:
            if site is None:
                rel = Path(path).relative_to(ENGINE).with_suffix("")
                site = f"{'.'.join(rel.parts)}:{frame.f_lineno} {frame.f_code.co_name}"
            name = frame.f_code.co_name
            prompt = prompt or (name == "prefill" and path.endswith("runner.py"))
            if name == "_step" and path.endswith("engine.py"):
                stage, step = ("prefill" if prompt else _stage_of(path, frame.f_lineno)), frame.f_locals["step"]
                break
        frame = frame.f_back
    return stage, step, site or "outside the engine"


_LINES: dict[str, list[str]] = {}


def _stage_of(path: str, line: int) -> str:
    """The stage a line of SpecEngine._step belongs to (STAGES); a call spanning lines is read from its first."""
    lines = _LINES.get(path)
    if lines is None:
        lines = _LINES[path] = Path(path).read_text().splitlines()
    for text in (lines[line - 1], *reversed(lines[max(0, line - 4): line - 1])):
        for needle, stage in STAGES:
            if needle in text:
                return stage
    return "other"


def _lands_on_host(op: str, tensor: torch.Tensor, args, kwargs) -> bool:
    """Does `.cpu()` / `.to(...)` move `tensor` from another device to the CPU (a copy to the host: a read)?"""
    if tensor.device.type == "cpu":
        return False
    if op == "cpu":
        return True
    target = kwargs.get("device") if kwargs else None
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
    return target is not None and torch.device(target).type == "cpu"


class _Watch(TorchFunctionMode):
    def __init__(self, census: Census):
        super().__init__()
        self.census = census

    def __torch_function__(self, func, types, args=(), kwargs=None):
        op = getattr(func, "__name__", "")
        if op in READS or op in MOVES:
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if (tensor is not None and tensor.device.type == self.census.device
                    and (op in READS or _lands_on_host(op, tensor, args, kwargs))):
                stage, step, site = _stage_and_site()
                self.census.by_step[stage, step] += 1
                self.census.by_site[stage, site, op] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def watch(device: str) -> Iterator[Census]:
    """Count host reads of tensors on `device` (a type: "cuda", "cpu") and explicit CUDA synchronisations while the
    block runs."""
    census = Census(torch.device(device).type)
    real = torch.cuda.synchronize

    def counted(*args, **kwargs):
        census.synchronize += 1
        return real(*args, **kwargs)

    torch.cuda.synchronize = counted
    try:
        with _Watch(census):
            yield census
    finally:
        torch.cuda.synchronize = real


@contextmanager
def cuda_sync_warnings() -> Iterator[list]:
    """On a GPU, torch's own count of synchronising calls (its sync debug mode warns at each): the cross-check of the
    census, which sees only tensor methods. A list of the warnings' texts; empty without CUDA."""
    import warnings

    if not torch.cuda.is_available():
        yield []
        return
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            seen: list = []
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode(before)
            seen.extend(str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message))
