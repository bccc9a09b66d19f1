"""One small adapter per kind of decoder layer: which past a query may see, and how its cache keeps the accepted path.

A model's layers are read from its text config the way transformers builds their caches
(`cache_utils.get_layer_types_and_kwargs`: `layer_types`, else `sliding_window` / `attention_chunk_size`), so the
engine sees the same kinds the model runs. Each kind answers two questions for tree verification:

  kind               what a query at sequence index i sees of a key at index j     the engine's cache layer
  -----------------  ------------------------------------------------------------  ---------------------------------
  full attention     every j the tree pattern allows                                DynamicLayer, compacted
  sliding window w   ... and j > i - w                    (Mistral, Gemma 3, GPT-OSS) DynamicLayer, compacted, then
                                                                                     rolled to about w columns
  chunks of c        ... and j // c == i // c                       (Llama 4)      the same, to its current chunk
  sinks              as the kind it wraps: a sink is a per-head logit in the softmax's denominator, the same for
                     every query and mask (GPT-OSS), so neither the mask nor the cache changes
  shared keys        as its own type (Gemma 3n's last layers read the keys and values an earlier layer of that type
                     just updated, under that type's mask)                          none of its own (SharedKV)
  recurrent          every node read along its own path (gated delta rule, Mamba-2, LFM2's short convolutions:
                     recurrent_paths.py)                                            its states, one copy per path
  cross-attention    the image's tiles, whole (Mllama)                              kept whole (CrossAttention)
  anything else      refused (an MLP-only layer typed "dummy", a type not known here): a tree mask says nothing of
                     how it mixes tokens, and cutting cache columns would not undo what a rejected branch wrote

"Sequence index" is a token's place in the decoded sequence (a tree node at depth d after a root at L: L + d), the
index transformers' own window and chunk masks use; the runner keeps it per cache column (columns.py's `Columns`).
transformers' rolling layer keeps the newest w - 1 columns after every pass, and after a tree pass those are
rejected branches as much as accepted ones. So a windowed layer here is a plain DynamicLayer: the tree pass appends
to it, the compaction keeps the accepted path, and only then are the columns that no later query can see dropped
from its front (`roll`), so that it holds about its window. Its masks are built over the columns it still holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs


@dataclass(frozen=True)
class FullAttention:
    name: str = "full_attention"
    windowed = False
    width = None  # the keys a query sees at most: every one

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray | None:
        """Which keys each query may see beyond the tree's own pattern: None, every one.  # [q], [kv] -> [q, kv]"""
        return None

    def first_visible(self, L: int) -> int:
        """The smallest sequence index a query at index L or later can still see: columns before it may go."""
        return 0

    def describe(self) -> str:
        return "full attention"


@dataclass(frozen=True)
class SlidingWindow:
    window: int  # w: a query sees the w newest sequence indices, itself included
    name: str = "sliding_attention"
    windowed = True

    @property
    def width(self) -> int:
        return self.window

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray:
        return kv_seq[None, :] > q_seq[:, None] - self.window

    def first_visible(self, L: int) -> int:
        return L - self.window + 1

    def describe(self) -> str:
        return f"a sliding window of {self.window}"


@dataclass(frozen=True)
class Chunked:
    chunk: int  # c: a query sees the keys of its own chunk of c sequence indices
    name: str = "chunked_attention"
    windowed = True

    @property
    def width(self) -> int:
        return self.chunk

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray:
        return kv_seq[None, :] // self.chunk == q_seq[:, None] // self.chunk

    def first_visible(self, L: int) -> int:
        return L // self.chunk * self.chunk

    def describe(self) -> str:
        return f"chunks of {self.chunk}"


@dataclass(frozen=True)
class WithSinks:
    """A kind whose attention adds learned sink logits (GPT-OSS): what it sees is the wrapped kind's."""

    inner: FullAttention | SlidingWindow | Chunked

    @property
    def name(self) -> str:
        return self.inner.name

    @cached_property
    def windowed(self) -> bool:
        return self.inner.windowed

    @property
    def width(self) -> int | None:
        return self.inner.width

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray | None:
        return self.inner.visible(q_seq, kv_seq)

    def first_visible(self, L: int) -> int:
        return self.inner.first_visible(L)

    def describe(self) -> str:
        return f"{self.inner.describe()} with sinks"


@dataclass(frozen=True)
class Recurrent:
    """A layer that carries a state from token to token (the gated delta rule; Mamba-2, alone or beside attention):
    a tree mask does not reach it, so its model reads every tree node along its own path (recurrent_paths.py)."""

    name: str  # transformers' layer type: "linear_attention", "hybrid"
    has_keys: bool  # also attention with key/value columns beside the state (Falcon-H1's "hybrid")
    what: str = "a recurrent state"  # the layer's own name, from the model type (`_RECURRENT`)
    windowed = False
    width = None

    def visible(self, q_seq: np.ndarray, kv_seq: np.ndarray) -> np.ndarray | None:
        return None  # a path is read as a chain: every key of it is visible

    def first_visible(self, L: int) -> int:
        return 0

    def describe(self) -> str:
        return f"{self.what} beside attention" if self.has_keys else self.what


@dataclass(frozen=True)
class CrossAttention:
    """A layer that attends to the vision encoder's keys and values, not to the text (Mllama's
    `cross_attention_layers`, which transformers types as full attention): its cache holds the image's keys and
    values, written by the prompt's pass and read whole by every later token. No tree mask reaches it (which tiles a
    token sees is the model's cross-attention mask, carried on every pass: `families.Family.carried`), it holds no
    text columns (the cache's length is read off another layer), and a compaction keeps it whole."""

    name: str = "cross_attention"
    windowed = False
    width = None
    has_keys = False  # no text columns
    text_columns = False

    def describe(self) -> str:
        return "cross-attention to the image"


@dataclass(frozen=True)
class SharedKV:
    """A layer that attends with the keys and values of an earlier layer of its own type, after that layer's update
    (Gemma 3n's last `num_kv_shared_layers`: `kv_sharing_modes` "reuse"; transformers gives it a cache layer that holds
    nothing). What it sees is its type's: it takes that type's mask, built over the columns the producing layer holds,
    and a compaction has nothing of its own to keep (the producer's columns are compacted with the producer)."""

    inner: FullAttention | SlidingWindow | Chunked

    @property
    def name(self) -> str:
        return self.inner.name

    windowed = False  # the producer's columns are rolled with the producer; this layer holds none
    width = None
    has_keys = False
    text_columns = False

    def describe(self) -> str:
        return f"{self.inner.describe()} sharing an earlier layer's keys and values"


Kind = FullAttention | SlidingWindow | Chunked | WithSinks | Recurrent | CrossAttention | SharedKV
SUPPORTED = ("full attention, sliding windows, chunked attention and attention sinks (under a mask), recurrent layers "
             "whose several-token passes continue their state (path by path), cross-attention to an image (kept "
             "whole), layers that share an earlier layer's keys and values")


@dataclass(frozen=True)
class Unsupported:
    """A layer type tree verification cannot reach (a recurrent state, a shared cache, a type not known here)."""

    name: str
    windowed = False

    def describe(self) -> str:
        why = {"dummy": "a layer without a KV cache of its own that shares no other layer's (an MLP-only layer)"}.get(
            self.name)
        return f"{self.name} ({why})" if why else self.name


def _sinks(model_or_config) -> bool:
    """Does the model's attention add sink logits? Read from its modules (GPT-OSS: `self_attn.sinks`)."""
    modules = getattr(model_or_config, "modules", None)
    return modules is not None and any(hasattr(m, "sinks") and hasattr(m, "q_proj") for m in modules())


def text_config(model_or_config):
    cfg = getattr(model_or_config, "config", model_or_config)
    getter = getattr(cfg, "get_text_config", None)
    return getter(decoder=True) if getter is not None else cfg


# transformers' layer type -> the kind, made from the layer's cache kwargs (cache_utils.get_layer_types_and_kwargs);
# a type not here is refused (`Unsupported`). `register_kind` adds one.
KINDS: dict[str, Callable[[dict], Kind | None]] = {
    "full_attention": lambda kw: FullAttention(),
    "sliding_attention": lambda kw: SlidingWindow(int(kw["sliding_window"])) if kw.get("sliding_window") else None,
    # transformers passes the chunk size under the window's name
    "chunked_attention": lambda kw: Chunked(int(kw["sliding_window"])) if kw.get("sliding_window") else None,
    "linear_attention": lambda kw: Recurrent("linear_attention", has_keys=False),  # Qwen3.5, Qwen3-Next, Mamba
    "hybrid": lambda kw: Recurrent("hybrid", has_keys=True),  # Falcon-H1: Mamba-2 and attention in one layer
    "conv": lambda kw: Recurrent("conv", has_keys=False),  # LFM2: a short convolution over the last few tokens
}
# what a recurrent layer is, by model type (transformers calls them all "linear_attention" or "hybrid")
_RECURRENT = {"qwen3_5": "the gated delta rule", "qwen3_5_moe": "the gated delta rule",
              "qwen3_next": "the gated delta rule", "falcon_h1": "Mamba-2", "nemotron_h": "Mamba-2",
              "granitemoehybrid": "Mamba-2", "bamba": "Mamba-2", "mamba2": "Mamba-2", "mamba": "Mamba",
              "falcon_mamba": "Mamba", "jamba": "Mamba", "lfm2": "a short convolution",
              "lfm2_moe": "a short convolution"}


def register_kind(layer_type: str, make: Callable[[dict], Kind | None]) -> None:
    """Make layers of `layer_type` a kind trees are verified through: `make(cache kwargs)` returns the kind (an object
    with the attributes and methods of `SlidingWindow`), or None where those kwargs are not one it handles."""
    KINDS[layer_type] = make


def kinds_of(model_or_config) -> list[Kind | Unsupported]:
    """Each decoder layer's kind, in order, as transformers reads the config to build the model's caches."""
    text = text_config(model_or_config)
    types, kwargs = get_layer_types_and_kwargs(text)
    sinks = _sinks(model_or_config)
    model_type = getattr(text, "model_type", "").removesuffix("_text")
    cross = set(getattr(text, "cross_attention_layers", None) or ())  # Mllama: typed full attention by transformers
    # Gemma 3n: transformers types a layer that reuses another's keys and values "dummy"; it reads those of the last
    # earlier layer of its own type, and sees what that layer sees
    sharing = getattr(text, "kv_sharing_modes", None) or [None] * len(types)
    own_types = getattr(text, "layer_types", None) or types
    out: list[Kind | Unsupported] = []
    for i, (t, kw) in enumerate(zip(types, kwargs)):
        make = KINDS.get(t)
        kind = None if make is None else make(kw)
        if i in cross:
            out.append(CrossAttention())
        elif t == "dummy" and sharing[i] == "reuse":
            producer = next((out[j] for j in reversed(range(i)) if own_types[j] == own_types[i]), None)
            out.append(SharedKV(producer) if isinstance(producer, FullAttention | SlidingWindow | Chunked)
                       else Unsupported(t))
        elif kind is None:
            out.append(Unsupported(t))
        else:
            if isinstance(kind, Recurrent):
                kind = Recurrent(kind.name, kind.has_keys, _RECURRENT.get(model_type, kind.what))
            out.append(WithSinks(kind) if sinks and not isinstance(kind, Recurrent) else kind)
    return out


@dataclass(frozen=True)
class LayerPlan:
    """A model's layer kinds, what tree verification needs of them, and why it cannot be done where it cannot (its
    answers are computed once: the runner asks them every pass)."""

    kinds: tuple[Kind | Unsupported, ...]

    @cached_property
    def by_name(self) -> dict[str, Kind]:
        """One kind per type of layer over the text (transformers keys its per-type masks by it)."""
        return {k.name: k for k in self.kinds if not isinstance(k, Unsupported) and getattr(k, "text_columns", True)}

    @cached_property
    def whole_layers(self) -> frozenset[int]:
        """The layers whose cache holds no text columns (cross-attention to an image; a layer sharing another's keys
        and values, which holds nothing): a compaction and a roll keep them as they are."""
        return frozenset(i for i, k in enumerate(self.kinds) if not getattr(k, "text_columns", True))

    @cached_property
    def windowed(self) -> bool:
        """Does any layer see less than the whole past (a window, a chunk)? Then masks are built per kind."""
        return any(k.windowed for k in self.kinds)

    @cached_property
    def recurrent(self) -> bool:
        """Does any layer carry a state? Then trees are read path by path (recurrent_paths.py), not under a tree
        mask."""
        return any(isinstance(k, Recurrent) for k in self.kinds)

    @cached_property
    def kv_layer(self) -> int:
        """The first layer with key/value columns (a hybrid model's first layers may hold only a state): the cache's
        length is read off it."""
        return next((i for i, k in enumerate(self.kinds) if not isinstance(k, Unsupported)
                     and getattr(k, "has_keys", True)), 0)

    @cached_property
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
        """Give every attention layer of `cache` (a DynamicCache made from the model's config) a plain DynamicLayer,
        where transformers made a rolling window: the engine compacts it like any other and rolls it itself
        (`Columns.roll`). Layers of an unsupported kind keep transformers' own class (their model runs `ar` only)."""
        for i, kind in enumerate(self.kinds):
            if kind.windowed and i < len(cache.layers):
                cache.layers[i] = DynamicLayer()


def plan_for(model_or_config) -> LayerPlan:
    return LayerPlan(tuple(kinds_of(model_or_config)))

