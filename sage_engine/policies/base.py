"""The policy interface: a strategy the engine asks before a step, while drafting, and after verification.

  reset()                                before a run: forget what earlier runs taught (the engine calls it)
  skip_draft(quote)                      before a step: True makes it a plain step (no draft, one target forward)
  shape(root_alpha, quote, probe)        after the draft's read: the tree's TreeShape (depth 0: no tree)
  expand(shape, level, tree, frontier)   while drafting, once per level: add nodes, return those to grow
  finalize(tree)                         the tree sent to verification (default: all of it)
  observe(outcome)                       after verification: learn (history, next alpha)

`quote` is the engine's measured costs at this step (costs.Quote), None where nothing is measured; only a priced
policy (priced.py) reads it, so that every other policy draws the same trees in every run.
A policy may also offer its rules as numbers (`step_rule`, `level_rule`) so that the draft's compiled step can run
them (draft_compiled.py); `draft_path` says which of its hooks allow that, and why not where they do not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..core.costs import Quote
from ..core.policy_io import PYTHON, DraftPath, Frontier, LevelRule, StepOutcome, StepRule, TreeShape
from ..core.tree import DraftTree


class Policy:
    """Base strategy. `top_k` is how many candidates per node the draft must return."""

    name = "base"
    uses_draft = True
    top_k = 1
    samples_draft = False  # under sampling: the draft samples its tokens (ratio rule) instead of ranking them
    entropy_k = 10  # k of the normalised top-k entropy behind alpha (SAGE's k; reported for every policy)
    node_alphas = False  # does the policy read each drafted node's alpha (DraftTree.alphas)? the root's is always there
    # the draft-only visual-token pruning this policy's draft reads its prompt with (pruning.VisualPruning), where the
    # engine sets none of its own (SpecEngine(draft_pruning=...) wins: a pruning sweep prunes every policy alike)
    draft_pruning = None

    @functools.cached_property
    def key(self) -> str:
        """The policy with its settings: the cost meter keeps step timings per key. Made once per settings object
        (make_policy shares one default object per class): hashing two dozen fields every run adds up."""
        cfg = getattr(self, "cfg", None)
        try:
            return by_identity(_KEYS, cfg, (self.name,), lambda: _key(self.name, cfg))
        except TypeError:  # settings that cannot be hashed (a subclass's own): made for this policy alone
            return f"{self.name}{cfg!r}"

    def reset(self) -> None:
        """A new run starts: a policy that learns within a run (SAGE's alpha and history) starts again here, so that
        one policy object used for several runs gives each the trees a fresh one would (default: nothing to forget)."""

    def skip_draft(self, quote: Quote | None = None) -> bool:
        """True: decode this step without drafting (default: a policy with a draft always drafts)."""
        return False

    def plain_shape(self) -> TreeShape:
        """The shape of a step decoded without a draft."""
        return TreeShape(depth=0, width=0, max_nodes=0)

    def shape(self, root_alpha: float | None, quote: Quote | None = None, probe=None) -> TreeShape:
        raise NotImplementedError

    def expand(self, shape: TreeShape, level: int, tree: DraftTree, frontier: Frontier) -> list[int]:
        """Add level `level` nodes to `tree` from `frontier`; return the nodes to expand next."""
        raise NotImplementedError

    def finalize(self, tree: DraftTree) -> DraftTree:
        """The tree actually sent to verification (default: everything drafted)."""
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        """Update internal state after a verified step (default: stateless)."""

    # ------------------------------------------------------------------ compiled forms
    def draft_path(self, sampled: bool) -> DraftPath:
        """The fastest path this policy's drafts may take where the draft's layers are the compiled ones (`sampled`:
        a sampled run). A policy without compiled rules drafts level by level in Python."""
        return DraftPath(PYTHON, f"{type(self).__name__} has no compiled form")

    def level_rule(self) -> LevelRule | None:
        """Its expansion as numbers for the compiled levels (only asked where `draft_path` allows them)."""
        return None

    def step_rule(self, quote: Quote | None) -> StepRule | None:
        """This step's shape and expansion as numbers for the one-call compiled step, or None where this step's shape
        needs more than its root's alpha (only asked where `draft_path` allows the compiled step)."""
        return None


def overridden(policy: Policy, base: type, names: tuple[str, ...]) -> list[str]:
    """The methods among `names` that `policy`'s class defines otherwise than `base`."""
    cls = type(policy)
    return [n for n in names if getattr(cls, n) is not getattr(base, n)]


def by_identity(store: dict, obj, key: tuple, make: Callable[[], object]):
    """make()'s value for the object `obj` (and `key`), made once and kept in `store` by obj's identity, obj held with
    it so that the identity stays obj's. The store starts again past 256 entries."""
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
