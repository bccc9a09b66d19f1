"""One model behind three verbs: prefill a prompt, forward tokens under a tree mask, keep cache columns.

The runner owns the model's KV cache and applies its family's position rule (families.py), so the rest of the engine
speaks only in sequence positions, token ids and boolean attention patterns: a token at sequence position p is fed at
position_ids [1, q] = p + rope_delta, where rope_delta is the text shift the family's rule reads after prefill (M-RoPE:
the model's rope_deltas; 1D: 0; after a pruned draft prefill: what keeps the text at its unpruned positions).
Cached forwards (decode steps, tree levels, verify passes) go through the model's own decoder layers called in turn
(stack.py) once the first one has given bit-identical logits to forward(), else through forward(). With `fused`, the
runner computes those layers with fused products instead (fused.py), kept once its first forward came out close to
forward() with the same argmax on every row (their last bits may differ: see fused.py on exactness); where several
ways of computing them pass (oneDNN-packed or transposed weights, and for a draft the same layers in NumPy, host.py,
or compiled, compiled.py), the check (checks.py) times them and keeps the fastest. It runs once per model: on a short
text prompt when the engine is built (`check_layers`), else on its first cached forward. A prompt goes through forward()
until the fused layers are kept; then through the model's own forward only up to its text model (vision tower,
merged visual features, positions: stack.prompt_inputs) and the fused layers (fused.FusedDecoder.prefill), once the
first such prefill has come out close to forward()'s in logits, keys and values (`_check_prompt`). On that path a
Qwen2.5-VL-style vision tower runs in fewer calls (vision.py), unless the check fails with it and passes without.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from transformers import DynamicCache

from .cache import compact, copy_cache
from .checks import RunnerChecks, backend_name, sync
from .compiled import CompiledDecoder, compiled_decoder
from .families import Family, adapter_for
from .fused import WARM_ROWS, FusedDecoder, fused_decoders
from .host import HostDecoder, host_decoder
from .pruning import VisualPruning, pruned_prefill_inputs
from .stack import DecoderStack, decoder_stack, prompt_inputs
from .tree import DraftTree, additive_mask, verify_allowed, verify_inputs
from .vision import FusedVision, fused_vision


class Pass(NamedTuple):
    """One model forward: its logits and what it took."""

    logits: torch.Tensor  # prefill: [V] after the prompt's last token; forward: [q, V]
    ms: float  # wall time of the model call
    # forward(top=k) on the compiled layers: the last row's softmax top-k over the shared vocabulary, same call
    top: tuple[list[list[float]], list[list[int]]] | None = None  # ([1][k] probs, [1][k] tokens); else None
    # forward(argmax=True) through the kept layers: each row's argmax, taken in the pass while its logits are in the
    # cores' caches (~5 us there; the same op on them after the pass ~20-60 us on this project's CPUs)
    argmax: np.ndarray | torch.Tensor | None = None  # [q] int64 (NumPy on the CPU)


def rows_argmax(logits: torch.Tensor, on_cpu: bool) -> np.ndarray | torch.Tensor:
    """Each row's argmax (the first of equal maxima, as torch's): NumPy's on the CPU, whose array's tolist() is a
    shorter path than a tensor's right after a forward (torch's argmax and tolist took ~27 us there, NumPy's ~20);
    torch's elsewhere.  # [q, V] -> [q]"""
    return logits.numpy().argmax(-1) if on_cpu else logits.argmax(-1)


@dataclass(frozen=True)
class _KeptPrompt:
    """A prefilled prompt kept for the next request on the same inputs (`ModelRunner.keep_prompt`)."""

    inputs: dict[str, torch.Tensor]  # held, so that no other request's inputs can take their identity
    pruning: VisualPruning | None
    cache: DynamicCache  # after the prompt (copied on each reuse: a run appends to and crops its own)
    rope_delta: int
    logits: torch.Tensor  # [V] after the prompt's last token


def inference(fn):
    """`torch.inference_mode` around `fn`, entered only where the caller is not in it already: entering costs ~3 us,
    and the engine runs each decode step, a dozen runner calls, inside one (engine.py)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run


class ModelRunner(RunnerChecks):
    def __init__(self, model: torch.nn.Module, vocab_limit: int | None = None, family: Family | None = None,
                 layer_stack: bool = True, fused: bool = False, row_invariant: bool = True):
        """layer_stack: run cached forwards through the decoder layers directly (stack.py) where that is
        checked to equal forward(); False: always forward(). fused: with the stack, compute the layers with
        fused products where they are checked close to forward() (fused.py: logits that may differ from
        forward()'s in the last bits). row_invariant: fused products give a token the same numbers in a one-token
        step as in a pass over many (a target's `ar` steps and verify passes); False (a draft, whose numbers only
        shape its guesses): a one-token step takes BLAS's cheaper one-row path (fused.Product), and the same layers
        computed in NumPy (host.py) and compiled with Numba (compiled.py) are candidates too."""
        self.model = model
        self.family = family or adapter_for(model)
        self.stack: DecoderStack | None = decoder_stack(model, self.family) if layer_stack else None
        # the ways its layers can be fused (fused.py): the check keeps the fastest of those close to forward()
        self._candidates = fused_decoders(self.stack, row_invariant) if fused and self.stack is not None else []
        if not row_invariant:  # a draft: its layers in NumPy (host.py) and compiled (compiled.py) too, where they can
            hosts = [h for h in map(host_decoder, self._candidates) if h is not None]
            self._candidates += hosts + [c for c in map(compiled_decoder, hosts) if c is not None]
        self.fused: FusedDecoder | HostDecoder | None = self._candidates[0] if self._candidates else None
        self.stack_checked = False  # the first tree forward compares the stack (and the fused layers) with forward()
        # prompts through the fused layers too (fused.FusedDecoder.prefill): None until the first prefill after the
        # layers' check has compared them with forward() on a real prompt (`_check_prompt`)
        self.fused_prefill: bool | None = None
        # its vision tower computed in fewer calls (vision.py) inside that prompt path, where the tower allows; dropped
        # if the prompt check fails with it and passes without it
        self.vision: FusedVision | None = fused_vision(model) if self._candidates else None
        # why a faster path was turned down or not offered, one line each (SpecEngine.backends reports them)
        self.notes: list[str] = [] if layer_stack else ["forward() asked for: no other path offered"]
        if not row_invariant and self._candidates and not any(
                isinstance(c, CompiledDecoder) for c in self._candidates):
            self.notes.append("no compiled layers offered (Numba missing, or layers of unequal heads)")
        self.check_ms = 0.0  # time spent checking so far (once per runner: not a cost of the step it falls in)
        emb = model.get_input_embeddings()
        self.device = emb.weight.device  # where input ids go (first shard)
        if self.device.type == "meta":  # accelerate offloaded it (CPU/disk): ids go where its hook runs it
            hooks = [emb._hf_hook, *getattr(emb._hf_hook, "hooks", [])]
            self.device = torch.device(next(h.execution_device for h in hooks
                                            if getattr(h, "execution_device", None) is not None))
        self.dtype = emb.weight.dtype
        # read once: right after a forward, asking the device's type and comparing dtypes took ~8 us a step
        self._cpu, self._cuda = self.device.type == "cpu", self.device.type == "cuda"
        self._float32 = self.dtype == torch.float32
        self._cpu_float32 = self._cpu and self._float32
        self.vocab_limit = vocab_limit  # slice logits to the vocabulary both models share
        self._blocked_value: float | None = None  # a masked column's additive value (finfo(dtype).min), once asked
        self._one_io: tuple[np.ndarray, torch.Tensor, torch.Tensor] | None = None  # _one_token_pass's id and position
        self.cache: DynamicCache | None = None
        self._empty: DynamicCache | None = None  # an empty cache of the model's layers, copied for each prompt
        self.rope_delta = 0  # text-position shift after the prompt (family rule; 0 for 1D families unpruned)
        # keep_prompt: a prefill of the very inputs (same dict object) of the last one copies its cache instead
        # of running the model again (many draws on one prompt: check-sampling, generate --num-samples). The
        # reuse takes a copy's time, not a prefill's: off where prefill is timed (bench, the demo's race).
        self.keep_prompt = False
        self._kept: _KeptPrompt | None = None

    @property
    def seq_len(self) -> int:
        """Columns in the cache: the fused layers' buffers' length while the cache's layers view them (cache.KVBuffers:
        a compaction leaves the views longer), else its first layer's, read off the keys' shape
        (DynamicCache.get_seq_length's answer for the cache layers the runner makes, without its checks and its call
        into torch; asked a few times a step).
        A layer no forward has written holds no keys, or an empty 1D tensor."""
        if self.cache is None:
            return 0
        keys = self.cache.layers[0].keys if self.cache.layers else None
        buffers = getattr(self.fused, "buffers", None)
        n = None if buffers is None else buffers.length_of(keys)
        if n is not None:
            return n
        return 0 if keys is None or keys.dim() != 4 else keys.shape[2]

    @inference
    def prefill(self, inputs: dict[str, torch.Tensor], pruning: VisualPruning | None = None) -> Pass:
        """Run the whole prompt (with `pruning`, only part of its visual tokens): the logits after its last
        token.  # [V]"""
        kept = self._kept
        if self.keep_prompt and kept is not None and kept.inputs is inputs and kept.pruning == pruning:
            t0 = time.perf_counter()
            self.cache, self.rope_delta = copy_cache(kept.cache), kept.rope_delta
            return Pass(kept.logits, (time.perf_counter() - t0) * 1e3)
        self._kept = None
        self.cache = self._new_cache()
        positions = self.family.positions
        positions.reset(self.model)  # never reuse a previous request's shift
        batch = {k: v.to(self.device) for k, v in inputs.items()}
        t0 = time.perf_counter()
        self.rope_delta = 0
        if pruning is not None:
            batch, self.rope_delta = pruned_prefill_inputs(self.model, batch, pruning, self.family)
        decoder = self._prompt_decoder(batch) if pruning is None else None
        if decoder is not None and self.fused_prefill is None:
            logits, ms = self._check_prompt(decoder, batch, t0)
        else:
            logits = None if decoder is None else self._checked_prompt(decoder, batch)
            if logits is None:
                logits = self._own_prompt(batch)
            sync(self.device)
            ms = (time.perf_counter() - t0) * 1e3
        if pruning is None:
            self.rope_delta = positions.shift_after_prefill(self.model)
        logits = self._logits(logits)
        if self.keep_prompt:
            self._kept = _KeptPrompt(inputs, pruning, copy_cache(self.cache), self.rope_delta, logits)
        return Pass(logits, ms)

    def _new_cache(self) -> DynamicCache:
        """An empty cache for a prompt: a copy of one made from the model's config once (making one reads the config's
        layer types: ~28 us, ~70 us in a run's first drafted step, against a few for the copy)."""
        if self._empty is None:
            self._empty = DynamicCache(config=self.model.config)
        return copy_cache(self._empty)

    def _prompt_decoder(self, batch: dict) -> FusedDecoder | None:
        """The fused layers a whole prompt can go through: the checked ones (a NumPy candidate's torch original), not
        after their prompt check failed, and not packed ones over more rows than they were warmed for."""
        if not self.stack_checked or self.fused is None or self.fused_prefill is False:
            return None
        decoder = self.fused.fused if isinstance(self.fused, HostDecoder) else self.fused
        ids = batch.get("input_ids")
        if decoder.packed and (ids is None or ids.shape[-1] > WARM_ROWS):
            return None
        return decoder

    def _own_prompt(self, batch: dict) -> torch.Tensor:
        """The prompt through the model's own forward() into the (empty) cache: the logits after its last token.
        # [V]"""
        return self.model(**batch, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    def _fused_prompt(self, decoder: FusedDecoder, batch: dict, cache: DynamicCache) -> torch.Tensor | None:
        """The prompt's logits after its last token [V], its keys and values in `cache` (empty): the model's own
        forward up to its text model (the vision tower, the merge of visual features, the positions), then the
        fused layers; None where the forward's call to its text model is not plain (stack.prompt_inputs)."""
        if self.vision is not None:
            batch = self.vision.encoded(batch)
        found = prompt_inputs(self.model, self.stack, batch, cache)
        return None if found is None else decoder.prefill(*found, cache)

    def _checked_prompt(self, decoder: FusedDecoder, batch: dict) -> torch.Tensor | None:
        """The prompt through the checked fused path into the (empty) cache: its logits [V]; None, the cache emptied
        again, where this prompt does not take that path (forward() then runs it, and raises if the input is at
        fault)."""
        try:
            logits = self._fused_prompt(decoder, batch, self.cache)
        except Exception:  # noqa: BLE001 - a prompt the checked path does not take
            logits = None
        if logits is None:
            self.cache = self._new_cache()  # what an unfinished capture may have left
        return logits

    @inference
    def forward(self, tokens: list[int], positions: list[int], allowed: np.ndarray, top: int = 0,
                argmax: bool = False) -> Pass:
        """Append `tokens` at sequence `positions`; `allowed` [q, r] is their attention pattern over the
        newest r key columns (the last q of which are these tokens); older columns are always visible.
        The logits after each token (ids and positions made in NumPy: a third of torch.tensor's time), with `top`
        the compiled layers' top-k of the last row (`Pass.top`), with `argmax` each row's argmax where the pass runs
        through the kept torch layers (`Pass.argmax`).  # [q, V]"""
        q, r = allowed.shape
        shifted = [p + self.rope_delta for p in positions]
        sees_all = q == 1 and (r == 1 or allowed.all())  # one token that sees every column (itself at least): no mask
        if self.stack_checked and isinstance(self.fused, HostDecoder):  # NumPy takes the lists and pattern as they are
            t0 = time.perf_counter()
            logits = self.fused.run(tokens, shifted, None if sees_all else ~allowed, self.cache, top, self.vocab_limit)
            return Pass(self._logits(logits), (time.perf_counter() - t0) * 1e3, self.fused.top)
        if sees_all and self._cpu and self.stack_checked:  # a plain step, a chain level: two numbers to write
            return self._one_token_pass(tokens[0], shifted[0], argmax)
        past = self.seq_len + q - r
        ids_pos = torch.from_numpy(np.array(tokens + shifted, dtype=np.int64)).view(2, 1, q)
        ids, pos = (ids_pos if self._cpu else ids_pos.to(self.device)).unbind()
        # [1, 1, q, past + r]; none for one token that sees every column (a plain step, a chain level)
        mask = None if sees_all else additive_mask(allowed, past, self.dtype, self.device)
        if self.stack is not None and not self.stack_checked:
            t0 = time.perf_counter()
            self._check_stack(ids, pos, mask)
            self.check_ms += (time.perf_counter() - t0) * 1e3
        return self._timed_pass(ids, pos, mask, max(shifted), argmax)

    @inference
    def forward_tree(self, root: int, tree: DraftTree, argmax: bool = False, past: int | None = None) -> Pass:
        """A verify pass: `root` at the cache length L (`past`, where the caller has just read it), the tree's nodes
        at L + their depth, each seeing the past, the root, its ancestors and itself; the logits after the root and
        after each node. Once the layers are checked, their ids, positions and mask are built in one compiled call
        (tree.verify_inputs).  # [1 + n, V]"""
        L = self.seq_len if past is None else past
        if not tree.tokens or not self.stack_checked or isinstance(self.fused, HostDecoder):
            return self.forward([root] + tree.tokens, [L] + [L + d for d in tree.depths], verify_allowed(tree.parents),
                                argmax=argmax)
        blocked = self._blocked_value
        if blocked is None:
            blocked = self._blocked_value = float(torch.finfo(self.dtype).min)
        *inputs, depth = verify_inputs(tree, root, L + self.rope_delta, L, blocked)
        ids, pos, mask = map(torch.from_numpy, inputs)
        if not self._cpu_float32:
            ids, pos, mask = ids.to(self.device), pos.to(self.device), mask.to(device=self.device, dtype=self.dtype)
        return self._timed_pass(ids, pos, mask, L + self.rope_delta + depth, argmax)

    def _one_token_pass(self, token: int, position: int, argmax: bool = False) -> Pass:
        """A pass of one token that sees every column, on the CPU once the layers are checked: its id and (shifted)
        position written into a tensor pair made once, where building them from lists took ~15-20 us right after
        the last forward, for two numbers.  # [1, V]"""
        if self._one_io is None:
            buf = np.zeros((2, 1, 1), dtype=np.int64)
            self._one_io = (buf, *torch.from_numpy(buf).unbind())
        buf, ids, pos = self._one_io
        buf[0, 0, 0], buf[1, 0, 0] = token, position
        return self._timed_pass(ids, pos, None, position, argmax)

    def _timed_pass(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, top: int,
                    argmax: bool = False) -> Pass:
        """One cached forward of ids, positions [1, q] (`top` the largest) under `mask`, through the kept layers
        (else forward()), timed; with `argmax`, each row's argmax taken in it (`Pass.argmax`).  # -> logits [q, V]"""
        t0 = time.perf_counter()
        net = self.fused or self.stack
        if net is not None:
            logits = net(ids, pos, mask, self.cache, top)
        else:
            logits = self._forward(ids, pos, mask)
        logits = self._logits(logits[0])
        best = rows_argmax(logits, self._cpu) if argmax else None
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return Pass(logits, (time.perf_counter() - t0) * 1e3, argmax=best)

    @property
    def compiled(self) -> bool:
        """Are the kept layers the compiled ones (compiled.py), which can run a drafted step in one call?"""
        return self.stack_checked and isinstance(self.fused, CompiledDecoder)

    @property
    def tree_forward(self) -> str:
        """How cached steps run: "fused+packed" or "fused" (fused.py), "fused+numpy" (host.py), "fused+numba"
        (compiled.py), "layers" (stack.py) or "forward" (the model's forward())."""
        return backend_name(self.fused or self.stack)

    @property
    def prompt_path(self) -> str:
        """How a whole prompt runs: "fused+vision" (the fused layers, the pictures through vision.py), "fused", or
        "forward" (the model's forward(): the fused path unchecked or dropped, or none)."""
        if not self.fused_prefill:
            return "forward"
        return "fused+vision" if self.vision is not None else "fused"

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=self.cache,
                          use_cache=True).logits

    @inference
    def keep(self, start: int, cols: list[int]) -> None:
        """Keep cache columns start + cols (in order), drop the rest of the region. Where the kept layers' buffers
        hold the cache, its layers keep their longer views until the next pass (cache.KVBuffers): `seq_len` and every
        pass of the kept layers read the length from the buffers; code that reads the layers itself calls
        `sync_cache()` first."""
        compact(self.cache, start, cols, getattr(self.fused, "buffers", None))

    @inference
    def sync_cache(self) -> None:
        """Point the cache's layers at exactly the columns in use, where a compaction has left them longer."""
        buffers = getattr(self.fused, "buffers", None)
        if self.cache is not None and buffers is not None and buffers.owns(self.cache.layers):
            buffers.publish(self.cache.layers, buffers.length)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._float32 and logits.dtype != torch.float32:  # a float32 model's logits are float32
            logits = logits.float()
        limit = self.vocab_limit
        return logits if limit is None or limit >= logits.shape[-1] else logits[..., :limit]
