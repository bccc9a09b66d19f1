"""The speculative decoding engine: one loop, every policy, a stream of step events.

Contract: `stream()` is the one generator every consumer reads (CLI, benchmark, app);
`generate()` consumes it. The engine knows the ORDER of the stages and nothing else:
  0. prefill   the target reads the prompt; its argmax is the first token (the draft reads the prompt
               with the first step that drafts: a run of plain steps never pays for it)
  1. draft     the policy shapes a tree, the draft grows it            (draft.py, policies/)
  2. verify    one target forward over [root, tree]                     (verify.py)
  3. accept    longest agreeing path + the target's bonus token         (verify.py)
  4. compact   both KV caches keep only the accepted path               (cache.py via runner.py)
  5. observe   the policy learns from the outcome (alpha, D_max), the
               engine's cost meter from the step's timings             (policies/, costs.py)
The output equals the target's own decoding: greedy, every emitted token is a target argmax; sampling
(sampling.py), the output has the target's sampling distribution (under the tree rule, the very draws the
target alone makes with the same seed).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import torch
from PIL import Image
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from .costs import CostMeter, Quote, StepTiming
from .draft import Draft, Drafter
from .errors import InputError
from .events import Deferred, GenerationResult, StepEvent, TreeView, summarize
from .families import shared_vocab
from .inputs import PreparedInput, prepare_input
from .models import ModelPair
from .policies import Policy, make_policy
from .policy_io import StepOutcome
from .pruning import VisualPruning
from .runner import ModelRunner
from .sampling import RatioAcceptance, SampledAcceptance, Sampling
from .tree import DraftTree
from .tree import warm as warm_verify_inputs
from .verify import GreedyAcceptance, Verdict, verify_tree


def text_decoder(tokenizer) -> Callable[[list[int]], str]:
    """ids -> text as `tokenizer.decode(ids, skip_special_tokens=True)` gives it. Where that call is only the Rust
    tokenizer's own decode (a `tokenizers`-backed tokenizer with transformers' own decode, no clean-up of spaces), the
    Rust decode is called directly: a third of the time (~2 against ~5.5 us a call on this CPU), and the transcript
    decodes up to four short windows a step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cls = type(tokenizer)
    plain = cls.decode is PreTrainedTokenizerBase.decode and getattr(cls, "_decode", None) is TokenizersBackend._decode
    if plain and backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


class Transcript:
    """The output so far, with the stopping rules: EOS, token budget, stop strings. Its text is decoded when first
    asked for (`texts`), step by step in order: a consumer that reads no step's text (the benchmark) never pays for it,
    as transformers' generate() decodes only for a streamer."""

    def __init__(self, tokenizer, eos: set[int], budget: int, stop: tuple[str, ...]):
        self.eos, self.budget, self.stop = eos, budget, tuple(s for s in stop if s)
        self.decode = text_decoder(tokenizer)
        self.ids: list[int] = []
        self.text = ""  # the text of the steps decoded so far
        self.finish_reason: str | None = None
        self._prefix = self._read = 0  # incremental detokenisation window: ids[_prefix:] is re-decoded
        # per step: ids after its drafted tokens, ids after it, did it draft, was it the run's last; appended after its
        # ids, so that another thread reading the texts (the app's) never sees a step whose ids are not there yet
        self._marks: list[tuple[int, int, bool, bool]] = []
        self._texts: list[tuple[str, str]] = []  # per decoded step: (text of its drafted tokens, of the rest)

    def extend(self, tokens: list[int], drafted: int = 0) -> tuple[list[int], int]:
        """Append what a step produced (its first `drafted` tokens from the draft, the rest the target's own),
        truncated by the stopping rules; returns (ids added, the step's index for `texts`)."""
        take = tokens[: max(0, self.budget - len(self.ids))]
        if self.eos and not self.eos.isdisjoint(take):  # cut after the first end-of-sequence token
            take = take[: next(i for i, tok in enumerate(take) if tok in self.eos) + 1]
            self.finish_reason = "eos"
        if self.stop:
            take = self._cut_at_stop(take)
        if len(self.ids) + len(take) >= self.budget and self.finish_reason is None:
            self.finish_reason = "length"
        start = len(self.ids)
        self.ids += take
        self._marks.append((start + min(drafted, len(take)), start + len(take), drafted > 0, self.finished))
        return take, len(self._marks) - 1

    def step_text(self, step: int) -> str:
        """The text step `step` added."""
        return "".join(self.texts(step))

    def drafted_text(self, step: int) -> str:
        """The start of it that the step's accepted draft tokens wrote."""
        return self.texts(step)[0]

    def texts(self, step: int) -> tuple[str, str]:
        """(text of step `step`'s drafted tokens, text of the rest of it), decoding the steps up to it in order. A
        character whose bytes are split between tokens is given with the token that completes it."""
        while len(self._texts) <= step:
            drafted_end, end, drafted, last = self._marks[len(self._texts)]
            from_draft = self._new_text(drafted_end, last) if drafted else ""
            self._texts.append((from_draft, self._new_text(end, last)))
        return self._texts[step]

    def _new_text(self, end: int, last: bool) -> str:
        """Text of ids[_read:end], decoding only a short window (the previous chunk gives context); `last`: of the
        run's final step (a split character is not waited for)."""
        ids = self.ids
        before = self.decode(ids[self._prefix : self._read])
        window = self.decode(ids[self._prefix : end])
        if window.endswith("\ufffd") and not last:
            return ""  # an unfinished multi-byte character: wait for the next tokens
        self._prefix, self._read = self._read, end
        if window.startswith(before):
            added = window[len(before) :]
            self.text += added
            return added
        full = self.decode(ids[:end])  # bytes regrouped across the window edge: resynchronise
        added = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text = full
        return added

    def _cut_at_stop(self, take: list[int]) -> list[int]:
        for j in range(1, len(take) + 1):
            tail = self.decode(self.ids + take[:j])[-(max(map(len, self.stop)) + 64) :]
            if any(s in tail for s in self.stop):
                self.finish_reason = "stop_string"
                return take[:j]
        return take

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# torch.inference_mode()'s own guard, which that context manager enters through a few Python frames of its own (~2.4
# against ~0.5 us a call warm, several times that right after a model forward); the public one where torch has none
_inference_mode = getattr(torch._C, "_InferenceMode", torch.inference_mode)

TREE_FORWARDS = ("fused", "layers", "forward")  # SpecEngine(tree_forward=...), the CLI's --tree-forward


class SpecEngine:
    """Lossless tree speculative decoding of a target VLM with a draft VLM (batch of one)."""

    def __init__(self, pair: ModelPair, acceptance=None, draft_pruning: VisualPruning | None = None,
                 tree_forward: str = "fused", keep_prompt: bool = False):
        """draft_pruning: feed the draft only part of the visual tokens (draft-only; output unchanged).
        tree_forward: how both models' cached steps run (runner.py): "fused", each model's layers computed with fused
        products where checked close to forward() (fused.py; on transposed or oneDNN-packed weight copies, or for the
        draft in NumPy (host.py), whichever the runner times faster);
        "layers", the target's through its own decoder layers where checked bit-identical to forward() (stack.py),
        the draft's fused; "forward", both through forward().
        keep_prompt: runs on the same PreparedInput as the last one reuse both models' prefilled caches
        (runner.py); for many draws on one prompt, never where prefill is timed."""
        if tree_forward not in TREE_FORWARDS:
            raise ValueError(f"unknown tree_forward {tree_forward!r}; choose one of {', '.join(TREE_FORWARDS)}")
        self.pair = pair
        self.draft_pruning = draft_pruning
        self.tokenizer = pair.tokenizer
        stack = tree_forward != "forward"
        self.target = ModelRunner(pair.target, layer_stack=stack, fused=tree_forward == "fused")
        self.draft = None
        if pair.draft is not None:
            self.draft = ModelRunner(pair.draft, vocab_limit=shared_vocab(pair.target, pair.draft),
                                     layer_stack=stack, fused=stack, row_invariant=False)
        self.drafter = Drafter(self.draft, draft_pruning) if self.draft is not None else None
        if self.drafter is not None:
            warm_verify_inputs()  # the compiled builder of a verify pass's inputs, loaded now, not in a first step
        words = (self.tokenizer.encode("A check of the layers.", add_special_tokens=False) * 8)[:8]
        for runner in (self.target, self.draft):  # each model's layers checked against forward() now, not in a run
            if runner is not None:
                runner.check_layers(words)
        self._check_prompts()
        self.keep_prompt = keep_prompt
        self.accept = acceptance or GreedyAcceptance()
        self.costs = CostMeter()  # step timings of every run on this engine (cost-aware policies read them)
        self._texts: dict[int, str] = {}

    def _check_prompts(self) -> None:
        """Each model's prompt path through its fused layers checked against forward() now, on a small picture (its
        visual tokens take the model's multimodal positions), not in a run; where the pair cannot take one, the check
        stays where it was (the model's first prompt in a run)."""
        runners = [r for r in (self.target, self.draft) if r is not None and r.prompt_unchecked]
        if not runners:
            return
        try:
            prep = prepare_input(self.pair, "Describe the picture.", images=[Image.new("RGB", (84, 84), (200, 60, 40))])
        except Exception:  # noqa: BLE001 - e.g. a text-only pair: its first prompt is checked instead
            return
        for runner in runners:
            runner.check_prompt(prep.target_inputs if runner is self.target else prep.for_draft())

    def backends(self) -> dict[str, dict]:
        """What each model runs on, and why a faster path was turned down (the runners' checks, one line each):
        {"target": {"cached": ..., "prompt": ..., "notes": [...]}, "draft": {...}}. bench, `generate --json` and the
        app's run record carry it, so that no fallback is silent."""
        out = {}
        for role, runner in (("target", self.target), ("draft", self.draft)):
            if runner is not None:
                out[role] = {"cached": runner.tree_forward, "prompt": runner.prompt_path, "notes": list(runner.notes)}
        return out

    @property
    def keep_prompt(self) -> bool:
        return self.target.keep_prompt

    @keep_prompt.setter
    def keep_prompt(self, on: bool) -> None:
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.keep_prompt = on

    # ------------------------------------------------------------------ helpers
    def token_text(self, tok: int) -> str:
        text = self._texts.get(tok)
        if text is None:
            text = self._texts[tok] = self.tokenizer.decode([tok])
        return text

    def _budget(self, prepared: PreparedInput, max_new_tokens: int) -> int:
        if max_new_tokens < 1:
            raise InputError("max_new_tokens must be at least 1")
        cfg = self.pair.target.config
        ctx = getattr(getattr(cfg, "text_config", cfg), "max_position_embeddings", None)
        n = prepared.prompt_tokens
        if ctx is not None and n >= ctx:
            raise InputError(f"the prompt is too long for the model ({n} tokens; its context is {ctx})")
        return max_new_tokens if ctx is None else min(max_new_tokens, ctx - n)

    def _tree_view(self, root: int, tree: DraftTree, drafted: int, verdict: Verdict, rule: str) -> TreeView:
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
        )

    def _acceptance(self, policy: Policy, sampling: Sampling | None):
        """The run's acceptance rule: greedy; under sampling the ratio rule for a draft that samples its tokens,
        else the tree rule (sampling.py)."""
        if sampling is None or sampling.greedy:
            return self.accept
        return RatioAcceptance(sampling) if policy.samples_draft else SampledAcceptance(sampling)

    # ------------------------------------------------------------------ the loop
    def stream(
        self,
        prepared: PreparedInput,
        policy: Policy | str = "sage",
        max_new_tokens: int = 128,
        stop: tuple[str, ...] = (),
        ignore_eos: bool = False,
        sampling: Sampling | None = None,
    ) -> Iterator[StepEvent]:
        """Decode `prepared` with `policy`, yielding one StepEvent per step (step 0: prefill).

        ignore_eos: keep decoding past end-of-sequence tokens (fixed-length benchmarks and tests).
        sampling: temperature, top-p and seed (sampling.py); None or temperature 0: greedy.
        """
        policy = make_policy(policy) if isinstance(policy, str) else policy
        drafting = policy.uses_draft
        if drafting and self.draft is None:
            raise InputError(f"policy {policy.name!r} needs a draft model")
        eos = set() if ignore_eos else self.pair.eos_token_ids
        out = Transcript(self.tokenizer, eos, self._budget(prepared, max_new_tokens), stop)

        # 0. prefill: the target reads the prompt; its argmax is the first token (the draft reads it later).
        t0 = time.perf_counter()
        accept = self._acceptance(policy, sampling)
        prefill = self.target.prefill(prepared.target_inputs)
        first = accept.first(prefill.logits)
        ids, index = out.extend([first])
        yield self._event(0, policy, out, ids, index, t0, target_ms=prefill.ms)
        if drafting:
            self.drafter.start(prepared.for_draft(), first, sampling, ends=eos)
        root, step = first, 0
        quote = self.costs.quote(policy.key)  # the policy's view of the meter, the same object every step
        while not out.finished:
            step += 1
            t0 = time.perf_counter()  # the step's clock starts here: entering it is part of its cost
            with _inference_mode(True):  # one entry for the step's dozen runner calls (runner.inference)
                event = self._step(step, root, policy, quote, accept, out, t0)
            root = event.bonus_token
            yield event

    def _step(self, step: int, root: int, policy: Policy, quote: Quote, accept, out: Transcript,
              t0: float) -> StepEvent:
        """Decode step `step` after `root` (the last decided token), its clock started at `t0`, `quote` the policy's
        prices: draft, verify, accept, compact, observe."""
        key, drafting = policy.key, policy.uses_draft
        checked_ms = self._check_ms()
        # 1. draft a tree shaped by the policy (ar, or a step the policy decodes plain: an empty tree).
        left = out.budget - len(out.ids)  # tokens the run may still emit: a tree deeper than left - 1 is waste
        if drafting and left > 1 and not policy.skip_draft(quote):
            draft = self.drafter.grow(policy, quote, max_depth=left - 1)
        else:
            draft = Draft(policy.plain_shape(), DraftTree(), 0)
        tree = draft.tree
        # 2. verify the whole tree in one target forward.
        start_t = self.target.seq_len
        verify = verify_tree(self.target, root, tree, accept.argmax, start_t)
        # 3. accept the longest agreeing path plus the bonus token.
        verdict = accept(tree, verify)
        # 4. compact both caches to the accepted path (a plain step's one column is its path).
        if tree.tokens:
            self.target.keep(start_t, [0] + [1 + n for n in verdict.accepted])
        if drafting:
            self.drafter.settle(tree, verdict.accepted, verdict.bonus)
        # 5. the policy learns from the outcome (and the meter from what the step cost).
        # the step's cost as the meter and the policy judge it: without the draft's prefill and the runners'
        # one-off check of their layers (a first drafted step ~10 ms slower would turn a fresh engine's policy
        # to plain steps), both still in the event's times
        wall_ms = (time.perf_counter() - t0) * 1e3 - draft.prefill_ms - (self._check_ms() - checked_ms)
        stalled = self.costs.record(StepTiming(key, len(verdict.accepted) + 1, len(tree), wall_ms, verify.ms,
                                               draft.ms, draft.forwards, sum(tree.cum_probs)))
        policy.observe(StepOutcome(tree, verdict.accepted, len(verdict.accepted) + 1, wall_ms, draft.forwards > 0,
                                   stalled))
        ids, index = out.extend(verdict.accepted_tokens + [verdict.bonus], len(verdict.accepted_tokens))
        # the tree's view is made when a consumer first reads it (the app draws it; the benchmark never looks)
        view = Deferred(self._tree_view, root, tree, draft.drafted, verdict, accept.name)
        return self._event(step, policy, out, ids, index, t0, target_ms=verify.ms, draft=draft, view=view,
                           verdict=verdict)

    def generate(self, prepared: PreparedInput, policy: Policy | str = "sage", max_new_tokens: int = 128,
                 stop: tuple[str, ...] = (), ignore_eos: bool = False,
                 sampling: Sampling | None = None) -> GenerationResult:
        """Run `stream()` to the end and summarise it."""
        name = policy if isinstance(policy, str) else policy.name
        t0 = time.perf_counter()
        steps = list(self.stream(prepared, policy, max_new_tokens, stop, ignore_eos, sampling))
        seconds = time.perf_counter() - t0
        ids = [t for s in steps for t in s.new_token_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return GenerationResult(name, text, ids, summarize(steps, ids, seconds), steps)

    def _check_ms(self) -> float:
        """Time the runners have spent checking their layers against forward() (stack.py, fused.py) so far."""
        return self.target.check_ms + (0.0 if self.draft is None else self.draft.check_ms)

    # ------------------------------------------------------------------ telemetry
    def _event(self, step: int, policy: Policy, out: Transcript, ids: list[int], index: int, t0: float, *,
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
        )
        event.other_ms = max(0.0, (time.perf_counter() - t0) * 1e3 - d_prefill - target_ms - d_ms)
        return event
