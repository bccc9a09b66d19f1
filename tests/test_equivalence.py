"""THE key test: every speculative policy emits exactly the target's own greedy tokens (fp32).

Real transformers architectures (Qwen2.5-VL with M-RoPE, LLaVA with CLIP + Llama), random
init, built from configs; images, video and text-only prompts; drafts that agree fully
(copy), partly (noisy copy) or rarely (independent model); several seeds. Negative controls
show the test catches a wrong tree mask or wrong positions.
"""

import itertools

import pytest
import torch

from sage_engine import SageConfig, SpecEngine, make_policy, prepare_input
from sage_engine import verify as verify_mod
from sage_engine.config import Eagle2Config
from sage_engine.runner import ModelRunner
from tiny_models import clip, image, llava_pair, qwen25_pair

MAX_NEW = 40
POLICIES = {
    "chain": lambda: make_policy("chain"),
    "static": lambda: make_policy("static"),
    "eagle2": lambda: make_policy("eagle2"),
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
    for media, (kind, seed) in itertools.product(medias, (("noisy", 0), ("noisy", 1), ("noisy", 2), ("noisy", 3), ("copy", 0),
                                                    ("independent", 0)))
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
    monkeypatch.setattr(verify_mod, "verify_allowed", lambda parents: torch.ones(
        len(parents) + 1, len(parents) + 1, dtype=torch.bool).tril().numpy())
    assert _run(pair, prep, "static") != reference


def test_negative_control_dropping_the_mrope_delta_is_caught(monkeypatch):
    pair = get_pair("qwen2.5-vl", "noisy", 0)
    prep = prepare_input(pair, "describe what you see", images=[image(12)])
    reference = _run(pair, prep, "ar")
    assert _run(pair, prep, "sage") == reference
    real_prefill = ModelRunner.prefill

    def prefill_without_delta(self, inputs, pruning=None):
        out = real_prefill(self, inputs, pruning)
        self.rope_delta = 0
        return out

    monkeypatch.setattr(ModelRunner, "prefill", prefill_without_delta)
    assert _run(pair, prep, "sage") != reference


def test_negative_control_node_positions_off_by_one_are_caught(monkeypatch):
    pair = get_pair("llava", "noisy", 0)
    prep = prepare_input(pair, "describe what you see", images=[image(13)])
    reference = _run(pair, prep, "ar")
    assert _run(pair, prep, "eagle2") == reference
    real = verify_mod.verify_tree

    def shifted(runner, root, tree):
        tree.depths[:] = [d + 1 for d in tree.depths]
        try:
            return real(runner, root, tree)
        finally:
            tree.depths[:] = [d - 1 for d in tree.depths]

    monkeypatch.setattr("sage_engine.engine.verify_tree", shifted)
    assert _run(pair, prep, "eagle2") != reference
