"""THE key test: every speculative policy emits exactly the target's own greedy tokens (fp32).

Real transformers architectures (Qwen2.5-VL with M-RoPE, LLaVA with CLIP + Llama), random
init, built from configs; images, video and text-only prompts; drafts that agree fully
(copy), partly (noisy copy) or rarely (independent model); several seeds. Negative controls
show the test catches a wrong tree mask or wrong positions.
"""

import itertools

import numpy as np
import pytest
import torch

from sage_engine import SageConfig, SpecEngine, make_policy, prepare_input
from sage_engine.config import Eagle2Config
from sage_engine.core import engine as engine_mod
from sage_engine.core import runner as runner_mod
from sage_engine.core.runner import ModelRunner
from sage_engine.errors import ModelError
from sage_testing.tiny_pairs import clip, image, llava_pair, qwen25_pair, sharp_pair

MAX_NEW = 40
POLICIES = {
    "chain": lambda: make_policy("chain"),
    "static": lambda: make_policy("static"),
    "eagle2": lambda: make_policy("eagle2"),
    "specvlm": lambda: make_policy("specvlm"),  # eagle2's tree from a draft that reads part of the visual tokens
    "sage": lambda: make_policy("sage"),
    "sage-cost": lambda: make_policy("sage", SageConfig(threshold="cost")),
    "sage-current-root-small": lambda: make_policy("sage", SageConfig(alpha_source="current_root", n_max=12)),
    "eagle2-narrow": lambda: make_policy("eagle2", Eagle2Config(depth=4, top_k=3, total_nodes=10)),
}
FAMILIES = {"qwen2.5-vl": (qwen25_pair, ("image", "video", "text")), "llava": (llava_pair, ("image", "text"))}
_pairs: dict = {}


def get_pair(family, kind, seed):
    key = (family, kind, seed)
    if key not in _pairs:
        _pairs[key] = FAMILIES[family][0](kind, seed=seed)
    return _pairs[key]


def media_kwargs(media, seed):
    if media == "image":
        return {"images": [image(seed)]}
    if media == "two-images":
        return {"images": [image(seed), image(seed + 100, size=84)]}
    if media == "video":
        return {"video": clip(seed)}
    return {}


CASES = [
    (family, media, kind, seed)
    for family, (_, medias) in FAMILIES.items()
    for media, (kind, seed) in itertools.product(
        medias, (("noisy", 0), ("noisy", 1), ("noisy", 2), ("noisy", 3), ("copy", 0), ("independent", 0)))
] + [("qwen2.5-vl", "two-images", "noisy", 2)]


@pytest.mark.parametrize("family,media,kind,seed", CASES)
def test_speculative_equals_target_greedy(family, media, kind, seed):
    pair = get_pair(family, kind, seed)
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "describe what you see", **media_kwargs(media, 10 + seed))
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True)
    assert len(reference.token_ids) == MAX_NEW
    accepted_any = 0
    for name, factory in POLICIES.items():
        res = engine.generate(prep, factory(), max_new_tokens=MAX_NEW, ignore_eos=True)
        assert res.token_ids == reference.token_ids, f"{name} diverged from ar"
        accepted_any += sum(len(s.accepted_tokens) for s in res.steps)
        if kind == "copy" and name in ("chain", "static"):  # a perfect draft is accepted to full depth
            assert res.stats.mean_accepted > 5.5, name
    if kind != "independent":
        assert accepted_any > 0


@pytest.mark.parametrize("family,media", [("qwen2.5-vl", "image"), ("qwen2.5-vl", "video"), ("llava", "image")])
def test_ar_equals_transformers_generate(family, media):
    pair = get_pair(family, "noisy", 0)
    prep = prepare_input(pair, "describe what you see", **media_kwargs(media, 5))
    ours = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    hf = pair.target.generate(**prep.target_inputs, max_new_tokens=MAX_NEW, do_sample=False)[0, prep.prompt_tokens:]
    assert len(hf) >= 1 and ours[: len(hf)] == hf.tolist()  # transformers stops at EOS, ours goes on


def test_eos_inside_an_accepted_chunk_stops_at_the_same_token():
    pair = qwen25_pair("copy", seed=7)
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "describe what you see", images=[image(7)])
    free = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    stop_tok = free[12]
    pair.target.generation_config.eos_token_id = stop_tok
    pair.tokenizer.eos_token = pair.tokenizer.convert_ids_to_tokens(stop_tok)
    pair.target.config.text_config.eos_token_id = stop_tok
    ar = engine.generate(prep, "ar", max_new_tokens=MAX_NEW)
    sage = engine.generate(prep, "sage", max_new_tokens=MAX_NEW)
    assert ar.token_ids == free[: free.index(stop_tok) + 1]
    assert sage.token_ids == ar.token_ids and sage.stats.finish_reason == "eos"


@pytest.mark.parametrize("policy", ["chain", "static", "sage:threshold=paper"])
def test_nothing_is_drafted_below_an_end_of_sequence_node(policy):
    """An EOS node is verified (the run stops there if it is accepted) but never fed to the draft, so no node
    has an EOS parent; the output still ends at the target's own EOS. A sharpened pair (see "Deep trees" below):
    SAGE drafts deep trees on it."""
    pair = qwen25_pair("copy", seed=0, sigma=0.05, sharpness=8.0)  # its own: the test changes its EOS
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "describe what you see", images=[image(7)])

    def trees(res):
        return [s.tree for s in res.steps[1:] if s.tree is not None]

    def below(res, tok):
        return sum(p >= 0 and t.tokens[p] == tok for t in trees(res) for p in t.parents)

    def drafted_parents(res):
        """Tokens the run emits first as an accepted node that has children in its tree (after 8 tokens)."""
        emitted = list(res.steps[0].new_token_ids)
        for s in res.steps[1:]:
            for n in s.accepted_nodes:
                tok = s.tree.tokens[n]
                if len(emitted) >= 8 and tok not in emitted and n in s.tree.parents:
                    yield tok
                emitted.append(tok)
            emitted.append(s.bonus_token)

    free = engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True)
    stop_tok = next(drafted_parents(free))  # the EOS to be
    pair.target.generation_config.eos_token_id = stop_tok
    pair.target.config.text_config.eos_token_id = stop_tok
    ar = engine.generate(prep, "ar", max_new_tokens=MAX_NEW)
    spec = engine.generate(prep, policy, max_new_tokens=MAX_NEW)
    assert ar.token_ids == free.token_ids[: free.token_ids.index(stop_tok) + 1] and spec.token_ids == ar.token_ids
    assert any(stop_tok in t.tokens for t in trees(spec))  # the EOS was drafted...
    assert below(spec, stop_tok) == 0  # ...and nothing below it


def test_budget_cuts_inside_a_step():
    pair = get_pair("qwen2.5-vl", "copy", 0)
    prep = prepare_input(pair, "describe", images=[image(3)])
    res = SpecEngine(pair).generate(prep, "sage", max_new_tokens=7, ignore_eos=True)
    assert len(res.token_ids) == 7 and res.stats.finish_reason == "length"


def _run(pair, prep, policy_name):
    return SpecEngine(pair).generate(prep, policy_name, max_new_tokens=MAX_NEW, ignore_eos=True).token_ids


def test_negative_control_causal_mask_instead_of_tree_mask_is_caught(monkeypatch):
    pair = get_pair("qwen2.5-vl", "noisy", 0)
    prep = prepare_input(pair, "describe what you see", images=[image(11)])
    reference = _run(pair, prep, "ar")
    assert _run(pair, prep, "static") == reference
    _wrong_verify_mask(monkeypatch, lambda parents: torch.ones(
        len(parents) + 1, len(parents) + 1, dtype=torch.bool).tril().numpy())
    _caught_twice(monkeypatch, pair, prep, "static", reference)


def _caught_twice(monkeypatch, pair, prep, policy, reference):
    """A broken tree pass is refused by the engine's own check when it is built (tree_check.py), and, with that check
    bypassed, gives other tokens than `ar`: the equivalence tests would catch it too."""
    with pytest.raises(ModelError, match="differ from the same tokens read alone"):
        _run(pair, prep, policy)
    monkeypatch.setattr(engine_mod, "tree_refusal", lambda runner, words, media=None: None)
    assert _run(pair, prep, policy) != reference


def _wrong_verify_mask(monkeypatch, pattern):
    """Verify passes built with `pattern(parents)` [1 + n, 1 + n] bool over [root, nodes] instead of the tree's own
    (the verify pass's inputs, the compiled builder's or the fallback's)."""
    real = runner_mod.verify_inputs

    def wrong(tree, root, start, past, blocked):
        ids, pos, mask, depth = real(tree, root, start, past, blocked)
        mask = mask.copy()
        mask[0, 0, :, past:] = np.where(pattern(tree.parents), 0.0, blocked)
        return ids, pos, mask, depth

    monkeypatch.setattr(runner_mod, "verify_inputs", wrong)
    monkeypatch.setattr(runner_mod, "verify_allowed", pattern)


def test_negative_control_dropping_the_mrope_delta_is_caught(monkeypatch):
    pair = get_pair("qwen2.5-vl", "noisy", 0)
    prep = prepare_input(pair, "describe what you see", images=[image(12)])
    reference = _run(pair, prep, "ar")
    assert _run(pair, prep, "sage") == reference
    real_prefill = ModelRunner.prefill

    def prefill_without_delta(self, inputs, pruning=None, own=False):
        out = real_prefill(self, inputs, pruning, own)
        self.rope_delta = 0
        return out

    monkeypatch.setattr(ModelRunner, "prefill", prefill_without_delta)
    with pytest.raises(ModelError, match="on an image prompt its logits after its token 1 .* differ from generate"):
        _run(pair, prep, "sage")  # the engine's check of `ar` (ar_check.py) refuses it when built
    monkeypatch.setattr(engine_mod, "decode_refusal", lambda runner, media: None)
    assert _run(pair, prep, "sage") != reference


def test_negative_control_node_positions_off_by_one_are_caught(monkeypatch):
    pair = get_pair("llava", "noisy", 0)
    prep = prepare_input(pair, "describe what you see", images=[image(13)])
    reference = _run(pair, prep, "ar")
    assert _run(pair, prep, "eagle2") == reference
    real = runner_mod.verify_inputs

    def shifted(tree, root, start, past, blocked):  # the verify pass's nodes one position too far
        ids, pos, mask, depth = real(tree, root, start, past, blocked)
        pos = pos.copy()
        pos[0, 1:] += 1
        return ids, pos, mask, depth

    monkeypatch.setattr(runner_mod, "verify_inputs", shifted)
    _caught_twice(monkeypatch, pair, prep, "eagle2", reference)


# Deep trees. Random init gives near-uniform next-token distributions, on which SAGE's thresholds keep its
# trees one or two levels deep; a sharpened head (tiny_pairs.sharpen) makes them as peaked as a trained
# model's, so SAGE drafts deep, wide trees and the target accepts several tokens a step.
DEEP = {
    "sage-paper": lambda: make_policy("sage", SageConfig(threshold="paper", alpha_source="prev_path")),
    "sage-paper-current-root": lambda: make_policy("sage", SageConfig(threshold="paper")),
    "sage": lambda: make_policy("sage"),
    "eagle2": lambda: make_policy("eagle2"),
}
DEEP_CASES = [("qwen2.5-vl", "image", "copy"), ("qwen2.5-vl", "video", "noisy"), ("qwen2.5-vl", "image", "noisy"),
              ("llava", "image", "copy"), ("llava", "image", "noisy")]
_sharp: dict = {}


def sharp_case(family, media, kind):
    if (family, kind) not in _sharp:
        _sharp[family, kind] = sharp_pair(family, kind)
    pair = _sharp[family, kind]
    return pair, prepare_input(pair, "describe what you see", **media_kwargs(media, 10))


def is_transformers_greedy(pair, prep, ids) -> bool:
    hf = pair.target.generate(**prep.target_inputs, max_new_tokens=MAX_NEW, do_sample=False)[0, prep.prompt_tokens:]
    return len(hf) >= 1 and ids[: len(hf)] == hf.tolist()  # transformers stops at EOS, the engine goes on


def deep_runs(pair, prep):
    """ar's ids, then each DEEP policy's result (one engine, as the app and the bench use it)."""
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    return reference, {name: engine.generate(prep, make(), max_new_tokens=MAX_NEW, ignore_eos=True)
                       for name, make in DEEP.items()}


@pytest.mark.parametrize("family,media,kind", DEEP_CASES)
def test_deep_sage_trees_equal_target_greedy(family, media, kind):
    pair, prep = sharp_case(family, media, kind)
    reference, runs = deep_runs(pair, prep)
    assert is_transformers_greedy(pair, prep, reference)  # the reference is transformers' own greedy decoding
    for name, res in runs.items():
        assert res.token_ids == reference, f"{name} diverged from ar"
    paper = runs["sage-paper"]
    depths = [max(s.tree.depths, default=0) for s in paper.steps[1:]]
    assert max(depths) >= 4 and sum(d >= 4 for d in depths) >= 2  # deep trees, more than once
    assert max(len(s.accepted_tokens) for s in paper.steps[1:]) >= 3  # paths several nodes deep accepted
    if kind == "copy":
        assert paper.stats.mean_accepted > 4


def _hide_grandparents(parents):
    """A wrong ancestor matrix: each node sees itself and its parent, not its grandparents."""
    import numpy as np
    anc = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i, p] = True
    return anc


@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "copy"), ("llava", "image", "noisy")])
def test_negative_control_a_node_that_cannot_see_its_grandparent_is_caught(monkeypatch, family, media, kind):
    pair, prep = sharp_case(family, media, kind)
    _wrong_verify_mask(monkeypatch, lambda parents: np.block(
        [[np.ones((len(parents) + 1, 1), bool), np.vstack([np.zeros((1, len(parents)), bool),
                                                            _hide_grandparents(parents)])]]))
    reference, runs = deep_runs(pair, prep)
    assert runs["sage-paper"].token_ids != reference  # SAGE's own deep trees expose the bug


def test_negative_control_a_wrong_mrope_delta_everywhere_is_caught(monkeypatch):
    """The reference is decoded with the same wrong delta, so only transformers' own generate() shows it: the engine's
    check of `ar` when it is built, and, with that check bypassed, the key test's reference check."""
    pair, prep = sharp_case("qwen2.5-vl", "image", "noisy")
    real_prefill = ModelRunner.prefill

    def prefill_with_wrong_delta(self, inputs, pruning=None, own=False):
        out = real_prefill(self, inputs, pruning, own)
        self.rope_delta += 3
        return out

    monkeypatch.setattr(ModelRunner, "prefill", prefill_with_wrong_delta)
    assert "differ from generate()'s" in SpecEngine(pair).decode_refusal  # the engine's check of `ar` refuses it
    monkeypatch.setattr(engine_mod, "decode_refusal", lambda runner, media: None)
    reference, runs = deep_runs(pair, prep)
    assert all(res.token_ids == reference for res in runs.values())  # wrong alike: equality alone misses it
    assert not is_transformers_greedy(pair, prep, reference)  # the key test's reference check catches it


@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "noisy"), ("llava", "image", "copy")])
@pytest.mark.parametrize("pattern", ["plain first", "every third plain", "plain after the first"])
def test_plain_steps_between_drafted_ones_keep_the_output(family, media, kind, pattern):
    """A drafting policy that decodes some steps plain (sage's fallback): the draft reads the prompt with the
    first drafted step and catches up on every token it missed; nothing changes the output."""
    from sage_engine.policies import SagePolicy

    class Scripted(SagePolicy):
        def __init__(self):
            super().__init__(SageConfig(threshold="paper"))
            self.calls = 0

        def skip_draft(self, quote=None):
            self.calls += 1
            return {"plain first": self.calls <= 3, "every third plain": self.calls % 3 == 0,
                    "plain after the first": self.calls > 1 and self.calls % 5 != 0}[pattern]

    pair, prep = sharp_case(family, media, kind)
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    res = engine.generate(prep, Scripted(), max_new_tokens=MAX_NEW, ignore_eos=True)
    assert res.token_ids == reference
    plain = [s for s in res.steps[1:] if s.depth == 0]
    drafted = [s for s in res.steps[1:] if s.depth > 0]
    assert plain and drafted and all(s.draft_forwards == 0 and not s.tree.tokens for s in plain)
    assert sum(s.draft_prefill_ms > 0 for s in res.steps) == 1 and drafted[0].draft_prefill_ms > 0
    assert res.steps[0].draft_ms == 0 and res.stats.prefill_seconds * 1e3 >= drafted[0].draft_prefill_ms


def teacher_forced_guesses(pair, prep, ids: list[int]) -> list[int]:
    """The draft's top choice after each of `ids` (one full forward over the prompt and them), from scratch."""
    inputs = dict(prep.for_draft())
    n = inputs["input_ids"].shape[1]
    for key, value in inputs.items():  # per-token rows (ids, attention mask, token types) go on with the text
        if value.dim() == 2 and value.shape == (1, n):
            fill = int(key == "attention_mask")  # 1 for the mask, 0 (text) for token types
            tail = torch.tensor([ids]) if key == "input_ids" else torch.full((1, len(ids)), fill)
            inputs[key] = torch.cat([value, tail.to(value.dtype)], dim=1)
    with torch.inference_mode():
        logits = pair.draft(**inputs).logits[0, -len(ids):]
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "noisy"), ("llava", "image", "copy")])
def test_tries_turned_down_after_the_drafts_read_keep_the_output_and_count_its_agreement(family, media, kind):
    """sage's try after a plain stretch: the draft reads the tokens it missed, and its top choices among them (the
    probe) decide whether the step drafts a tree; a turned-down try is a plain step whose read the draft keeps."""
    from sage_engine.policies import SagePolicy

    class Declining(SagePolicy):  # three plain steps, then a try; every other try turned down
        def __init__(self):
            super().__init__(SageConfig(threshold="paper"))
            self.calls, self.probes = 0, {}

        def skip_draft(self, quote=None):
            self.calls += 1
            return self.calls % 4 != 0

        def shape(self, root_alpha, quote=None, probe=None):
            self.probes[self.calls] = probe
            shape = super().shape(root_alpha, quote, probe)
            return shape if self.calls % 8 == 0 else shape._replace(depth=0)

    pair, prep = sharp_case(family, media, kind)
    engine = SpecEngine(pair)
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    policy = Declining()
    res = engine.generate(prep, policy, max_new_tokens=MAX_NEW, ignore_eos=True)
    assert res.token_ids == reference
    # every step asks skip_draft() but a last one that may emit only one token (no tree to draft): step == call
    tries = {s.step: s for s in res.steps[1:] if s.step % 4 == 0 and s.step <= policy.calls}
    turned_down = [s for s in tries.values() if s.step % 8]
    assert turned_down and all(s.depth == 0 and s.draft_forwards == 1 and not s.tree.tokens for s in turned_down)
    assert any(s.tree.tokens for s in tries.values())
    guesses = teacher_forced_guesses(pair, prep, reference)  # guesses[i]: the draft's choice after token i
    for step, probe in policy.probes.items():
        before = sum(len(s.new_token_ids) for s in res.steps[:step])  # tokens emitted before this try
        plain = range(before - 3, before)  # the three plain steps' tokens
        assert probe.pairs == 3 and probe.matches == sum(guesses[i - 1] == reference[i] for i in plain)
    assert len(policy.probes) == len(tries) and {p.matches for p in policy.probes.values()} != {0}
