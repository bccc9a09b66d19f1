"""Hostile and odd media, written on demand: what a stranger might upload to a public demo.

Each builder writes one small file and returns its path. Shared by test_media.py (the engine's readers),
test_app_inputs.py (the API) and test_cli.py (the CLI).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(path: Path, side: int = 30000) -> str:
    """A ~100-byte PNG whose header declares side x side pixels (1-bit greyscale; only a few rows of data)."""
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + (side + 7) // 8) * 4)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b""))
    return str(path)


def video(path: Path, fourcc: str = "MJPG", frames: int = 8, size: tuple[int, int] = (64, 64), fps: float = 4) -> str:
    """A clip written by OpenCV with `fourcc` (MJPG -> .avi, VP80 -> .webm, mp4v -> .mp4): a square moving right."""
    import cv2

    w, h = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    assert writer.isOpened(), f"OpenCV cannot write {fourcc} here"
    for i in range(frames):
        frame = np.full((h, w, 3), 40, np.uint8)
        x = (w - 16) * i // max(1, frames - 1)
        frame[h // 3: h // 3 + 16, x: x + 16] = (40, 40, 220)
        writer.write(frame)
    writer.release()
    return str(path)


def avi_declaring(path: Path, frames: int) -> str:
    """An 8-frame MJPG AVI whose headers (avih dwTotalFrames, strh dwLength) declare `frames` frames."""
    src = path.with_name(path.stem + "-src.avi")
    data = bytearray(Path(video(src)).read_bytes())
    struct.pack_into("<I", data, data.find(b"avih") + 8 + 16, frames)
    struct.pack_into("<I", data, data.find(b"strh") + 8 + 32, frames)
    path.write_bytes(bytes(data))
    return str(path)


def odd_images(d: Path) -> dict[str, str]:
    """Valid images in modes a camera, scanner or editor may produce: name -> path."""
    ramp = np.tile(np.linspace(0, 1, 64), (64, 1))
    images = {
        "greyscale": Image.fromarray((ramp * 255).astype(np.uint8), "L"),
        "rgba": Image.fromarray(np.dstack([(ramp * 255).astype(np.uint8)] * 3 + [np.full((64, 64), 128, np.uint8)])),
        "16-bit": Image.fromarray((ramp * 65535).astype(np.uint16)),
        "cmyk": Image.new("CMYK", (64, 64), (0, 200, 200, 0)),
        "palette": Image.new("RGB", (64, 64), (200, 30, 30)).quantize(4),
    }
    ext = {"cmyk": "jpg", "palette": "gif"}
    out = {}
    for name, img in images.items():
        out[name] = str(d / f"{name.replace('-', '')}.{ext.get(name, 'png')}")
        img.save(out[name])
    return out


def wrong_extensions(d: Path) -> dict[str, str]:
    """Files whose name says one thing and whose bytes another: name -> path."""
    Image.new("RGB", (64, 64), (30, 160, 60)).save(d / "png-inside.png")
    (d / "image-named.mp4").write_bytes((d / "png-inside.png").read_bytes())
    (d / "video-named.png").write_bytes(Path(video(d / "clip-for-rename.avi")).read_bytes())
    (d / "text-named.png").write_text("hello, I am a text file\n")
    return {"png named .mp4": str(d / "image-named.mp4"), "video named .png": str(d / "video-named.png"),
            "text named .png": str(d / "text-named.png")}
