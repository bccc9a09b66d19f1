"""Where the two models go: the target over the GPUs with an accelerate device map, the draft on its own device.

`--device` semantics (one flag; a preset carries its default):
  cpu     both models on the CPU.
  cuda    (or cuda:N) both models whole on one GPU; refused when they do not fit it.
  multi   the target spread over GPUs 0..n-2 by a balanced accelerate device map (per-GPU `max_memory`,
          nothing split inside the model's `_no_split_modules`, e.g. a decoder layer), the draft alone
          on the last GPU. If the other GPUs cannot hold the target, it also takes what the draft leaves
          of the last GPU; with a single GPU both share it. Refused when the weights do not fit at all
          (unless `allow_offload`: the rest goes to CPU RAM, slow but exact).
  auto    cpu without a GPU; cuda when target + draft fit one GPU; multi otherwise.
Each GPU keeps `reserve` (default 10%) of its memory free for the KV cache, activations and the CUDA
context. Planning builds the models on the meta device (no weights, a few seconds for 72B), so a plan
for a 72B pair can be made and tested on a laptop. Tensors cross devices only at shard boundaries
(accelerate's hooks move the hidden states); the engine feeds ids to the first shard.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..errors import ModelError, first_line

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # the names a pair loads in

GiB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("auto", "cpu", "cuda", "multi")


@dataclass(frozen=True)
class Placement:
    """The answer: where each model goes."""

    mode: str  # "cpu" | "cuda" | "multi"
    target_device_map: dict[str, int | str] | None  # module name -> GPU index (or "cpu"); None: whole on target_device
    target_device: str  # where the target's input ids go (its first shard)
    draft_device: str
    max_memory: dict[int | str, int] | None  # bytes per device offered to the target's weights
    target_bytes: int  # weights at the planned dtype
    draft_bytes: int
    no_split: tuple[str, ...]  # module classes kept whole on one device
    draft_shares_gpu: bool = False  # the draft's GPU also holds target layers

    def describe(self) -> dict:
        """JSON-ready summary: mode, devices, sizes in GiB."""
        devices = sorted({str(d) for d in (self.target_device_map or {}).values()}) or [self.target_device]
        return {"mode": self.mode, "target_devices": devices, "draft_device": self.draft_device,
                "target_gib": round(self.target_bytes / GiB, 1), "draft_gib": round(self.draft_bytes / GiB, 1),
                "draft_shares_gpu": self.draft_shares_gpu}


@contextmanager
def quiet_accelerate():
    """accelerate warns 'Device N is not available' for every GPU it plans on a machine without them, and calls the
    shards of a device map kept on the CPU "offloaded" there."""
    logs = [logging.getLogger(name) for name in ("accelerate.utils.modeling", "accelerate.big_modeling")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def meta_model(config, dtype: torch.dtype) -> torch.nn.Module:
    """The model of `config` with every weight on the meta device (shapes only, no memory); a text-only LM's config
    builds its causal LM, as models.load_pair loads it."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from .families import is_text_only

    auto = AutoModelForCausalLM if is_text_only(config) else AutoModelForImageTextToText
    with init_empty_weights():
        return auto.from_config(config, dtype=dtype)


def weight_bytes(model: torch.nn.Module, dtype: torch.dtype) -> int:
    from accelerate.utils import compute_module_sizes

    return int(compute_module_sizes(model, dtype=dtype)[""])


def gpu_memory() -> list[float]:
    """Total memory (GB) of every visible GPU; [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / GiB for i in range(torch.cuda.device_count())]


def plan_placement(
    target_config,
    draft_config,
    n_gpus: int,
    gpu_memory_gb: float | list[float],
    dtype: str = "bfloat16",
    device: str = "auto",
    reserve: float = 0.10,
    allow_offload: bool = False,
) -> Placement:
    """Plan target and draft placement from their configs (built on the meta device) and the GPUs."""
    if device not in MODES and not device.startswith("cuda:"):
        raise ModelError(f"unknown device {device!r}; choose one of {', '.join(MODES)} or cuda:N")
    torch_dtype = DTYPES[dtype]
    mem = [float(gpu_memory_gb)] * n_gpus if not isinstance(gpu_memory_gb, (list, tuple)) else list(gpu_memory_gb)
    if len(mem) != n_gpus:
        raise ValueError("give one memory size per GPU")
    target = meta_model(target_config, torch_dtype)
    t_bytes = weight_bytes(target, torch_dtype)
    d_bytes = 0 if draft_config is None else weight_bytes(meta_model(draft_config, torch_dtype), torch_dtype)
    no_split = tuple(sorted(getattr(target, "_no_split_modules", None) or ()))
    usable = [int(m * GiB * (1 - reserve)) for m in mem]

    if device == "cpu" or (device == "auto" and n_gpus == 0):
        return Placement("cpu", None, "cpu", "cpu", None, t_bytes, d_bytes, no_split)
    if n_gpus == 0:
        raise ModelError(f"--device {device} needs a GPU and none is visible; use --device cpu")
    single = device.startswith("cuda") or (device == "auto" and t_bytes + d_bytes <= max(usable))
    if single:
        gpu = int(device.split(":")[1]) if ":" in device else max(range(n_gpus), key=lambda i: usable[i])
        if t_bytes + d_bytes > usable[gpu]:
            raise ModelError(f"target + draft need {(t_bytes + d_bytes) / GiB:.1f} GiB at {dtype}; GPU {gpu} offers "
                             f"{usable[gpu] / GiB:.1f} GiB after {reserve:.0%} headroom; use --device multi")
        return Placement("cuda", None, f"cuda:{gpu}", f"cuda:{gpu}", None, t_bytes, d_bytes, no_split)
    return _plan_multi(target, t_bytes, d_bytes, no_split, usable, torch_dtype, dtype, reserve, allow_offload)


def _plan_multi(target, t_bytes, d_bytes, no_split, usable, torch_dtype, dtype, reserve, allow_offload) -> Placement:
    """Balanced device map over GPUs 0..n-2 (draft alone on n-1); else share the draft's GPU; else offload."""
    n = len(usable)
    draft_gpu = n - 1
    if d_bytes > usable[draft_gpu]:
        raise ModelError(f"the draft needs {d_bytes / GiB:.1f} GiB at {dtype}; GPU {draft_gpu} offers "
                         f"{usable[draft_gpu] / GiB:.1f} GiB")
    own = {g: usable[g] for g in range(n - 1)}  # the draft keeps its GPU to itself
    shared = {**own, draft_gpu: usable[draft_gpu] - d_bytes}  # the target also takes the draft GPU's rest
    for budget, shares in ((own, False), (shared, True)):
        if budget and sum(budget.values()) >= t_bytes:
            device_map, budget = _device_map(target, budget, no_split, torch_dtype, balanced=True)
            if all(isinstance(d, int) for d in device_map.values()):  # everything fits on the GPUs
                return Placement("multi", device_map, f"cuda:{next(iter(device_map.values()))}",
                                 f"cuda:{draft_gpu}", budget, t_bytes, d_bytes, no_split, draft_shares_gpu=shares)
    if not allow_offload:
        raise ModelError(f"the target needs {t_bytes / GiB:.1f} GiB at {dtype}; {n} GPU(s) offer "
                         f"{sum(shared.values()) / GiB:.1f} GiB after {reserve:.0%} headroom and the draft")
    device_map, budget = _device_map(target, {**shared, "cpu": t_bytes}, no_split, torch_dtype, balanced=False)
    first = next(iter(device_map.values()))
    return Placement("multi", device_map, "cpu" if first == "cpu" else f"cuda:{first}", f"cuda:{draft_gpu}",
                     budget, t_bytes, d_bytes, no_split, draft_shares_gpu=True)


def _device_map(model, budget: dict, no_split: tuple[str, ...], dtype: torch.dtype, balanced: bool):
    """accelerate's device map for `model` under `budget` (bytes per device); balanced evens out the GPUs."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    with quiet_accelerate():
        if balanced:
            budget = get_balanced_memory(model, max_memory=dict(budget), no_split_module_classes=list(no_split),
                                         dtype=dtype, low_zero=False)
        device_map = infer_auto_device_map(model, max_memory=dict(budget), no_split_module_classes=list(no_split),
                                           dtype=dtype)
    return device_map, budget


def place_pair(target: str, draft: str | None, dtype: str, device: str) -> Placement:
    """The entry point `load_pair` uses: read both configs (local or hub), count the GPUs, plan."""
    mem = gpu_memory()
    if device == "cpu" or (device == "auto" and not mem):
        return Placement("cpu", None, "cpu", "cpu", None, 0, 0, ())
    if not mem:
        raise ModelError(f"--device {device} needs a GPU and none is visible; use --device cpu")
    from transformers import AutoConfig

    try:
        t_cfg = AutoConfig.from_pretrained(target, trust_remote_code=False)
        d_cfg = None if draft is None else AutoConfig.from_pretrained(draft, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the model configs to place them: {first_line(e)}") from None
    return plan_placement(t_cfg, d_cfg, len(mem), mem, dtype, device)
