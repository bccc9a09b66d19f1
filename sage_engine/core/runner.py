"""One model behind three verbs: prefill a prompt, forward tokens under a tree mask, keep cache columns.

The runner owns the model's KV cache and applies its family's position rule (families.py), so the rest of the engine
speaks only in sequence positions, token ids and boolean attention patterns: a token at sequence position p is fed at
position_ids [1, q] = p + rope_delta, where rope_delta is the text shift the family's rule reads after prefill (M-RoPE:
the model's rope_deltas; 1D: 0; after a pruned draft prefill: what keeps the text at its unpruned positions).
How the model's passes are computed is its backend's business (backends/): the runner asks backends.choose which ones
apply, has them checked against forward() once (when the engine is built, else at its first cached forward and first
prefill) and calls the kept one; it knows nothing of policies or trees beyond an attention pattern.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from ..backends import choose
from ..backends.choose import sync
from ..backends.hf_forward import ModelForward
from ..backends.prompt_path import FusedPrompt
from ..models.columns import Columns
from ..models.families import Family, adapter_for
from ..models.layer_kinds import plan_for
from ..models.pruning import VisualPruning, pruned_prefill_inputs
from ..models.recurrent_paths import PathRegion
from .cache import compact, copy_cache
from .passes import Pass, inference, rows_argmax
from .tree import DraftTree, additive_mask, verify_allowed, verify_inputs


@dataclass(frozen=True)
class _KeptPrompt:
    """A prefilled prompt kept for the next request on the same inputs (`ModelRunner.keep_prompt`)."""

    inputs: dict[str, torch.Tensor]  # held, so that no other request's inputs can take their identity
    pruning: VisualPruning | None
    cache: DynamicCache  # after the prompt (copied on each reuse: a run appends to and crops its own)
    rope_delta: int
    logits: torch.Tensor  # [V] after the prompt's last token
    columns: Columns | None  # the cache's columns (ModelRunner.columns)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, vocab_limit: int | None = None, family: Family | None = None,
                 backend: str = "layers", row_invariant: bool = True, named: str | None = None):
        """backend: the backends the model may run on (backends.choose.BACKENDS): "auto" every one that applies, the
        fastest that passes its check kept; "forward" the model's forward() alone; "layers" its own decoder layers in
        turn where checked bit-identical to forward(); "fused", "numpy", "numba" those layers computed another way,
        where checked close to forward(). row_invariant: a row's numbers may not depend on how many rows share a
        product (a target: its `ar` steps against its verify passes); False for a draft, whose numbers only shape its
        guesses (then the NumPy and Numba layers may be offered too). named: only the backend of that name (another
        runner's `tree_forward`; choose.offer), checked but not timed."""
        self.model = model
        self.family = family or adapter_for(model)
        self.plan = plan_for(model)  # its layers' kinds (layer_kinds.py): what each sees, how its cache keeps a path
        # where a layer sees less than the whole past (a window, a chunk): every cache column's sequence index, and
        # what each windowed layer type has dropped of them (columns.Columns). None where every layer sees all.
        self.columns: Columns | None = None
        # a model with recurrent layers: its uncommitted columns, each read along its own path (recurrent_paths.py)
        self.paths = PathRegion() if self.plan.recurrent else None
        # forward(): what every other backend is checked against
        self.reference = ModelForward(model, None if self.family.masks_by_type else self.family.language_model(model))
        self.offered = choose.offer(model, self.family, backend, row_invariant, named)
        self.stack = self.offered.stack
        # the fused backend kept by the check (until checked: the first offered), None: none
        self.fused = self.offered.candidates[0] if self.offered.candidates else None
        self.stack_checked = False  # the first cached forward checks the offered backends against forward()
        self.prompts = FusedPrompt(model, self.stack, self.offered.vision)
        self.notes = list(self.offered.notes)  # why a faster path was not offered or turned down, one line each
        self.check_ms = 0.0  # time spent checking so far (once per runner: not a cost of the step it falls in)
        emb = model.get_input_embeddings()
        self.device = emb.weight.device  # where input ids go (first shard)
        if self.device.type == "meta":  # accelerate offloaded it (CPU/disk): ids go where its hook runs it
            hooks = [emb._hf_hook, *getattr(emb._hf_hook, "hooks", [])]
            self.device = torch.device(next(h.execution_device for h in hooks
                                            if getattr(h, "execution_device", None) is not None))
        self.dtype = emb.weight.dtype
        # read once: asking the device's type and comparing dtypes right after a forward is not free
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
        if self.paths is not None:  # committed columns + the region read since (recurrent_paths.py)
            return self.paths.length
        if self.columns is not None:  # windowed layers may hold fewer: the cache's columns are counted here
            return self.columns.seq.shape[0]
        return self._held_columns()

    def _held_columns(self) -> int:
        """The columns the cache's first key/value layer holds (its fused buffers' length while it views them)."""
        keys = getattr(self.cache.layers[self.plan.kv_layer], "keys", None) if self.cache.layers else None
        buffers = self.backend.buffers
        n = None if buffers is None else buffers.length_of(keys)
        if n is not None:
            return n
        return 0 if keys is None or keys.dim() != 4 else keys.shape[2]

    @inference
    def prefill(self, inputs: dict[str, torch.Tensor], pruning: VisualPruning | None = None,
                own: bool = False) -> Pass:
        """Run the whole prompt (with `pruning`, only part of its visual tokens; `own`: through forward(), never the
        fused prompt path, whose check is left to a real prompt): the logits after its last token.  # [V]"""
        # what every later pass carries of the prompt (Mllama: the cross-attention mask's last row)
        self.reference.carry = {k: v.to(self.device) for k, v in self.family.carry(inputs).items()}
        kept = self._kept
        if self.keep_prompt and kept is not None and kept.inputs is inputs and kept.pruning == pruning:
            t0 = time.perf_counter()
            self.cache, self.rope_delta = copy_cache(kept.cache), kept.rope_delta
            self.columns = None if kept.columns is None else kept.columns.copy()
            if self.paths is not None:
                self.paths.reset(self._held_columns())
            return Pass(kept.logits, (time.perf_counter() - t0) * 1e3)
        self._kept = None
        self.cache, self.columns = self._new_cache(), None
        positions = self.family.positions
        positions.reset(self.model)  # never reuse a previous request's shift
        batch = {k: v.to(self.device) for k, v in inputs.items()}
        t0 = time.perf_counter()
        self.rope_delta = 0
        if pruning is not None:
            batch, self.rope_delta = pruned_prefill_inputs(self.model, batch, pruning, self.family)
        decoder = self.prompts.layers_for(self.fused, batch) if pruning is None and self.stack_checked and not own \
            else None
        if decoder is not None and self.prompts.state is None:  # forward() runs it, then the fused path is checked
            logits = self._own_prompt(batch)
            sync(self.device)
            ms = (time.perf_counter() - t0) * 1e3
            t1 = time.perf_counter()
            self.prompts.check(decoder, batch, logits, self.cache)
            self.check_ms += (time.perf_counter() - t1) * 1e3
        else:
            logits = None if decoder is None else self._checked_prompt(decoder, batch)
            if logits is None:
                logits = self._own_prompt(batch)
            sync(self.device)
            ms = (time.perf_counter() - t0) * 1e3
        if pruning is None:
            self.rope_delta = positions.shift_after_prefill(self.model)
        if self.paths is not None:  # the prompt is committed: read path by path from here
            self.paths.reset(self._held_columns())
        elif self.plan.windowed:  # the prompt's columns, each its own sequence index; what the windows drop of them
            self.columns = Columns.prompt(self.plan, self._held_columns())
            self.columns.roll(self.plan, self.cache.layers)
        logits = self._logits(logits)
        if self.keep_prompt:
            columns = None if self.columns is None else self.columns.copy()
            self._kept = _KeptPrompt(inputs, pruning, copy_cache(self.cache), self.rope_delta, logits, columns)
        return Pass(logits, ms)

    def _new_cache(self) -> DynamicCache:
        """An empty cache for a prompt: a copy of one made from the model's config once (making one reads the config's
        layer types, several times the copy's cost)."""
        if self._empty is None:
            self._empty = DynamicCache(config=self.model.config)
            self.plan.cache_layers(self._empty)  # windows and chunks keep every column (layer_kinds.py)
        return copy_cache(self._empty)

    def _own_prompt(self, batch: dict) -> torch.Tensor:
        """The prompt through the model's own forward() into the (empty) cache: the logits after its last token.
        # [V]"""
        return self.model(**batch, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    def _checked_prompt(self, decoder, batch: dict) -> torch.Tensor | None:
        """The prompt through the checked fused path into the (empty) cache: its logits [V]; None, the cache emptied
        again, where this prompt does not take that path (forward() then runs it, and raises if the input is at
        fault)."""
        try:
            logits = self.prompts.run(decoder, batch, self.cache)
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
        if self.paths is not None:  # recurrent layers: each token read along its own path (recurrent_paths.py)
            t0 = time.perf_counter()
            logits, self.cache = self.paths.forward(self.model, self.cache, tokens, shifted, allowed, self.device)
            sync(self.device)
            return Pass(self._logits(logits), (time.perf_counter() - t0) * 1e3)
        if self.plan.windowed:  # a window or a chunk: a mask per kind over every column, built from their indices
            return self._windowed_pass(tokens, positions, shifted, allowed, argmax)
        sees_all = q == 1 and (r == 1 or allowed.all())  # one token that sees every column (itself at least): no mask
        if self.stack_checked and self.backend.takes_lists:  # NumPy takes the lists and pattern as they are
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
        if not self.stack_checked:
            t0 = time.perf_counter()
            self._check_cached(ids, pos, mask)
            self.check_ms += (time.perf_counter() - t0) * 1e3
        return self._timed_pass(ids, pos, mask, max(shifted), argmax)

    @inference
    def forward_tree(self, root: int, tree: DraftTree, argmax: bool = False, past: int | None = None) -> Pass:
        """A verify pass: `root` at the cache length L (`past`, where the caller has just read it), the tree's nodes
        at L + their depth, each seeing the past, the root, its ancestors and itself; the logits after the root and
        after each node. Once the layers are checked, their ids, positions and mask are built in one compiled call
        (tree.verify_inputs).  # [1 + n, V]"""
        L = self.seq_len if past is None else past
        if self.paths is not None and not tree.tokens:  # a plain step: its token is always kept, read in directly
            t0 = time.perf_counter()
            logits = self.paths.commit(self.model, self.cache, [root], [L + self.rope_delta], self.device)
            sync(self.device)
            return Pass(self._logits(logits), (time.perf_counter() - t0) * 1e3)
        if self.columns is not None:  # between steps (no region open): windowed layers drop what the root cannot see
            self.columns.roll(self.plan, self.cache.layers)
        if not tree.tokens or not self.stack_checked or self.backend.takes_lists or self.plan.windowed:
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

    def _windowed_pass(self, tokens: list[int], positions: list[int], shifted: list[int], allowed: np.ndarray,
                       argmax: bool) -> Pass:
        """`forward` on a model with a window or a chunk: the tree's pattern over every column (the older ones all
        allowed) narrowed by each layer kind (layer_kinds.LayerPlan.masks) on the columns' sequence indices; one
        additive mask, or one per layer type where the kinds differ (transformers' models take them keyed by type).
        Every pass carries its masks, a one-token step too: the model's own would follow its rolling cache."""
        q = allowed.shape[0]
        q_seq = np.asarray(positions, dtype=np.int64)
        # [1, 1, q, held + q] per layer type: each type's layers hold their own columns
        masks = {name: additive_mask(m, 0, self.dtype, self.device)
                 for name, m in self.columns.masks(self.plan, q_seq, allowed).items()}
        mask = masks if self.plan.mixed else next(iter(masks.values()))
        self.columns.append(q_seq)
        ids_pos = torch.from_numpy(np.array(tokens + shifted, dtype=np.int64)).view(2, 1, q)
        ids, pos = ids_pos.to(self.device).unbind()
        return self._timed_pass(ids, pos, mask, max(shifted), argmax)

    def _one_token_pass(self, token: int, position: int, argmax: bool = False) -> Pass:
        """A pass of one token that sees every column, on the CPU once the layers are checked: its id and (shifted)
        position written into a tensor pair made once, rather than built from lists after every forward, for two
        numbers.  # [1, V]"""
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
        logits = self._logits(self.backend(ids, pos, mask, self.cache, top)[0])
        best = rows_argmax(logits, self._cpu) if argmax else None
        if self._cuda and best is None:  # the argmax's copy to the host has waited for the pass already
            torch.cuda.synchronize(self.device)
        return Pass(logits, (time.perf_counter() - t0) * 1e3, argmax=best)

    @property
    def backend(self):
        """The backend cached forwards run on: the kept fused one, else the model's layers, else forward()."""
        return self.fused or self.stack or self.reference

    @property
    def compiled(self) -> bool:
        """Are the kept layers the compiled ones, on which a drafted step can run in one call (draft_compiled.py)?"""
        return self.stack_checked and self.backend.compiled

    @property
    def tree_forward(self) -> str:
        """The backend's name: "fused+packed", "fused", "fused+numpy", "fused+numba", "layers" or "forward"."""
        return self.backend.name

    @property
    def prompt_path(self) -> str:
        """How a whole prompt runs: "fused+vision", "fused" (backends/prompt_path.py), or "forward"."""
        return self.prompts.name

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.reference(ids, pos, mask, self.cache)

    def _check_cached(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> None:
        """This forward run through forward() and every offered backend (backends.choose.check_cached); keep what
        passes. Nothing offered: forward() is the backend, nothing to check."""
        self.stack_checked = True
        if self.stack is None and not self.offered.candidates:
            return
        kept = choose.check_cached(self._forward, self.offered, self.cache, lambda: self.seq_len, (ids, pos, mask),
                                   self.device)
        self.stack, self.fused = kept.stack, kept.fused
        self.notes += kept.notes
        if self.fused is None:
            self.prompts.state = False  # the prompt path needs fused layers

    @property
    def prompt_unchecked(self) -> bool:
        """Are fused layers kept and their prompt path not yet checked?"""
        return self.stack_checked and self.fused is not None and self.prompts.state is None

    def check_layers(self, ids: list[int]) -> None:
        """Check the offered backends now, on a text prompt of `ids` and a 3-node tree after it, instead of inside the
        first decode step; the cache is dropped after it. Where the model cannot take a text-only prompt, the check
        stays where it was (the first cached forward of a run)."""
        if (self.stack is None and not self.offered.candidates) or self.stack_checked or len(ids) < 4:
            return
        with self._scratch_check():
            try:
                prompt = torch.tensor([ids[:-3]])
                self.prefill({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)})
                n = self.seq_len
                self.forward(ids[-3:], [n, n + 1, n + 1], verify_allowed([-1, -1]))  # a root and two children
            except Exception:  # noqa: BLE001 - e.g. a model that needs its images: checked on the first real forward
                self.stack_checked = False

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

    @contextlib.contextmanager
    def _scratch_check(self) -> Iterator[None]:
        """A check run when the engine is built, outside any run: its whole time (its prompt included) is checking
        time, and the cache it filled is dropped after it."""
        t0, before = time.perf_counter(), self.check_ms
        try:
            yield
        finally:
            self.cache, self.rope_delta, self._kept, self.columns = None, 0, None, None
            self.check_ms = before + (time.perf_counter() - t0) * 1e3

    @inference
    def keep(self, start: int, cols: list[int]) -> None:
        """Keep cache columns start + cols (in order), drop the rest of the region. Where the kept layers' buffers
        hold the cache, its layers keep their longer views until the next pass (cache.KVBuffers): `seq_len` and every
        pass of the kept layers read the length from the buffers; code that reads the layers itself calls
        `sync_cache()` first."""
        if self.paths is not None:  # the kept path read onto the committed cache (recurrent_paths.py)
            self.cache = self.paths.keep(self.model, self.cache, start, cols, self.device)
            return
        if self.columns is not None:  # windowed layers: each group compacted over the columns it holds, then rolled
            self.columns.compact(self.plan, self.cache.layers, start, cols)
        else:
            compact(self.cache, start, cols, self.backend.buffers, self.plan.whole_layers)

    @inference
    def sync_cache(self) -> None:
        """Point the cache's layers at exactly the columns in use, where a compaction has left them longer."""
        buffers = self.backend.buffers
        if self.cache is not None and buffers is not None and buffers.owns(self.cache.layers):
            buffers.publish(self.cache.layers, buffers.length)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._float32 and logits.dtype != torch.float32:  # a float32 model's logits are float32
            logits = logits.float()
        limit = self.vocab_limit
        return logits if limit is None or limit >= logits.shape[-1] else logits[..., :limit]
