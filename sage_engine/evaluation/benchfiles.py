"""Benchmark files read in their own formats: local `.jsonl` / `.json` files, media resolved on disk, no download.

A file is `.jsonl` (one JSON object per line, blank lines skipped) or `.json` (a list of objects; a dict with that
list under "data", "annotations" or "questions"; or a dict of id -> object, as GQA's question files are). Every
row's media file is checked up front, so that a missing one stops a run before any model work.

Formats, the keys read (first present wins) and the prompt built:

image-qa       TextVQA / ChartQA / GQA. Image: image, image_path, image_file, imgname, img; or imageId /
               image_id, read as `<id>.jpg` or `<id>.png`, whichever exists. Question: question, query, prompt,
               text. Reference: answer, answers (a list: its first), label.
               Prompt: the question + "\\nAnswer the question using a single word or phrase.".
video-qa       MVBench. Video: video, video_path, video_name. Question: question. Choices: candidates, options.
               Reference: answer. Prompt: "Question: <q>\\nOptions:\\n(A) <c1>\\n(B) <c2>...\\n"
               "Answer with the option's letter from the given choices directly."
video-caption  VideoDetailedCaption. Video as video-qa. Question: question (optional; else "Describe what
               happens in the video in detail."). Reference: caption, answer. Prompt: the question.
gsm8k          {"question", "answer"}: text only. Prompt: the question as it is. Reference: the number after
               the answer's last "####" (commas dropped), the whole answer where it has none.
humaneval      {"task_id", "prompt", "canonical_solution", ...}: text only. Prompt: "Complete the following
               Python function.\\n\\n" + prompt. Reference: canonical_solution.

Ids: the row's own question_id, questionId, task_id, id or qid (or its key in a dict-of-rows file), else
"<file stem>-<row number>" counting rows from 1. A media path is resolved against `media_root`, else the file's
own folder; an absolute path is kept. A name without its extension (a GQA imageId, a bare video name) is tried
with the usual extensions. `detect_format` picks the format from the keys of the first rows; `write_fixtures`
writes three-row files of every format from the tinyworld renderer, for tests and smoke runs.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, first_line

FORMATS = ("image-qa", "video-qa", "video-caption", "gsm8k", "humaneval")

IMAGE_KEYS = ("image", "image_path", "image_file", "imgname", "img")
IMAGE_ID_KEYS = ("imageId", "image_id")   # a bare id: the file is <id>.jpg or <id>.png
VIDEO_KEYS = ("video", "video_path", "video_name")
QUESTION_KEYS = ("question", "query", "prompt", "text")
CHOICE_KEYS = ("candidates", "options")
ID_KEYS = ("question_id", "questionId", "task_id", "id", "qid")
LIST_KEYS = ("data", "annotations", "questions")
IMAGE_EXTS = (".jpg", ".png", ".jpeg")
VIDEO_EXTS = (".mp4", ".webm", ".mkv", ".avi", ".mov")

# The short-answer instruction LLaVA-style evaluations (LLaVA-1.5's TextVQA/GQA question files, lmms-eval) append
# to a VQA question, on its own line, so that a model answers in the few words the metric compares.
SHORT_ANSWER = "\nAnswer the question using a single word or phrase."
# MVBench's multiple-choice layout: lettered options, then the instruction to answer with the letter alone.
CHOICE_INSTRUCTION = "Answer with the option's letter from the given choices directly."
CAPTION_QUESTION = "Describe what happens in the video in detail."
HUMANEVAL_PREFIX = "Complete the following Python function.\n\n"
DETECT_ROWS = 5   # detect_format looks at this many first rows


@dataclass(frozen=True)
class BenchmarkItem:
    """One question of a benchmark file."""
    id: str                 # the row's own id, else "<file stem>-<row number>"
    media: str              # "image" | "video" | "text"
    path: str               # absolute media path; "" for text
    prompt: str             # what the model is asked, built as the benchmark asks it
    reference: str | None   # the row's answer / caption / canonical solution where it has one


@dataclass(frozen=True)
class BenchmarkFile:
    name: str    # file stem
    format: str  # one of FORMATS
    items: tuple[BenchmarkItem, ...]


@dataclass(frozen=True)
class _Row:
    """A row as read, with where it came from (for error messages) and its 1-based number."""
    number: int
    where: str   # "line 7" (.jsonl) or "row 3" (.json)
    data: dict
    key: str | None = None   # its key in a dict-of-rows .json file


def _load_rows(path: Path) -> list[_Row]:
    if not path.is_file():
        raise InputError(f"benchmark file not found: {path}")
    if path.suffix not in (".jsonl", ".json"):
        raise InputError(f"{path.name}: a benchmark file is .jsonl or .json, not {path.suffix or 'no extension'}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path.name}: cannot read it ({first_line(e)})") from None
    return _jsonl_rows(path, text) if path.suffix == ".jsonl" else _json_rows(path, text)


def _jsonl_rows(path: Path, text: str) -> list[_Row]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path.name}: line {lineno} is not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path.name}: line {lineno} is a JSON {type(obj).__name__}, not an object")
        rows.append(_Row(len(rows) + 1, f"line {lineno}", obj))
    return rows


def _json_rows(path: Path, text: str) -> list[_Row]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path.name}: not valid JSON (line {e.lineno}: {e.msg})") from None
    keys: list[str | None]
    if isinstance(obj, dict) and any(isinstance(obj.get(k), list) for k in LIST_KEYS):
        obj = next(obj[k] for k in LIST_KEYS if isinstance(obj.get(k), list))
    if isinstance(obj, dict) and obj and all(isinstance(v, dict) for v in obj.values()):
        keys, obj = list(obj), list(obj.values())   # GQA: {question id: row}
    elif isinstance(obj, list):
        keys = [None] * len(obj)
    else:
        raise InputError(f"{path.name}: a .json benchmark is a list of objects or a dict with one under "
                         f"{', '.join(repr(k) for k in LIST_KEYS)}")
    rows = []
    for i, (key, row) in enumerate(zip(keys, obj), 1):
        if not isinstance(row, dict):
            raise InputError(f"{path.name}: row {i} is a JSON {type(row).__name__}, not an object")
        rows.append(_Row(i, f"row {i}", row, key))
    return rows


def _has(keys, names) -> bool:
    return any(k in keys for k in names)


def detect_format(rows: list[dict]) -> str:
    """The format of rows, from the keys of the first few: video + choices -> video-qa, video -> video-caption,
    image -> image-qa, task_id + prompt -> humaneval, question + an answer with "####" -> gsm8k."""
    head = [r for r in rows[:DETECT_ROWS] if isinstance(r, dict)]
    keys = {k for r in head for k in r}
    if _has(keys, VIDEO_KEYS):
        return "video-qa" if _has(keys, CHOICE_KEYS) else "video-caption"
    if _has(keys, IMAGE_KEYS + IMAGE_ID_KEYS):
        return "image-qa"
    if {"task_id", "prompt"} <= keys:
        return "humaneval"
    if {"question", "answer"} <= keys and any("####" in str(r.get("answer", "")) for r in head):
        return "gsm8k"
    raise InputError(f"cannot tell the benchmark format from the keys ({', '.join(sorted(keys)[:12]) or 'none'}); "
                     f"name one of: {', '.join(FORMATS)}")


class _Reader:
    """Builds the items of one file: finds keys, resolves media, and records every missing media file."""

    def __init__(self, path: Path, base: Path):
        self.path, self.base = path, base
        self.missing: list[str] = []

    def fail(self, row: _Row, what: str) -> InputError:
        return InputError(f"{self.path.name}: {row.where}: {what}")

    def first(self, row: _Row, names, what: str, required: bool = True):
        for k in names:
            if row.data.get(k) not in (None, ""):
                return row.data[k]
        if required:
            raise self.fail(row, f"no {what} (looked for {', '.join(names)}; the row has "
                                 f"{', '.join(list(row.data)[:10]) or 'no keys'})")
        return None

    def media(self, row: _Row, value, exts: tuple[str, ...]) -> str:
        """The absolute path of a row's media file; a missing one is recorded and reported after all rows."""
        if not isinstance(value, str):
            raise self.fail(row, f"the media entry is a {type(value).__name__}, not a path")
        p = self.base / Path(value).expanduser()   # an absolute path replaces the base
        for candidate in (p, *(p.with_name(p.name + e) for e in exts)):
            if candidate.is_file():
                return str(candidate)
        tried = f" (also tried {', '.join(exts)})" if exts else ""
        self.missing.append(f"{row.where}: media file not found: {p}{tried}")
        return str(p)

    def item_id(self, row: _Row) -> str:
        own = self.first(row, ID_KEYS, "id", required=False)
        own = row.key if own is None else own
        return str(own) if own is not None else f"{self.path.stem}-{row.number}"

    def image_qa(self, row: _Row) -> BenchmarkItem:
        if _has(row.data, IMAGE_KEYS):
            path = self.media(row, self.first(row, IMAGE_KEYS, "image"), ())
        else:
            path = self.media(row, str(self.first(row, IMAGE_ID_KEYS, "image")), IMAGE_EXTS)
        question = str(self.first(row, QUESTION_KEYS, "question")).strip()
        prompt = question if question.endswith(SHORT_ANSWER.strip()) else question + SHORT_ANSWER
        return BenchmarkItem(self.item_id(row), "image", path, prompt, _short_answer(row.data))

    def video_qa(self, row: _Row) -> BenchmarkItem:
        path = self.media(row, self.first(row, VIDEO_KEYS, "video"), VIDEO_EXTS)
        question = str(self.first(row, ("question",), "question")).strip()
        choices = self.first(row, CHOICE_KEYS, "candidates")
        if not isinstance(choices, list) or not 2 <= len(choices) <= 26:
            raise self.fail(row, "the candidates are not a list of 2 to 26 choices")
        options = "\n".join(f"({chr(65 + i)}) {c}" for i, c in enumerate(choices))
        prompt = f"Question: {question}\nOptions:\n{options}\n{CHOICE_INSTRUCTION}"
        return BenchmarkItem(self.item_id(row), "video", path, prompt, _text(row.data.get("answer")))

    def video_caption(self, row: _Row) -> BenchmarkItem:
        path = self.media(row, self.first(row, VIDEO_KEYS, "video"), VIDEO_EXTS)
        question = self.first(row, ("question",), "question", required=False) or CAPTION_QUESTION
        reference = self.first(row, ("caption", "answer"), "caption", required=False)
        return BenchmarkItem(self.item_id(row), "video", path, str(question).strip(), _text(reference))

    def gsm8k(self, row: _Row) -> BenchmarkItem:
        question = str(self.first(row, ("question",), "question"))
        answer = _text(row.data.get("answer"))
        if answer is not None and "####" in answer:
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        return BenchmarkItem(self.item_id(row), "text", "", question, answer)

    def humaneval(self, row: _Row) -> BenchmarkItem:
        code = str(self.first(row, ("prompt",), "prompt"))
        reference = _text(row.data.get("canonical_solution"))
        return BenchmarkItem(self.item_id(row), "text", "", HUMANEVAL_PREFIX + code, reference)


def _text(value) -> str | None:
    return None if value is None else str(value)


def _short_answer(data: dict) -> str | None:
    """answer, else the first of answers (VQA's {"answer": ...} entries read too), else label."""
    if data.get("answer") is not None:
        return str(data["answer"])
    answers = data.get("answers")
    if isinstance(answers, list) and answers:
        first = answers[0]
        return str(first.get("answer")) if isinstance(first, dict) else str(first)
    return _text(data.get("label"))


_BUILDERS = {"image-qa": _Reader.image_qa, "video-qa": _Reader.video_qa, "video-caption": _Reader.video_caption,
             "gsm8k": _Reader.gsm8k, "humaneval": _Reader.humaneval}


def read_benchmark(path: str | Path, fmt: str | None = None, limit: int | None = None,
                   media_root: str | Path | None = None) -> BenchmarkFile:
    """The first `limit` rows (all by default) of a benchmark file as items, in `fmt` or the detected format.
    Raises InputError (one line) for a missing or malformed file, an unknown format, a row without the keys its
    format needs, or any media file that does not exist."""
    path = Path(path).expanduser()
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"unknown benchmark format {fmt!r}; name one of: {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1, not {limit}")
    rows = _load_rows(path)[:limit]
    if not rows:
        raise InputError(f"{path.name}: no rows")
    if fmt is None:
        try:
            fmt = detect_format([r.data for r in rows])
        except InputError as e:
            raise InputError(f"{path.name}: {e}") from None
    base = Path(media_root).expanduser() if media_root is not None else path.parent
    reader = _Reader(path, base.resolve())
    items = tuple(_BUILDERS[fmt](reader, r) for r in rows)
    if reader.missing:
        more = f" (and {len(reader.missing) - 1} more rows with missing media)" if len(reader.missing) > 1 else ""
        raise InputError(f"{path.name}: {reader.missing[0]}{more}")
    return BenchmarkFile(path.stem, fmt, items)


# ---------------------------------------------------------------- fixtures

GSM8K_ROWS = (
    {"question": "Tom has 3 boxes with 4 apples in each box. He eats 2 apples. How many apples are left?",
     "answer": "The boxes hold 3 * 4 = <<3*4=12>>12 apples.\n"
               "After eating 2 there are 12 - 2 = <<12-2=10>>10.\n#### 10"},
    {"question": "A pencil costs $2 and a notebook costs $5. How much do 2 pencils and 3 notebooks cost?",
     "answer": "2 pencils cost 2 * 2 = <<2*2=4>>4 dollars.\n3 notebooks cost 3 * 5 = <<3*5=15>>15 dollars.\n"
               "Together they cost 4 + 15 = <<4+15=19>>19 dollars.\n#### 19"},
    {"question": "A school has 1,200 pupils and a third of them walk to school. How many pupils do not walk?",
     "answer": "1200 / 3 = <<1200/3=400>>400 pupils walk.\n1200 - 400 = <<1200-400=800>>800 do not.\n#### 800"},
)

# HumanEval rows: (entry_point, prompt, canonical_solution, test); each test's check() passes on its solution.
_FUNCTIONS = (
    ("add", 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n'
            '    """\n',
     "    return a + b\n",
     "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"),
    ("count_vowels", 'def count_vowels(s: str) -> int:\n    """Count the vowels (a, e, i, o, u) in s, ignoring case.\n'
                     '    >>> count_vowels("Hello")\n    2\n    """\n',
     '    return sum(c in "aeiou" for c in s.lower())\n',
     "def check(candidate):\n    assert candidate('Hello') == 2\n    assert candidate('xyz') == 0\n"),
    ("running_max", "from typing import List\n\n\ndef running_max(xs: List[int]) -> List[int]:\n"
                    '    """The largest element seen so far, at each position.\n'
                    '    >>> running_max([1, 3, 2, 5])\n    [1, 3, 3, 5]\n    """\n',
     "    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n    return out\n",
     "def check(candidate):\n    assert candidate([1, 3, 2, 5]) == [1, 3, 3, 5]\n    assert candidate([]) == []\n"),
)
HUMANEVAL_ROWS = tuple({"task_id": f"Fixture/{i}", "prompt": prompt, "canonical_solution": solution, "test": test,
                        "entry_point": entry} for i, (entry, prompt, solution, test) in enumerate(_FUNCTIONS))


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _short(ex) -> list[str]:
    """Short answers to a tinyworld question, from the fact its scorer checks (a count also as a digit)."""
    from ..tinyworld.language import NUMBERS
    f = ex.facts
    if "count" in f:
        return [NUMBERS[f["count"]], str(f["count"])]
    if "yes" in f:
        return ["yes" if f["yes"] else "no"]
    return [str(next(iter(f.values())))]


def _image_rows(folder: Path, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """TextVQA-style rows (relative paths under images/, answers lists) and GQA-style rows (imageId, the
    image beside the file), each asking a question tinyworld's pair is trained on."""
    from PIL import Image

    from ..tinyworld.language import image_example
    from ..tinyworld.world import render_image, sample_scene
    (folder / "images").mkdir(parents=True, exist_ok=True)
    textvqa, gqa = [], []
    for i, kind in enumerate(("count", "colour", "shape")):
        scene = sample_scene(rng, 2, 3, occlusion=0.0)
        name = f"images/textvqa_{i}.png"
        Image.fromarray(render_image(scene, noise_seed=rng.randrange(1 << 30))).save(folder / name)
        ex = image_example(scene, rng, kind)
        textvqa.append({"question_id": 100 + i, "image": name, "question": ex.prompt, "answers": _short(ex)})
    for i, kind in enumerate(("yesno", "size", "position")):
        scene = sample_scene(rng, 2, 3, occlusion=0.0)
        image_id = f"tw{i}"
        Image.fromarray(render_image(scene, noise_seed=rng.randrange(1 << 30))).save(folder / f"{image_id}.png")
        ex = image_example(scene, rng, kind)
        gqa.append({"imageId": image_id, "question": ex.prompt, "answer": _short(ex)[0], "fullAnswer": ex.answer})
    return textvqa, gqa


_EVENT_CHOICES = {"move": "The {} moves.", "appear": "A {} appears.", "disappear": "The {} disappears.",
                  "grow": "The {} grows larger.", "shrink": "The {} shrinks.", "recolour": "The {} changes colour."}


def _choices(clip, rng: random.Random) -> tuple[str, list[str]]:
    """The clip's event about its subject and three other events about it, shuffled."""
    name = clip.subject.name()
    right = _EVENT_CHOICES[clip.event].format(name)
    choices = [right, *rng.sample([t.format(name) for e, t in _EVENT_CHOICES.items() if e != clip.event], 3)]
    rng.shuffle(choices)
    return right, choices


def _video_rows(folder: Path, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """MVBench-style rows (what happens, how many at the start) and VideoDetailedCaption-style rows."""
    from ..tinyworld.language import NUMBERS, describe_clip
    from ..tinyworld.world import render_clip, sample_clip, write_mp4
    (folder / "videos").mkdir(parents=True, exist_ok=True)
    mvbench, vdc = [], []
    for i in range(6):
        clip = sample_clip(rng)
        name = f"videos/{'mvbench' if i < 3 else 'vdc'}_{i % 3}.mp4"
        write_mp4(render_clip(clip, noise_seed=rng.randrange(1 << 30)), folder / name)
        if i >= 3:
            vdc.append({"video_name": name, "question": "Describe the video in detail.",
                        "answer": describe_clip(clip, rng)})
            continue
        question, (answer, choices) = "What happens in the video?", _choices(clip, rng)
        if i == 1:   # one counting question; the others ask what happens
            question, answer = "How many shapes are there at the start?", NUMBERS[len(clip.start.objects)]
            choices = [NUMBERS[k] for k in range(1, 5)]
        mvbench.append({"video": name, "question": question, "candidates": choices, "answer": answer})
    return mvbench, vdc


def write_fixtures(folder: str | Path, seed: int = 7) -> dict[str, Path]:
    """Three-row benchmark files of every format in `folder`, their images and clips rendered by tinyworld
    (images/, videos/, and GQA's <imageId>.png beside gqa.json). Returns {name: path}: textvqa, gqa, mvbench,
    vdc, gsm8k, humaneval."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(40_000_019 + seed)   # a stream apart from training, eval and render
    textvqa, gqa = _image_rows(folder, rng)
    mvbench, vdc = _video_rows(folder, rng)
    (folder / "gqa.json").write_text(json.dumps(gqa, indent=1) + "\n")
    (folder / "mvbench.json").write_text(json.dumps(mvbench, indent=1) + "\n")
    return {"textvqa": _write_jsonl(folder / "textvqa.jsonl", textvqa), "gqa": folder / "gqa.json",
            "mvbench": folder / "mvbench.json", "vdc": _write_jsonl(folder / "vdc.jsonl", vdc),
            "gsm8k": _write_jsonl(folder / "gsm8k.jsonl", GSM8K_ROWS),
            "humaneval": _write_jsonl(folder / "humaneval.jsonl", HUMANEVAL_ROWS)}

