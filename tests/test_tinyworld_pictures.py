"""Pictures from outside the shapes world: their facts from the pixels (pixels.py), the answers made from those
facts and the scorers that read them back (picture_talk.py), the held-out split (pictures.py), the square canvas
the engine puts every picture on for the embedded pair, and clean text."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from sage_engine.evaluation.suites import REAL
from sage_engine.models.media import on_canvas, squeeze_to_square
from sage_engine.tinyworld import picture_talk as T
from sage_engine.tinyworld import pictures as P
from sage_engine.tinyworld.pixels import CHANGE_L, DARK, LIGHT, PALETTE, canvas, clip_facts, colour_names, picture_facts
from sage_engine.tinyworld.world import SIZE


def flat(rgb, h=SIZE, w=SIZE) -> np.ndarray:
    img = np.empty((h, w, 3), np.uint8)
    img[:] = rgb
    return img


@pytest.mark.parametrize("rgb, name", [
    ((220, 30, 30), "red"), ((250, 140, 20), "orange"), ((245, 220, 30), "yellow"), ((30, 170, 50), "green"),
    ((30, 80, 230), "blue"), ((150, 50, 190), "purple"), ((250, 160, 190), "pink"), ((120, 70, 30), "brown"),
    ((128, 128, 128), "grey"), ((5, 5, 5), "black"), ((252, 252, 252), "white"), ((150, 200, 240), "blue"),
])
def test_colours_are_named_as_people_name_them(rgb, name):
    assert PALETTE[int(colour_names(np.array([[rgb]], np.uint8))[0, 0])] == name


def test_a_picture_s_facts_follow_its_pixels():
    img = flat((20, 60, 200))              # blue
    img[:28, :28] = (250, 250, 250)       # white top left: the brightest part
    img[56:, 56:] = (10, 10, 10)           # black bottom right: the darkest part
    f = picture_facts(img)
    assert f.cells == ("white", "blue", "blue", "blue", "blue", "blue", "blue", "blue", "black")
    assert f.brightest == 0 and f.darkest == 8 and f.main == ("blue",)
    assert f.brightness == "medium" or DARK <= f.lightness <= LIGHT
    assert picture_facts(flat((10, 10, 10))).brightness == "dark"
    assert picture_facts(flat((240, 240, 230))).brightness == "light"


def test_a_region_shows_every_colour_covering_a_third_of_it():
    img = flat((30, 170, 50))
    img[:28, :12] = (220, 30, 30)           # 12 of 28 columns of the top left cell red: > 0.3
    f = picture_facts(img)
    assert f.cells[0] == "green" and f.shows[0] == {"green", "red"} and f.shows[1] == {"green"}


def test_any_picture_is_squeezed_whole_onto_the_square_canvas():
    wide = flat((30, 80, 230), 300, 600)
    wide[:100, :200] = (250, 250, 250)      # the top left third of a 2:1 picture
    c = canvas(wide)
    assert c.shape == (SIZE, SIZE, 3) and np.array_equal(c, squeeze_to_square(wide, SIZE))
    assert picture_facts(wide).cells[0] == "white" and picture_facts(wide).cells[1] == "blue"
    from PIL import Image
    images, _ = on_canvas([Image.fromarray(wide)], None, SIZE)
    assert images[0].size == (SIZE, SIZE)


def test_a_clip_s_changes_and_motion_follow_its_frames():
    rng = np.random.default_rng(0)
    texture = (rng.random((SIZE, 2 * SIZE, 3)) * 255).astype(np.uint8)
    import cv2
    texture = cv2.GaussianBlur(texture, (0, 0), 2)
    pan = [texture[:, x:x + SIZE] for x in (0, 6, 12, 18)]   # the window moves right: the picture moves left
    assert clip_facts(pan).motion == "left"
    assert clip_facts(pan[::-1]).motion == "right"
    still = [flat((30, 170, 50))] * 4
    assert not clip_facts(still).changes
    lit = flat((60, 60, 60))
    lit[:28, :28] = (200, 200, 200)
    c = clip_facts([flat((60, 60, 60))] * 2 + [lit] * 2)
    assert c.lighter == (0,) and not c.darker and c.motion is None and c.changes
    assert c.end.cell_l[0] - c.start.cell_l[0] >= CHANGE_L


def test_every_answer_made_from_the_facts_scores_true_and_is_clean():
    rng = random.Random(4)
    for _ in range(60):
        f = picture_facts(P.sample_picture(rng))
        for kind in T.PICTURE_KINDS:
            ex = T.picture_example(f, rng, kind)
            got = T.score_picture(ex, ex.answer)
            assert got and all(got.values()), (ex.answer, got)
            assert not T.text_defects(ex.answer), ex.answer
    for _ in range(20):
        frames = P.sample_clip_frames(rng)
        c = clip_facts([frames[i] for i in (0, 2, 4, 6)])
        for kind in T.CLIP_KINDS:
            ex = T.clip_example(c, rng, kind)
            got = T.score_picture(ex, ex.answer)
            assert got and all(got.values()), (ex.answer, got)
            assert not T.text_defects(ex.answer), ex.answer


def test_the_scorers_catch_wrong_facts():
    img = flat((20, 60, 200))
    img[:28, :28] = (250, 250, 250)
    f = picture_facts(img)
    rng = random.Random(0)
    ex = T.picture_example(f, rng, "pic_describe")
    wrong = ex.answer.replace("In the top row, the left is white, the middle is blue",
                              "In the top row, the left is red, the middle is red")
    assert wrong != ex.answer
    got = T.score_picture(ex, wrong)
    assert not got["region_0"] and not got["region_1"] and got["region_3"]
    assert not T.score_picture(ex, "This picture has three shapes: a red square in the top left.")["kind"]
    assert not T.score_picture(ex, ex.answer.replace("medium", "x").replace(
        "neither very light nor very dark", "mostly dark"))["brightness"]


@pytest.mark.parametrize("text", [
    "This pictureThe imageThe image top left, there top left", "a smallBBBBBBIt", "In the bottomNoNoNoNoNoNoNoNo",
    "This picture top left is top left is top is top left corner", "The top row is blue blue.",
])
def test_broken_text_is_caught(text):
    assert T.text_defects(text)


def test_held_out_photos_and_videos_never_reach_training():
    train = {path for _, path in P.PHOTOS_TRAIN}
    held = {path for _, path in P.PHOTOS_HELD_OUT + P.VIDEOS_HELD_OUT}
    assert not train & held
    assert {it.path for it in REAL} <= held   # the benchmark's real suite is held out whole
    for a in P.photos("train"):
        for b in P.photos("held_out"):
            assert a.shape != b.shape or not np.array_equal(a, b)


SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "models"


@pytest.mark.skipif(not (SHIPPED / "tinyworld-target").is_dir(), reason="no shipped pair in assets/models")
def test_the_shipped_pair_describes_held_out_pictures_in_clean_sentences_without_shapes():
    """The shipped target's answers about held-out pictures and clips (a stream of its own) name no shape, say
    that the picture is not one of shapes, and have no stutter, glued words or character runs."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from sage_engine.tinyworld.evaluate import generate, make_picture_items

    items = [it for it in make_picture_items(seed=101, n=24, real=False)
             if it.example.kind in ("pic_describe", "pic_other", "pic_noshape", "clip_describe")]
    model = AutoModelForImageTextToText.from_pretrained(SHIPPED / "tinyworld-target", dtype=torch.float32).eval()
    answers = generate(model, AutoProcessor.from_pretrained(SHIPPED / "tinyworld-target"), items)
    dirty = [(a, T.text_defects(a)) for a in answers if T.text_defects(a)]
    shapes = [a for it, a in zip(items, answers) if not T.score_picture(it.example, a)["kind"]]
    assert len(items) >= 70 and not dirty and not shapes, (dirty[:3], shapes[:3])


@pytest.mark.skipif(not (SHIPPED / "tinyworld-target").is_dir(), reason="no shipped pair in assets/models")
def test_the_engine_puts_any_photo_on_the_shipped_pair_s_square_canvas(tmp_path):
    """A 2:1 photo reaches the shipped pair as its 84 x 84 canvas: 3 x 3 merged visual tokens, the whole picture."""
    from PIL import Image

    from sage_engine import load_pair, prepare_input
    from sage_engine.models.media import square_canvas

    wide = flat((30, 80, 230), 300, 600)
    Image.fromarray(wide).save(tmp_path / "wide.png")
    pair = load_pair()
    assert square_canvas(pair.target) == SIZE
    prep = prepare_input(pair, "Describe the image.", images=[str(tmp_path / "wide.png")])
    assert prep.target_inputs["image_grid_thw"].tolist() == [[1, SIZE // 14, SIZE // 14]]
    assert prep.images[0].size == (SIZE, SIZE)


def test_a_row_is_read_cell_by_cell_and_a_row_missing_a_cell_says_nothing():
    assert T.read_rows("In the top row, the left is white, the middle is blue and the right is red.") == {
        0: ["white", "blue", "red"]}
    assert T.read_rows("In the bottom row, the left is white and the right is red.") == {}
    assert T.read_rows("In the top row, the left is white, the left is blue and the right is red.") == {}
