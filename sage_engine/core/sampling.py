"""Lossless sampling (temperature, top-p, seed): the warped distributions and the two exact acceptance rules.

The tree rule (`SampledAcceptance`), for trees the draft built deterministically from its top candidates
(static, eagle2, sage, and chain:draw=top): at the root, draw the next token from the target's own (tempered,
top-p) distribution p; if the draw is one of the node's children, descend to it and draw again from p there;
the first draw that is not a child is emitted as the step's last token. Every emitted token is a draw from p
given exactly the tokens before it (a tree node's logits are the target's logits after its path), so the output
has the target's sampling distribution whatever the draft proposed; the draft only decides how many draws one
target forward serves. Draws are inverse-CDF over token ids with one uniform per emitted token from a seeded
generator, so a run consumes the same uniforms, position by position, as the target sampling alone (`ar`): with
the same seed the speculative sample equals the target-only sample token for token (in fp32, up to the ~1e-6 by
which tree logits differ from sequential ones, which could move a draw sitting on a bucket edge).

The ratio rule (`RatioAcceptance`), the classic one for a chain whose tokens the draft sampled from its own
warped distribution q (chain, the default draw): accept draft token x with probability min(1, p(x) / q(x)); at
the first rejection emit a draw from the residual normalize(max(0, p - q)); when every token is accepted, emit
a draw from p after the last. It extends to trees whose children the draft sampled without replacement
(sage:draw=sample): siblings are tried in draw order, each against q with the earlier siblings removed. The
output again has the target's distribution, with a higher acceptance than the tree rule's p(x) when both
distributions are flat (1 - TV(p, q) per token), but its uniforms are not the target-only run's: same
distribution, different draw.

The draft's q is warped with the same temperature and top-p as the target (`DraftSampler`): SAGE's confidence
alpha reads it, so hotter sampling gives flatter q, lower alpha, and wider, shallower trees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .passes import Pass
from .tree import DraftTree
from .verify import Trial, Verdict

SEEDS = 1 << 32  # torch's CPU generator seeds its Mersenne Twister with the low 32 bits of a seed
DRAFT_STREAM = 0x5DEECE66  # XORed into the draft's seed: never the target's seed, so its draws are independent


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
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < SEEDS:
            raise ValueError(f"seed must be an integer in [0, 2**32) (got {s!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warped(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution tokens are sampled from: softmax(logits / T), cut to the top-p nucleus and renormalised
    (ties at the cut kept in token-id order); row-wise.  # [..., V] -> [..., V] float64"""
    probs = torch.softmax(logits.double() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more probable tokens
        sorted_p[before >= sampling.top_p] = 0.0  # keep a token while the mass before it is short of top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs / probs.sum(dim=-1, keepdim=True)


def inverse_cdf(probs, u: float) -> int:
    """The token whose cumulative-probability bucket (in token-id order) holds the uniform `u`.  # [V] numpy or
    CPU tensor"""
    cdf = np.cumsum(np.asarray(probs, dtype=np.float64))
    return int(min(np.searchsorted(cdf, float(u) * cdf[-1], side="right"), cdf.size - 1))


def warped_rows(logits: torch.Tensor, sampling: Sampling) -> np.ndarray:
    """`warped` for every row at once, on the host (one call and one copy per step; rows are then read with
    numpy's cheap indexing).  # [n, V] -> [n, V] float64"""
    return warped(logits, sampling).cpu().numpy()


class _Uniforms:
    """A run's stream of uniforms (a seeded generator, read in blocks: one call per BLOCK uniforms, the same
    sequence for every consumer); `pick` draws one token from a distribution with the next one."""

    BLOCK = 64

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)
        self._block: list[float] = []

    def uniform(self) -> float:
        if not self._block:
            self._block = torch.rand(self.BLOCK, generator=self.generator, dtype=torch.float64).tolist()[::-1]
        return self._block.pop()

    def pick(self, probs) -> tuple[int, float]:
        """(token, the uniform behind it): one inverse-CDF draw from `probs`.  # [V]"""
        u = self.uniform()
        return inverse_cdf(probs, u), u


class DraftSampler(_Uniforms):
    """The draft's side of a sampled run: q = the draft's logits warped like the target's, and its own draws."""

    def __init__(self, sampling: Sampling):
        super().__init__(sampling.seed ^ DRAFT_STREAM)
        self.sampling = sampling

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q for each row.  # [F, V] -> [F, V] float64"""
        return warped(logits, self.sampling)

    def without_replacement(self, q: torch.Tensor, k: int) -> torch.Tensor:
        """k tokens per row drawn from q without replacement, in draw order (the Gumbel-top-k trick: the order of
        log q + Gumbel noise is a sequential draw without replacement; one token: an inverse-CDF draw per row,
        one uniform instead of V).  # [F, V] -> [F, k] int64"""
        if k == 1:
            cdf = torch.cumsum(q, dim=-1)  # [F, V]
            u = torch.rand((q.shape[0], 1), generator=self.generator, dtype=cdf.dtype) * cdf[:, -1:]
            return torch.searchsorted(cdf, u, right=True).clamp_max(q.shape[-1] - 1)
        u = torch.rand(q.shape, generator=self.generator, dtype=torch.float64).clamp_min(1e-300)
        keys = torch.log(q) - torch.log(-torch.log(u))  # log 0 = -inf: tokens outside q's support come last
        return torch.topk(keys, min(k, q.shape[-1]), dim=-1).indices


class SampledAcceptance(_Uniforms):
    """The tree rule above, for one run (it owns the run's generator)."""

    name = "tree"
    argmax = False  # reads the verify pass's logits only

    def __init__(self, sampling: Sampling):
        super().__init__(sampling.seed)
        self.sampling = sampling

    def draw(self, logits: torch.Tensor) -> int:
        """One token from the target's distribution after `logits`, with the run's next uniform.  # [V]"""
        return self.pick(warped_rows(logits[None], self.sampling)[0])[0]

    def first(self, logits: torch.Tensor) -> int:
        return self.draw(logits)

    def __call__(self, tree: DraftTree, verify: Pass) -> Verdict:
        """Descend while the draws are children; the first draw that is not is the step's last token.
        verify.logits[0] after the root, [1 + i] after node i.  # [1 + n, V]"""
        logits = verify.logits
        children = tree.children_by_token()
        path: list[int] = []
        trials: list[Trial] = []
        node = -1
        ps = warped_rows(logits, self.sampling)  # the target's p after the root and after every node
        while True:
            p = ps[0 if node < 0 else 1 + node]
            tok, u = self.pick(p)
            kids = children.get(node, {})
            trials += [Trial(c, float(p[t]), tree.probs[c], u) for t, c in kids.items()]
            child = kids.get(tok)
            if child is None:
                return Verdict(path, [tree.tokens[i] for i in path], tok, trials)
            path.append(child)
            node = child


class RatioAcceptance(SampledAcceptance):
    """The ratio rule above, for a tree whose children the draft sampled without replacement from its q (each
    node's q in `tree.q_dists`; siblings in draw order). At a node with children x1..xm: accept x_k with
    probability min(1, p_k(x_k) / q_k(x_k)), where q_k is q with x1..x_{k-1} removed and renormalised and
    p_1 = p; an accepted child is descended into, a rejection sets p_{k+1} = normalize(max(0, p_k - q_k)); when
    no child is accepted the step ends with a draw from p_{m+1}. A chain (one child per node) is the classic
    rule above."""

    name = "ratio"

    def passes(self, p_x: float, q_x: float) -> tuple[bool, float]:
        """Accept with probability min(1, p_x / q_x): (accepted, the uniform of the test)."""
        u = self.uniform()
        return u * q_x < p_x, u

    def __call__(self, tree: DraftTree, verify: Pass) -> Verdict:
        logits = verify.logits
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(tree.parents):
            children.setdefault(parent, []).append(i)  # node order within a parent = draw order
        path: list[int] = []
        trials: list[Trial] = []
        node = -1
        ps = warped_rows(logits, self.sampling)
        while True:
            child, p = self._try_children(tree, children.get(node, []), ps[0 if node < 0 else 1 + node], trials)
            if child is None:
                return Verdict(path, [tree.tokens[j] for j in path], self.pick(p)[0], trials)
            path.append(child)
            node = child

    def _try_children(self, tree: DraftTree, kids: list[int], p: np.ndarray, trials: list[Trial]):
        """(the accepted child or None, the distribution to draw from when none is).  p: [V] float64"""
        q = None
        for c in kids:
            if q is None:
                if tree.q_dists[c] is None:
                    raise ValueError("the ratio rule needs a tree whose every token the draft sampled")
                q = np.zeros_like(p)
                drafted = np.asarray(tree.q_dists[c].cpu(), dtype=np.float64)
                q[: drafted.size] = drafted  # the draft's vocabulary can be a prefix of the target's
            x = tree.tokens[c]
            ok, u = self.passes(float(p[x]), float(q[x]))
            trials.append(Trial(c, float(p[x]), float(q[x]), u))
            if ok:
                return c, p
            residual = np.maximum(p - q, 0.0)  # zero only where rejection was impossible: then p itself
            total = float(residual.sum())
            p = residual / total if total > 0 else p
            q = self._without(q, x)
            if q is None:
                break
        return None, p

    @staticmethod
    def _without(q: np.ndarray, x: int) -> np.ndarray | None:
        """The law of the next sibling's draw: q without x, renormalised (None: nothing left to draw)."""
        q = q.copy()
        q[x] = 0.0
        total = float(q.sum())
        return q / total if total > 0 else None
