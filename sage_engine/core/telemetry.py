"""The step events the engine streams, made from what its stages measured: the one place a StepEvent and its
TreeView are built. A step's texts and tree view are handed over Deferred (made when a consumer first reads them):
the benchmark never reads them and never pays for them."""

from __future__ import annotations

import time

from ..policies import Policy
from .draft import Draft
from .events import Deferred, StepEvent, TreeView
from .transcript import Transcript
from .tree import DraftTree
from .verify import Verdict


class Telemetry:
    """StepEvents and TreeViews of one engine, with its tokenizer's single-token texts kept."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, tok: int) -> str:
        text = self._texts.get(tok)
        if text is None:
            text = self._texts[tok] = self.tokenizer.decode([tok])
        return text

    def tree_view(self, root: int, tree: DraftTree, drafted: int, verdict: Verdict, rule: str) -> TreeView:
        target_p: list[float | None] = [None] * len(tree)
        draft_q: list[float | None] = [None] * len(tree)
        draw_u: list[float | None] = [None] * len(tree)
        for t in verdict.trials:
            target_p[t.node], draft_q[t.node], draw_u[t.node] = round(t.p, 5), round(t.q, 5), round(t.u, 5)
        return TreeView(
            root_token=root,
            root_text=self.token_text(root),
            tokens=list(tree.tokens),
            texts=[self.token_text(t) for t in tree.tokens],
            parents=list(tree.parents),
            depths=list(tree.depths),
            probs=[round(p, 5) for p in tree.probs],
            cum_probs=[round(p, 5) for p in tree.cum_probs],
            drafted_nodes=drafted,
            rule=rule,
            target_p=target_p,
            draft_q=draft_q,
            draw_u=draw_u,
            alphas=[None if a is None else round(a, 5) for a in tree.alphas],
        )

    def event(self, step: int, policy: Policy, out: Transcript, ids: list[int], index: int, t0: float, *,
               target_ms: float, draft: Draft | None = None, view: Deferred | None = None,
               verdict: Verdict | None = None) -> StepEvent:
        """The StepEvent of step `step` (0: prefill; no draft), from what its stages measured; its own making is part
        of the step's other_ms (measured once it is made)."""
        shape = None if draft is None else draft.shape
        d_ms, d_fw, d_prefill = (0.0, 0, 0.0) if draft is None else (draft.ms, draft.forwards, draft.prefill_ms)
        alpha = shape.alpha if shape is not None else None
        price = shape.price if shape is not None else None
        event = StepEvent(
            step=step,
            kind="prefill" if step == 0 else "decode",
            policy=policy.name,
            alpha=alpha,
            entropy=None if alpha is None else 1.0 - alpha,
            root_alpha=None if draft is None else draft.tree.root_alpha,
            depth=0 if shape is None else shape.depth,
            width=0 if shape is None else shape.width,
            d_max=None if shape is None else shape.d_max,
            tree=view,
            accepted_nodes=[] if verdict is None else verdict.accepted,  # the verdict's lists: nothing changes them
            accepted_tokens=[] if verdict is None else verdict.accepted_tokens,
            bonus_token=None if verdict is None else verdict.bonus,
            new_token_ids=ids,
            new_text=Deferred(out.step_text, index),  # decoded when first read (Transcript.texts)
            accepted_text=Deferred(out.drafted_text, index),
            bonus_text=(self.token_text(verdict.bonus)
                        if verdict is not None and len(ids) > len(verdict.accepted_tokens) else None),
            target_ms=target_ms,
            draft_ms=d_ms,
            other_ms=0.0,
            draft_forwards=d_fw,
            total_tokens=len(out.ids),
            finished=out.finished,
            finish_reason=out.finish_reason,
            node_price=None if price is None else price.node,
            level_price=None if price is None else price.level,
            draft_prefill_ms=d_prefill,
            draft_path=None if draft is None or draft.path is None else draft.path.name,
            draft_path_why="" if draft is None or draft.path is None else draft.path.why,
            drafted_depth=0 if draft is None else draft.tree.depth,
            drafted_width=0 if draft is None else draft.tree.parents.count(-1),
            nodes=0 if draft is None else len(draft.tree),
        )
        event.other_ms = max(0.0, (time.perf_counter() - t0) * 1e3 - d_prefill - target_ms - d_ms)
        return event
