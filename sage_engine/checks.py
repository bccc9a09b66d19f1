"""The checks behind a ModelRunner's fast paths: each runs once per model and keeps a path only where it computes
what the model's own forward() does.

The layer stack (stack.py) is kept only where its logits equal forward()'s bit for bit; the fused layers (fused.py,
host.py, compiled.py) only where theirs and the keys and values they append are near forward()'s with the same argmax
on every row, the fastest of those that pass timed against each other; the fused prompt path only where a whole
prompt's logits, keys and values come out near forward()'s. `check_layers` and `check_prompt` run them when the engine
is built; otherwise they run inside a run's first cached forward and first prefill, their time counted apart
(`check_ms`), never as the step's.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator

import torch
from transformers import DynamicCache

from .cache import compact
from .fused import FusedDecoder
from .host import HostDecoder, pick
from .tree import verify_allowed


def near(got: torch.Tensor, ref: torch.Tensor, argmax: bool = False) -> bool:
    """The runner's check of the fused layers against forward(): within 1e-3 of `ref`'s largest magnitude and,
    with `argmax` (logits), the same argmax on every row."""
    if got.shape != ref.shape:
        return False
    scale = float(ref.abs().max()) or 1.0
    within = float((got.float() - ref.float()).abs().max()) <= 1e-3 * scale
    return within and (not argmax or torch.equal(got.argmax(-1), ref.argmax(-1)))


def backend_name(net) -> str:
    """What a runner's cached forwards run on: "fused+numba" (compiled.py), "fused+numpy" (host.py), "fused+packed" or
    "fused" (fused.py), "layers" (stack.py) or "forward" (None: the model's forward())."""
    from .compiled import CompiledDecoder  # compiled.py imports host.py: kept out of this module's import time

    if net is None:
        return "forward"
    if isinstance(net, CompiledDecoder):
        return "fused+numba"
    if isinstance(net, HostDecoder):
        return "fused+numpy"
    if isinstance(net, FusedDecoder):
        return "fused+packed" if net.packed else "fused"
    return "layers"


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a timer around a call measures the call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RunnerChecks:
    """ModelRunner's checks (mixed into it): they read and set its model, caches and kept paths."""

    def _check_prompt(self, decoder: FusedDecoder, batch: dict, t0: float) -> tuple[torch.Tensor, float]:
        """The first prefill after the layers' check: forward() gives this prompt's logits and cache; the fused path
        then runs the same prompt into a scratch cache and is kept for prompts only if its logits are near
        forward()'s with the same argmax and so are the keys and values it wrote (`near`). Its time is
        checking time, not this prefill's."""
        logits = self._own_prompt(batch)
        sync(self.device)
        ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        self.fused_prefill = self._prompt_close(decoder, batch, logits)
        if not self.fused_prefill and self.vision is not None:  # the layers may be right where the vision is not
            self.vision = None
            self.fused_prefill = self._prompt_close(decoder, batch, logits)
            self.notes.append("the fused vision tower turned down: the prompt's logits, keys or values differed from "
                              "forward()'s" if self.fused_prefill else "")
        if not self.fused_prefill:
            self.notes.append("the fused prompt path turned down: its logits, keys or values differed from forward()'s;"
                              " prompts run through forward()")
        self.notes = [n for n in self.notes if n]
        self.check_ms += (time.perf_counter() - t1) * 1e3
        return logits, ms

    def _prompt_close(self, decoder: FusedDecoder, batch: dict, logits: torch.Tensor) -> bool:
        """Does the fused path, run on this prompt into a scratch cache, give logits near forward()'s `logits` with the
        same argmax, and keys and values near those forward() wrote in the cache?"""
        scratch = DynamicCache(config=self.model.config)
        try:
            got = self._fused_prompt(decoder, batch, scratch)
            return got is not None and near(got, logits, argmax=True) and all(
                near(a.keys, b.keys) and near(a.values, b.values)
                for a, b in zip(scratch.layers, self.cache.layers) if b.is_initialized)
        except Exception:  # noqa: BLE001 - any failure means: not the same computation, do not use it
            return False

    def _check_stack(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Run this forward both ways (dropping the appended cache columns after each); keep the stack
        only if its logits equal forward()'s bit for bit, and the fused layers only if theirs and the keys and
        values they append are near forward()'s (`near`), with the same argmax on every row."""
        self.stack_checked = True
        start = self.seq_len
        ref = self._forward(ids, pos, mask)
        ref_kv = [(layer.keys[:, :, start:].clone(), layer.values[:, :, start:].clone())
                  for layer in self.cache.layers] if self._candidates else []  # only the fused check reads them
        compact(self.cache, start, [])
        if not self._try(self.stack, (ids, pos, mask), lambda got: torch.equal(got, ref)):
            self.notes.append("its decoder layers called in turn did not give forward()'s logits bit for bit: "
                              "cached forwards run through forward()")
            self.stack, self.fused, self._candidates = None, None, []
            return

        def close(got: torch.Tensor) -> bool:  # the fused layers' logits and appended keys and values
            kv = [(layer.keys[:, :, start:], layer.values[:, :, start:]) for layer in self.cache.layers]
            return near(got, ref, argmax=True) and all(
                near(k, rk) and near(v, rv) for (k, v), (rk, rv) in zip(kv, ref_kv))

        close_ones = [c for c in self._candidates if self._try(c, (ids, pos, mask), close)]
        self.notes += [f"{backend_name(c)} turned down: logits, keys or values not within 1e-3 of forward()'s or "
                       "another argmax" for c in self._candidates if not any(c is k for k in close_ones)]
        self._candidates = []
        self.fused = self._fastest(close_ones, (ids, pos, mask)) if close_ones else None

    def _fastest(self, candidates: list[FusedDecoder | HostDecoder], args: tuple, rounds: int = 5):
        """The candidate with the least median time over `rounds` interleaved rounds of this forward and a one-token
        step (which products are faster depends on the CPU: fused.py, host.py), a host one given an edge (host.pick)."""
        if len(candidates) == 1:
            return candidates[0]
        ids, pos, _ = args
        shapes = (args, (ids[:, :1], pos[:, :1], None))  # the first token sees every column: no mask
        start, times = self.seq_len, [[] for _ in candidates]
        for _ in range(rounds):
            for net, spent in zip(candidates, times):
                t0 = time.perf_counter()
                for shape in shapes:
                    net(*shape, self.cache)
                    compact(self.cache, start, [])
                sync(self.device)
                spent.append(time.perf_counter() - t0)
        return candidates[pick([statistics.median(spent) for spent in times], candidates)]

    def _try(self, net, args: tuple, same) -> bool:
        """Run `net` on this forward's inputs, judge its logits with `same`, drop what it appended."""
        start = self.seq_len
        try:
            got = net(*args, self.cache)
            ok = bool(got.shape[:-1] == args[0].shape and same(got))
        except Exception:  # noqa: BLE001 - any failure means: not the same computation, do not use it
            ok = False
        if self.seq_len > start:
            compact(self.cache, start, [])
        return ok

    @property
    def prompt_unchecked(self) -> bool:
        """Are the layers kept and their prompt path not yet checked (`_check_prompt`)?"""
        return self.stack_checked and self.fused is not None and self.fused_prefill is None

    def check_prompt(self, inputs: dict[str, torch.Tensor]) -> None:
        """Check the prompt path now, on `inputs`, instead of on the first prompt of a run; the cache is dropped after
        it. A prompt the model cannot take leaves the check to the first real one."""
        if not self.prompt_unchecked:
            return
        with self._scratch_check():
            try:
                self.prefill(inputs)  # forward() first: if it raises, the path stays unchecked
            except Exception:  # noqa: BLE001 - checked on the first real prompt instead
                pass

    def check_layers(self, ids: list[int]) -> None:
        """Check the stack (and the fused layers) now, on a text prompt of `ids` and a 3-node tree after it, instead
        of inside the first decode step; the cache is dropped after it. Where the model cannot take a text-only
        prompt, the check stays where it was (the first cached forward of a run)."""
        if self.stack is None or self.stack_checked or len(ids) < 4:
            return
        with self._scratch_check():
            try:
                prompt = torch.tensor([ids[:-3]])
                self.prefill({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)})
                n = self.seq_len
                self.forward(ids[-3:], [n, n + 1, n + 1], verify_allowed([-1, -1]))  # a root and two children
            except Exception:  # noqa: BLE001 - e.g. a model that needs its images: checked on the first real forward
                self.stack_checked = False

    @contextlib.contextmanager
    def _scratch_check(self) -> Iterator[None]:
        """A check run when the engine is built, outside any run: its whole time (its prompt included) is checking
        time, and the cache it filled is dropped after it."""
        t0, before = time.perf_counter(), self.check_ms
        try:
            yield
        finally:
            self.cache, self.rope_delta, self._kept = None, 0, None
            self.check_ms = before + (time.perf_counter() - t0) * 1e3
