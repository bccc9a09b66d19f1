"""The engine's media readers against hostile and odd files: one-line InputErrors, bounded work, valid RGB."""

from __future__ import annotations

import time

import hostile_media as hm
import numpy as np
import pytest

from sage_engine import InputError
from sage_engine.models.media import MAX_VIDEO_FRAMES, load_image, sample_video


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and len(text) < 200, text
    return text


def test_decompression_bomb_is_refused_from_its_header(tmp_path, monkeypatch):
    path = hm.png_bomb(tmp_path / "bomb.png")
    assert (tmp_path / "bomb.png").stat().st_size < 1000
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("pixels decoded"))
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        load_image(path)
    assert "image is too large" in one_line(e) and "900 megapixels" in str(e.value)
    assert time.perf_counter() - t0 < 0.5
    # below PIL's own bomb threshold (2 x 89 MP) our 40 MP limit refuses it, also from the header
    with pytest.raises(InputError, match=r"too large \(8000x8000 pixels"):
        load_image(hm.png_bomb(tmp_path / "64mp.png", 8000))


@pytest.mark.parametrize("kind", ["greyscale", "rgba", "16-bit", "cmyk", "palette"])
def test_odd_images_become_rgb(tmp_path, kind):
    img = load_image(hm.odd_images(tmp_path)[kind])
    arr = np.asarray(img)
    assert img.mode == "RGB" and arr.shape == (64, 64, 3) and arr.dtype == np.uint8
    if kind in ("greyscale", "16-bit"):  # a 0..1 ramp: 16-bit data is scaled, not clipped at 255
        assert arr[0, 0, 0] == 0 and arr[0, -1, 0] == 255 and 100 < arr[0, 32, 0] < 160
    if kind == "rgba":  # half-transparent over white, not over black
        assert arr[0, 0, 0] > 100


def test_wrong_extensions(tmp_path):
    files = hm.wrong_extensions(tmp_path)
    assert load_image(files["png named .mp4"]).size == (64, 64)  # read by content, not by name
    for name in ("video named .png", "text named .png"):
        with pytest.raises(InputError) as e:
            load_image(files[name])
        assert "cannot read image" in one_line(e) and "not an image format" in str(e.value)
    clip = sample_video(files["png named .mp4"])  # OpenCV reads a still image as a 1-frame video
    assert len(clip.frames) == 1


def test_zero_byte_files(tmp_path):
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "zero.mp4").write_bytes(b"")
    with pytest.raises(InputError, match="image file is empty"):
        load_image(tmp_path / "zero.png")
    with pytest.raises(InputError, match="video file is empty"):
        sample_video(str(tmp_path / "zero.mp4"))


@pytest.mark.parametrize("fourcc,ext", [("MJPG", "avi"), ("mp4v", "mp4"), ("VP80", "webm")])
def test_one_frame_video(tmp_path, fourcc, ext):
    clip = sample_video(hm.video(tmp_path / f"one.{ext}", fourcc, frames=1), 8)
    assert len(clip.frames) == 1 and clip.frames_indices == [0] and clip.total_num_frames == 1


def test_video_declaring_a_huge_frame_count_is_refused(tmp_path):
    path = hm.avi_declaring(tmp_path / "long.avi", 2_000_000_000)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        sample_video(path)
    assert "video is too long" in one_line(e) and f"limit is {MAX_VIDEO_FRAMES}" in str(e.value)
    assert time.perf_counter() - t0 < 1.0
    ok = sample_video(hm.avi_declaring(tmp_path / "fine.avi", 100))  # a count that is merely wrong: counted
    assert ok.total_num_frames == 8 and len(ok.frames) == 8


def test_video_with_huge_frames_is_refused(tmp_path):
    path = hm.video(tmp_path / "big.avi", "MJPG", frames=1, size=(4200, 4200))
    with pytest.raises(InputError) as e:
        sample_video(path)
    assert "video frames are too large (4200x4200" in one_line(e)
