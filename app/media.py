"""Media at the app's edge: the sampled-frame strip, browser previews of videos, examples, run export.

Reading and validating media is the engine's job (sage_engine.models.media raises one-line InputErrors);
the app only hands it the uploaded paths and shows what came back.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from sage_engine import InputError
from sage_engine.models.media import MAX_VIDEO_PIXELS, VideoClip
from sage_engine.models.presets import ASSETS

NO_MEDIA = "no image and no video: upload an image or a video (or click an example) for the model to answer about"
BOTH_MEDIA = ("both an image and a video were given: clear one of them (the model reads one picture or one clip, "
              "and would mix the two)")


def check_media(image, video) -> None:
    """One image or one video (InputError in one line otherwise); a text-only pair's callers skip this."""
    if image and video:
        raise InputError(BOTH_MEDIA)
    if not image and not video:
        raise InputError(NO_MEDIA)


EXAMPLES_DIR = ASSETS / "examples"  # the one place that knows where the assets are: presets.ASSETS


def frame_strip(clip: VideoClip | None) -> list:
    """Gallery items for the frames the model actually sees (no captions: a caption covers a small thumbnail; their
    times are in the strip's label, frames_label)."""
    return [] if clip is None else list(clip.frames)


def frames_label(clip: VideoClip) -> str:
    """The frame strip's label: which times the model sees, in one short line (the label sits over the strip's top
    edge: a second line would cover the thumbnails)."""
    fps = clip.fps or 1.0
    times = [f"{i / fps:.1f}" for i in clip.frames_indices]
    if len(times) <= 4:
        return f"Frames the model sees: {', '.join(times)} s"
    return f"The {len(times)} frames the model sees: {times[0]} to {times[-1]} s"


# Codecs (OpenCV's FOURCC, lower case) and containers a browser's <video> element plays.
PLAYABLE_CODECS = frozenset({"vp80", "vp90", "vp08", "vp09", "av01", "avc1", "h264", "x264", "theo"})
PLAYABLE_CONTAINERS = frozenset({".webm", ".mp4", ".m4v", ".mov", ".ogg", ".ogv"})
PREVIEW_SIDE = 480  # longest side of a preview, px
PREVIEW_SECONDS = 30.0  # a preview shows at most this much of the video


def browser_playable(path: str) -> bool:
    """Whether a browser plays this file as it is (container by name, codec as OpenCV reads it)."""
    import cv2

    if Path(path).suffix.lower() not in PLAYABLE_CONTAINERS:
        return False
    cap = cv2.VideoCapture(path)
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC)) if cap.isOpened() else 0
    finally:
        cap.release()
    return code.to_bytes(4, "little").decode("latin-1").lower() in PLAYABLE_CODECS


class Previews:
    """Browser-playable stand-ins (VP8 WebM) for uploaded videos the browser cannot play, e.g. MPEG-4 part 2
    ('mp4v', OpenCV's default for .mp4) or MJPG AVI. The page shows the stand-in in place of the upload;
    `original()` maps it back, so the model always reads the visitor's own file."""

    def __init__(self, directory: str | None = None, keep: int = 256):
        self.directory = Path(directory or tempfile.mkdtemp(prefix="sage-previews-"))
        self.keep = keep  # previews remembered (the oldest file is deleted first)
        self._originals: OrderedDict[str, str] = OrderedDict()  # preview file name -> uploaded path

    def original(self, path: str | None) -> str | None:
        """The upload a preview stands for (matched by file name: Gradio copies the file into its cache)."""
        if not path:
            return path
        found = self._originals.get(Path(path).name)
        return found if found and os.path.isfile(found) else path

    def is_preview(self, path: str | None) -> bool:
        return bool(path) and Path(path).name in self._originals

    def make(self, path: str) -> str | None:
        """A playable preview of `path`, or None when the browser plays it already or OpenCV cannot read it."""
        if self.is_preview(path) or browser_playable(path):
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"preview-{uuid.uuid4().hex}.webm"  # unguessable: the name maps to an upload
        if not _transcode(path, out):
            out.unlink(missing_ok=True)
            return None
        self._originals[out.name] = path
        while len(self._originals) > self.keep:
            (self.directory / self._originals.popitem(last=False)[0]).unlink(missing_ok=True)
        return str(out)


def _transcode(src: str, dst: Path) -> bool:
    """The first PREVIEW_SECONDS of `src` as VP8 WebM, scaled to at most PREVIEW_SIDE px; False if unreadable."""
    import cv2

    cap = cv2.VideoCapture(src)
    writer = None
    try:
        w, h = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH) or 0), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT) or 0)
        if not cap.isOpened() or w * h <= 0 or w * h > MAX_VIDEO_PIXELS:
            return False
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0) or 24.0
        scale = min(1.0, PREVIEW_SIDE / max(w, h))
        size = (max(2, round(w * scale) // 2 * 2), max(2, round(h * scale) // 2 * 2))  # even sides for the codec
        writer = cv2.VideoWriter(str(dst), cv2.VideoWriter_fourcc(*"VP80"), fps, size)
        written = 0
        while writer.isOpened() and written < fps * PREVIEW_SECONDS:
            ok, frame = cap.read()
            if not ok or frame is None:
                break
            writer.write(cv2.resize(frame, size, interpolation=cv2.INTER_AREA) if frame.shape[1::-1] != size else frame)
            written += 1
        return written > 0
    finally:
        cap.release()
        if writer is not None:
            writer.release()


@dataclass(frozen=True)
class Example:
    file: str  # absolute path
    media: str  # "image" | "video"
    prompt: str


def load_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Examples listed in `examples.json` ([{"file", "media", "prompt"}]) whose files exist; [] if absent."""
    index = directory / "examples.json"
    if not index.is_file():
        return []
    try:
        rows = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    out = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("media") not in ("image", "video"):
            continue
        path = Path(str(row.get("file", "")))
        if not path.is_absolute():  # relative to examples.json, else to the repository root
            path = directory / path if (directory / path).is_file() else directory.parent.parent / path
        if path.is_file() and str(row.get("prompt", "")).strip():
            out.append(Example(str(path), row["media"], str(row["prompt"])))
    return out


class RunFiles:
    """Where exported runs are written (one directory per app; files older than `keep_s` are removed)."""

    def __init__(self, directory: str | None = None, keep_s: float = 3600.0):
        self.directory = Path(directory or tempfile.mkdtemp(prefix="sage-runs-"))
        self.keep_s = keep_s

    def write(self, payload: dict) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in self.directory.glob("sage-run-*.json"):
            if now - old.stat().st_mtime > self.keep_s:
                old.unlink(missing_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"sage-run-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".json",
                                    dir=self.directory)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1)
        return path
