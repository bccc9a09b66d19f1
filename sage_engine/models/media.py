"""Reading user media safely: images through PIL, videos through OpenCV with uniform frame sampling.

Every failure is an InputError with a one-line message; sizes are bounded before decoding: an image's
pixel count is read from its header, a video's frame size and frame count from its container, and a
video whose container gives no usable count is counted without keeping frames (memory stays bounded).
Odd but valid images (greyscale, palette, RGBA, 16-bit, CMYK) become plain 8-bit RGB.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import InputError

MAX_IMAGE_BYTES = 25 * 1024 * 1024  # a larger upload is refused before decoding
MAX_IMAGE_PIXELS = 40_000_000  # decompression-bomb guard (PIL checks it too)
MAX_VIDEO_BYTES = 200 * 1024 * 1024
MAX_VIDEO_FRAMES = 20_000  # a longer video (as declared, or as counted) is refused / read only this far
MAX_VIDEO_PIXELS = 4096 * 4096  # per frame; a larger declared or decoded frame size is refused
DEFAULT_NUM_FRAMES = 8  # frames sampled from a video when the processor names no number of its own


def video_frames_for(processor) -> int:
    """How many frames to sample for this processor (its own setting when it has one). Here, with no torch, so
    that the page can show a video's frames before the engine is imported."""
    vp = getattr(processor, "video_processor", None)
    n = getattr(vp, "num_frames", None)
    return int(n) if isinstance(n, int) and n > 0 else DEFAULT_NUM_FRAMES


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


def squeeze_to_square(rgb: np.ndarray, side: int) -> np.ndarray:
    """An RGB uint8 picture (H, W, 3) squeezed to side x side, aspect ratio not kept (area averaging when
    shrinking): what a model that reads every picture on one square canvas sees (`square_canvas`), each part of
    the picture in the same place of the canvas."""
    import cv2

    rgb = np.ascontiguousarray(rgb[..., :3])
    if rgb.shape[:2] == (side, side):
        return rgb
    shrink = rgb.shape[0] >= side and rgb.shape[1] >= side
    return cv2.resize(rgb, (side, side), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def square_canvas(model) -> int | None:
    """The side of the square canvas a model reads every picture and frame on (its config's `square_canvas`, which
    the embedded tinyworld pair sets), or None: pictures go to its processor as they are."""
    side = getattr(getattr(model, "config", None), "square_canvas", None)
    return int(side) if isinstance(side, int) and side > 0 else None


def on_canvas(images: list[Image.Image], clip: VideoClip | None, side: int) -> tuple[list[Image.Image],
                                                                                    VideoClip | None]:
    """Images and a clip's frames squeezed to a side x side canvas (squeeze_to_square)."""
    images = [Image.fromarray(squeeze_to_square(np.asarray(im), side)) for im in images]
    if clip is not None:
        frames = [squeeze_to_square(f, side) for f in clip.frames]
        clip = VideoClip(frames, clip.total_num_frames, clip.fps, clip.duration, clip.frames_indices, side, side)
    return images, clip


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
        name = os.path.basename(path)
        try:
            img = Image.open(path)  # reads the header only
            _check_pixels(img.width, img.height)  # before any pixel is decoded
            img.load()
        except InputError:
            raise
        except Image.DecompressionBombError as e:  # PIL's own guard, raised by open() from the header
            found = re.search(r"\((\d+) pixels\)", str(e))
            declared = f"{int(found.group(1)) / 1e6:.0f} megapixels" if found else "too many pixels"
            raise InputError(f"image is too large (its header declares {declared}; the limit is "
                             f"{MAX_IMAGE_PIXELS // 1_000_000} megapixels)") from None
        except UnidentifiedImageError:
            raise InputError(f"cannot read image {name}: not an image format this app reads") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise InputError(f"cannot read image {name}: {type(e).__name__} (damaged or truncated file?)") from None
    _check_pixels(img.width, img.height)
    if img.width < 1 or img.height < 1:
        raise InputError("image has no pixels")
    return _to_rgb(img)


def _check_pixels(width: int, height: int) -> None:
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(f"image is too large ({width}x{height} pixels; the limit is "
                         f"{MAX_IMAGE_PIXELS // 1_000_000} megapixels)")


def _to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB: 16/32-bit greyscale scaled (PIL's convert would clip it at 255), transparency over white."""
    if img.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
        arr = np.asarray(img, dtype=np.float64)
        wide = img.mode != "I" or arr.max(initial=0) > 255  # 16-bit data (mode I may hold 8-bit values)
        scale = 257.0 if wide else 1.0  # 65535 -> 255
        img = Image.fromarray(np.clip(arr / scale, 0, 255).astype(np.uint8), "L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def sample_video(path: str, num_frames: int = 8) -> VideoClip:
    """`num_frames` frames at uniform indices arange(n) * total // n, RGB, with metadata."""
    import cv2  # imported here: only video inputs need OpenCV

    path = os.fspath(path)
    _check_file(path, MAX_VIDEO_BYTES, "video")
    name = os.path.basename(path)
    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise InputError(f"cannot open video {name}: not a readable video file")
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        _check_frame_size(int(cap.get(cv2.CAP_PROP_FRAME_WIDTH) or 0), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT) or 0))
        if total > MAX_VIDEO_FRAMES:
            raise InputError(f"video is too long (its container declares {total} frames; the limit is "
                             f"{MAX_VIDEO_FRAMES})")
        frames, indices = _read_uniform(cap, total, num_frames) if total > 0 else ([], [])
        if len(frames) < min(num_frames, max(total, 1)):  # count missing or wrong: count the frames, then sample
            cap.release()
            total = _count_frames(cv2.VideoCapture(path))
            cap = cv2.VideoCapture(path)
            frames, indices = _read_uniform(cap, total, num_frames) if total > 0 else ([], [])
    finally:
        cap.release()
    if not frames:
        raise InputError(f"video {name} has no decodable frames")
    fps = fps if fps > 0 else 24.0
    h, w = frames[0].shape[:2]
    return VideoClip(frames, total, fps, total / fps, indices, w, h)


def _check_frame_size(width: int, height: int) -> None:
    if width * height > MAX_VIDEO_PIXELS:
        raise InputError(f"video frames are too large ({width}x{height} pixels; the limit is "
                         f"{MAX_VIDEO_PIXELS / 1e6:.1f} megapixels per frame)")


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
        _check_frame_size(frame.shape[1], frame.shape[0])  # the container may understate it
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        got.append(idx)
    return frames, got


def _count_frames(cap) -> int:
    """Frames a capture really yields (at most MAX_VIDEO_FRAMES), keeping none of them."""
    try:
        n = 0
        while n < MAX_VIDEO_FRAMES and cap.grab():
            n += 1
        return n
    finally:
        cap.release()
