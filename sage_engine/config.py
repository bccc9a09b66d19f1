"""Hyperparameters of every decoding policy, as frozen dataclasses with the papers' defaults.

One comment per field. Where the SAGE paper leaves a choice open, the field says
what we chose and why; every such choice is configurable.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, get_args

# The 25-node, depth-5 static tree of SpecVLM / Medusa (nodes per level 4/8/8/3/2).
# Each path lists the rank of the chosen child among the draft's top-k at every level.
MEDUSA_25: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)


Draw = Literal["sample", "top"]  # how a policy's draft chooses its tokens under sampling
DRAWS: tuple[str, ...] = get_args(Draw)


@dataclass(frozen=True)
class ChainConfig:
    """Classic speculative decoding: the draft proposes one chain."""

    k: int = 5  # chain length (draft tokens per step)
    # Under sampling (greedy ignores it): "sample" draws each draft token from the draft's warped distribution q
    # and the target accepts it with probability min(1, p/q) (the classic rule; same distribution as the target
    # alone, a different draw for a seed); "top" drafts the draft's top-1 token and verifies with the tree rule
    # (the target's own draw: the target-only sample of the same seed, token for token).
    draw: Draw = "sample"

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"chain knobs: k must be an integer >= 1 (got {self.k!r})")
        if self.draw not in DRAWS:
            raise ValueError(f"chain knobs: unknown draw {self.draw!r}; choose one of {', '.join(DRAWS)}")


@dataclass(frozen=True)
class StaticConfig:
    """A fixed token tree, given as data: a list of rank paths."""

    paths: tuple[tuple[int, ...], ...] = MEDUSA_25  # default: SpecVLM/Medusa 25-node depth-5 tree


@dataclass(frozen=True)
class Eagle2Config:
    """EAGLE-2 dynamic tree: expand by cumulative draft probability, rerank, keep the best N."""

    depth: int = 6  # levels drafted
    top_k: int = 10  # children per expanded node, and nodes expanded per level
    total_nodes: int = 64  # nodes kept after reranking all candidates (excluding the root)


@dataclass(frozen=True)
class VisualPruning:
    """Fractions of visual tokens the draft does NOT read (`--draft-prune`, and `specvlm`'s defaults)."""

    image: float = 0.8  # paper: 80% of image tokens pruned
    video: float = 0.9  # paper: 90% of video tokens pruned

    def __post_init__(self):
        for v in (self.image, self.video):
            if not 0.0 <= v < 1.0:
                raise ValueError("pruning ratios must be in [0, 1)")

    @property
    def active(self) -> bool:
        """Does it leave any visual token out? (0, 0) has the draft read the whole prompt, on the unpruned prefill."""
        return self.image > 0 or self.video > 0


@dataclass(frozen=True)
class SpecVLMConfig(Eagle2Config):
    """SpecVLM as the SAGE paper runs it: an EAGLE-2 tree whose draft reads only part of the visual tokens."""

    image_prune: float = VisualPruning.image  # fraction of the image tokens the draft does not read (the paper: 80%)
    video_prune: float = VisualPruning.video  # fraction of the video tokens the draft does not read (the paper: 90%)

    def __post_init__(self):
        for v in (self.image_prune, self.video_prune):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ValueError(f"specvlm knobs: pruning ratios must be in [0, 1) (got {v!r})")


AlphaSource = Literal["prev_path", "prev_root", "current_root"]
ALPHA_SOURCES: tuple[str, ...] = get_args(AlphaSource)
Threshold = Literal["paper", "cost"]
THRESHOLDS: tuple[str, ...] = get_args(Threshold)


@dataclass(frozen=True)
class SageConfig:
    """SAGE: entropy-guided tree shape (Eq. 7-12) plus the history controller on D_max."""

    k: int = 10  # top-k of the draft distribution used for the normalised entropy (Eq. 7-9)
    d_min: int = 3  # D_min: depth at alpha = 0
    # D_max: depth at alpha = 1 (initial value; the history controller moves it). Ours: 16, the top of the
    # controller's bounds (the engine's depth cap); the paper starts at 8 (`sage:d_max=8`). A run's first tree is
    # the one the controller cannot have shaped yet, and an answer's opening is the draft's surest stretch: on fresh
    # tinyworld scenes a first tree cut at depth 8 accepted 8.4 of the 9 tokens it could give. With the two-layer
    # draft, right 9 times in 10 on fresh scenes, 16 made `sage` 2-5% faster than 12 there (2-3% slower on real
    # photos). Priced (`priced:sage`), every level beyond the first pays its own measured cost, so an unsure draft
    # stops sooner.
    d_max: int = 16
    w_min: int = 2  # W_min: root width at alpha = 1
    w_max: int = 10  # W_max: root width at alpha = 0
    n_max: int = 64  # N_max: node budget per tree (excluding the root)
    theta_scale: float = 0.1  # theta_l = theta_scale * l / D(alpha): cumulative-probability threshold
    width_parent_bias: float = 0.5  # W_l = W * (1/l) * (width_parent_bias + P_parent) for l > 1
    alpha0: float = 0.5  # confidence before the first step ("confidence starts at 0.5")
    # Open in the paper: which draft distribution feeds alpha for the NEXT tree.
    #  prev_path: mean alpha over the draft distributions of step t's accepted path (incl. root);
    #  prev_root: alpha of step t's root distribution only (the paper's "planned from step t");
    #  current_root: alpha of the new tree's own root distribution (not in the paper; it is free here
    #                because the draft computes that distribution before growing the tree). The default:
    #                `bench` reports how well each source predicts the accepted length; on the embedded pair
    #                only the current root's alpha does (the paper's step-to-step correlation is absent there).
    alpha_source: AlphaSource = "current_root"
    # Open in the paper: rounding of D(alpha) and W(alpha). We round half up; W_l uses ceil so a
    # confident parent keeps at least one child (the threshold theta_l does the pruning).
    history_window: int = 10  # sliding window of acceptance lengths
    history_low: float = 2.0  # mean accepted length below this lowers D_max
    history_high: float = 3.0  # above this raises D_max
    history_step: int = 1  # open in the paper: D_max change per adjustment
    d_max_bounds: tuple[int, int] = (4, 16)  # open in the paper: D_max stays within these
    history_cooldown: int = 0  # open: steps to wait after an adjustment before the next one (0 = every step)
    # "paper" (the default): the paper's theta_l and N_max, every step drafted; the same input and settings give the
    # same trees in every run. "cost" asks for this machine's prices (ours, not in the paper): `make_policy` then
    # wraps the policy in policies/priced.py's PricedPolicy, as `priced:sage` does (PricedConfig's knobs); a
    # SagePolicy made directly is unpriced whatever this says.
    threshold: Threshold = "paper"
    # Under sampling (greedy ignores it), not in the paper: "top" builds the tree from the draft's top candidates
    # and the target draws at each node (the tree rule: the target-only sample of the same seed); "sample" gives
    # each node as many children as the top candidates earn, drawn from q without replacement, verified with the
    # ratio rule (same distribution, a different draw; higher acceptance where p and q are flat).
    draw: Draw = "top"
    max_depth_cap: int = field(default=16, repr=False)  # hard ceiling on any tree depth

    def __post_init__(self):
        """Refuse inconsistent knobs with one line (the CLI, the app and the API all show this message)."""
        problem = sage_problem(self)
        if problem:
            raise ValueError(f"SAGE knobs: {problem}")


def sage_problem(cfg: SageConfig) -> str | None:
    """What is wrong with `cfg`'s knobs, or None."""
    numbers = {f: getattr(cfg, f) for f in ("k", "d_min", "d_max", "w_min", "w_max", "n_max", "theta_scale",
                                            "width_parent_bias", "alpha0", "history_low", "history_high")}
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name} must be a finite number (got {value!r})"
    if not 1 <= cfg.d_min <= cfg.d_max <= cfg.max_depth_cap:
        return f"need 1 <= D_min <= D_max <= {cfg.max_depth_cap} (got {cfg.d_min}, {cfg.d_max})"
    if not 1 <= cfg.w_min <= cfg.w_max:
        return f"need 1 <= W_min <= W_max (got {cfg.w_min}, {cfg.w_max})"
    if cfg.k < 2 or cfg.n_max < 1 or not 0.0 <= cfg.theta_scale <= 1.0:
        return f"need k >= 2, N_max >= 1 and 0 <= theta scale <= 1 (got {cfg.k}, {cfg.n_max}, {cfg.theta_scale})"
    if not 0.0 <= cfg.alpha0 <= 1.0:
        return f"need 0 <= alpha0 <= 1 (got {cfg.alpha0})"
    if cfg.alpha_source not in ALPHA_SOURCES:
        return f"unknown alpha source {cfg.alpha_source!r}; choose one of {', '.join(ALPHA_SOURCES)}"
    if cfg.threshold not in THRESHOLDS:
        return f"unknown threshold {cfg.threshold!r}; choose one of {', '.join(THRESHOLDS)}"
    if cfg.draw not in DRAWS:
        return f"unknown draw {cfg.draw!r}; choose one of {', '.join(DRAWS)}"
    if cfg.history_window < 1:
        return "need history_window >= 1"
    return None


@dataclass(frozen=True)
class PricedConfig:
    """A policy priced by this machine's measured costs (`priced:NAME`, policies/priced.py; not in the paper, ours).

    A node needs trusted cumulative probability >= rate x ms per node (on top of the policy's own rule), another
    draft level needs its frontier's to sum >= rate x ms per draft level (a policy that reads `TreeShape.price`:
    SAGE), and while drafted steps decode slower than plain ones the policy takes plain steps (no draft), retrying
    the draft with a growing wait (a retry drafts only if the draft's guesses among the tokens it missed would pay)."""

    fallback_steps: int = 2  # plain steps after drafted ones first lose to plain ones (0: never fall back)
    fallback_window: int = 4  # this run's last drafted steps that judge the draft
    # drafted steps lose only where their rate plus this many of its standard errors is below the plain rate (0: their
    # measured rate alone). Four drafted steps of a draft that often agrees with the target on an input it does not
    # know make 1 to a dozen tokens each, and their rate alone falls below the plain one by chance; a plainly wrong
    # draft makes one token every step, and its four steps are evidence at once
    fallback_z: float = 1.0

    def __post_init__(self):
        z = self.fallback_z
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z):
            raise ValueError(f"priced knobs: fallback_z must be a finite number (got {z!r})")
        if self.fallback_steps < 0 or self.fallback_window < 1 or z < 0:
            raise ValueError("priced knobs: need fallback_steps >= 0, fallback_window >= 1 and fallback_z >= 0")


# Each policy's config dataclass (None: no knobs), by policy name; policies/ pairs them with the classes.
POLICY_CONFIGS: dict[str, type | None] = {
    "ar": None, "chain": ChainConfig, "static": StaticConfig, "eagle2": Eagle2Config, "specvlm": SpecVLMConfig,
    "sage": SageConfig,
}

# The policies that draft: every one but `ar`, in POLICY_CONFIGS' order. Here, beside the names, so that the demo
# can list them without importing the policies (and with them torch and Numba); policies/ derives the same tuple
# from its classes' `uses_draft`, and tests/test_app_background_load.py checks that the two agree.
SPECULATIVE_POLICIES: tuple[str, ...] = tuple(name for name in POLICY_CONFIGS if name != "ar")

# SAGE as the paper publishes it (its node thresholds, D_max 8), as a policy spec: what the experiments, the
# compare view and the doctor set beside the project's own `sage`
PAPER_SAGE = "sage:threshold=paper:d_max=8"


PRICED_PREFIX = "priced:"  # `priced:SPEC`: SPEC priced by this machine's measured costs (policies/priced.py)


def parse_spec(spec: str):
    """'sage:n_max=32:theta_scale=0.2' -> ('sage', SageConfig(n_max=32, theta_scale=0.2)): a policy with some
    scalar knobs of its config dataclass changed (for benchmarks that compare settings); ValueError if unknown.
    A priced spec (`priced:sage:d_max=8`) gives the wrapped policy's name and settings."""
    name, changes = spec_knobs(spec)
    cfg_cls = POLICY_CONFIGS[name]
    return name, None if cfg_cls is None else dataclasses.replace(cfg_cls(), **changes)


def spec_knobs(spec: str) -> tuple[str, dict]:
    """'chain:k=3' -> ('chain', {'k': 3}): the policy's name and the knobs the spec changes, typed like its
    config's fields; ValueError (one line) for an unknown policy, knob or value. `priced:SPEC`: SPEC's."""
    if spec.startswith(PRICED_PREFIX):
        spec = spec[len(PRICED_PREFIX):]
    name, *pairs = spec.split(":")
    if name not in POLICY_CONFIGS:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_CONFIGS)}")
    cfg_cls = POLICY_CONFIGS[name]
    if cfg_cls is None:
        if pairs:
            raise ValueError(f"policy {name!r} has no knobs")
        return name, {}
    cfg = cfg_cls()
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        current = getattr(cfg, key, None)
        if not sep or key.startswith("_") or not isinstance(current, (int, float, str)) or isinstance(current, bool):
            raise ValueError(f"{spec!r}: {key!r} is not a scalar knob of {cfg_cls.__name__}")
        try:
            changes[key] = type(current)(value)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(type(current), f"a {type(current).__name__}")
            raise ValueError(f"{spec!r}: {key} must be {kind} (got {value!r})") from None
    dataclasses.replace(cfg, **changes)  # the config checks the values (SageConfig: one "SAGE knobs:" line)
    return name, changes
