"""The whole speculative loop in one file, for reading: draft a tree, verify it in one target pass, accept, compact.

This is not the engine (engine.py): it runs each model through transformers' own forward() and DynamicCache, has no
backends, no compiled step and no cost meter (so no `priced:` policy), reads plain full-attention models only
(no sliding windows, no recurrent layers) and stops at EOS and the token budget alone. What it shares with the engine
is what decides the output: the rules of rules.py, the policy hooks (policies/base.py: reset, skip_draft, shape,
expand, finalize, observe), the tree as data (tree.py) and the sampling rules (sampling.py).
tests/test_reference.py runs it beside SpecEngine for every policy and checks the same trees and tokens at every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from transformers import DynamicCache

from .core import rules
from .core.passes import Pass
from .core.policy_io import Frontier, StepOutcome
from .core.sampling import DraftSampler, RatioAcceptance, SampledAcceptance, Sampling
from .core.tree import DraftTree, additive_mask, chain_allowed, verify_allowed
from .models.families import adapter_for, shared_vocab
from .models.loading import ModelPair
from .models.pruning import pruned_prefill_inputs
from .policies import Policy, make_policy


class Model:
    """One model and its KV cache: `prefill` a prompt, `forward` tokens under an attention pattern, `keep` columns."""

    def __init__(self, model: torch.nn.Module, vocab: int | None = None):
        self.model, self.vocab, self.family = model, vocab, adapter_for(model)
        self.cache, self.delta = None, 0  # delta: the text-position shift after the prompt (M-RoPE's rope_deltas)

    def prefill(self, inputs: dict, pruning=None) -> torch.Tensor:
        """The prompt into a new cache (`pruning`: only part of its visual tokens); the logits after it.  # [V]"""
        self.cache, self.delta = DynamicCache(config=self.model.config), 0
        self.family.positions.reset(self.model)
        if pruning is not None:  # the draft reads fewer visual tokens; its text keeps the unpruned positions
            inputs, self.delta = pruned_prefill_inputs(self.model, inputs, pruning, self.family)
        logits = self.model(**inputs, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        if pruning is None:
            self.delta = self.family.positions.shift_after_prefill(self.model)
        return logits[..., : self.vocab]

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def forward(self, tokens: list[int], positions: list[int], allowed: np.ndarray) -> torch.Tensor:
        """Append `tokens` at sequence `positions`; `allowed` [q, r] is what they see of the newest r columns (the
        last q are these tokens), every older column being visible. The logits after each token.  # [q, V]"""
        q, r = allowed.shape
        past = self.length + q - r
        mask = None if q == 1 and allowed.all() else additive_mask(allowed, past, self.model.dtype, "cpu")
        ids, pos = torch.tensor([tokens]), torch.tensor([[p + self.delta for p in positions]])
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=self.cache,
                         use_cache=True)
        return out.logits[0, :, : self.vocab]

    def keep(self, start: int, cols: list[int]) -> None:
        """Keep columns start + cols of the step's region, in order; drop the rest of it."""
        idx = torch.tensor([*range(start), *(start + c for c in cols)])
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, idx], layer.values[:, :, idx]


class Step(NamedTuple):
    """One decode step: the verified tree, the accepted nodes, the target's bonus token, the tokens it emitted."""

    tree: DraftTree
    accepted: list[int]
    bonus: int
    tokens: list[int]


def candidates(logits: torch.Tensor, policy: Policy, rows: list[int], sampler: DraftSampler | None,
               qs: dict) -> Frontier:
    """The draft's candidates after each row (policy_io.Frontier): the top max(top_k, entropy_k) by probability;
    under sampling from the draft's warped q, and for a draft that samples its tokens, its draws (q kept in `qs`)."""
    k = max(policy.top_k, policy.entropy_k)
    if sampler is not None and not policy.samples_draft:  # ranked under sampling: the warped top-k (a rule)
        p, t = rules.warped_top(logits.float().numpy(), k, sampler.sampling.temperature, sampler.sampling.top_p)
        return Frontier(rows, t.tolist(), p.tolist())
    probs = torch.softmax(logits, dim=-1) if sampler is None else sampler.probs(logits)
    p, t = torch.topk(probs, k, dim=-1)
    frontier = Frontier(rows, t.tolist(), p.tolist())
    if sampler is not None:  # a draft that samples: top_k draws per row without replacement, in draw order
        drawn = sampler.without_replacement(probs, policy.top_k)
        frontier.drawn_tokens, frontier.drawn_probs = drawn.tolist(), torch.gather(probs, -1, drawn).tolist()
        qs.update(zip(rows, probs))
    return frontier


@torch.inference_mode()
def generate(pair: ModelPair, prepared, policy: Policy | str = "sage", max_new_tokens: int = 128,
             sampling: Sampling | None = None, ignore_eos: bool = False) -> Iterator[Step]:
    """Decode `prepared` (inputs.PreparedInput) with `policy`: first the prefill's Step (an empty tree; its tokens:
    the first token), then one Step per decode step; the run's tokens are every Step's tokens in order."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    policy.reset()
    sampler = None if sampling is None or sampling.greedy else DraftSampler(sampling)
    accept = None if sampler is None else (RatioAcceptance if policy.samples_draft else SampledAcceptance)(sampling)
    ends = set() if ignore_eos else pair.eos_token_ids
    target = Model(pair.target)
    draft = Model(pair.draft, shared_vocab(pair.target, pair.draft)) if policy.uses_draft else None
    pruning = policy.draft_pruning if (prepared.images or prepared.video is not None) else None
    pruning = pruning if pruning is not None and pruning.active else None

    # 0. prefill: the target reads the prompt; its choice after it is the first token (the draft reads it later)
    logits = target.prefill(prepared.target_inputs)
    out = [int(logits.argmax()) if accept is None else accept.first(logits)]
    yield Step(DraftTree(), [], out[0], out[:])
    pending, unread = [out[0]], True  # tokens the draft has not read (the last is the root); its prompt unread
    while out[-1] not in ends and len(out) < max_new_tokens:
        root, left = out[-1], max_new_tokens - len(out)
        # 1. draft: the draft reads what it has not, the policy shapes the tree, one draft forward per level
        tree, region, forwards, qs = DraftTree(), None, 0, {}
        if draft is not None and left > 1 and not policy.skip_draft(None):
            if unread:
                draft.prefill(prepared.for_draft(), pruning)
                unread = False
            start, p = draft.length, len(pending)
            region, root_pos = (start, p), start + p - 1
            read = draft.forward(pending, list(range(root_pos - p + 1, root_pos + 1)), chain_allowed(p))
            frontier = candidates(read[-1:], policy, [-1], sampler, qs)
            alpha = rules.confidence(np.asarray(frontier.top_probs[0][: policy.entropy_k], np.float64))
            tree = DraftTree(root_alpha=float(alpha))
            shape = policy.shape(tree.root_alpha, None, None)  # no quote of prices, no probe: no priced policy here
            shape, fed, forwards = shape._replace(depth=min(shape.depth, left - 1)), 0, 1  # no deeper than the budget
            for level in range(1, shape.depth + 1):
                size = len(tree)
                grow = policy.expand(shape, level, tree, frontier)
                for n in range(size, len(tree)) if qs else ():  # a sampled draft: the q each node was drawn from
                    tree.q_dists[n] = qs.get(tree.parents[n])
                grow = [n for n in grow if tree.tokens[n] not in ends]  # nothing follows an end of sequence
                if not grow:
                    break
                for j, node in enumerate(grow):
                    tree.draft_slots[node] = fed + j
                allowed = rules.level_pattern(np.array(grow), np.array(tree.parents), np.array(tree.draft_slots), p,
                                              fed)  # each node sees the pending tokens, its ancestors and itself
                logits = draft.forward([tree.tokens[n] for n in grow], [root_pos + tree.depths[n] for n in grow],
                                       allowed)
                forwards, fed = forwards + 1, fed + len(grow)
                frontier = candidates(logits, policy, grow, sampler, qs)
                if policy.node_alphas:
                    for node, row in zip(grow, frontier.top_probs):
                        tree.alphas[node] = rules.confidence(np.asarray(row[: policy.entropy_k], np.float64))
            tree = policy.finalize(tree)
        # 2. verify: one target forward over [root, tree], node i at L + its depth (rules.verify_pattern)
        L = target.length
        logits = target.forward([root] + tree.tokens, [L] + [L + d for d in tree.depths], verify_allowed(tree.parents))
        # 3. accept the longest path of the target's own choices, then its next token (the bonus)
        if accept is None:
            best, accepted, node = logits.argmax(-1).tolist(), [], -1
            for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):  # a child follows its parent
                if parent == node and token == best[1 + node]:
                    accepted.append(i)
                    node = i
            bonus = best[1 + node]
        else:
            verdict = accept(tree, Pass(logits, 0.0))
            accepted, bonus = verdict.accepted, verdict.bonus
        # 4. compact both caches to the accepted path
        if tree.tokens:
            target.keep(L, [0] + [1 + n for n in accepted])
        if region is None:
            pending = pending + [bonus]
        else:
            start, p = region
            fed = 0  # the accepted nodes the draft has read: a leading run of the path
            while fed < len(accepted) and tree.draft_slots[accepted[fed]] >= 0:
                fed += 1
            draft.keep(start, [*range(p), *(p + tree.draft_slots[n] for n in accepted[:fed])])
            pending = [tree.tokens[n] for n in accepted[fed:]] + [bonus]
        # 5. observe: the policy learns from the outcome
        emitted = [tree.tokens[n] for n in accepted] + [bonus]
        policy.observe(StepOutcome(tree, accepted, len(emitted), 0.0, forwards > 0, False))
        emitted = emitted[:max_new_tokens - len(out)]
        if ends and not ends.isdisjoint(emitted):  # the run ends at its first end-of-sequence token
            emitted = emitted[: next(i for i, t in enumerate(emitted) if t in ends) + 1]
        out += emitted
        yield Step(tree, accepted, bonus, emitted)
