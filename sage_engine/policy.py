"""Decoding policies: how each step's draft tree is shaped, and how the shape learns from the last step.

A policy is a strategy with four verbs, called by the draft stage and the engine:
  skip_draft(quote)        -> bool       before a step: True makes it a plain step (no draft, one target forward)
  shape(root_alpha, quote, probe) -> TreeShape  after the draft's read (depth, width, budget; depth 0: no tree)
  expand(shape, level, tree, frontier) -> nodes to grow next   while drafting, once per level
  observe(outcome)         -> None       after verification (history, next alpha)
`quote` is the engine's measured costs for this step (costs.py), None where nothing is measured; the data the verbs
take and give (TreeShape, Frontier, Probe, StepOutcome) and the confidence alpha are in shapes.py.
Baselines are policies too; the engine has one loop for all of them.
Symbols follow the SAGE paper: alpha (confidence), D (depth), W (width), theta_l, N_max.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from .config import POLICY_CONFIGS, ChainConfig, Eagle2Config, SageConfig, StaticConfig, parse_spec
from .costs import BreakEven, Quote, robust_rate
from .shapes import Frontier, Probe, StepOutcome, TreeShape
from .tree import DraftTree


class Policy:
    """Base strategy. `top_k` is how many candidates per node the draft must return."""

    name = "base"
    uses_draft = True
    top_k = 1
    samples_draft = False  # under sampling: the draft samples its tokens (ratio rule) instead of ranking them
    entropy_k = 10  # k of the normalised top-k entropy behind alpha (SAGE's k; reported for every policy)
    node_alphas = False  # does the policy read each drafted node's alpha (DraftTree.alphas)? the root's is always there

    @functools.cached_property
    def key(self) -> str:
        """The policy with its settings: step timings are kept per key. Made once per policy, and once per setting
        across policies (`_key`): the repr of SageConfig's two dozen fields took ~24 us, ~55 us in a run's first step,
        and the CLI, the benchmark and the app make a fresh policy for every run."""
        cfg = getattr(self, "cfg", None)
        try:  # by the settings object first (make_policy's shared defaults), else by their value
            return by_identity(_KEYS, cfg, (self.name,), lambda: _key(self.name, cfg))
        except TypeError:  # settings that cannot be hashed (a subclass's own): made for this policy alone
            return f"{self.name}{cfg!r}"

    def skip_draft(self, quote: Quote | None = None) -> bool:
        """True: decode this step without drafting (default: a policy with a draft always drafts)."""
        return False

    def plain_shape(self) -> TreeShape:
        """The shape of a step decoded without a draft."""
        return TreeShape(depth=0, width=0, max_nodes=0)

    def shape(self, root_alpha: float | None, quote: Quote | None = None, probe: Probe | None = None) -> TreeShape:
        raise NotImplementedError

    def expand(self, shape: TreeShape, level: int, tree: DraftTree, frontier: Frontier) -> list[int]:
        """Add level `level` nodes to `tree` from `frontier`; return the nodes to expand next."""
        raise NotImplementedError

    def finalize(self, tree: DraftTree) -> DraftTree:
        """The tree actually sent to verification (default: everything drafted)."""
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        """Update internal state after a verified step (default: stateless)."""


def by_identity(store: dict, obj, key: tuple, make: Callable[[], object]):
    """make()'s value for the object `obj` (and `key`), made once and kept in `store` by obj's identity, obj held with
    it so that the identity stays obj's: a value per settings object without hashing its two dozen fields at every
    look-up (~10-20 us in a run's first step). The store starts again past 256 entries."""
    slot = (id(obj), *key)
    held = store.get(slot)
    if held is None or held[0] is not obj:
        if len(store) >= 256:
            store.clear()
        held = store[slot] = obj, make()
    return held[1]


_KEYS: dict[tuple, tuple[object, str]] = {}  # Policy.key by settings object (`by_identity`)


@functools.lru_cache(maxsize=256)
def _key(name: str, cfg) -> str:
    """Policy.key of a policy named `name` with settings `cfg` (a frozen dataclass, or None)."""
    return name if cfg is None else f"{name}{cfg!r}"


class AutoregressivePolicy(Policy):
    """`ar`: the target alone, one token per forward."""

    name = "ar"
    uses_draft = False

    def shape(self, root_alpha, quote=None, probe=None):
        return self.plain_shape()

    def expand(self, shape, level, tree, frontier):
        return []


class ChainPolicy(Policy):
    """`chain`: classic speculative decoding, a chain of k draft tokens."""

    name = "chain"

    def __init__(self, cfg: ChainConfig = ChainConfig()):
        self.cfg = cfg
        self.samples_draft = cfg.draw == "sample"

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.k, width=1, max_nodes=self.cfg.k, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        tokens, probs = ((frontier.top_tokens, frontier.top_probs) if frontier.drawn_tokens is None
                         else (frontier.drawn_tokens, frontier.drawn_probs))
        node = tree.add(tokens[0][0], frontier.nodes[0], probs[0][0])
        return [node] if level < shape.depth else []


class StaticTreePolicy(Policy):
    """`static`: a fixed tree given as rank paths (default: the 25-node SpecVLM/Medusa tree)."""

    name = "static"

    def __init__(self, cfg: StaticConfig = StaticConfig()):
        paths = sorted(set(tuple(p) for p in cfg.paths), key=lambda p: (len(p), p))
        for p in paths:
            if len(p) > 1 and p[:-1] not in paths:
                raise ValueError(f"static tree path {p} has no parent path {p[:-1]}")
        self.child_ranks: dict[tuple[int, ...], list[int]] = {}
        for p in paths:
            self.child_ranks.setdefault(p[:-1], []).append(p[-1])
        self.depth = max(len(p) for p in paths)
        self.n_nodes = len(paths)
        self.top_k = max(p[-1] for p in paths) + 1
        self._path_of: dict[int, tuple[int, ...]] = {}

    def shape(self, root_alpha, quote=None, probe=None):
        self._path_of = {-1: ()}
        return TreeShape(depth=self.depth, width=len(self.child_ranks[()]), max_nodes=self.n_nodes, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        grow = []
        for row, parent in enumerate(frontier.nodes):
            prefix = self._path_of[parent]
            for rank in self.child_ranks.get(prefix, ()):
                node = tree.add(frontier.top_tokens[row][rank], parent, frontier.top_probs[row][rank])
                self._path_of[node] = prefix + (rank,)
                if self._path_of[node] in self.child_ranks:
                    grow.append(node)
        return grow


def _best_candidates(frontier: Frontier, tree: DraftTree, per_row: Sequence[int], limit: int, floor: float):
    """(row, rank, cumulative prob) of the best candidates, at most per_row[row] per frontier row,
    cumulative probability above `floor`, at most `limit` in all, best first."""
    found = []
    for row, (node, probs) in enumerate(zip(frontier.nodes, frontier.top_probs)):
        parent = 1.0 if node < 0 else tree.cum_probs[node]
        for rank, p in enumerate(probs[: per_row[row]]):
            if parent * p > floor:
                found.append((row, rank, parent * p))
    found.sort(key=lambda c: -c[2])  # stable: ties stay in (row, rank) order
    return found[: max(limit, 0)]


class Eagle2Policy(Policy):
    """`eagle2`: expand the top-k nodes by cumulative draft probability per level, rerank all, keep N."""

    name = "eagle2"

    def __init__(self, cfg: Eagle2Config = Eagle2Config()):
        self.cfg = cfg
        self.top_k = cfg.top_k

    def shape(self, root_alpha, quote=None, probe=None):
        return TreeShape(depth=self.cfg.depth, width=self.cfg.top_k, max_nodes=self.cfg.total_nodes, alpha=root_alpha)

    def expand(self, shape, level, tree, frontier):
        k = self.cfg.top_k
        # A candidate outside its level's top N can never reach the global top N: skip it early.
        best = _best_candidates(frontier, tree, [k] * len(frontier.nodes), self.cfg.total_nodes, 0.0)
        added = [
            tree.add(frontier.top_tokens[r][c], frontier.nodes[r], frontier.top_probs[r][c]) for r, c, _ in best
        ]
        return added[:k] if level < shape.depth else []  # `best` is sorted: the first k are the top-k

    def finalize(self, tree):
        order = sorted(range(len(tree)), key=lambda i: (-tree.cum_probs[i], tree.depths[i], i))
        return tree.subtree(order[: self.cfg.total_nodes])


class SagePolicy(Policy):
    """`sage`: entropy-guided depth and width, width decay, thresholds, history controller on D_max."""

    name = "sage"

    def __init__(self, cfg: SageConfig = SageConfig()):
        self.cfg = cfg
        self.samples_draft = cfg.draw == "sample"
        self.top_k = cfg.w_max  # candidates per node: at most W_max children
        self.entropy_k = cfg.k
        self.node_alphas = cfg.alpha_source == "prev_path"  # the accepted path's alphas plan the next tree
        self.alpha = cfg.alpha0  # confidence planned for the next tree
        self.d_max = cfg.d_max  # moved by the history controller
        self.history: list[int] = []
        self._cooldown = 0
        self.price: BreakEven | None = None  # the last shape's prices (threshold "cost", once measured)
        self._plain_left = 0  # plain steps still to take before the draft is tried again (threshold "cost")
        self._backoff = cfg.fallback_steps  # plain steps after the next drafted stretch that loses to plain steps
        self._drafted: list[tuple[int, float]] = []  # this run's drafted steps: (tokens, wall ms)
        self._trying = False  # the step after a plain stretch is a try: the draft reads, its probe decides
        self.probing = False  # this step is a try after plain steps: its shape depends on the probe, not alpha alone
        self._declined = False  # the probe said no: this step's read is not a drafted step to judge
        self._started = False  # has this run asked skip_draft() yet?
        # where in `_drafted` the judge's window starts: None, the run's first drafted step (judged from two steps on);
        # after a try the probe let through, the try's first step (judged once it holds a whole window)
        self._window_from: int | None = None

    # Eq. 10-11, rounding half up (open in the paper).
    def depth_for(self, alpha: float) -> int:
        d = self.cfg.d_min + alpha * (self.d_max - self.cfg.d_min)
        return max(1, min(self.cfg.max_depth_cap, int(math.floor(d + 0.5))))

    def width_for(self, alpha: float) -> int:
        w = self.cfg.w_min + (1.0 - alpha) * (self.cfg.w_max - self.cfg.w_min)
        return max(1, int(math.floor(w + 0.5)))

    def skip_draft(self, quote: Quote | None = None) -> bool:
        """Threshold "cost": fall back to plain steps while this run's drafted steps decode slower than plain ones.

        The judge is this run's last `fallback_window` drafted steps against the engine's plain rate (measured
        on plain steps, else estimated from drafted steps, costs.py): they lose when their rate plus `fallback_z`
        standard errors is below it (costs.robust_rate); a run's first step is judged by the
        engine's last drafted steps of this policy (a draft that kept losing on the last inputs starts a new
        one with 8x `fallback_steps` plain steps; the draft reads the prompt only when tried, so a short answer
        never pays for it, while a longer one on an input the draft knows loses only its first steps). While
        they lose, the next `_backoff` steps are plain, then the draft is tried: it reads what it missed, and
        `shape()` drafts only if its agreement with those tokens (the probe) would beat plain steps. A try the
        probe lets through is judged once it has drafted `fallback_window` steps of its own, on those alone: judged
        from its first step, its window still held the drafted steps that lost before the wait, and a short first
        step undid the probe's evidence. Each losing try doubles the wait (up to 8x `fallback_steps`), a winning
        one resets it."""
        if self.cfg.threshold != "cost" or quote is None or self.cfg.fallback_steps < 1:
            return False
        if self._plain_left > 0:
            self._plain_left -= 1
            return True
        plain = quote.plain_rate()
        if not self._started:  # a run starts where the engine's last runs of this policy left off
            self._started = True
            earlier = quote.drafted_rate(self.cfg.fallback_z)
            if plain is not None and earlier is not None and earlier < plain:
                self._backoff = 8 * self.cfg.fallback_steps  # the longest wait: the draft lost on earlier inputs
                return self._fall_back()
        window, start = self.cfg.fallback_window, self._window_from
        recent = self._drafted[max(start or 0, len(self._drafted) - window) :]
        if self._trying or len(recent) < (2 if start is None else window) or plain is None:
            self.probing, self._trying = self._trying, False
            return False
        if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= plain:
            self._backoff = self.cfg.fallback_steps
            return False
        return self._fall_back()

    def _fall_back(self) -> bool:
        """This step and the next `_backoff` - 1 are plain, then the draft is tried; the wait doubles."""
        self._plain_left, self._trying = self._backoff - 1, True
        self._backoff = min(8 * self.cfg.fallback_steps, 2 * self._backoff)
        return True

    def plain_shape(self) -> TreeShape:
        return TreeShape(depth=0, width=0, max_nodes=0, d_max=self.d_max)

    def shape(self, root_alpha, quote=None, probe=None):
        alpha = root_alpha if (self.cfg.alpha_source == "current_root" and root_alpha is not None) else self.alpha
        probing, self.probing = self.probing, False
        if probing and probe is not None and probe.pairs and quote is not None:
            if quote.chain_pays(probe.agreement, self.depth_for(1.0)) is False:  # a try the probe turns down
                self._fall_back()
                self._declined = True
                return TreeShape(0, 0, 0, alpha, self.d_max)
        if probing:  # a try the probe let through (on pairs it read) is judged on a window of its own steps
            self._window_from = len(self._drafted) if probe is not None and probe.pairs else None
        price = self.prices(quote)
        return TreeShape(self.depth_for(alpha), self.width_for(alpha), self.cfg.n_max, alpha, self.d_max, price)

    def prices(self, quote: Quote | None) -> BreakEven | None:
        """This step's node and level prices (threshold "cost", once measured; else None), kept in `price`."""
        self.price = quote.break_even() if self.cfg.threshold == "cost" and quote is not None else None
        return self.price

    def expand(self, shape, level, tree, frontier):
        cfg = self.cfg
        if level == 1:
            per_row = [shape.width] * len(frontier.nodes)
        else:  # Eq. 12: W_l = W * (1/l) * (0.5 + P_parent), ceil so a likely parent keeps a child
            per_row = [math.ceil(shape.width / level * (cfg.width_parent_bias + (tree.probs[n] if n >= 0 else 1.0)))
                       for n in frontier.nodes]
        theta = cfg.theta_scale * level / shape.depth
        if shape.price is not None:  # threshold "cost": a node must also pay for its verification
            theta = max(theta, shape.price.node)
        best = _best_candidates(frontier, tree, per_row, shape.max_nodes - len(tree), theta)
        if frontier.drawn_tokens is None:
            added = [tree.add(frontier.top_tokens[r][c], frontier.nodes[r], frontier.top_probs[r][c])
                     for r, c, _ in best]
        else:  # a sampled draft: as many children per row as the ranked candidates earned, the first drawn ones
            counts = [sum(r == row for row, _, _ in best) for r in range(len(frontier.nodes))]
            added = [tree.add(frontier.drawn_tokens[r][c], frontier.nodes[r], frontier.drawn_probs[r][c])
                     for r in range(len(frontier.nodes)) for c in range(counts[r])]
        if shape.price is not None and sum(c for *_, c in best) < shape.price.level:
            return []  # the next level could not add the tokens one more draft forward costs
        return added if level < shape.depth else []

    def observe(self, outcome):
        cfg = self.cfg
        if not outcome.drafted or self._declined:  # a plain step (or a turned-down try) says nothing of the draft
            self._declined = False
            return
        if not outcome.stalled:  # judged against the meter's plain rate, which leaves such steps out too
            self._drafted.append((outcome.tokens_this_step, outcome.wall_ms))
        tree, path = outcome.tree, outcome.accepted
        if cfg.alpha_source == "prev_root" and tree.root_alpha is not None:
            self.alpha = tree.root_alpha
        elif cfg.alpha_source == "prev_path":
            seen = [tree.root_alpha] + [tree.alphas[n] for n in path]
            seen = [a for a in seen if a is not None]
            if seen:
                self.alpha = float(sum(seen) / len(seen))
        # History controller: sliding window of tokens per step.
        self.history = (self.history + [outcome.tokens_this_step])[-cfg.history_window :]
        if self._cooldown > 0:
            self._cooldown -= 1
            return
        mean = sum(self.history) / len(self.history)
        lo, hi = cfg.d_max_bounds
        if mean < cfg.history_low and self.d_max > lo:
            self.d_max = max(lo, self.d_max - cfg.history_step)
            self._cooldown = cfg.history_cooldown
        elif mean > cfg.history_high and self.d_max < hi:
            self.d_max = min(hi, self.d_max + cfg.history_step)
            self._cooldown = cfg.history_cooldown


_CLASSES = (AutoregressivePolicy, ChainPolicy, StaticTreePolicy, Eagle2Policy, SagePolicy)
_POLICIES = {cls.name: (cls, POLICY_CONFIGS[cls.name]) for cls in _CLASSES}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)  # the one list of the engine's policy names
SPECULATIVE_POLICIES: tuple[str, ...] = tuple(n for n, (cls, _) in _POLICIES.items() if cls.uses_draft)


_DEFAULT_CONFIGS: dict[type, object] = {}


def make_policy(name: str, config=None) -> Policy:
    """A fresh policy by name; `config` overrides the defaults of that policy's dataclass.

    `name` may also be a spec with overridden knobs, `sage:n_max=32:d_max=10` (see `parse_spec`)."""
    if ":" in name and config is None:
        name, config = parse_spec(name)
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(_POLICIES)}")
    cls, cfg_cls = _POLICIES[name]
    if cfg_cls is None:
        return cls()
    if config is None:  # the settings are frozen: one default object per class, shared by the policies made with it
        config = _DEFAULT_CONFIGS.get(cfg_cls) or _DEFAULT_CONFIGS.setdefault(cfg_cls, cfg_cls())
    return cls(config)
