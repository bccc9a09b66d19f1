"""The machine the doctor runs on: devices, memory, versions, dtype support, and fp32 made exact.

No version is enforced: the engine imports and runs on other releases than the pinned ones (a GPU machine brings its
own), and the report lists each difference as a warning.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ...core import jit
from ...errors import SageError

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("torch", "torchvision", "transformers", "accelerate", "tokenizers", "safetensors", "numpy", "numba",
            "scipy", "threadpoolctl", "opencv-python-headless", "pillow")


def devices(device: str) -> list[str]:
    """The devices `--device` names: cpu; cuda (= cuda:0); cuda:N; multi (every visible GPU). SageError (one line)
    for a device that is not there."""
    if device == "cpu":
        return ["cpu"]
    if not torch.cuda.is_available():
        raise SageError(f"--device {device} needs a GPU and torch sees none (CUDA build: "
                           f"{torch.version.cuda or 'no'}); use --device cpu")
    n = torch.cuda.device_count()
    if device == "multi":
        return [f"cuda:{i}" for i in range(n)]
    index = int(device.split(":")[1]) if ":" in device else 0
    if not 0 <= index < n:
        raise SageError(f"--device {device}: torch sees {n} GPU(s)")
    return [f"cuda:{index}"]


def pins() -> dict[str, str]:
    """The versions the project pins (requirements.txt in a checkout, else the installed package's metadata)."""
    lines = (ROOT / "requirements.txt").read_text().splitlines() if (ROOT / "requirements.txt").exists() else (
        importlib.metadata.requires("sage-engine") or [])
    out = {}
    for line in lines:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def packages() -> tuple[dict, list[str]]:
    """{package: {"installed", "pinned"}} for the engine's dependencies, and a warning per difference."""
    pinned, out, warnings = pins(), {}, []
    for name in PACKAGES:
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        want = pinned.get(name)
        out[name] = {"installed": have, "pinned": want}
        if have is None:
            warnings.append(f"{name} is not installed" + (f" (pinned {want})" if want else ""))
        elif want and have.split("+")[0] != want:
            warnings.append(f"{name} {have} is not the pinned {want}: run on, results are checked below")
    if jit.missing():
        warnings.append(jit.missing())
    return out, warnings


def _works(device: str, dtype: torch.dtype) -> bool:
    """Does a product in `dtype` run on `device`?"""
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        return bool((a @ a)[0, 0].item() == 4)
    except (RuntimeError, TypeError):
        return False


def _ram_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def describe(device_list: list[str]) -> dict:
    """JSON-ready: the host, each device (name, memory, bf16 support), torch's and CUDA's versions, the packages."""
    pkgs, warnings = packages()
    found = []
    for d in device_list:
        if d == "cpu":
            found.append({"device": "cpu", "name": platform.processor() or platform.machine(), "memory_gib": _ram_gib(),
                          "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                          "bf16": _works("cpu", torch.bfloat16), "fp16": _works("cpu", torch.float16)})
        else:
            p = torch.cuda.get_device_properties(d)
            found.append({"device": d, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                          "capability": f"{p.major}.{p.minor}", "bf16": torch.cuda.is_bf16_supported(),
                          "fp16": True})
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "devices": found,
        "numba": "compiled" if jit.numba is not None else jit.missing(),
        "packages": pkgs,
        "warnings": warnings,
    }


@contextmanager
def exact_fp32() -> Iterator[dict]:
    """fp32 products computed in fp32: TF32 and reduced-precision reductions off while the block runs (a GPU's
    defaults may round fp32 products through TF32, and the target's tree and one-token passes then part)."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (torch.get_float32_matmul_precision(), cuda.allow_tf32, cudnn.allow_tf32,
             cuda.allow_fp16_reduced_precision_reduction, cuda.allow_bf16_reduced_precision_reduction)
    torch.set_float32_matmul_precision("highest")
    cuda.allow_tf32 = cudnn.allow_tf32 = False
    cuda.allow_fp16_reduced_precision_reduction = cuda.allow_bf16_reduced_precision_reduction = False
    try:
        yield {"float32_matmul_precision": "highest", "tf32": False, "reduced_precision_reductions": False}
    finally:
        (precision, cuda.allow_tf32, cudnn.allow_tf32, cuda.allow_fp16_reduced_precision_reduction,
         cuda.allow_bf16_reduced_precision_reduction) = saved
        torch.set_float32_matmul_precision(precision)
