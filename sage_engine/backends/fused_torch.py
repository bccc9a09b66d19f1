"""The "fused" backend: decoder layers in fewer, larger calls; a small model's cached step is mostly per-call overhead.

Where it applies: pre-norm attention + SwiGLU layers (q/k/v/o and gate/up/down projections, RMSNorms) with a static
rotary, at most MAX_FUSED_PARAMS weights, the whole model on one device, float32 (products on weight copies laid out
for the call) or bf16 (F.linear); every other model gets the "layers" backend, or forward().

A level of a 1-layer, hidden-128 draft through its own modules (hf_layers.py) is nearly all the cost of dozens of small
calls: three projections for q, k and v, two for the MLP's gate and up, three RMSNorms of six operations each, the
attention wrapper, the cache's update. `FusedDecoder` computes the same layer (pre-norm attention with rotary
positions, SwiGLU MLP) with q/k/v as one product and gate/up as one, q and k rotated together, the norms' weights
folded into the products after them (`Norm`), cos and sin from one table lookup, SDPA on the cache's own tensors and
the weights called directly (no module calls).

Products. A float32 model's products run on a copy of each weight laid out for the call, in one of two ways
(`Product`): x @ W^T on a contiguous transposed copy, or, for a model on the CPU with hidden size >= PACK_MIN_HIDDEN
(the embedded target), oneDNN on a copy packed into its blocked layout (`packs`; torch's own operators,
`torch.ops.mkldnn`, what torch.compile's CPU backend uses for frozen weights). Which is faster depends on the CPU
(packed won on one 2-core Xeon, transposed on another with AMX: docs/log/SPEED.md). `fused_decoders` builds both
where both apply and the runner keeps the one its timing finds faster on this machine (`choose.fastest`, when it
checks the layers). Narrower products (the draft's) are never packed: a packed call has a fixed cost that a narrow
product does not repay. oneDNN builds a kernel on the first call for each row count, so a packed decoder runs every
row count up to WARM_ROWS once when it is built. For a draft, the same layers computed in NumPy from this decoder's
weights (numpy_host.py) are one more candidate (the timings of each way: docs/log/SPEED.md).

Exactness. A fused product (with a norm's weight folded into it) sums and rounds in another order than the model's
modules do, so the logits differ from forward()'s in the last bits (the embedded target: up to ~2e-5 on logits of
magnitude ~10-15). Differences of that size are already there without fusing: a verify pass over 13 tokens and a
one-token step through the same modules take different BLAS paths and differ by as much. Every emitted token is the
argmax of the target's logits as the engine computes them, in the `ar` lane and in verification alike; it equals
transformers' own generate() wherever no two top logits are closer than that (every `bench` run checks `hf_generate`
token for token against `ar`). `--tree-forward layers` keeps both models on their own modules (hf_layers.py,
bit-identical to forward() at the same shapes). The runner checks the fused layers once per model (when
the engine is built, on a short text prompt; else on its first cached forward): the same argmax on every row and
logits within 1e-3 of their scale, or they are dropped.

Used where a layer is exactly that block: its children are the two norms, an attention of q/k/v/o projections and
an MLP of gate/up/down projections with SiLU (nothing else, e.g. no q/k norms), and the fused copies of the
weights are small (a large model's forward is arithmetic, not overhead, and the copies would cost memory).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from ..core.cache import KVBuffers
from .fused_products import (  # noqa: F401 - Product, PACK_MIN_HIDDEN and the rest are read from here too
    MAX_FUSED_PARAMS,
    PACK_MIN_HIDDEN,
    WARM_ROWS,
    Norm,
    Product,
    _folded,
    _norm,
    _product,
    _rms,
    _rms_norm,
    _rotate,
    _warm,
)
from .hf_layers import DecoderStack
from .padding import NO_PADDING, Rule, pad_rows, padded, row_rule

_LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_ATTN_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MLP_PARTS = {"gate_proj", "up_proj", "down_proj", "act_fn"}


@dataclass(frozen=True)
class FusedLayer:
    index: int  # the layer's index in the cache
    norm1: Norm  # input RMSNorm
    qkv: Product  # [(H + 2 KV) hd, D]: q, k and v projections stacked
    heads: int  # H
    kv_heads: int  # KV
    head_dim: int  # hd
    scaling: float
    out: Product  # o_proj
    norm2: Norm  # post-attention RMSNorm
    gate_up: Product  # [2 I, D]: gate and up projections stacked
    down: Product  # down_proj


def _fuse(index: int, layer: torch.nn.Module, product, fold: bool) -> FusedLayer | None:
    """The layer as a FusedLayer, or None if it is not exactly the pre-norm attention + SwiGLU block; `product(weight,
    bias)` makes each Product; `fold`: its norms' weights folded into the products after them (`Norm`)."""
    parts = dict(layer.named_children())
    if set(parts) != _LAYER_PARTS:
        return None
    attn, mlp = parts["self_attn"], parts["mlp"]
    a, m = dict(attn.named_children()), dict(mlp.named_children())
    if set(a) != _ATTN_PARTS or set(m) != _MLP_PARTS:
        return None
    if not all(type(a[k]) is torch.nn.Linear for k in _ATTN_PARTS) or not all(  # plain: their weights are used
            type(m[k]) is torch.nn.Linear for k in ("gate_proj", "up_proj", "down_proj")):
        return None
    if getattr(getattr(mlp, "config", None), "hidden_act", None) not in ("silu", "swish"):
        return None
    norm1, norm2 = _rms(parts["input_layernorm"]), _rms(parts["post_attention_layernorm"])
    hd, scaling = getattr(attn, "head_dim", None), getattr(attn, "scaling", None)
    if norm1 is None or norm2 is None or hd is None or scaling is None or getattr(attn, "sliding_window", None):
        return None
    q, k, v = a["q_proj"], a["k_proj"], a["v_proj"]
    biases = [q.bias, k.bias, v.bias]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    qkv_bias = None if biases[0] is None else torch.cat(biases).detach()
    (norm1, f1), (norm2, f2) = _norm(norm1, fold), _norm(norm2, fold)
    return FusedLayer(
        index=getattr(attn, "layer_idx", index), norm1=norm1,
        qkv=product(_folded(torch.cat([q.weight, k.weight, v.weight]), f1), qkv_bias),
        heads=q.out_features // hd, kv_heads=k.out_features // hd, head_dim=hd, scaling=float(scaling),
        out=product(a["o_proj"].weight, a["o_proj"].bias), norm2=norm2,
        gate_up=product(_folded(torch.cat([m["gate_proj"].weight, m["up_proj"].weight]), f2), None),
        down=product(m["down_proj"].weight, m["down_proj"].bias),
    )


@dataclass(frozen=True)
class FusedDecoder:
    """The "fused" backend (see backends/__init__.py): the layers as fewer, larger torch products."""

    takes_lists = compiled = False

    stack: DecoderStack  # embedding, rotary tables, final norm and head
    layers: tuple[FusedLayer, ...]
    norm: Norm
    sign: torch.Tensor  # [hd]: -1 on the first half, 1 on the second (`_rotate`)
    embed_weight: torch.Tensor | None  # a plain Embedding's weight (else the stack's module is called)
    head: Product | None  # a plain Linear head, likewise
    rope: dict = field(default_factory=dict)  # "table": [n, 2 hd], (cos, signed sin) of positions 0..n-1
    # on the CPU, where every layer has the same key heads and head size: the cached steps' keys and values, written
    # in place (a concatenation per layer copied the cache each step) and compacted in one move (cache.KVBuffers)
    buffers: KVBuffers | None = None

    @property
    def name(self) -> str:
        return "fused+packed" if self.packed else "fused"

    @property
    def prompt_layers(self) -> FusedDecoder:
        """The layers a whole prompt can go through (`prefill`): these."""
        return self

    @property
    def packed(self) -> bool:
        """Do the products go through oneDNN on packed weights (`packs`)?"""
        return self.layers[0].qkv.packed is not None

    @functools.cached_property
    def rows(self) -> Rule:  # the rows its products are called with (`Product.rows`)
        return self.layers[0].qkv.rows

    @property
    def products(self) -> list[Product]:
        """Every Product of the decoder: each layer's four, then the head's (where it is a plain Linear)."""
        return [p for f in self.layers for p in (f.qkv, f.out, f.gate_up, f.down)] + (
            [] if self.head is None else [self.head])

    def rotary(self, h: torch.Tensor, positions: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) of `positions` [1, q] for `_rotate`, from one table row each: the stack's rotary
        tables (the model's own rotary, `DecoderStack.position_embeddings`) with sin's first half negated, side by
        side, so that one embedding lookup gathers both.  # -> 2 x [1, 1, q, hd]"""
        table = self.rope.get("table")
        if table is None or table.shape[0] <= top:  # the model's dtype and device: the stack's, fixed
            self.stack.position_embeddings(h, positions, top)  # grows the stack's tables to cover `top`
            cos, sin = self.stack.tables["cos"][0], self.stack.tables["sin"][0]  # [n, hd]
            table = self.rope["table"] = torch.cat([cos, sin * self.sign], dim=-1)
        cs = F.embedding(positions, table)[:, None]  # [1, 1, q, 2 hd]
        hd = self.sign.shape[0]
        return cs[..., :hd], cs[..., hd:]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 top: int | None = None) -> torch.Tensor:
        """Same contract as DecoderStack: ids, positions [1, q], mask [1, 1, q, kv]; appends to `cache`.
        # -> [1, q, V]"""
        q = ids.shape[1]
        m = padded(q, self.rows)  # rows carried through the products (`_layers`)
        ids = ids if m == q else ids.expand(1, m) if q == 1 else pad_rows(ids.T, m).T
        h = self.stack.embed(ids) if self.embed_weight is None else F.embedding(ids, self.embed_weight)  # [1, m, D]
        cos, sin = self.rotary(h, positions, int(positions.max()) if top is None else top)  # [1, 1, q, hd]
        logits = self._head(self._layers(h, cos, sin, mask, cache, rows=q))
        return logits[:, :q] if m > q else logits

    def prefill(self, embeds: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """A whole prompt into an empty `cache`, causal, from its input embeddings [1, q, D] and the rotary positions
        its text model's rotary takes ([3, 1, q] for M-RoPE, else [1, q]; hf_layers.prompt_inputs): the logits after its
        last token.  # -> [V]"""
        cos, sin = self.stack.rotary(embeds, positions)  # the model's own rotary, called as its text model calls it
        h = self._layers(embeds, cos[:, None], (sin * self.sign)[:, None], None, cache, prompt=True)
        return self._head(h[:, -1:])[0, -1]

    def _layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, cache,
                prompt: bool = False, rows: int | None = None) -> torch.Tensor:
        """The decoder layers over h [1, q, D], appending keys and values to `cache`; `prompt`: the cache is empty and
        the rows attend causally (no mask). `rows`: h holds that many tokens' rows, then copies of the first up to the
        count its products pad to (`Product.rows`); the products take them all, the attention and the cache the
        tokens': the numbers of padded products, without padding at each of 25 calls.  # -> [1, h's rows, D]"""
        q, buffers = rows or h.shape[1], None if prompt else self.buffers
        carried = q < h.shape[1]
        if buffers is not None:
            cached = [cache.layers[f.index] for f in self.layers]
            n = buffers.reserve(cached, q)
            grown = list(buffers.at(n + q))
        for i, f in enumerate(self.layers):
            H, KV, hd = f.heads, f.kv_heads, f.head_dim
            qkv = f.qkv(f.norm1(h))
            qkv = (qkv[:, :q] if carried else qkv).view(1, q, H + 2 * KV, hd).transpose(1, 2)
            qk = _rotate(qkv[:, : H + KV], cos, sin)  # q and k heads in one rotation: [1, H + KV, q, hd]
            if prompt:  # the cache layer's first keys and values (DynamicLayer initialises itself)
                keys, values = cache.update(qk[:, H:], qkv[:, H + KV :], f.index)
            elif buffers is not None:  # written into the layer's slice of the buffers, attended through a view
                k_buf, v_buf = buffers.views[i]
                k_buf.narrow(2, n, q).copy_(qk[:, H:])
                v_buf.narrow(2, n, q).copy_(qkv[:, H + KV :])
                keys, values = cached[i].keys, cached[i].values = grown[i]
            else:
                layer = cache.layers[f.index]
                keys = layer.keys = torch.cat([layer.keys, qk[:, H:]], dim=-2)  # what DynamicLayer.update does
                values = layer.values = torch.cat([layer.values, qkv[:, H + KV :]], dim=-2)
            a = F.scaled_dot_product_attention(qk[:, :H], keys, values, attn_mask=mask, is_causal=prompt,
                                               scale=f.scaling, enable_gqa=H != KV)  # [1, H, q, hd]
            a = a.transpose(1, 2).reshape(1, q, H * hd)
            h = h + f.out(pad_rows(a, h.shape[1]) if carried else a)
            gate, up = f.gate_up(f.norm2(h)).chunk(2, dim=-1)
            h = h + f.down(F.silu(gate) * up)
        if buffers is not None:
            buffers.published(cached)
        return h

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        return self.stack.head(h) if self.head is None else self.head(h)


def packs(stack: DecoderStack) -> bool:
    """Whether the stack's products go through oneDNN on prepacked weights: float32 on the CPU, hidden size at least
    PACK_MIN_HIDDEN, and torch's oneDNN operators present and right on a small product."""
    weight = stack.head.weight if isinstance(getattr(stack.head, "weight", None), torch.Tensor) else None
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    if weight.shape[-1] < PACK_MIN_HIDDEN or not torch.backends.mkldnn.is_available():
        return False
    try:  # a private operator (what torch.compile's CPU backend uses for frozen weights): check it is there and right
        w, b, x = torch.randn(24, 16), torch.randn(24), torch.randn(1, 3, 16)
        return torch.allclose(_product(w, b, True)(x), F.linear(x, w, b), atol=1e-5)
    except (AttributeError, RuntimeError):
        return False


def fused_decoders(stack: DecoderStack, row_invariant: bool = True) -> list[FusedDecoder]:
    """The ways this stack's layers can be fused: products on transposed copies, and on packed ones where `packs`
    (the runner keeps the faster of those close to forward(), `choose.check_cached`); none where a layer is not
    exactly the block FusedDecoder computes, the rotary is not a static table (`static_rope`) or the copies would
    hold more than MAX_FUSED_PARAMS weights. row_invariant: products give a row the same numbers alone as among
    others (`Product.rows`), as the target's must; False for a model whose numbers only shape guesses."""
    kinds = [False, True] if packs(stack) else [False]
    return [d for d in (fused_decoder(stack, pack, row_invariant) for pack in kinds) if d is not None]


def fused_decoder(stack: DecoderStack, pack: bool = False, row_invariant: bool = True) -> FusedDecoder | None:
    """The stack's layers fused, their products on transposed copies of the weights or (`pack`) on packed ones;
    `row_invariant` (float32): their rows padded by the rule padding.row_rule finds for them on this machine, and None
    where no rule makes them invariant."""
    fused = _fused(stack, pack)
    weight = None if fused is None else fused.layers[0].qkv.weight
    if weight is None or not row_invariant or weight.dtype != torch.float32:
        return fused
    rule = row_rule(lambda w: _product(w, None, pack), [tuple(p.weight.shape) for p in fused.products], weight)
    if rule is None or rule == NO_PADDING:
        return None if rule is None else fused
    pad = functools.partial(replace, rows=rule)  # the same weight copies, their rows padded by the rule
    layers = tuple(replace(f, qkv=pad(f.qkv), out=pad(f.out), gate_up=pad(f.gate_up), down=pad(f.down))
                   for f in fused.layers)
    return replace(fused, layers=layers, head=None if fused.head is None else pad(fused.head))


def _fused(stack: DecoderStack, pack: bool) -> FusedDecoder | None:
    if not stack.static_rope or not stack.layers:
        return None
    head = stack.head
    plain_head = type(head) is torch.nn.Linear
    copies = sum(p.numel() for layer in stack.layers for name, p in layer.named_parameters()  # every product's copy
                 if name.endswith("_proj.weight")) + (head.weight.numel() if plain_head else 0)
    if copies > MAX_FUSED_PARAMS:
        return None
    # float32: the norms' weights folded into the products after them (`Norm`), the final one into the head's copy
    fold = head.weight.dtype == torch.float32 and plain_head
    norm = _rms(stack.norm)
    product = functools.partial(_product, pack=pack)  # every Product of this decoder
    layers = tuple(_fuse(i, layer, product, fold) for i, layer in enumerate(stack.layers))
    if norm is None or any(f is None for f in layers):
        return None
    norm, factor = _norm(norm, fold)
    hd = layers[0].head_dim
    if hd % 2 or any(f.head_dim != hd for f in layers):
        return None
    weight = layers[0].qkv.weight
    sign = torch.cat([-torch.ones(hd // 2), torch.ones(hd // 2)]).to(device=weight.device, dtype=weight.dtype)
    embed = stack.embed
    plain_embed = type(embed) is torch.nn.Embedding and embed.max_norm is None  # else its own forward (e.g. scaled)
    same_kv = len({(f.kv_heads, f.head_dim) for f in layers}) == 1
    buffers = KVBuffers(len(layers), layers[0].kv_heads, hd, weight.dtype) if same_kv and weight.is_cpu else None
    fused = FusedDecoder(stack, layers, norm, sign, embed.weight if plain_embed else None,
                         product(_folded(head.weight, factor), head.bias) if plain_head else None, buffers=buffers)
    if pack:
        _warm(fused.products, WARM_ROWS)
    return fused



