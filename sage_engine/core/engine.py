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
reference.py is the same loop in one file, on transformers' forward() alone, for reading; tests/test_reference.py
checks that both draw the same trees and tokens.
Only a priced policy (policies/priced.py) reads the meter's quote: every other one draws the same trees in every run.
The output equals the target's own decoding: greedy, every emitted token is a target argmax; sampling
(sampling.py), the output has the target's sampling distribution (under the tree rule, the very draws the
target alone makes with the same seed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from PIL import Image

from ..backends.choose import BACKENDS
from ..backends.choose import known as known_backend
from ..errors import InputError, ModelError, first_line
from ..models.ar_check import decode_refusal, media_inputs
from ..models.families import shared_vocab
from ..models.inputs import PreparedInput, prepare_input
from ..models.loading import ModelPair
from ..models.pruning import VisualPruning
from ..models.tree_check import tree_refusal
from ..policies import Policy, make_policy
from . import jit
from .costs import CostMeter, Quote, StepTiming
from .draft import Draft, Drafter
from .events import Deferred, GenerationResult, StepEvent, summarize
from .policy_io import StepOutcome
from .runner import ModelRunner
from .sampling import RatioAcceptance, SampledAcceptance, Sampling
from .telemetry import Telemetry
from .transcript import Transcript
from .tree import DraftTree
from .tree import warm as warm_verify_inputs
from .verify import GreedyAcceptance, verify_tree

# torch.inference_mode()'s own guard, which that context manager enters through a few Python frames of its own; the
# public one where torch has none
_inference_mode = getattr(torch._C, "_InferenceMode", torch.inference_mode)

TREE_FORWARDS = BACKENDS  # SpecEngine(tree_forward=...), the CLI's --tree-forward: the backends both models may use


class SpecEngine:
    """Lossless tree speculative decoding of a target VLM with a draft VLM (batch of one)."""

    def __init__(self, pair: ModelPair, acceptance=None, draft_pruning: VisualPruning | None = None,
                 tree_forward: str = "auto", keep_prompt: bool = False, pinned: dict[str, str] | None = None):
        """draft_pruning: feed the draft only part of the visual tokens (draft-only; output unchanged), whatever the
        policy (a policy's own, `Policy.draft_pruning`, applies where this is None).
        tree_forward: the backend both models' passes run on (backends/): "auto", the fastest of those that apply and
        pass their check against forward(); "forward", "layers", "fused", "numpy" or "numba" that one where it applies
        (a target is never offered "numpy" or "numba"; what each model got, and why, is in `backends()`).
        keep_prompt: runs on the same PreparedInput as the last one reuse both models' prefilled caches
        (runner.py); for many draws on one prompt, never where prefill is timed.
        pinned: {"target" | "draft": a backend's name}: that model offered only that backend (a runner's
        `tree_forward`), still checked against forward() but not timed against the others (`twin`)."""
        if not known_backend(tree_forward):
            raise ValueError(f"unknown tree_forward {tree_forward!r}; choose one of {', '.join(TREE_FORWARDS)}")
        self.pair = pair
        self.compiled = jit.ACTIVE if jit.numba is not None else None  # built with compiled code (None: no Numba)
        self.draft_pruning = draft_pruning
        self.tokenizer = pair.tokenizer
        pinned = pinned or {}
        self.target = ModelRunner(pair.target, backend=tree_forward, named=pinned.get("target"))
        self.draft = None
        if pair.draft is not None:
            self.draft = ModelRunner(pair.draft, vocab_limit=shared_vocab(pair.target, pair.draft),
                                     backend=tree_forward, row_invariant=False, named=pinned.get("draft"))
        self.drafter = Drafter(self.draft) if self.draft is not None else None
        if self.drafter is not None:
            warm_verify_inputs()  # the compiled builder of a verify pass's inputs, loaded now, not in a first step
        words = (self.tokenizer.encode("A check of the layers.", add_special_tokens=False) * 8)[:8]
        for runner in (self.target, self.draft):  # each model's layers checked against forward() now, not in a run
            if runner is not None:
                runner.check_layers(words)
        self._check_prompts()
        # each model's inputs for each kind of media it takes: what the checks below read besides a text prompt
        media = {"target": media_inputs(pair.processor, self.target.family)}
        # the target's plain decode proved to be its own greedy decode (ar_check.py): else no policy runs on it
        self.decode_refusal = decode_refusal(self.target, media["target"])
        if self.decode_refusal is not None:
            self.target.notes.append(f"decoding refused: {self.decode_refusal}")
        # each model's tree passes proved exact on the backend they will run on (tree_check.py)
        self.tree_refusals = {}
        if self.draft is not None and self.decode_refusal is None:
            media["draft"] = media["target"] if pair.draft_processor is None else \
                media_inputs(pair.draft_processor, self.draft.family)
            self.tree_refusals = self._check_trees(words, media)
        self.keep_prompt = keep_prompt
        self.accept = acceptance or GreedyAcceptance()
        self.costs = CostMeter()  # step timings of every run on this engine (cost-aware policies read them)
        self.telemetry = Telemetry(self.tokenizer)

    def twin(self) -> SpecEngine:
        """A second engine on the same pair that runs as this one does: each model on the backend this engine's checks
        kept (checked again, not timed again: on a busy machine the timing may pick another one). Each engine holds
        one decode's caches; the app's race decodes its two lanes in turns on two (app/race.py)."""
        return SpecEngine(self.pair, acceptance=self.accept, draft_pruning=self.draft_pruning,
                          pinned={role: b["cached"] for role, b in self.backends().items()})

    def check_trees(self, policy: Policy | str) -> None:
        """Raise the one-line ModelError where `policy` cannot run on this pair: the target's plain decode is not its
        own (ar_check.py; then no policy runs), or `policy` drafts trees and a model of this pair cannot verify them
        (tree_check.py); callers that start work before decoding (the app's race) ask first."""
        policy = make_policy(policy) if isinstance(policy, str) else policy
        if self.decode_refusal is not None:
            raise ModelError(f"policy {policy.name!r} cannot run on this pair: in the target, {self.decode_refusal}; "
                             "no policy runs on it")
        if policy.uses_draft and self.tree_refusals:
            role, why = next(iter(self.tree_refusals.items()))
            raise ModelError(f"policy {policy.name!r} cannot run on this pair: in the {role}, {why}; only 'ar' runs on "
                             "it")

    def _check_trees(self, words: list[int], media: dict[str, dict]) -> dict[str, str]:
        """Each model's tree passes proved exact once, now (tree_check.py), on a text prompt and on each of its `media`
        prompts: {role: why not} for a model that cannot verify a tree, which every drafting policy then refuses in
        one line (`ar` still runs)."""
        refusals = {}
        for role, runner in (("target", self.target), ("draft", self.draft)):
            try:
                why = tree_refusal(runner, words, {k: v for k, v in media[role].items() if k != "a text"})
            except Exception as e:  # noqa: BLE001 - e.g. a model that needs its images: its layer kinds are known
                runner.notes.append(f"the tree check could not read a prompt ({first_line(e)}); its layers are of "
                                    f"kinds trees support ({runner.plan.describe()})")
                continue
            if why is not None:
                refusals[role] = why
                runner.notes.append(f"trees refused: {why}")
        return refusals

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
                out[role] = {"cached": runner.tree_forward, "prompt": runner.prompt_path,
                             "notes": runner.notes + runner.prompts.notes}
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
    def _budget(self, prepared: PreparedInput, max_new_tokens: int) -> int:
        if max_new_tokens < 1:
            raise InputError("max_new_tokens must be at least 1")
        cfg = self.pair.target.config
        ctx = getattr(getattr(cfg, "text_config", cfg), "max_position_embeddings", None)
        n = prepared.prompt_tokens
        if ctx is not None and n >= ctx:
            raise InputError(f"the prompt is too long for the model ({n} tokens; its context is {ctx})")
        return max_new_tokens if ctx is None else min(max_new_tokens, ctx - n)

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
        policy.reset()  # a policy object used again starts as a fresh one: nothing carries over from its last run
        drafting = policy.uses_draft
        if drafting and self.draft is None:
            raise InputError(f"policy {policy.name!r} needs a draft model")
        self.check_trees(policy)
        eos = set() if ignore_eos else self.pair.eos_token_ids
        out = Transcript(self.tokenizer, eos, self._budget(prepared, max_new_tokens), stop)

        # 0. prefill: the target reads the prompt; its argmax is the first token (the draft reads it later).
        t0 = time.perf_counter()
        accept = self._acceptance(policy, sampling)
        prefill = self.target.prefill(prepared.target_inputs)
        first = accept.first(prefill.logits)
        ids, index = out.extend([first])
        yield self.telemetry.event(0, policy, out, ids, index, t0, target_ms=prefill.ms)
        if drafting:
            self.drafter.start(prepared.for_draft(), first, sampling, ends=eos,
                               pruning=self.pruning_for(policy, prepared))
        root, step = first, 0
        while not out.finished:
            step += 1
            t0 = time.perf_counter()  # the step's clock starts here: entering it is part of its cost
            with _inference_mode(True):  # one entry for the step's dozen runner calls (runner.inference)
                event = self._step(step, root, policy, self.costs.quote(policy.key), accept, out, t0)
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
        # one-off check of their layers (a first drafted step that slow would turn a fresh engine's policy to
        # plain steps), both still in the event's times
        wall_ms = (time.perf_counter() - t0) * 1e3 - draft.prefill_ms - (self._check_ms() - checked_ms)
        timing = self.costs.timing(StepTiming(key, len(verdict.accepted) + 1, len(tree), wall_ms, verify.ms,
                                              draft.ms, draft.forwards, sum(tree.cum_probs)))
        stalled = self.costs.record(timing)
        policy.observe(StepOutcome(tree, verdict.accepted, timing.tokens, timing.wall_ms, draft.forwards > 0, stalled))
        ids, index = out.extend(verdict.accepted_tokens + [verdict.bonus], len(verdict.accepted_tokens))
        # the tree's view is made when a consumer first reads it (the app draws it; the benchmark never looks)
        view = Deferred(self.telemetry.tree_view, root, tree, draft.drafted, verdict, accept.name)
        return self.telemetry.event(step, policy, out, ids, index, t0, target_ms=verify.ms, draft=draft, view=view,
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

    def pruning_for(self, policy: Policy, prepared: PreparedInput) -> VisualPruning | None:
        """The visual-token pruning the draft reads `prepared` with under `policy`: the engine's, else the policy's;
        None for a prompt without an image or a video, or where nothing would be left out."""
        pruning = self.draft_pruning or policy.draft_pruning
        if pruning is None or not (prepared.images or prepared.video is not None) or not pruning.active:
            return None
        return pruning

    def _check_ms(self) -> float:
        """Time the runners have spent checking their backends against forward() (backends/choose.py) so far."""
        return self.target.check_ms + (0.0 if self.draft is None else self.draft.check_ms)
