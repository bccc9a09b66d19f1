"""The pieces the fused layers are made of (fused_torch.py): one projection on a weight copy laid out for the call
(`Product`), an RMSNorm with its weight folded into the next product (`Norm`), the rotary on one table row, and the
packed products' warm-up. Plain float32 or bf16 torch, no model code."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .padding import NO_PADDING, Rule, pad_rows, padded

MAX_FUSED_PARAMS = 16_000_000  # fused weight copies above this (64 MB in fp32) are not worth their memory
PACK_MIN_HIDDEN = 256  # narrower products are faster on a transposed copy than through oneDNN's fixed per-call cost
WARM_ROWS = 96  # oneDNN builds a kernel per new row count (~0.4 ms): packed products run 1..96 rows when built
_WARMED: set[tuple] = set()  # kinds of packed product whose kernels this process has built (oneDNN keeps them)


@dataclass(frozen=True)
class Product:
    """One projection, y = x W^T + b. In float32, as x @ W^T on a contiguous copy of W^T, or by oneDNN on a copy of W
    prepacked into its blocked layout (`packed`): either skips what `F.linear` does on every call with the module's
    [out, in] weight (about half the cost of F.linear on a few rows). A
    row-invariant model's products pad their rows by `rows`, the rule its decoder found on this machine (padding.py):
    BLAS computes one row, on some CPUs a few, with other kernels than many, so a token would get other numbers in
    an `ar` step than in a verify pass. Attention is not padded: logits may still differ by ~1e-5 between the two
    lanes (see the module's note on exactness). A padded one-row product costs about twice the one-row one, so a
    model whose numbers only shape guesses (the draft) keeps the one-row path (NO_PADDING). Other dtypes:
    `F.linear`, whose bias is added before the one rounding (a separate addition would round twice in bfloat16)."""

    weight: torch.Tensor  # [out, in] (a view of `transposed` when there is one)
    bias: torch.Tensor | None
    packed: torch.Tensor | None = None  # W in oneDNN's layout (an opaque mkldnn tensor)
    transposed: torch.Tensor | None = None  # W^T [in, out], contiguous
    rows: Rule = NO_PADDING  # (least, multiple): the rows a call is padded to, for row-count invariance (padding.py)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rule, q = self.rows, x.shape[-2]
        if rule is not NO_PADDING and (q < rule[0] or q % rule[1]):  # the rows padded by the rule (`rows`)
            return self(pad_rows(x, padded(q, rule)))[..., :q, :]
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.transposed is None:
            return F.linear(x, self.weight, self.bias)
        y = x @ self.transposed
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class Norm:
    """An RMSNorm as FusedDecoder computes it. In float32 its weight (times sqrt(D)) is folded into the columns of
    the product that reads its output, so the norm itself is h / sqrt(||h||^2 + D eps) = h / (sqrt(D) rms(h)): a
    reduction, a hypot and a division, against the half-dozen operations of torch's rms_norm (a 6-layer target has 13
    norms per forward). Other dtypes: the model's own formula
    (`_rms_norm`)."""

    weight: torch.Tensor | None  # None: folded into the next product
    eps: float
    floor: torch.Tensor | None = None  # folded: sqrt(D eps), as a tensor for torch.hypot

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return h / torch.linalg.vector_norm(h, dim=-1, keepdim=True).hypot_(self.floor)
        return _rms_norm(h, self.weight, self.eps)


def _norm(norm: tuple[torch.Tensor, float], fold: bool) -> tuple[Norm, torch.Tensor | None]:
    """The Norm, and with `fold` the per-column factor to fold into the next product's weight (else None)."""
    weight, eps = norm
    if not fold:
        return Norm(weight, eps), None
    d = weight.shape[-1]
    floor = torch.tensor((d * eps) ** 0.5, dtype=weight.dtype, device=weight.device)
    return Norm(None, eps, floor), weight.detach() * d**0.5


def _folded(weight: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """W diag(factor): a product that reads a folded Norm's output (`_product` detaches it)."""
    return weight if factor is None else weight * factor


def _rms(norm: torch.nn.Module) -> tuple[torch.Tensor, float] | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    if eps is None or weight is None or "RMSNorm" not in type(norm).__name__ or list(norm.children()):
        return None
    return weight, float(eps)


def _rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama / Qwen2 compute it: normalised in float32, cast back, then scaled in the input's dtype (in
    float32 that is torch's rms_norm with the weight, one call)."""
    if h.dtype == torch.float32:
        return F.rms_norm(h, (h.shape[-1],), weight, eps)
    return weight * F.rms_norm(h.float(), (h.shape[-1],), eps=eps).to(h.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, the half-split convention of Llama / Qwen2: x cos + rotate_half(x) sin, where
    rotate_half(x) = (-x2, x1) for the halves x1, x2 of x. With `signed_sin` = (-sin1, sin2) that is
    x cos + (x2, x1) signed_sin, the same products and sum: a roll of x instead of a negation, two slices and a
    concatenation (one fused multiply-add would round differently from the model in bfloat16)."""
    if x.dtype == torch.float32:  # the sum and the second product in one call (not the model's rounding in bf16)
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def _product(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> Product:
    weight = weight.detach()
    if pack:
        return Product(weight, bias, packed=torch.ops.mkldnn._reorder_linear_weight(weight))
    if weight.dtype != torch.float32:
        return Product(weight, bias)
    transposed = weight.t().contiguous()
    return Product(transposed.t(), bias, transposed=transposed)


@torch.inference_mode()
def _warm(products: list[Product], rows: int) -> None:
    """Call one packed product of each kind (weight shape, with or without a bias, at this thread count) on 1..rows
    rows, so that no decode step builds a kernel; a kind an earlier model of this process warmed is skipped."""
    kinds = {(tuple(p.weight.shape), p.bias is None, torch.get_num_threads(), rows): p
             for p in products if p.packed is not None}
    for kind, p in kinds.items():
        if kind in _WARMED:
            continue
        for m in range(1, rows + 1):
            p(p.weight.new_zeros(1, m, p.weight.shape[1]))
        _WARMED.add(kind)
