"""THE equivalence test on three more families: Qwen2-VL, LLaVA-OneVision, SmolVLM2 (Idefics3).

Every speculative policy (chain, static, eagle2, specvlm, sage) must emit exactly the target's own greedy
token ids in fp32, with images and with video (all three families take video). Drafts: a noisy
copy (partial agreement), an exact copy (everything accepted) and an independent smaller model
(for LLaVA-OneVision with a padded embedding matrix, for SmolVLM with its own image-token layout
and processor, so the two models read prompts of different lengths).
"""

import pytest
import torch
from tiny_families import llava_ov_pair, qwen2vl_pair, smolvlm_pair

from sage_engine import SpecEngine, prepare_input
from sage_engine.config import SPECULATIVE_POLICIES
from sage_testing.tiny_pairs import clip, image

MAX_NEW = 24
POLICIES = SPECULATIVE_POLICIES  # every drafting policy, each checked against ar
FAMILIES = {"qwen2-vl": qwen2vl_pair, "llava-onevision": llava_ov_pair, "smolvlm": smolvlm_pair}
CASES = [  # (draft kind, media); seed 0 everywhere: each case is a different prompt/draft, not a new seed
    ("noisy", "image"), ("noisy", "video"), ("noisy", "text"), ("copy", "image"),
    ("independent", "image"), ("independent", "video"),
]
_pairs: dict = {}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared; tiny models gain nothing from threads
    yield
    torch.set_num_threads(before)


def get_pair(family: str, kind: str):
    if (family, kind) not in _pairs:
        if family == "smolvlm":
            pytest.importorskip("num2words", reason="SmolVLMProcessor needs num2words")
        _pairs[family, kind] = FAMILIES[family](kind, seed=0)
    return _pairs[family, kind]


def media(kind: str, seed: int) -> dict:
    return {"image": {"images": [image(seed)]}, "video": {"video": clip(seed)}, "text": {}}[kind]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind,medium", CASES)
def test_every_policy_gives_ar_tokens(family, kind, medium):
    pair = get_pair(family, kind)
    engine = SpecEngine(pair)
    prep = prepare_input(pair, "describe what you see", **media(medium, 20))
    reference = engine.generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    assert len(reference) == MAX_NEW
    for name in POLICIES:
        res = engine.generate(prep, name, max_new_tokens=MAX_NEW, ignore_eos=True)
        assert res.token_ids == reference, f"{family}/{kind}/{medium}: {name} diverged from ar"
        if kind == "copy" and name in ("chain", "static"):  # a perfect draft is accepted to full depth
            assert res.stats.mean_accepted > 4.0, (name, res.stats.mean_accepted)


def test_visual_input_reaches_the_target():
    """The image changes the target's greedy text, so the equivalence above is about multimodal prefixes."""
    for family in FAMILIES:
        pair = get_pair(family, "noisy")
        engine = SpecEngine(pair)
        outs = {tuple(engine.generate(prepare_input(pair, "describe what you see", images=[image(s)]), "ar",
                                      max_new_tokens=8, ignore_eos=True).token_ids) for s in (1, 2, 3)}
        assert len(outs) > 1, family


def test_layout_and_padding_differences_are_what_the_pairs_claim():
    smol = get_pair("smolvlm", "independent")
    prep = prepare_input(smol, "describe what you see", images=[image(4)])
    assert smol.draft_processor is not None  # another tile size / tokens per tile: its own processor
    assert prep.for_draft()["input_ids"].shape[1] < prep.target_inputs["input_ids"].shape[1]
    ov = get_pair("llava-onevision", "independent")
    rows = lambda m: m.get_output_embeddings().out_features  # noqa: E731
    assert rows(ov.draft) == rows(ov.target) + 64 and len(ov.tokenizer) == rows(ov.target)


def test_qwen_video_frames_stay_uncapped_without_the_deprecation_warning():
    """transformers 5.23's Qwen2-VL video processor, left to its default, keeps frames uncapped and warns (once a
    process) that a later version will cap them; prepare_input asks for the uncapped frames explicitly: the same
    pixels and grid as the default's, and no warning."""
    import logging

    from transformers.utils import logging as hf_logging

    from sage_engine.models.families import adapter_for
    from sage_engine.models.inputs import _messages

    pair = get_pair("qwen2-vl", "noisy")
    video = clip(3)
    said: list[str] = []
    listener = logging.Handler()
    listener.emit = lambda record: said.append(record.getMessage())
    hf_logging.get_logger("transformers").addHandler(listener)
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # the suite runs with transformers' warnings off (conftest.py)
    try:
        logging.Logger.warning_once.cache_clear()  # transformers' once-a-process warnings may warn again
        ours = prepare_input(pair, "describe what you see", video=video).target_inputs
        assert not any("cap_pixels_per_frame" in m for m in said)
        logging.Logger.warning_once.cache_clear()
        text = pair.processor.apply_chat_template(_messages("describe what you see", 0, True),
                                                  add_generation_prompt=True)
        default = pair.processor(text=[text], return_tensors="pt", **adapter_for(pair.target).processor_kwargs(video))
        assert any("cap_pixels_per_frame" in m for m in said)  # the default path warns: the check above can fail
    finally:
        hf_logging.set_verbosity(before)
        hf_logging.get_logger("transformers").removeHandler(listener)
    assert torch.equal(ours["pixel_values_videos"], default["pixel_values_videos"])
    assert torch.equal(ours["video_grid_thw"], default["video_grid_thw"])
    assert torch.equal(ours["input_ids"], default["input_ids"])
