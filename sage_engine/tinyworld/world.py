"""The tinyworld: seeded scenes of coloured shapes, rendered as images and short videos.

Every scene carries its ground truth (`Scene`, `Clip`), so that answers can be
generated for training and scored for evaluation. Images are SIZE x SIZE RGB
uint8 arrays (84 = 3 x 28: 9 visual tokens for Qwen2-VL-style processors, one per cell);
videos are CLIP_FRAMES frames written as real MP4 files (OpenCV, 'mp4v'), of
which the models see MODEL_FRAMES sampled uniformly, like the engine does.

Objects sit on a 3 x 3 grid of cells named by position words; each cell is exactly one
merged visual token (28 x 28 pixels), so what a token shows is what one cell holds. One cell may hold
two objects (a small one in front of a large one: occlusion). In a clip exactly
one event happens halfway: an object moves, appears, disappears, grows, shrinks
or changes colour.
"""
from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import cv2
import numpy as np

from ..models.media import sample_video

SIZE = 84             # image side in pixels: 3 cells of 28 (one merged visual token each)
CLIP_FRAMES = 8       # frames written to each MP4
CLIP_FPS = 4.0        # frames per second of the MP4
MODEL_FRAMES = 4      # frames the models see (uniformly sampled; even for temporal_patch_size 2)

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (250, 140, 20),
    "yellow": (245, 220, 30),
    "green": (30, 170, 50),
    "blue": (30, 80, 230),
    "purple": (150, 50, 190),
}
SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
SIZES = ("small", "large")
RADIUS = {"small": 8, "large": 12}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (245, 245, 245),
    "grey": (120, 120, 120),
    "black": (15, 15, 15),
}
# cell index = 3 * row + col; the words used for each cell
POSITIONS = ("top left", "top", "top right", "left", "centre", "right", "bottom left", "bottom", "bottom right")
EVENTS = ("move", "appear", "disappear", "grow", "shrink", "recolour")


@dataclasses.dataclass(frozen=True)
class Obj:
    shape: str
    colour: str
    size: str
    cell: int          # index into POSITIONS
    dx: int = 0        # pixel jitter of the centre
    dy: int = 0

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]

    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclasses.dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[Obj, ...]   # drawn in order: a later object is in front
    occluded: tuple[int, int] | None = None   # (back, front) indices sharing one cell

    def truth(self) -> dict:
        return {
            "background": self.background,
            "count": len(self.objects),
            "objects": [dataclasses.asdict(o) | {"position": o.position} for o in self.objects],
            "occluded": list(self.occluded) if self.occluded else None,
        }


@dataclasses.dataclass(frozen=True)
class Clip:
    """A video: `start` scene, one event at the midpoint, `end` scene."""
    start: Scene
    end: Scene
    event: str          # one of EVENTS
    subject: Obj        # the object the event is about (as in `start`, or as it appears)
    after: Obj | None   # the subject after the event (move, grow, shrink, recolour)

    def truth(self) -> dict:
        return {
            "event": self.event,
            "subject": dataclasses.asdict(self.subject) | {"position": self.subject.position},
            "after": None if self.after is None else dataclasses.asdict(self.after) | {"position": self.after.position},
            "start": self.start.truth(),
            "end": self.end.truth(),
        }


# ---------------------------------------------------------------- sampling

OCCLUSION = 0.2   # the world's share of 3- and 4-object scenes with an occluding pair (training may draw more)


def shares_a_cell(o: Obj, objects) -> bool:
    """Whether another of `objects` sits in o's cell: an occluding pair, which one visual token shows whole."""
    return any(x is not o and x.cell == o.cell for x in objects)


def has_occluding_pair(objects) -> bool:
    """Whether two of `objects` share a cell."""
    return len({o.cell for o in objects}) < len(objects)


def _free_object(rng: random.Random, used: set[tuple[str, str]], cell: int) -> Obj:
    while True:
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
        if (shape, colour) not in used:
            used.add((shape, colour))
            return Obj(shape, colour, rng.choice(SIZES), cell, rng.randint(-2, 2), rng.randint(-2, 2))


def sample_scene(rng: random.Random, min_count: int = 1, max_count: int = 4, occlusion: float = OCCLUSION) -> Scene:
    """A scene of 1-4 objects with distinct (colour, shape) pairs, in distinct cells
    except for at most one occluding pair (large behind, small in front), which a scene of 3 or more
    objects has with probability `occlusion`."""
    count = rng.randint(min_count, max_count)
    used: set[tuple[str, str]] = set()
    occlude = count >= 3 and rng.random() < occlusion
    cells = rng.sample(range(9), count - (1 if occlude else 0))
    objs = [_free_object(rng, used, c) for c in cells]
    occluded = None
    if occlude:
        back = dataclasses.replace(objs[0], size="large", dx=0, dy=0)
        front = _free_object(rng, used, back.cell)
        front = dataclasses.replace(front, size="small", dx=rng.choice((-5, 5)), dy=rng.choice((-5, 5)))
        objs[0] = back
        objs.append(front)
        occluded = (0, len(objs) - 1)
    return Scene(rng.choice(list(BACKGROUNDS)), tuple(objs), occluded)


def sample_clip(rng: random.Random) -> Clip:
    """A clip whose start scene has 1-3 objects (no occlusion) and one event."""
    while True:
        scene = sample_scene(rng, 1, 3)
        if scene.occluded is None:
            break
    objs = list(scene.objects)
    free = [c for c in range(9) if c not in {o.cell for o in objs}]
    event = rng.choice(EVENTS)
    i = rng.randrange(len(objs))
    subj = objs[i]
    if event == "appear":
        new = _free_object(rng, {(o.shape, o.colour) for o in objs}, rng.choice(free))
        return Clip(scene, dataclasses.replace(scene, objects=tuple(objs + [new])), event, new, None)
    if event == "disappear":
        end = dataclasses.replace(scene, objects=tuple(objs[:i] + objs[i + 1:]))
        return Clip(scene, end, event, subj, None)
    if event == "move":
        after = dataclasses.replace(subj, cell=rng.choice(free))
    elif event in ("grow", "shrink"):
        subj = dataclasses.replace(subj, size="small" if event == "grow" else "large")
        objs[i] = subj
        after = dataclasses.replace(subj, size="large" if event == "grow" else "small")
    else:  # recolour: the new colour must keep (colour, shape) pairs distinct
        taken = {(o.shape, o.colour) for o in objs}
        colours = [c for c in COLOURS if (subj.shape, c) not in taken]
        after = dataclasses.replace(subj, colour=rng.choice(colours))
    start = dataclasses.replace(scene, objects=tuple(objs))
    end = dataclasses.replace(scene, objects=tuple(objs[:i] + [after] + objs[i + 1:]))
    return Clip(start, end, event, subj, after)


def mirror_cell(cell: int) -> int:
    """The cell seen in a mirror: same row, column 2 - col."""
    row, col = divmod(cell, 3)
    return 3 * row + 2 - col


def mirror_object(o: Obj) -> Obj:
    """The object in the left-right mirrored picture: render_image of the mirrored scene is the original
    picture flipped left-right (up to antialiasing and the background noise). OpenCV puts pixel centres
    on integer coordinates, so the flip maps x to SIZE - 1 - x while the cell centres mirror to SIZE - x:
    hence dx -> -dx - 1."""
    return dataclasses.replace(o, cell=mirror_cell(o.cell), dx=-o.dx - 1)


def mirror_scene(scene: Scene) -> Scene:
    return dataclasses.replace(scene, objects=tuple(mirror_object(o) for o in scene.objects))


def mirror_clip(clip: Clip) -> Clip:
    return dataclasses.replace(clip, start=mirror_scene(clip.start), end=mirror_scene(clip.end),
                               subject=mirror_object(clip.subject),
                               after=None if clip.after is None else mirror_object(clip.after))


# ---------------------------------------------------------------- drawing

def _centre(cell: int) -> tuple[float, float]:
    row, col = divmod(cell, 3)
    return (col + 0.5) * SIZE / 3, (row + 0.5) * SIZE / 3


def _polygon(shape: str, cx: float, cy: float, r: float) -> np.ndarray:
    if shape == "square":
        s = r * 0.85
        pts = [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    elif shape == "triangle":
        pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    elif shape == "diamond":
        pts = [(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)]
    elif shape == "star":
        pts = [(cx + (r if k % 2 == 0 else r * 0.42) * math.cos(-math.pi / 2 + k * math.pi / 5),
                cy + (r if k % 2 == 0 else r * 0.42) * math.sin(-math.pi / 2 + k * math.pi / 5)) for k in range(10)]
    elif shape == "cross":
        a, b = r * 0.33, r * 0.95
        pts = [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a), (-b, a), (-b, -a),
               (-a, -a)]
        pts = [(cx + x, cy + y) for x, y in pts]
    else:
        raise ValueError(shape)
    return np.round(np.array(pts) * 16).astype(np.int32)  # 4 fractional bits


def draw_object(img: np.ndarray, o: Obj, radius: float | None = None, cell_pos: tuple[float, float] | None = None,
                colour: tuple[int, int, int] | None = None) -> None:
    cx, cy = cell_pos if cell_pos is not None else _centre(o.cell)
    cx, cy = cx + o.dx, cy + o.dy
    r = radius if radius is not None else RADIUS[o.size]
    rgb = colour if colour is not None else COLOURS[o.colour]
    if o.shape == "circle":
        cv2.circle(img, (round(cx * 16), round(cy * 16)), round(r * 16), rgb, -1, cv2.LINE_AA, shift=4)
    else:
        cv2.fillPoly(img, [_polygon(o.shape, cx, cy, r)], rgb, cv2.LINE_AA, shift=4)


def _canvas(background: str, noise_seed: int) -> np.ndarray:
    img = np.empty((SIZE, SIZE, 3), np.uint8)
    img[:] = BACKGROUNDS[background]
    noise = np.random.default_rng(noise_seed).integers(-6, 7, size=img.shape)
    return np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def render_image(scene: Scene, noise_seed: int = 0) -> np.ndarray:
    """RGB uint8 array (SIZE, SIZE, 3)."""
    img = _canvas(scene.background, noise_seed)
    for o in scene.objects:
        draw_object(img, o)
    return img


def clip_frame_objects(clip: Clip, f: int) -> list[tuple[Obj, float | None, tuple[float, float] | None]]:
    """What frame `f` of `clip` draws, in order: (object, radius or None, cell centre or None),
    the arguments of `draw_object` (render_clip draws exactly these; vision_aux labels them)."""
    t = min(max((f - 2) / 2, 0.0), 1.0)   # 0 for frames 0-2, 0.5 for frame 3, 1 for frames 4-7
    out: list[tuple[Obj, float | None, tuple[float, float] | None]] = []
    if clip.event in ("move", "grow", "shrink"):
        for o in clip.start.objects:
            if o != clip.subject:
                out.append((o, None, None))
                continue
            a, b = clip.subject, clip.after
            (x0, y0), (x1, y1) = _centre(a.cell), _centre(b.cell)
            r = RADIUS[a.size] + t * (RADIUS[b.size] - RADIUS[a.size])
            out.append((a, r, (x0 + t * (x1 - x0), y0 + t * (y1 - y0))))
    else:
        scene = clip.start if f < CLIP_FRAMES // 2 else clip.end
        out.extend((o, None, None) for o in scene.objects)
    return out


def render_clip(clip: Clip, noise_seed: int = 0) -> list[np.ndarray]:
    """CLIP_FRAMES RGB frames: frames 0-2 show `start`, 4-7 show `end`; the event happens
    at frame 3 (motion and growth pass halfway there, the rest switch at the midpoint), so the
    uniformly sampled frames 0, 2 | 4, 6 the models see are before | after in each temporal group."""
    frames = []
    for f in range(CLIP_FRAMES):
        img = _canvas(clip.start.background, noise_seed)
        for o, r, pos in clip_frame_objects(clip, f):
            draw_object(img, o, radius=r, cell_pos=pos)
        frames.append(img)
    return frames


# ---------------------------------------------------------------- video files

def write_video(frames: list[np.ndarray], path: str | Path, fps: float = CLIP_FPS, fourcc: str = "mp4v") -> None:
    """RGB frames to a video file through OpenCV. mp4v (MPEG-4 Part 2 in MP4) is what the world's clips use;
    VP90 (VP9 in WebM) is what browsers play as it is (OpenCV's wheels have no H.264 encoder)."""
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"cannot open a {fourcc} video writer for {path}")
    for fr in frames:
        writer.write(cv2.cvtColor(fr, cv2.COLOR_RGB2BGR))
    writer.release()


def write_mp4(frames: list[np.ndarray], path: str | Path, fps: float = CLIP_FPS) -> None:
    write_video(frames, path, fps, "mp4v")


def read_video(path: str | Path, num_frames: int = MODEL_FRAMES) -> tuple[list[np.ndarray], dict]:
    """`num_frames` RGB frames sampled the way the engine samples any video (media.sample_video), with the
    metadata the processor wants."""
    clip = sample_video(str(path), num_frames)
    meta = {"total_num_frames": clip.total_num_frames, "fps": clip.fps, "duration": clip.duration,
            "frames_indices": clip.frames_indices}
    return clip.frames, meta


def clip_metadata(num_frames: int = MODEL_FRAMES) -> dict:
    """The metadata `read_video` returns for one of our clips (used when frames come from memory)."""
    idx = [i * CLIP_FRAMES // num_frames for i in range(num_frames)]
    return {"total_num_frames": CLIP_FRAMES, "fps": CLIP_FPS, "duration": CLIP_FRAMES / CLIP_FPS, "frames_indices": idx}
