"""Telemetry as data: what the engine streams per step, and what a whole run returns.

Every consumer (CLI, benchmark, Gradio app) reads these; none of them touches a tensor.
All of them serialise to plain JSON with `to_dict()`.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Literal


@dataclass
class TreeView:
    """One step's verified draft tree, node i in level order (parent -1 = the root)."""

    root_token: int
    root_text: str
    tokens: list[int]
    texts: list[str]
    parents: list[int]
    depths: list[int]
    probs: list[float]  # draft probability of the node given its parent path
    cum_probs: list[float]  # product along the path
    drafted_nodes: int  # nodes the draft proposed before any final pruning (eagle2 reranks)
    # How the target tested the nodes: "greedy" (argmax match), "tree" (the target draws at each node on the
    # path; a draw that is a child descends) or "ratio" (a sampled chain: accept with probability min(1, p/q)).
    # Sampling only, per node (None: not tested): the target's probability p of the node's token after its
    # parent, the draft's q of it, and the uniform u behind the decision (ratio rule: p and q as the test saw
    # them, after earlier siblings were rejected; the node's first sibling sees the plain p and q).
    rule: str = "greedy"
    target_p: list[float | None] = field(default_factory=list)
    draft_q: list[float | None] = field(default_factory=list)
    draw_u: list[float | None] = field(default_factory=list)
    # each node's own next-token confidence alpha, where the policy reads it (Policy.node_alphas), else None
    alphas: list[float | None] = field(default_factory=list)


class Deferred(functools.partial):
    """A value made when first read, as `Deferred(function, *args)`: the engine hands a step's tree view and texts to
    its event this way, so that a consumer that never looks at them (the benchmark) does not pay for them in the step
    (both run from cold caches right after a target forward). A `functools.partial`: made
    in C, with no Python frame of its own; calling it makes the value."""


class _DeferredField:
    """A dataclass field (a descriptor-typed field) holding a value or a `Deferred`, which it makes on first read and
    keeps; `asdict()` and equality read the made value."""

    def __init__(self, default=None):
        self.default = default

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.default
        value = obj.__dict__[self.slot]
        if isinstance(value, Deferred):
            value = obj.__dict__[self.slot] = value()
        return value

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.slot] = self.default if value is self else value  # `self`: the field at its default


@dataclass
class StepEvent:
    """One engine step. Step 0 is the prefill (no tree); every later step is one target forward."""

    step: int
    kind: Literal["prefill", "decode"]
    policy: str
    alpha: float | None  # confidence the tree was planned from (SAGE), else the root's confidence
    entropy: float | None  # normalised top-k entropy H / log k behind `alpha` (= 1 - alpha)
    root_alpha: float | None  # confidence of this step's root distribution (all policies with a draft)
    depth: int  # planned depth D (the policy's TreeShape; 0 for ar / prefill)
    width: int  # planned root width W
    d_max: int | None  # SAGE history controller state
    # a TreeView, or a Deferred one (made when first read); keyword-only (it has a default, the fields after it none)
    tree: TreeView | None = field(default=_DeferredField(), kw_only=True)
    accepted_nodes: list[int]  # indices into tree nodes, root side first
    accepted_tokens: list[int]  # draft tokens the target agreed with
    bonus_token: int | None  # the target's own token after the accepted path
    new_token_ids: list[int]  # tokens this step adds to the output (after EOS/budget truncation)
    # decoded text this step adds (the engine hands it Deferred: decoded when first read); keyword-only, as `tree`
    new_text: str = field(default=_DeferredField(""), kw_only=True)
    target_ms: float  # target forward time (prefill or verify)
    draft_ms: float  # draft forward time
    other_ms: float  # everything else in the step: policy, tree, masks, acceptance, cache compaction
    draft_forwards: int
    total_tokens: int  # output tokens so far
    finished: bool = False
    finish_reason: str | None = None  # "eos" | "length" | "stop_string"
    # a priced policy (policies/priced.py), once measured: the least cumulative draft probability a node needed this
    # step, and the least expected tokens (sum of cumulative probabilities) a further draft level needed; with
    # draft_path and depth, what policies.priced.replay_of replays a run from
    node_price: float | None = None
    level_price: float | None = None
    # the draft's prefill when this step is the run's first to draft (the draft reads the prompt only then);
    # not in target_ms / draft_ms / other_ms: run statistics count it as prefill
    draft_prefill_ms: float = 0.0
    # the start of new_text that the accepted draft tokens wrote (the rest: the target's); Deferred like new_text
    accepted_text: str = field(default=_DeferredField(""), kw_only=True)
    bonus_text: str | None = None  # the bonus token alone, special tokens shown (e.g. an end of sequence)
    # how the draft was drawn (policy_io.DraftPath): "compiled step", "compiled levels" or "python"; None: no draft
    draft_path: str | None = None
    draft_path_why: str = ""  # what kept it off a faster path ("" on the fastest)
    # what was drafted, beside what was planned: the verified tree's depth, its root's children and its nodes
    drafted_depth: int = 0
    drafted_width: int = 0
    nodes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def __getstate__(self) -> dict:
        """Pickled with its deferred fields made (a ZeroGPU Space's worker process hands each event to the app's
        process by pickle; the function that makes a deferred field is the engine's and does not cross)."""
        for name, attr in vars(type(self)).items():
            if isinstance(attr, _DeferredField):
                getattr(self, name)
        return dict(self.__dict__)


@dataclass
class RunStats:
    """Whole-run figures; mean_accepted (tau) = decode-step tokens / target forwards after prefill."""

    new_tokens: int
    seconds: float
    tokens_per_second: float
    target_forwards: int  # after prefill
    mean_accepted: float
    draft_forwards: int
    prefill_seconds: float
    target_seconds: float
    draft_seconds: float
    other_seconds: float
    overhead_fraction: float  # share of decode time outside model forwards
    finish_reason: str | None
    draft_paths: dict[str, int] = field(default_factory=dict)  # drafted steps per draft path (StepEvent.draft_path)
    draft_path_why: list[str] = field(default_factory=list)  # what kept drafted steps off a faster path, each once

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    policy: str
    text: str
    token_ids: list[int]
    stats: RunStats
    steps: list[StepEvent] = field(default_factory=list)

    def to_dict(self, with_steps: bool = True) -> dict:
        out = {"policy": self.policy, "text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict()}
        if with_steps:
            out["steps"] = [s.to_dict() for s in self.steps]
        return out


def summarize(steps: list[StepEvent], token_ids: list[int], seconds: float) -> RunStats:
    """RunStats from a run's step events (the one place these figures are computed)."""
    decode = [s for s in steps if s.kind == "decode"]
    prefill = [s for s in steps if s.kind == "prefill"]
    decode_tokens = sum(len(s.new_token_ids) for s in decode)
    target_s = sum(s.target_ms for s in decode) / 1e3
    draft_s = sum(s.draft_ms for s in steps) / 1e3
    other_s = sum(s.other_ms for s in decode) / 1e3
    decode_s = target_s + sum(s.draft_ms for s in decode) / 1e3 + other_s
    return RunStats(
        new_tokens=len(token_ids),
        seconds=seconds,
        tokens_per_second=len(token_ids) / seconds if seconds > 0 else 0.0,
        target_forwards=len(decode),
        mean_accepted=decode_tokens / len(decode) if decode else 0.0,
        draft_forwards=sum(s.draft_forwards for s in steps),
        prefill_seconds=(sum(s.target_ms + s.draft_ms + s.other_ms for s in prefill)
                         + sum(s.draft_prefill_ms for s in steps)) / 1e3,
        target_seconds=target_s,
        draft_seconds=draft_s,
        other_seconds=other_s,
        overhead_fraction=other_s / decode_s if decode_s > 0 else 0.0,
        finish_reason=steps[-1].finish_reason if steps else None,
        draft_paths=dict(Counter(s.draft_path for s in decode if s.draft_path)),
        draft_path_why=list(dict.fromkeys(s.draft_path_why for s in decode if s.draft_path_why)),
    )
