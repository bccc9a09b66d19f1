"""Drafting: the draft model grows the step's token tree level by level, and keeps its own cache in step.

One draft forward per level over the whole frontier (not one per node), under a tree mask (rules.level_pattern):
every frontier node sees the prompt, the accepted text, its own ancestors and itself. Where the draft's layers are
the compiled ones (backends/numba_layers.py) and the policy's hooks allow it (Policy.draft_path), a step's read,
shape and levels run in one compiled call, or its levels alone (draft_compiled.py): the same rules (rules.py), the
same trees. Each Draft names the path it took and why not a faster one (policy_io.DraftPath).
The draft's KV cache region of a step holds the pending tokens (accepted text the draft has
not read yet; the last one is the root) followed by the fed tree nodes in feeding order;
`tree.draft_slots` records each node's column, and `settle()` keeps the accepted ones.
The draft reads the prompt with the first step that drafts: a run of plain steps never pays for it.
A node whose token ends the run (end of sequence) is verified but never fed: nothing after it can be emitted.
Under sampling the draft's distribution is warped like the target's (temperature, top-p): candidates, their
probabilities and alpha come from it, and a policy that samples its draft (chain, sage:draw=sample) draws its
children from it without replacement.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import torch

from ..backends import draft_compiled
from ..backends import numba_layers as compiled
from ..models.pruning import VisualPruning
from ..policies import Policy
from . import cache, rules
from .costs import Quote
from .policy_io import COMPILED_LEVELS, COMPILED_STEP, PYTHON, DraftPath, Frontier, Probe, TreeShape, check_tree
from .runner import ModelRunner
from .sampling import DraftSampler, Sampling
from .tree import DraftTree, chain_allowed


class Draft(NamedTuple):
    """What the draft stage produced for one step."""

    shape: TreeShape
    tree: DraftTree  # the tree to verify (after the policy's final pruning)
    drafted: int  # nodes drafted before that pruning
    forwards: int = 0  # draft forwards this step (prompt prefill excluded)
    ms: float = 0.0  # their time
    prefill_ms: float = 0.0  # the draft's prompt prefill, when this step was the run's first to draft
    path: DraftPath | None = None  # how the draft was drawn (None: no draft this step)


class Drafter:
    """The draft model's side of a run: `start()`, then per drafted step `grow()`, after every step `settle()`."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.pruning: VisualPruning | None = None  # this run's draft-only visual-token pruning (never the output's)
        self.pending: list[int] = []  # accepted tokens the draft has not read; the last is the next root
        self.plain_tail = 0  # how many of them plain steps emitted (the last ones): the probe's pairs
        self._prompt: dict[str, torch.Tensor] | None = None  # the prompt, until the draft has read it
        self._region: tuple[int, int] | None = None  # this step's (cache start, pending tokens fed), if it drafted
        self.sampler: DraftSampler | None = None  # a sampled run's draft distribution and draws; None: greedy
        self.ends: frozenset[int] = frozenset()  # tokens that end the run: no node is drafted below one
        self._end_ids = np.zeros(0, np.int64)
        compiled.warm()  # the compiled top-k, read, step, levels and compaction loaded now, not in a first drafted step
        draft_compiled.warm()
        cache.warm()
        self._paths: tuple[Policy, bool, DraftPath] | None = None  # the last run's policy, sampled?, path

    def start(self, prompt: dict[str, torch.Tensor], first: int, sampling: Sampling | None = None,
              ends: Iterable[int] = (), pruning: VisualPruning | None = None) -> None:
        """A new run: the draft will read `prompt` (with `pruning`, only part of its visual tokens) when a step first
        drafts; `first` (the target's first token) is pending; `ends`: the tokens that end the run (its EOS tokens,
        none when it ignores EOS)."""
        self._prompt, self.pending, self._region, self.plain_tail = prompt, [first], None, 0
        self.pruning = pruning
        self.ends = frozenset(ends)
        self._end_ids = np.array(sorted(self.ends), np.int64)  # the same, for the compiled levels
        self.sampler = None if sampling is None or sampling.greedy else DraftSampler(sampling)

    def _top(self, logits: torch.Tensor, policy: Policy, rows: list[int], qs: dict[int, torch.Tensor],
             alphas: bool = True, top: tuple | None = None) -> tuple[Frontier, list[float] | None]:
        """The frontier `rows`' top max(k, entropy_k) candidates, and (with `alphas`) each row's confidence alpha over
        its top `entropy_k`. A draft that samples also draws as many tokens per row without replacement from the row's
        q (in draw order) and keeps q in `qs[row node]`.  # [F, V] -> Frontier [F][K], alpha [F] or None"""
        sampler = self.sampler
        k = max(policy.top_k, policy.entropy_k)
        if top is None and sampler is None:  # `top`: the forward's own (Pass.top), else one compiled call, or None
            top = compiled.top_candidates(logits, k)
        ranked = sampler is not None and not policy.samples_draft and logits.device.type == "cpu"
        if top is None and ranked:  # a sampled run's candidates as the compiled step ranks them (rules.warped_top)
            s = sampler.sampling
            p, t = rules.warped_top(logits.detach().float().numpy(), k, float(s.temperature), float(s.top_p))
            top = p.tolist(), t.tolist()
        if top is not None:
            frontier = Frontier(rows, top[1], top[0])
        else:
            probs = torch.softmax(logits, dim=-1) if sampler is None else sampler.probs(logits)
            p, t = torch.topk(probs, k, dim=-1)
            parts = [p, t.to(p.dtype)]  # token ids are exact in float32 below 2**24
            drawing = sampler is not None and policy.samples_draft
            if drawing:
                drawn = sampler.without_replacement(probs, policy.top_k)  # [F, top_k]
                parts += [drawn.to(p.dtype), torch.gather(probs, -1, drawn)]
                qs.update(zip(rows, probs))
            # one copy to the host per level, not one per list: on a GPU each copy waits for the device
            host = torch.cat(parts, -1).tolist()
            frontier = Frontier(rows, [[int(x) for x in r[k: 2 * k]] for r in host], [r[:k] for r in host])
            if drawing:
                m = policy.top_k
                frontier.drawn_tokens = [[int(x) for x in r[2 * k: 2 * k + m]] for r in host]
                frontier.drawn_probs = [r[2 * k + m:] for r in host]
        if not alphas:
            return frontier, None
        k = policy.entropy_k
        return frontier, [rules.confidence(np.asarray(row[:k], np.float64)) for row in frontier.top_probs]

    def path(self, policy: Policy) -> DraftPath:
        """The fastest path `policy`'s drafts may take on this draft (Policy.draft_path, where the draft's layers are
        the compiled ones), asked once per run."""
        sampled = self.sampler is not None
        held = self._paths
        if held is None or held[0] is not policy or held[1] != sampled:
            runner = self.runner
            if not (runner.compiled and draft_compiled.AVAILABLE):
                path = DraftPath(PYTHON, f"the draft's layers run on {runner.tree_forward}, not compiled")
            else:
                path = policy.draft_path(sampled)
            held = self._paths = (policy, sampled, path)
        return held[2]

    def grow(self, policy: Policy, quote: Quote | None = None, max_depth: int | None = None) -> Draft:
        """Read the pending tokens (the prompt first, on the run's first drafted step), then draft the tree, no
        deeper than `max_depth` (the tokens the run may still emit after this step's bonus)."""
        runner, prefill_ms = self.runner, 0.0
        if self._prompt is not None:  # its time: the whole call (its inputs, its empty cache, its positions' rule)
            t0, checking = time.perf_counter(), runner.check_ms
            runner.prefill(self._prompt, self.pruning)
            prefill_ms = (time.perf_counter() - t0) * 1e3 - (runner.check_ms - checking)  # a check is not a prefill
            self._prompt = None
        pending, p, start = self.pending, len(self.pending), runner.seq_len
        self._region = (start, p)
        root_pos = start + p - 1  # sequence index of the root
        sampling = None if self.sampler is None else self.sampler.sampling
        path = self.path(policy)
        if path.name == COMPILED_STEP:  # the read, the shape and the levels in one compiled call
            rule = policy.step_rule(quote)
            if rule is not None:
                t0 = time.perf_counter()
                depth_left = max(rule.depth_cap, rule.max_nodes) if max_depth is None else max_depth
                nodes, root_alpha, shape, forwards = draft_compiled.draft_step(
                    runner.fused, rule, sampling, max(policy.top_k, policy.entropy_k), policy.entropy_k, pending,
                    root_pos + runner.rope_delta, depth_left, self._end_ids, runner.vocab_limit, runner.cache)
                tree = draft_compiled.tree_of(nodes, root_alpha)
                ms = (time.perf_counter() - t0) * 1e3
                return Draft(shape, policy.finalize(tree), len(tree), forwards, ms, prefill_ms, path)
            path = DraftPath(COMPILED_LEVELS, "this step's shape reads more than alpha (a try after plain steps)")
        k = 0 if self.sampler is not None else max(policy.top_k, policy.entropy_k)  # the root's candidates, greedy
        read = runner.forward(pending, list(range(root_pos - p + 1, root_pos + 1)), chain_allowed(p), top=k)
        qs: dict[int, torch.Tensor] = {}  # a sampled draft's q per expanded node (-1: the root)
        frontier, alpha = self._top(read.logits[-1:], policy, [-1], qs, top=read.top)
        tree = DraftTree(root_alpha=float(alpha[0]))
        shape = policy.shape(tree.root_alpha, quote, self._probe(read.logits))
        if max_depth is not None and shape.depth > max_depth:
            shape = shape._replace(depth=max_depth)
        if path.name != PYTHON and shape.depth > 0:  # the levels in one compiled call
            t0 = time.perf_counter()
            nodes, forwards = draft_compiled.draft_levels(
                runner.fused, policy.level_rule(), shape, sampling, (frontier.top_probs[0], frontier.top_tokens[0]),
                self._end_ids, p, root_pos + runner.rope_delta, runner.vocab_limit, runner.cache)
            ms = (time.perf_counter() - t0) * 1e3
            tree = draft_compiled.tree_of(nodes, tree.root_alpha)
        else:
            forwards, ms = self._levels(policy, shape, tree, frontier, qs, p, root_pos)
        final = policy.finalize(tree)
        check_tree(shape, final)  # a policy's own expand() may break its shape; the compiled levels cannot
        return Draft(shape, final, len(tree), 1 + forwards, read.ms + ms, prefill_ms, path)

    def _levels(self, policy: Policy, shape: TreeShape, tree: DraftTree, frontier: Frontier,
                qs: dict[int, torch.Tensor], p: int, root_pos: int) -> tuple[int, float]:
        """Grow `tree` level by level after the read (one draft forward per level over the nodes the policy grows,
        whose first `p` cache columns of the region are the pending tokens).  # -> forwards, their ms"""
        forwards, ms, fed = 0, 0.0, 0  # fed: tree nodes already in the draft cache
        for level in range(1, shape.depth + 1):
            size = len(tree)
            grow = policy.expand(shape, level, tree, frontier)
            for n in range(size, len(tree)) if qs else ():  # a sampled draft: each new node's q
                tree.q_dists[n] = qs.get(tree.parents[n])
            if self.ends:  # an end-of-sequence node is a leaf: the run stops there if it is accepted
                grow = [n for n in grow if tree.tokens[n] not in self.ends]
            if not grow:
                break
            for j, node in enumerate(grow):
                tree.draft_slots[node] = fed + j
            allowed = rules.level_pattern(np.array(grow, np.int64), np.array(tree.parents, np.int64),
                                          np.array(tree.draft_slots, np.int64), p, fed)  # [g, p + fed + g]
            level_pass = self.runner.forward(
                [tree.tokens[n] for n in grow], [root_pos + tree.depths[n] for n in grow], allowed
            )  # [g, V]
            forwards, ms, fed = forwards + 1, ms + level_pass.ms, fed + len(grow)
            # a node's own alpha only where the policy reads it: a logarithm per candidate per level otherwise
            frontier, alpha = self._top(level_pass.logits, policy, grow, qs, policy.node_alphas)
            for node, a in zip(grow, alpha or ()):
                tree.alphas[node] = a
        return forwards, ms

    def _probe(self, logits: torch.Tensor) -> Probe:
        """How many of the tokens plain steps emitted were the draft's top choice, from the read's logits (row i
        predicts pending token i + 1).  # logits [p, V]"""
        k, pending = self.plain_tail, self.pending
        if not k:
            return Probe()
        p = len(pending)
        guess = logits[p - 1 - k : p - 1].argmax(-1).tolist()
        return Probe(k, sum(g == t for g, t in zip(guess, pending[p - k :])))

    def settle(self, tree: DraftTree, accepted: list[int], bonus: int) -> None:
        """After verification: keep the pending tokens and the accepted nodes the draft has fed in its cache,
        drop the rest; what it has not read (accepted nodes never fed, the bonus) is pending for the next step.
        After a plain step (no grow()), the bonus simply joins the pending tokens."""
        if self._region is None:
            self.pending = self.pending + [bonus]
            self.plain_tail += 1
            return
        start, p = self._region
        slots = tree.draft_slots
        fed = 0  # the accepted nodes the draft has fed: a leading run of the path (nodes are fed level by level)
        while fed < len(accepted) and slots[accepted[fed]] >= 0:
            fed += 1
        self.runner.keep(start, [*range(p), *[p + slots[n] for n in accepted[:fed]]])
        self.pending = [tree.tokens[n] for n in accepted[fed:]] + [bonus]
        self._region, self.plain_tail = None, 0
