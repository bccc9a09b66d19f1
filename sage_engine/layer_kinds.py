"""One small adapter per kind of decoder layer: which past a query may see, and how its cache keeps the accepted path.

A model's layers are read from its text config the way transformers builds their caches
(`cache_utils.get_layer_types_and_kwargs`: `layer_types`, else `sliding_window` / `attention_chunk_size`), so the
engine sees the same kinds the model runs. Each kind answers two questions for tree verification:

  kind               what a query at sequence index i sees of a key at index j     the engine's cache layer
  -----------------  ------------------------------------------------------------  ---------------------------------
  full attention     every j the tree pattern allows                                DynamicLayer, compacted
  sliding window w   ... and j > i - w                    (Mistral, Gemma 3, GPT-OSS) DynamicLayer, compacted
  chunks of c        ... and j // c == i // c                       (Llama 4)      DynamicLayer, compacted
  sinks              as the kind it wraps: a sink is a per-head logit in the softmax's denominator, the same for
                     every query and mask (GPT-OSS), so neither the mask nor the cache changes
  anything else      refused: a recurrent layer (gated delta rule, Mamba-2) reads the tree's nodes in sequence, so a
                     tree mask does not reach it, and cutting cache columns does not undo what a rejected branch wrote

"Sequence index" is a token's place in the decoded sequence (a tree node at depth d after a root at L: L + d), the
index transformers' own window and chunk masks use; the runner keeps it per cache column (`ModelRunner.columns`).
The window and chunk kinds keep every column (a full DynamicLayer where transformers would roll a window of w - 1):
a rolling cache keeps the newest columns, and after a tree pass those are rejected branches as much as accepted
ones. Their masks hide what the window no longer sees; memory grows as a full-attention layer's does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from .errors import ModelError


@dataclass(frozen=True)
class FullAttention:
    name: str = "full_attention"
    windowed = False

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray | None:
        """Which keys each query may see beyond the tree's own pattern: None, every one.  # [q], [kv] -> [q, kv]"""
        return None

    def describe(self) -> str:
        return "full attention"


@dataclass(frozen=True)
class SlidingWindow:
    window: int  # w: a query sees the w newest sequence indices, itself included
    name: str = "sliding_attention"
    windowed = True

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray:
        return kv_seq[None, :] > q_seq[:, None] - self.window

    def describe(self) -> str:
        return f"a sliding window of {self.window}"


@dataclass(frozen=True)
class Chunked:
    chunk: int  # c: a query sees the keys of its own chunk of c sequence indices
    name: str = "chunked_attention"
    windowed = True

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray:
        return kv_seq[None, :] // self.chunk == q_seq[:, None] // self.chunk

    def describe(self) -> str:
        return f"chunks of {self.chunk}"


@dataclass(frozen=True)
class WithSinks:
    """A kind whose attention adds learned sink logits (GPT-OSS): what it sees is the wrapped kind's."""

    inner: FullAttention | SlidingWindow | Chunked

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def windowed(self) -> bool:
        return self.inner.windowed

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray | None:
        return self.inner.visible(q_seq, kv_seq)

    def describe(self) -> str:
        return f"{self.inner.describe()} with sinks"


Kind = FullAttention | SlidingWindow | Chunked | WithSinks
SUPPORTED = "full attention, sliding windows, chunked attention and attention sinks"


@dataclass(frozen=True)
class Unsupported:
    """A layer type tree verification cannot reach (a recurrent state, a shared cache, a type not known here)."""

    name: str
    windowed = False

    def describe(self) -> str:
        why = {"linear_attention": "gated delta rule", "hybrid": "Mamba-2 beside attention", "mamba": "Mamba",
               "conv": "short convolution", "dummy": "a layer without its own KV cache"}.get(self.name)
        return f"{self.name} ({why})" if why else self.name


def _sinks(model_or_config) -> bool:
    """Does the model's attention add sink logits? Read from its modules (GPT-OSS: `self_attn.sinks`)."""
    modules = getattr(model_or_config, "modules", None)
    return modules is not None and any(hasattr(m, "sinks") and hasattr(m, "q_proj") for m in modules())


def text_config(model_or_config):
    cfg = getattr(model_or_config, "config", model_or_config)
    getter = getattr(cfg, "get_text_config", None)
    return getter(decoder=True) if getter is not None else cfg


def kinds_of(model_or_config) -> list[Kind | Unsupported]:
    """Each decoder layer's kind, in order, as transformers reads the config to build the model's caches."""
    types, kwargs = get_layer_types_and_kwargs(text_config(model_or_config))
    sinks = _sinks(model_or_config)
    out: list[Kind | Unsupported] = []
    for t, kw in zip(types, kwargs):
        if t == "full_attention":
            kind = FullAttention()
        elif t == "sliding_attention" and kw.get("sliding_window"):
            kind = SlidingWindow(int(kw["sliding_window"]))
        elif t == "chunked_attention" and kw.get("sliding_window"):
            kind = Chunked(int(kw["sliding_window"]))  # transformers passes the chunk size under this name
        else:
            out.append(Unsupported(t))
            continue
        out.append(WithSinks(kind) if sinks else kind)
    return out


@dataclass(frozen=True)
class LayerPlan:
    """A model's layer kinds, what tree verification needs of them, and why it cannot be done where it cannot."""

    kinds: tuple[Kind | Unsupported, ...]

    @property
    def by_name(self) -> dict[str, Kind]:
        """One kind per layer type name (transformers keys its per-type masks by it)."""
        return {k.name: k for k in self.kinds if not isinstance(k, Unsupported)}

    @property
    def windowed(self) -> bool:
        """Does any layer see less than the whole past (a window, a chunk)? Then masks are built per kind."""
        return any(k.windowed for k in self.kinds)

    @property
    def mixed(self) -> bool:
        """Do the layers need different masks (the model then takes a mask per layer type)?"""
        return len(self.by_name) > 1

    @property
    def refusal(self) -> str | None:
        """Why trees cannot be verified on this model, in one line; None where they can."""
        bad = [k for k in self.kinds if isinstance(k, Unsupported)]
        if not bad:
            return None
        names = ", ".join(dict.fromkeys(k.describe() for k in bad))
        return (f"{len(bad)} of its {len(self.kinds)} layers are {names}, which tree verification does not support "
                f"yet (it supports {SUPPORTED})")

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for k in self.kinds:
            counts[k.describe()] = counts.get(k.describe(), 0) + 1
        return ", ".join(f"{n} x {d}" for d, n in counts.items())

    def cache_layers(self, cache) -> None:
        """Give every attention layer of `cache` (a DynamicCache made from the model's config) a full DynamicLayer,
        where transformers made a rolling window: the engine keeps every column and masks by kind (module docstring).
        Layers of an unsupported kind keep transformers' own class (their model then runs `ar` only)."""
        for i, kind in enumerate(self.kinds):
            if kind.windowed and i < len(cache.layers):
                cache.layers[i] = DynamicLayer()

    def masks(self, allowed_full: np.ndarray, q_seq: np.ndarray, kv_seq: np.ndarray) -> dict[str, np.ndarray]:
        """The tree's pattern over every key column (`allowed_full` [q, kv]: True where the tree lets a query see a
        column) narrowed by each kind: {layer type: [q, kv] bool}."""
        out = {}
        for name, kind in self.by_name.items():
            vis = kind.visible(q_seq, kv_seq)
            out[name] = allowed_full if vis is None else allowed_full & vis
        return out


def plan_for(model_or_config) -> LayerPlan:
    return LayerPlan(tuple(kinds_of(model_or_config)))


def require_trees(plan: LayerPlan, role: str) -> None:
    """Raise the one-line ModelError where `plan` refuses trees."""
    if plan.refusal is not None:
        raise ModelError(f"the {role} cannot verify a draft tree: {plan.refusal}; only the 'ar' policy runs on it")
