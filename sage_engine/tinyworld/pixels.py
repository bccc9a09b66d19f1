"""What the tinyworld pair can truly say about any picture, computed from its pixels: the truth its answers about
photos, drawings and clips are trained on and scored against.

The pair sees a picture as an 84 x 84 canvas (`canvas`: the whole picture squeezed to a square, so every part of
it lands in one of the 3 x 3 cells, one visual token each). At that resolution it can tell colours, light and
dark and where they are, not objects. `picture_facts` and `clip_facts` say exactly that, by these rules:

- **Colour names** come from a fixed palette, Berlin and Kay's eleven basic colour terms (PALETTE). Each pixel is
  named by its nearest neighbour in CIELAB among the colours of the xkcd colour survey (matplotlib's
  XKCD_COLORS, about 950 names given by some 200,000 people) whose name ends in a basic term ("navy blue" ->
  blue, "light grey" -> grey); names without one ("teal", "beige") take no part. CIELAB distances follow human
  judgement far better than RGB ones, and the survey's names carry the lightness a term allows (brown is a
  dark orange, pink a light red).
- **A region's colour** is the name most of its pixels get (its plurality colour); a region also *shows* every
  colour that covers at least SHOWS of its pixels, and an answer naming any colour the region shows counts as
  right (a region is rarely one colour).
- **Main colours** of a picture: the names covering the most pixels; the second is named when it covers at least
  SECOND_MAIN of the picture.
- **Light and dark**: the mean CIELAB lightness L* (0 black, 100 white) of the picture: dark below DARK, light
  above LIGHT, else medium. The brightest and darkest parts are the cells of highest and lowest mean L*; an
  answer naming a cell within NEAR_L of the extreme counts as right.
- **A clip** (the frames the pair sees, in two halves: before and after) changes where a cell's mean L* moves by
  CHANGE_L or more (lighter or darker) or its colour changes; the picture moves left or right where the phase
  correlation of the two halves finds a horizontal shift of at least SHIFT_PX pixels of the canvas.
"""
from __future__ import annotations

import dataclasses
import functools

import cv2
import numpy as np

from ..models.media import squeeze_to_square
from .world import SIZE

PALETTE = ("black", "white", "grey", "red", "orange", "yellow", "green", "blue", "purple", "pink", "brown")
ACHROMATIC = 10.0    # chroma C* below which a pixel is white, grey or black by its lightness alone
WHITE_L, BLACK_L = 88.0, 18.0   # L* from which a low-chroma pixel is white, up to which it is black
SHOWS = 0.3          # share of a region's pixels from which it shows a colour
SECOND_MAIN = 0.2    # share of the picture from which a second main colour is named
DARK, LIGHT = 35.0, 65.0   # mean L* thresholds of a dark and a light picture
NEAR_L = 4.0         # L* margin within which a cell counts as the brightest or darkest
CHANGE_L = 10.0      # L* change of a cell's mean that makes it lighter or darker in a clip
SHIFT_PX = 3.0       # horizontal shift (canvas pixels) that counts as the picture moving
CELL = SIZE // 3


def canvas(rgb: np.ndarray) -> np.ndarray:
    """Any RGB uint8 picture (H, W, 3) as the pair sees it: squeezed to SIZE x SIZE (media.squeeze_to_square, which
    the engine applies to every picture and frame of a pair whose config sets `square_canvas`), so that its top
    left third is the top left cell whatever its shape."""
    return squeeze_to_square(rgb, SIZE)


def lab(rgb: np.ndarray) -> np.ndarray:
    """CIELAB of RGB uint8 pixels (..., 3) -> float32 (..., 3): L* in 0-100, a* and b* around 0 (D65)."""
    flat = rgb.reshape(-1, 1, 3).astype(np.float32) / 255.0
    return cv2.cvtColor(flat, cv2.COLOR_RGB2Lab).reshape(*rgb.shape[:-1], 3)


@functools.lru_cache(maxsize=1)
def _prototypes() -> tuple[np.ndarray, np.ndarray]:
    """(Lab (N, 3), palette index (N,)) of the xkcd survey colours whose name ends in a basic term."""
    from matplotlib.colors import XKCD_COLORS, to_rgb
    heads = {"gray": "grey", **{p: p for p in PALETTE}}
    rgb, idx = [], []
    for name, hexcode in XKCD_COLORS.items():
        head = name.removeprefix("xkcd:").split()[-1]
        if head in heads:
            rgb.append(to_rgb(hexcode))
            idx.append(PALETTE.index(heads[head]))
    px = np.round(np.array(rgb) * 255).astype(np.uint8)
    return lab(px), np.array(idx, np.int8)


@functools.lru_cache(maxsize=1)
def _table() -> np.ndarray:
    """Palette index of every RGB colour quantised to 5 bits a channel (32^3 entries, each named at its
    middle): naming a picture is then a look-up."""
    levels = (np.arange(32) * 8 + 4).astype(np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    protos, idx = _prototypes()
    g = lab(grid)
    out = np.empty(len(g), np.int8)
    for k in range(0, len(g), 16384):
        d = ((g[k:k + 16384, None, :] - protos[None]) ** 2).sum(-1)
        out[k:k + 16384] = idx[d.argmin(1)]
    grey = np.hypot(g[:, 1], g[:, 2]) < ACHROMATIC
    light = g[:, 0]
    out[grey] = PALETTE.index("grey")
    out[grey & (light >= WHITE_L)] = PALETTE.index("white")
    out[grey & (light <= BLACK_L)] = PALETTE.index("black")
    return out


def colour_names(rgb: np.ndarray) -> np.ndarray:
    """Palette index (int8) of every pixel of an RGB uint8 array (..., 3)."""
    q = rgb.astype(np.int32) >> 3
    return _table()[(q[..., 0] << 10) | (q[..., 1] << 5) | q[..., 2]]


@dataclasses.dataclass(frozen=True)
class PictureFacts:
    """What one picture (as the pair sees it) shows; cells in reading order (POSITIONS)."""

    brightness: str                  # "dark", "medium" or "light" (mean L*)
    lightness: float                 # mean L* of the picture
    cells: tuple[str, ...]           # each cell's plurality colour
    shows: tuple[frozenset, ...]     # each cell's colours covering >= SHOWS of it
    cell_l: tuple[float, ...]        # each cell's mean L*
    main: tuple[str, ...]            # the one or two main colours, most pixels first
    shares: dict                     # colour -> share of the picture's pixels

    @property
    def brightest(self) -> int:
        return int(np.argmax(self.cell_l))

    @property
    def darkest(self) -> int:
        return int(np.argmin(self.cell_l))

    def near_brightest(self, cell: int) -> bool:
        return self.cell_l[cell] >= max(self.cell_l) - NEAR_L

    def near_darkest(self, cell: int) -> bool:
        return self.cell_l[cell] <= min(self.cell_l) + NEAR_L

    def row(self, r: int) -> tuple[str, str, str]:
        return tuple(self.cells[3 * r: 3 * r + 3])


def _cells(a: np.ndarray) -> np.ndarray:
    """(SIZE, SIZE, ...) -> (9, CELL * CELL, ...): each cell's pixels, cells in reading order."""
    rest = a.shape[2:]
    return a.reshape(3, CELL, 3, CELL, *rest).swapaxes(1, 2).reshape(9, CELL * CELL, *rest)


def cell_stats(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of a picture already on the canvas (SIZE, SIZE, 3): (shares (9, len(PALETTE)): the share of each cell's pixels
    named by each palette colour, mean L* (9,) of each cell), cells in reading order. Every fact of `picture_facts`
    about a cell is read from these two, and so is the training loss that makes the vision towers see them
    (training/pixel_aux.py)."""
    names = _cells(colour_names(img)).astype(np.int64)
    shares = np.stack([np.bincount(c, minlength=len(PALETTE)) for c in names]) / CELL ** 2
    return shares, _cells(lab(img)[..., 0]).mean(1)


def picture_facts(rgb: np.ndarray) -> PictureFacts:
    """The facts of any RGB uint8 picture (H, W, 3), seen as the pair sees it (`canvas`)."""
    img = canvas(rgb)
    counts, cell_l = cell_stats(img)
    total = counts.mean(0)
    order = np.argsort(-total, kind="stable")
    main = [PALETTE[order[0]]] + ([PALETTE[order[1]]] if total[order[1]] >= SECOND_MAIN else [])
    mean_l = float(cell_l.mean())
    return PictureFacts(
        brightness="dark" if mean_l < DARK else "light" if mean_l > LIGHT else "medium",
        lightness=mean_l,
        cells=tuple(PALETTE[int(np.argmax(c))] for c in counts),
        shows=tuple(frozenset(PALETTE[i] for i in np.flatnonzero(c >= SHOWS)) | {PALETTE[int(np.argmax(c))]}
                    for c in counts),
        cell_l=tuple(float(x) for x in cell_l),
        main=tuple(main),
        shares={PALETTE[i]: float(total[i]) for i in order if total[i] > 0},
    )


@dataclasses.dataclass(frozen=True)
class ClipFacts:
    """What a clip shows: its first half's picture facts and what changes from the first half to the second."""

    start: PictureFacts
    end: PictureFacts
    lighter: tuple[int, ...]                   # cells whose mean L* rose by >= CHANGE_L
    darker: tuple[int, ...]                    # cells whose mean L* fell by >= CHANGE_L
    recoloured: tuple[tuple[int, str, str], ...]   # (cell, colour before, colour after) where the plurality changed
    motion: str | None                          # "left", "right" or None: how the picture moves
    shift: float                                # the measured horizontal shift (canvas pixels, + = right)

    @property
    def changes(self) -> bool:
        return bool(self.lighter or self.darker or self.recoloured or self.motion)


def _half(frames: list[np.ndarray]) -> np.ndarray:
    return np.mean([canvas(f).astype(np.float32) for f in frames], 0).round().astype(np.uint8)


def clip_facts(frames: list[np.ndarray]) -> ClipFacts:
    """The facts of the frames the pair sees (an even number: the first half before, the second after)."""
    h = len(frames) // 2
    a, b = _half(frames[:h]), _half(frames[h:])
    start, end = picture_facts(a), picture_facts(b)
    dl = np.array(end.cell_l) - np.array(start.cell_l)
    ga = lab(a)[..., 0].astype(np.float64)
    gb = lab(b)[..., 0].astype(np.float64)
    win = cv2.createHanningWindow((SIZE, SIZE), cv2.CV_64F)
    (dx, dy), response = cv2.phaseCorrelate(ga, gb, win)
    motion = None
    if abs(dx) >= SHIFT_PX and abs(dx) > 2 * abs(dy) and response > 0.2:
        motion = "right" if dx > 0 else "left"
    return ClipFacts(
        start, end,
        lighter=tuple(int(i) for i in np.flatnonzero(dl >= CHANGE_L)),
        darker=tuple(int(i) for i in np.flatnonzero(dl <= -CHANGE_L)),
        recoloured=tuple((i, start.cells[i], end.cells[i]) for i in range(9)
                         if start.cells[i] != end.cells[i] and start.cells[i] not in end.shows[i]
                         and end.cells[i] not in start.shows[i]),
        motion=motion, shift=float(dx),
    )

