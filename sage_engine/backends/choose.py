"""Which backend a model runs on: `offer` lists the ones that apply to it, the checks keep only those that compute
what its own forward() does, and the fastest of those is kept; every one turned down leaves a one-line note.

The "layers" backend is kept only where its logits equal forward()'s bit for bit; the fused ones (fused, numpy,
numba) only where theirs and the keys and values they append are within 1e-3 of forward()'s with the same argmax on
every row; where several pass they are timed against each other. The fused prompt path is kept only where a whole
prompt's logits, keys and values come out near forward()'s. The runner runs these checks once per model (when the
engine is built, or at its first cached forward and first prefill), their time counted apart from any step's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from transformers import DynamicCache

from ..core import jit
from ..core.cache import compact
from ..core.jit import numba as numba_installed
from .fused_torch import fused_decoders
from .hf_layers import DecoderStack, decoder_stack, stack_refusal
from .numba_layers import compiled_decoder
from .numpy_host import ThreadpoolController, host_decoder, pick
from .vision_tower import FusedVision, fused_vision

# --tree-forward: "auto" offers every backend that applies and keeps the fastest that passes its check
BACKENDS = ("auto", "forward", "layers", "fused", "numpy", "numba")
# backends of your own, by name (`register`): offered when asked for by that name, checked like the others
REGISTERED: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> None:
    """Make `name` a backend `--tree-forward` / SpecEngine(tree_forward=name) can ask for: `factory(model, stack,
    row_invariant)` returns the backend for a model (stack: its hf_layers.DecoderStack, None where its layers cannot
    be called in turn), or None where it does not apply (the model then runs on forward(), with a note). The check
    against forward() and the notes are the same as for the built-in ones."""
    if name in BACKENDS:
        raise ValueError(f"{name!r} is a built-in backend")
    REGISTERED[name] = factory


def known(name: str) -> bool:
    return name in BACKENDS or name in REGISTERED


class Offer(NamedTuple):
    """The backends a model may run on, before any check."""

    stack: DecoderStack | None  # its own layers in turn (also what the fused prompt path calls up to its layers)
    candidates: list  # the fused backends to check and time, best guess first
    vision: FusedVision | None  # its vision tower in fewer calls, for the fused prompt path
    notes: list[str]  # what was asked for and not offered, and why


def offer(model: torch.nn.Module, family, wanted: str = "auto", row_invariant: bool = True,
          named: str | None = None) -> Offer:
    """The backends `wanted` allows for `model` (BACKENDS). A target (row_invariant: its numbers must not depend on how
    many rows share a product, or its verify passes could part from its `ar` steps) is offered the torch fused layers
    at most: the NumPy and Numba layers take BLAS's one-row path; asked for them, it gets the torch ones and a note.
    named: only the backend of this name (a runner's `tree_forward`, e.g. "fused+packed"): a second runner of a model
    on the backend another one's checks kept, checked against forward() like any but not timed against the others,
    whose timing on a busy machine may pick another one."""
    if named in ("forward", "layers") or named in REGISTERED:  # asked for by that name as it is
        wanted, named = named, None
    if named is not None:
        made = offer(model, family, wanted, row_invariant)
        kept = [c for c in made.candidates if c.name == named]
        why = [] if kept else [f"{named} asked for and not offered here: "
                               + ("; ".join(made.notes) or f"offered {', '.join(c.name for c in made.candidates)}")]
        return made._replace(candidates=kept, vision=made.vision if kept else None, notes=made.notes + why)
    if not known(wanted):
        raise ValueError(f"unknown backend {wanted!r}; choose one of {', '.join([*BACKENDS, *REGISTERED])}")
    notes: list[str] = []
    stack = decoder_stack(model, family) if wanted != "forward" else None
    if wanted in REGISTERED:
        made = REGISTERED[wanted](model, stack, row_invariant)
        if made is None:
            notes.append(f"{wanted} does not apply to this model: forward() runs every pass")
        return Offer(stack, [] if made is None else [made], None, notes)
    if stack is None and wanted != "forward":
        notes.append(f"its layers are not called in turn: {stack_refusal(model, family)}; forward() runs every pass")
    if stack is None or wanted == "layers":
        return Offer(stack, [], None, notes)
    fused = fused_decoders(stack, row_invariant)
    if not fused:
        notes.append("no fused layers apply (not plain pre-norm attention + SwiGLU, a dynamic rotary, or too large)")
    hosts = [h for h in map(host_decoder, fused) if h is not None] if not row_invariant else []
    compiled = [c for c in map(compiled_decoder, hosts) if c is not None]
    if row_invariant and wanted in ("numpy", "numba"):
        notes.append(f"{wanted} is not offered for a target (its products must give a row the same numbers alone and "
                     "among others): torch's fused layers instead")
    elif wanted == "numba" and not compiled and hosts:
        notes.append("numba asked for and not offered (Numba missing, or layers of unequal heads): NumPy instead")
    elif not row_invariant and fused and not hosts and ThreadpoolController is None:
        notes.append("no NumPy or compiled layers offered: threadpoolctl is missing (it holds their BLAS to one "
                     "thread beside torch's); torch's fused layers instead")
    elif not row_invariant and fused and not compiled:
        notes.append("no compiled layers offered: Numba compiles in the background (first start); an engine built "
                     "after it has finished uses them" if numba_installed and not jit.ACTIVE else
                     "no compiled layers offered (Numba or SciPy missing, or layers of unequal heads)")
    candidates = {"auto": fused + hosts + compiled, "fused": fused, "numpy": hosts or fused,
                  "numba": compiled or hosts or fused}[wanted]
    return Offer(stack, candidates, fused_vision(model) if candidates else None, notes)


class Kept(NamedTuple):
    """What the check of the cached forwards kept."""

    stack: DecoderStack | None  # None: its layers did not give forward()'s logits bit for bit
    fused: object | None  # the fastest fused backend that passed, None: none did
    notes: list[str]


def check_cached(reference: Callable, offered: Offer, cache, length: Callable[[], int], args: tuple,
                 device: torch.device) -> Kept:
    """Run one cached forward (`args`: ids, positions, mask) through forward() (`reference`) and through each offered
    backend, dropping what each appended to `cache` (`length()`: its columns now), and keep those that compute what
    forward() does (see the module's note)."""
    start = length()
    ref = reference(*args)
    ref_kv = [(layer.keys[:, :, start:].clone(), layer.values[:, :, start:].clone())
              for layer in cache.layers] if offered.candidates else []  # only the fused check reads them
    compact(cache, start, [])
    if offered.stack is not None and not _try(offered.stack, args, cache, length, lambda got: torch.equal(got, ref)):
        return Kept(None, None, ["its decoder layers called in turn did not give forward()'s logits bit for bit: "
                                 "cached forwards run through forward()"])

    def close(got: torch.Tensor) -> bool:  # the fused layers' logits and appended keys and values
        kv = [(layer.keys[:, :, start:], layer.values[:, :, start:]) for layer in cache.layers]
        return near(got, ref, argmax=True) and all(near(k, rk) and near(v, rv) for (k, v), (rk, rv) in zip(kv, ref_kv))

    passed = [c for c in offered.candidates if _try(c, args, cache, length, close)]
    notes = [f"{c.name} turned down: logits, keys or values not within 1e-3 of forward()'s, or another argmax"
             for c in offered.candidates if not any(c is p for p in passed)]
    return Kept(offered.stack, fastest(passed, args, cache, length, device) if passed else None, notes)


def fastest(candidates: list, args: tuple, cache, length: Callable[[], int], device: torch.device,
            rounds: int = 5):
    """The candidate with the least median time over `rounds` interleaved rounds of this forward and a one-token
    step (which products are faster depends on the CPU), a NumPy or compiled one given an edge (numpy_host.pick)."""
    if len(candidates) == 1:
        return candidates[0]
    ids, pos, _ = args
    shapes = (args, (ids[:, :1], pos[:, :1], None))  # the first token sees every column: no mask
    start, times = length(), [[] for _ in candidates]
    for _ in range(rounds):
        for net, spent in zip(candidates, times):
            t0 = time.perf_counter()
            for shape in shapes:
                net(*shape, cache)
                compact(cache, start, [])
            sync(device)
            spent.append(time.perf_counter() - t0)
    return candidates[pick([statistics.median(spent) for spent in times], candidates)]


def _try(net, args: tuple, cache, length: Callable[[], int], same: Callable[[torch.Tensor], bool]) -> bool:
    """Run `net` on this forward's inputs, judge its logits with `same`, drop what it appended."""
    start = length()
    try:
        got = net(*args, cache)
        ok = bool(got.shape[:-1] == args[0].shape and same(got))
    except Exception:  # noqa: BLE001 - any failure means: not the same computation, do not use it
        ok = False
    if length() > start:
        compact(cache, start, [])
    return ok


def prompt_close(fused_prompt: Callable[[DynamicCache], torch.Tensor | None], logits: torch.Tensor, cache,
                 config) -> bool:
    """Does the fused prompt path, run into a scratch cache, give logits near forward()'s `logits` with the same
    argmax, and keys and values near those forward() wrote in `cache`?"""
    scratch = DynamicCache(config=config)
    try:
        got = fused_prompt(scratch)
        return got is not None and near(got, logits, argmax=True) and all(
            near(a.keys, b.keys) and near(a.values, b.values)
            for a, b in zip(scratch.layers, cache.layers) if b.is_initialized)
    except Exception:  # noqa: BLE001 - any failure means: not the same computation, do not use it
        return False


def near(got: torch.Tensor, ref: torch.Tensor, argmax: bool = False) -> bool:
    """Within 1e-3 of `ref`'s largest magnitude and, with `argmax` (logits), the same argmax on every row."""
    if got.shape != ref.shape:
        return False
    scale = float(ref.abs().max()) or 1.0
    within = float((got.float() - ref.float()).abs().max()) <= 1e-3 * scale
    return within and (not argmax or torch.equal(got.argmax(-1), ref.argmax(-1)))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a timer around a call measures the call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
