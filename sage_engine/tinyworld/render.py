"""`render`: N images (PNG) + N clips (MP4) of fresh scenes, with truth.jsonl and prompts.jsonl.

truth.jsonl  one object per media file: file, media, prompt, answer, kind, truth (scene facts)
prompts.jsonl one {"file", "prompt"} per media file: what `python -m sage_engine bench --inputs DIR`
             asks about each input (detailed descriptions: the bench measures long generations)
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image

from .language import image_example, video_example
from .world import render_clip, render_image, sample_clip, sample_scene, write_mp4, write_video


def render_dir(out: Path, seed: int, n: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20_000_003 + seed)   # a stream apart from training (seed 0..) and eval
    rows = []
    for i in range(n):
        scene = sample_scene(rng)
        name = f"img_{i:04d}.png"
        Image.fromarray(render_image(scene, noise_seed=rng.randrange(1 << 30))).save(out / name)
        ex = image_example(scene, rng, "describe")
        rows.append({"file": name, "media": "image", "prompt": ex.prompt, "answer": ex.answer,
                     "kind": ex.kind, "truth": scene.truth()})
    for i in range(n):
        clip = sample_clip(rng)
        name = f"vid_{i:04d}.mp4"
        write_mp4(render_clip(clip, noise_seed=rng.randrange(1 << 30)), out / name)
        ex = video_example(clip, rng, "describe_video")
        rows.append({"file": name, "media": "video", "prompt": ex.prompt, "answer": ex.answer,
                     "kind": ex.kind, "truth": clip.truth()})
    with open(out / "truth.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(out / "prompts.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"file": r["file"], "prompt": r["prompt"]}) + "\n")
    return rows


# photos for the demo, from the held-out split (pictures.PHOTOS_HELD_OUT): (package, path, name, prompt, credit)
EXAMPLE_PHOTOS = (
    ("scikit-image", "skimage/data/coffee.png", "photo_1.jpg", "Describe the image in detail.",
     "CC0, photo by Rachel Michetti (skimage.data.coffee)"),
    ("scikit-image", "skimage/data/astronaut.png", "photo_2.jpg", "What is in this picture?",
     "public domain, NASA (skimage.data.astronaut)"),
)


def write_example_photos(out: Path) -> list[dict]:
    """The demo's photos (EXAMPLE_PHOTOS), at most 320 px a side, as JPEG; rows for examples.json."""
    from .pictures import packaged, read_rgb
    rows = []
    for pkg, path, name, prompt, credit in EXAMPLE_PHOTOS:
        src = packaged(pkg, path)
        if src is None:
            continue
        img = Image.fromarray(read_rgb(src))
        img.thumbnail((320, 320))
        img.save(out / name, quality=88)
        rows.append({"file": name, "media": "image", "prompt": prompt, "credit": credit})
    return rows


def write_examples(out: Path, seed: int = 7) -> list[dict]:
    """A few demo inputs (3 images, 2 photos, 2 videos) with good prompts, listed in examples.json. The clips are
    WebM (VP9) so that a browser shows them without a server-side conversion."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(30_000_001 + seed)
    rows = []
    prompts = ["Describe the image in detail.", "How many shapes are there?", "What do you see?"]
    for i, prompt in enumerate(prompts):
        scene = sample_scene(rng, min_count=3 if i != 1 else 2, max_count=4)
        name = f"shapes_{i + 1}.png"
        Image.fromarray(render_image(scene, noise_seed=rng.randrange(1 << 30))).save(out / name)
        rows.append({"file": name, "media": "image", "prompt": prompt})
    rows[1:1] = write_example_photos(out)   # a visitor's own photo is what the demo meets first
    for i, prompt in enumerate(["Describe the video in detail.", "What happens in the video?"]):
        clip = sample_clip(rng)
        name = f"clip_{i + 1}.webm"
        write_video(render_clip(clip, noise_seed=rng.randrange(1 << 30)), out / name, fourcc="VP90")
        rows.append({"file": name, "media": "video", "prompt": prompt})
    (out / "examples.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows
