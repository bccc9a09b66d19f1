"""Lossless sampling (temperature, top-p, seed) for trees the draft built from its top candidates.

The rule for such deterministic trees: at the root, draw the next token from the target's own (tempered,
top-p) distribution; if the draw is one of the node's children, descend to it and draw again from the target's
distribution there; the first draw that is not a child is emitted as the step's last token. Every emitted token
is a draw from the target's distribution given exactly the tokens before it (a tree node's logits are the
target's logits after its path), so the output has the target's sampling distribution whatever the draft
proposed; the draft only decides how many draws one target forward serves.

Draws are inverse-CDF over token ids with one uniform per emitted token from a seeded generator, so a run
consumes the same uniforms, position by position, as the target sampling alone (`ar`) does: with the same
seed the speculative sample equals the target-only sample token for token (in fp32, up to the ~1e-6 by which
tree logits differ from sequential ones, which could move a draw sitting on a bucket edge).
Not here yet: the classic chain rule with draft-sampled tokens (accept with min(1, p/q), resample from the
residual), and tempering the draft's own distribution for SAGE's alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .tree import DraftTree
from .verify import Verdict


@dataclass(frozen=True)
class Sampling:
    """How the target's next tokens are chosen; temperature 0 is greedy (argmax)."""

    temperature: float = 0.0  # softmax temperature; 0 = greedy
    top_p: float = 1.0  # nucleus: the smallest set of most probable tokens whose probability reaches top_p
    seed: int = 0  # the generator of the uniforms (one per emitted token)

    def __post_init__(self):
        t, p, s = self.temperature, self.top_p, self.seed
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (got {t!r})")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0 < p <= 1:
            raise ValueError(f"top-p must be in (0, 1] (got {p!r})")
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"seed must be an integer >= 0 (got {s!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution the target samples from: softmax(logits / T), cut to the top-p nucleus and
    renormalised (ties at the cut kept in token-id order).  # [V] -> [V] float64"""
    probs = torch.softmax(logits.double() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more probable tokens
        sorted_p[before >= sampling.top_p] = 0.0  # keep a token while the mass before it is short of top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs / probs.sum()


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> int:
    """The token whose cumulative-probability bucket (in token-id order) holds the uniform `u`.  # [V]"""
    cdf = torch.cumsum(probs, dim=-1)
    return int(min(torch.searchsorted(cdf, u * cdf[-1], right=True).item(), cdf.numel() - 1))


class SampledAcceptance:
    """The deterministic-tree sampling rule above, for one run (it owns the run's generator)."""

    name = "sampled"

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.generator = torch.Generator().manual_seed(sampling.seed)

    def draw(self, logits: torch.Tensor) -> int:
        """One token from the target's distribution after `logits`, with the run's next uniform.  # [V]"""
        return inverse_cdf(target_probs(logits, self.sampling), torch.rand((), generator=self.generator,
                                                                             dtype=torch.float64))

    def first(self, logits: torch.Tensor) -> int:
        return self.draw(logits)

    def __call__(self, tree: DraftTree, logits: torch.Tensor) -> Verdict:
        """Descend while the draws are children; the first draw that is not is the step's last token.
        logits[0] after the root, logits[1 + i] after node i.  # [1 + n, V]"""
        children: dict[int, dict[int, int]] = {}
        for i, (parent, tok) in enumerate(zip(tree.parents, tree.tokens)):
            children.setdefault(parent, {}).setdefault(tok, i)
        path: list[int] = []
        node = -1
        while True:
            tok = self.draw(logits[0 if node < 0 else 1 + node])
            child = children.get(node, {}).get(tok)
            if child is None:
                return Verdict(path, [tree.tokens[i] for i in path], tok)
            path.append(child)
            node = child
