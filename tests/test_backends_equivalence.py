"""The key test on every backend: each policy, greedy and sampled, gives exactly the target's tokens whichever way the
models' passes are computed (backends/: forward(), the layers in turn, fused torch, NumPy, Numba), on tiny
random Qwen2.5-VL and LLaVA pairs (sharpened so SAGE drafts deep) and on the shipped pair; and each model really
runs on the backend asked for (a target asked for numpy or numba gets fused, and says so)."""

from pathlib import Path

import pytest
from test_equivalence import MAX_NEW, is_transformers_greedy, sharp_case

from sage_engine import SpecEngine, load_pair, prepare_input
from sage_engine.core.rules import numba
from sage_engine.core.sampling import Sampling

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("forward", "layers", "fused", "numpy") + (("numba",) if numba is not None else ())
GREEDY = ("chain", "static", "eagle2", "sage", "sage:threshold=paper", "sage:threshold=paper:alpha_source=prev_path")
SAMPLED = ("chain:draw=top", "eagle2", "sage:threshold=paper", "sage")  # the tree rule: the target-alone draws
SAMPLING = Sampling(0.8, top_p=0.9, seed=5)
DRAFT_NAMES = {"forward": "forward", "layers": "layers", "fused": ("fused", "fused+packed"), "numpy": "fused+numpy",
               "numba": "fused+numba"}
TARGET_NAMES = {**DRAFT_NAMES, "numpy": ("fused", "fused+packed"), "numba": ("fused", "fused+packed")}


def _runs_on(engine: SpecEngine, backend: str) -> None:
    names = engine.backends()
    assert names["draft"]["cached"] in DRAFT_NAMES[backend], names
    assert names["target"]["cached"] in TARGET_NAMES[backend], names
    if backend in ("numpy", "numba"):
        assert any("not offered for a target" in n for n in names["target"]["notes"]), names


def _all_policies_match(engine: SpecEngine, prep, budget: int) -> int:
    """Every policy's greedy and sampled tokens are ar's; the draft tokens accepted in all."""
    reference = engine.generate(prep, "ar", max_new_tokens=budget, ignore_eos=True).token_ids
    accepted = 0
    for policy in GREEDY:
        res = engine.generate(prep, policy, max_new_tokens=budget, ignore_eos=True)
        assert res.token_ids == reference, policy
        accepted += sum(len(s.accepted_tokens) for s in res.steps)
    sampled = engine.generate(prep, "ar", max_new_tokens=budget, ignore_eos=True, sampling=SAMPLING).token_ids
    for policy in SAMPLED:
        res = engine.generate(prep, policy, max_new_tokens=budget, ignore_eos=True, sampling=SAMPLING)
        assert res.token_ids == sampled, f"{policy} sampled"
    return accepted


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family,media,kind", [("qwen2.5-vl", "image", "noisy"), ("qwen2.5-vl", "video", "copy"),
                                               ("llava", "image", "copy")])
def test_every_policy_equals_the_target_on_every_backend(family, media, kind, backend):
    pair, prep = sharp_case(family, media, kind)
    engine = SpecEngine(pair, tree_forward=backend)
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    assert is_transformers_greedy(pair, prep, reference)  # ar is transformers' own greedy decoding
    assert _all_policies_match(engine, prep, MAX_NEW) > 0
    _runs_on(engine, backend)


@pytest.mark.skipif(not (ROOT / "assets" / "models").is_dir(), reason="no shipped pair in assets/models")
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_policy_equals_the_target_on_every_backend_with_the_shipped_pair(backend):
    pair = load_pair()
    engine = SpecEngine(pair, tree_forward=backend)
    prep = prepare_input(pair, "Describe it in detail.", images=[str(ROOT / "assets" / "examples" / "shapes_1.png")])
    assert _all_policies_match(engine, prep, 48) > 0
    _runs_on(engine, backend)
