"""Media at the app's edge: the sampled-frame strip, examples, run export.

Reading and validating media is the engine's job (sage_engine.media raises one-line InputErrors);
the app only hands it the uploaded paths and shows what came back.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sage_engine.media import VideoClip

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "assets" / "examples"


def frame_strip(clip: VideoClip | None) -> list[tuple]:
    """Gallery items (frame, caption) for the frames the model actually sees."""
    if clip is None:
        return []
    fps = clip.fps or 1.0
    return [(frame, f"frame {i} · {i / fps:.1f} s") for frame, i in zip(clip.frames, clip.frames_indices)]


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
