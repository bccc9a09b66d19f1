"""Reading user media safely: images through PIL, videos through OpenCV with uniform frame sampling.

Every failure is an InputError with a one-line message; sizes are bounded before decoding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import InputError

MAX_IMAGE_BYTES = 25 * 1024 * 1024  # a larger upload is refused before decoding
MAX_IMAGE_PIXELS = 40_000_000  # decompression-bomb guard (PIL checks it too)
MAX_VIDEO_BYTES = 200 * 1024 * 1024
MAX_VIDEO_FRAMES_DECODED = 20_000  # when the container lies about its length we decode at most this many


@dataclass
class VideoClip:
    """Frames sampled uniformly from a video, with the metadata video processors need."""

    frames: list[np.ndarray]  # RGB uint8, [H, W, 3] each
    total_num_frames: int
    fps: float
    duration: float
    frames_indices: list[int]
    width: int
    height: int

    def metadata(self) -> dict:
        return {
            "total_num_frames": self.total_num_frames,
            "fps": self.fps,
            "duration": self.duration,
            "frames_indices": self.frames_indices,
            "width": self.width,
            "height": self.height,
            "video_backend": "opencv",
        }


def _check_file(path: str, limit: int, what: str) -> None:
    if not path or not os.path.isfile(path):
        raise InputError(f"{what} file not found: {path}")
    size = os.path.getsize(path)
    if size == 0:
        raise InputError(f"{what} file is empty: {os.path.basename(path)}")
    if size > limit:
        raise InputError(f"{what} is too large ({size / 2**20:.0f} MB; the limit is {limit / 2**20:.0f} MB)")


def load_image(path_or_image) -> Image.Image:
    """An RGB PIL image from a path or an image object; InputError if unreadable or too large."""
    if isinstance(path_or_image, Image.Image):
        img = path_or_image
    else:
        path = os.fspath(path_or_image)
        _check_file(path, MAX_IMAGE_BYTES, "image")
        try:
            img = Image.open(path)
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise InputError(f"image is too large ({img.width}x{img.height} pixels; the limit is 40 megapixels)")
            img.load()
        except InputError:
            raise
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError, ValueError) as e:
            raise InputError(f"cannot read image {os.path.basename(path)}: {type(e).__name__}") from None
    if img.width * img.height > MAX_IMAGE_PIXELS:
        raise InputError(f"image is too large ({img.width}x{img.height} pixels; the limit is 40 megapixels)")
    if img.width < 1 or img.height < 1:
        raise InputError("image has no pixels")
    return img.convert("RGB")


def sample_video(path: str, num_frames: int = 8) -> VideoClip:
    """`num_frames` frames at uniform indices arange(n) * total // n, RGB, with metadata."""
    import cv2  # imported here: only video inputs need OpenCV

    path = os.fspath(path)
    _check_file(path, MAX_VIDEO_BYTES, "video")
    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise InputError(f"cannot open video {os.path.basename(path)}: not a readable video file")
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        frames, indices = _read_uniform(cap, total, num_frames) if total > 0 else ([], [])
        if len(frames) < min(num_frames, max(total, 1)):  # count missing or wrong: decode everything once
            cap.release()
            cap = cv2.VideoCapture(path)
            frames, indices, total = _read_all_then_sample(cap, num_frames)
    finally:
        cap.release()
    if not frames:
        raise InputError(f"video {os.path.basename(path)} has no decodable frames")
    fps = fps if fps > 0 else 24.0
    h, w = frames[0].shape[:2]
    return VideoClip(frames, total, fps, total / fps, indices, w, h)


def _uniform_indices(total: int, n: int) -> list[int]:
    n = max(1, min(n, total))
    return [i * total // n for i in range(n)]


def _read_uniform(cap, total: int, n: int) -> tuple[list[np.ndarray], list[int]]:
    import cv2

    wanted = _uniform_indices(total, n)
    frames, got, pos = [], [], 0
    for idx in wanted:
        while pos < idx:  # grab() skips decoding of frames we do not keep
            if not cap.grab():
                return frames, got
            pos += 1
        ok, frame = cap.read()
        pos += 1
        if not ok or frame is None:
            return frames, got
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        got.append(idx)
    return frames, got


def _read_all_then_sample(cap, n: int) -> tuple[list[np.ndarray], list[int], int]:
    import cv2

    all_frames = []
    while len(all_frames) < MAX_VIDEO_FRAMES_DECODED:
        ok, frame = cap.read()
        if not ok or frame is None:
            break
        all_frames.append(frame)
    if not all_frames:
        return [], [], 0
    idx = _uniform_indices(len(all_frames), n)
    return [cv2.cvtColor(all_frames[i], cv2.COLOR_BGR2RGB) for i in idx], idx, len(all_frames)
