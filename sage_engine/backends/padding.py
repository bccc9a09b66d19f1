"""Row-count invariance: a target token's numbers must not depend on how many rows share its products.

An `ar` step computes one token's row, a verify pass a dozen; if a product gave a row other numbers in the two, a token
could get other logits in the two lanes (in the last bits, which decide only near-ties). BLAS kernels block the rows,
and which counts take another kernel depends on the CPU and the thread count. Measured with torch's MKL:
- on a 2-core Intel Xeon, one row takes a matrix-vector path and every count from two up gives a row the same numbers;
- on a 2-core AMD EPYC (AVX2), one to three rows take other kernels than four, and with two threads so does any count
  below twelve that is not a multiple of four;
- oneDNN's packed products were invariant on both.
So a row-invariant model's products are called with their row count padded by a rule found on this machine when they
are built (`row_rule`): at least `least` rows, a multiple of `multiple` (the padding rows repeat the first, and are
dropped after the product). A way of computing the products that no rule makes invariant is not offered for a
row-invariant model (fused.fused_decoder).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Rule = tuple[int, int]  # (least rows, multiple of rows) a product is called with
NO_PADDING: Rule = (1, 1)
RULES: tuple[Rule, ...] = (NO_PADDING, (2, 1), (4, 4), (8, 8), (16, 16))  # tried in this order, the cheapest first
CHECKED_ROWS = (*range(1, 17), 24, 32, 48, 64, 65)  # row counts checked: a plain step's one, a verify pass's up to 65


def padded(q: int, rule: Rule) -> int:
    """The rows a call over q rows is padded to under `rule`."""
    least, multiple = rule
    return max(least, -(-q // multiple) * multiple)


def pad_rows(x: torch.Tensor, m: int) -> torch.Tensor:
    """x [..., q, K] with its first row repeated up to m rows, contiguous (oneDNN's products take no expanded rows).
    # -> [..., m, K]"""
    if x.shape[-2] == 1:  # a one-token step's: one call
        return torch.cat([x] * m, dim=-2)
    return torch.cat([x, x[..., :1, :].expand(*x.shape[:-2], m - x.shape[-2], x.shape[-1])], dim=-2)


@torch.inference_mode()
def row_rule(make: Callable[[torch.Tensor], Callable], shapes: list[tuple[int, int]],
             like: torch.Tensor) -> Rule | None:
    """The first of RULES under which products made by `make(weight)` (calling their kernel on the rows as given) for
    each [out, in] weight shape of `shapes`, on random numbers of `like`'s dtype and device, give every row of every
    count of CHECKED_ROWS, padded by the rule, the numbers it gets in a call over the most rows, bit for bit. None:
    no rule does."""
    gen = torch.Generator().manual_seed(0)
    probes = []
    for out, inp in sorted(set(shapes)):
        weight = torch.randn(out, inp, generator=gen).to(like)
        probes.append((make(weight), torch.randn(1, CHECKED_ROWS[-1], inp, generator=gen).to(like)))
    for rule in RULES:
        if all(_invariant(product, x, rule) for product, x in probes):
            return rule
    return None


def _invariant(product: Callable, x: torch.Tensor, rule: Rule) -> bool:
    def rows(q: int) -> torch.Tensor:
        return product(pad_rows(x[:, :q], padded(q, rule)))[:, :q]

    full = rows(x.shape[1])
    return all(torch.equal(rows(q), full[:, :q]) for q in CHECKED_ROWS[:-1])
