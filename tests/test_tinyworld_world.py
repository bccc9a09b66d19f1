"""tinyworld: the world (scenes, clips, rendering), its language (questions, answers, descriptions), the tokenizer."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from sage_engine.tinyworld import language as L
from sage_engine.tinyworld import world as W
from sage_engine.tinyworld.render import render_dir
from sage_engine.tinyworld.tokenizer import user_turn


def test_render_is_deterministic_and_fresh_per_seed(tmp_path):
    a = render_dir(tmp_path / "a", seed=3, n=2)
    b = render_dir(tmp_path / "b", seed=3, n=2)
    c = render_dir(tmp_path / "c", seed=4, n=2)
    assert a == b and a != c
    assert (tmp_path / "a" / "img_0000.png").read_bytes() == (tmp_path / "b" / "img_0000.png").read_bytes()
    rows = [json.loads(x) for x in (tmp_path / "a" / "prompts.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == ["img_0000.png", "img_0001.png", "vid_0000.mp4", "vid_0001.mp4"]
    truth = [json.loads(x) for x in (tmp_path / "a" / "truth.jsonl").read_text().splitlines()]
    assert {t["media"] for t in truth} == {"image", "video"} and all(t["prompt"] and t["answer"] for t in truth)


def test_rendered_pixels_match_the_truth():
    rng = random.Random(0)
    for _ in range(50):
        scene = W.sample_scene(rng)
        img = W.render_image(scene)
        covered = {scene.objects[scene.occluded[0]]} if scene.occluded else set()
        for o in scene.objects:
            if o in covered:
                continue
            row, col = divmod(o.cell, 3)
            x, y = int((col + 0.5) * W.SIZE / 3 + o.dx), int((row + 0.5) * W.SIZE / 3 + o.dy)
            assert np.abs(img[y, x].astype(int) - W.COLOURS[o.colour]).max() <= 8, (o, img[y, x])


def test_video_round_trips_through_mp4(tmp_path):
    clip = W.sample_clip(random.Random(1))
    frames = W.render_clip(clip)
    W.write_mp4(frames, tmp_path / "c.mp4")
    got, meta = W.read_video(tmp_path / "c.mp4")
    assert len(got) == W.MODEL_FRAMES and got[0].shape == (W.SIZE, W.SIZE, 3)
    assert meta == W.clip_metadata()
    assert np.abs(got[0].astype(int) - frames[0]).mean() < 8   # lossy, but the same picture


def test_gold_answers_score_right_and_wrong_answers_wrong():
    rng = random.Random(2)
    for _ in range(100):
        scene, clip = W.sample_scene(rng), W.sample_clip(rng)
        for k in L.IMAGE_KINDS:
            ex = L.image_example(scene, rng, k)
            assert L.score(ex, ex.answer, list(scene.objects)), (k, ex)
            assert not L.score(ex, "I do not know.", list(scene.objects)), (k, ex)
        for k in L.VIDEO_KINDS:
            ex = L.video_example(clip, rng, k)
            assert L.score(ex, ex.answer, L.clip_objects(clip)), (k, ex)


def test_descriptions_are_long_and_vary(tok):
    rng = random.Random(3)
    scene = W.sample_scene(rng, 3, 4)
    texts = {L.describe_scene(scene, rng) for _ in range(20)}
    assert len(texts) > 5   # choice points: phrasings and orders
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    assert 30 <= min(lengths) and max(lengths) <= 150


def test_descriptions_name_objects_in_reading_order_place_first():
    """Each object sentence opens with its place, and the places come in reading order (top row first, left to
    right), whatever order the scene lists its objects in; an occluding pair is one sentence at its cell."""
    rng = random.Random(11)
    for _ in range(200):
        scene = W.sample_scene(rng, 2, 4)
        body = L.describe_objects(scene, rng)
        cells = []
        for sentence in body:
            pos = L.parse_position(sentence.split(",")[0].split(" is ")[0].split(" we see ")[0])
            assert pos is not None, sentence
            cells.append(W.POSITIONS.index(pos))
        assert cells == sorted(cells), body
        units = len(scene.objects) - (1 if scene.occluded else 0)
        assert len(body) == units and sorted(cells) == sorted({o.cell for o in scene.objects}), (body, scene)


@pytest.mark.parametrize("text", ["a small red star", "Hello, wörld! 🙂 ∑ 数学 \t\n  <b>code</b>", "", "x" * 300])
def test_tokenizer_round_trips_any_text(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids or tok.unk_token_id is None


def test_chat_template_and_special_tokens(tok):
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert rendered == user_turn("video", "What happens?")
    for name in ("<|image_pad|>", "<|video_pad|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"):
        assert tok(name, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(name)]
    assert tok.image_token == "<|image_pad|>" and tok.video_token == "<|video_pad|>"


def test_batches_match_the_processor(tok):
    from sage_engine.tinyworld.architecture import build_processor
    from sage_engine.tinyworld.training.data import check_against_processor
    check_against_processor(build_processor(tok))
