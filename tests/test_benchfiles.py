"""Benchmark files read in their own formats (sage_engine.evaluation.benchfiles): the fixtures round-trip with their
format detected, prompts and references are built as each benchmark asks, and bad files fail in one line."""
import json
import shutil
from pathlib import Path

import pytest

from sage_engine.errors import InputError
from sage_engine.evaluation.benchfiles import (
    CAPTION_QUESTION,
    FORMATS,
    HUMANEVAL_PREFIX,
    SHORT_ANSWER,
    detect_format,
    read_benchmark,
    write_fixtures,
)

EXPECTED = {"textvqa": "image-qa", "gqa": "image-qa", "mvbench": "video-qa", "vdc": "video-caption",
            "gsm8k": "gsm8k", "humaneval": "humaneval"}


def rows_of(path: Path) -> list[dict]:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines()]


def one_line_error(match: str, fn, *args, **kw) -> str:
    with pytest.raises(InputError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_round_trips_with_its_format_detected(bench_files, name):
    bench = read_benchmark(bench_files[name])
    assert (bench.name, bench.format, len(bench.items)) == (name, EXPECTED[name], 3)
    assert len({it.id for it in bench.items}) == 3
    for it in bench.items:
        assert it.reference
        if it.media == "text":
            assert it.path == ""
        else:
            assert Path(it.path).is_absolute() and Path(it.path).is_file(), it.path


def test_fixture_media_are_tinyworld_images_and_clips(bench_files):
    import cv2
    from PIL import Image

    image = read_benchmark(bench_files["textvqa"]).items[0].path
    assert Image.open(image).size == (84, 84)
    cap = cv2.VideoCapture(read_benchmark(bench_files["mvbench"]).items[0].path)
    assert cap.isOpened() and int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 8
    cap.release()


def test_image_qa_prompt_and_reference(bench_files):
    rows = rows_of(bench_files["textvqa"])
    items = read_benchmark(bench_files["textvqa"]).items
    for row, it in zip(rows, items):
        assert it.prompt == row["question"] + "\nAnswer the question using a single word or phrase."
        assert it.reference == row["answers"][0] and it.id == str(row["question_id"]) and it.media == "image"
        assert it.path == str(bench_files["textvqa"].parent / row["image"])
    gqa_rows = rows_of(bench_files["gqa"])
    gqa = read_benchmark(bench_files["gqa"]).items
    assert [it.id for it in gqa] == ["gqa-1", "gqa-2", "gqa-3"]
    assert [Path(it.path).name for it in gqa] == [f"{r['imageId']}.png" for r in gqa_rows]
    assert [it.reference for it in gqa] == [r["answer"] for r in gqa_rows]


def test_mvbench_options_are_lettered(bench_files):
    rows = rows_of(bench_files["mvbench"])
    for row, it in zip(rows, read_benchmark(bench_files["mvbench"]).items):
        a, b, c, d = row["candidates"]
        assert it.prompt == (f"Question: {row['question']}\nOptions:\n(A) {a}\n(B) {b}\n(C) {c}\n(D) {d}\n"
                             "Answer with the option's letter from the given choices directly.")
        assert it.reference == row["answer"] and row["answer"] in row["candidates"] and it.media == "video"


def test_caption_prompt_and_default_question(bench_files, tmp_path):
    rows = rows_of(bench_files["vdc"])
    items = read_benchmark(bench_files["vdc"]).items
    assert [it.prompt for it in items] == [r["question"] for r in rows]
    assert [it.reference for it in items] == [r["answer"] for r in rows]
    bare = tmp_path / "captions.jsonl"   # no question, a caption, a video named without its extension
    bare.write_text(json.dumps({"video_id": "v1", "video": "clip", "caption": "A square moves."}) + "\n")
    shutil.copy(bench_files["vdc"].parent / "videos" / "vdc_0.mp4", tmp_path / "clip.mp4")
    (it,) = read_benchmark(bare).items
    assert (it.prompt, it.reference, it.path, it.id) == (CAPTION_QUESTION, "A square moves.",
                                                         str(tmp_path / "clip.mp4"), "captions-1")


def test_text_benchmarks(bench_files):
    gsm = read_benchmark(bench_files["gsm8k"]).items
    assert [it.reference for it in gsm] == ["10", "19", "800"]
    assert [it.prompt for it in gsm] == [r["question"] for r in rows_of(bench_files["gsm8k"])]
    rows = rows_of(bench_files["humaneval"])
    for row, it in zip(rows, read_benchmark(bench_files["humaneval"]).items):
        assert (it.id, it.media, it.path) == (row["task_id"], "text", "")
        assert it.prompt == HUMANEVAL_PREFIX + row["prompt"] and it.reference == row["canonical_solution"]
        scope: dict = {}   # each fixture function passes its own test
        exec(row["prompt"] + row["canonical_solution"] + row["test"], scope)
        scope["check"](scope[row["entry_point"]])


def test_limit_and_an_explicit_format(bench_files):
    assert [it.id for it in read_benchmark(bench_files["textvqa"], limit=2).items] == ["100", "101"]
    assert len(read_benchmark(bench_files["gsm8k"], limit=10).items) == 3
    one_line_error("limit", read_benchmark, bench_files["gsm8k"], limit=0)
    as_caption = read_benchmark(bench_files["mvbench"], fmt="video-caption")
    assert as_caption.format == "video-caption" and as_caption.items[0].prompt == rows_of(bench_files["mvbench"])[0][
        "question"]
    one_line_error("image-qa, video-qa", read_benchmark, bench_files["gsm8k"], fmt="mmlu")


def test_media_root(bench_files, tmp_path):
    moved = tmp_path / "textvqa.jsonl"
    shutil.copy(bench_files["textvqa"], moved)
    msg = one_line_error("line 1", read_benchmark, moved)
    assert str(tmp_path / "images" / "textvqa_0.png") in msg and "2 more" in msg
    items = read_benchmark(moved, media_root=bench_files["textvqa"].parent).items
    assert all(Path(it.path).is_file() for it in items)
    absolute = tmp_path / "abs.jsonl"   # absolute paths are kept whatever the root
    absolute.write_text(json.dumps({"image": items[0].path, "question": "How many shapes are there?"}) + "\n")
    assert read_benchmark(absolute, media_root="/nowhere").items[0].path == items[0].path


def test_blank_lines_skipped_and_a_bad_line_named(tmp_path):
    good = tmp_path / "sums.jsonl"   # ids count rows, not lines
    good.write_text('\n{"question": "1 + 1?", "answer": "#### 2"}\n\n{"question": "2 + 2?", "answer": "#### 4"}\n')
    assert [(it.id, it.reference) for it in read_benchmark(good).items] == [("sums-1", "2"), ("sums-2", "4")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n\n{"question": oops}\n')
    msg = one_line_error("line 3", read_benchmark, bad)
    assert "bad.jsonl" in msg
    bad.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n[1, 2]\n')
    one_line_error("line 2", read_benchmark, bad)


def test_missing_media_fails_before_any_item(bench_files, tmp_path):
    rows = rows_of(bench_files["mvbench"])
    rows[1]["video"] = "videos/nope.mp4"
    f = tmp_path / "mv.json"
    f.write_text(json.dumps(rows))
    msg = one_line_error("row 2", read_benchmark, f, media_root=bench_files["mvbench"].parent)
    assert "nope.mp4" in msg and "not found" in msg


def test_missing_file_and_undetectable_format(tmp_path):
    one_line_error("not found", read_benchmark, tmp_path / "none.jsonl")
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"foo": 1, "bar": 2}\n')
    msg = one_line_error("odd.jsonl", read_benchmark, odd)
    assert all(f in msg for f in FORMATS) and "bar, foo" in msg
    with pytest.raises(InputError, match="humaneval"):
        detect_format([{"question": "1 + 1?", "answer": "2"}])   # no "####": not sure it is gsm8k


def test_detect_format_from_keys():
    assert detect_format([{"video": "a.mp4", "question": "q", "options": ["x", "y"]}]) == "video-qa"
    assert detect_format([{"video_path": "a.mp4", "caption": "c"}]) == "video-caption"
    assert detect_format([{"imgname": "a.png", "query": "q", "label": "3"}]) == "image-qa"
    assert detect_format([{"imageId": "n1", "question": "q", "answer": "yes"}]) == "image-qa"
    assert detect_format([{"task_id": "H/0", "prompt": "def f():\n"}]) == "humaneval"
    assert detect_format([{"question": "q", "answer": "so\n#### 4"}]) == "gsm8k"


def test_json_dicts_with_data_and_keyed_rows(bench_files, tmp_path):
    folder = bench_files["gqa"].parent
    wrapped = tmp_path / "TextVQA_val.json"   # TextVQA's own layout: rows under "data", image_id without ".jpg"
    shutil.copy(folder / "tw0.png", tmp_path / "img0.png")
    wrapped.write_text(json.dumps({"dataset_name": "textvqa", "data": [
        {"question_id": 7, "image_id": "img0", "question": "What colour is it?",
         "answers": [{"answer": "red"}, {"answer": "red"}]}]}))
    (it,) = read_benchmark(wrapped).items
    assert (it.id, it.path, it.reference) == ("7", str(tmp_path / "img0.png"), "red")
    assert it.prompt == "What colour is it?" + SHORT_ANSWER
    keyed = tmp_path / "testdev_questions.json"   # GQA's own layout: {question id: row}
    keyed.write_text(json.dumps({"201": {"imageId": "tw1", "question": "Is it small?", "answer": "no"}}))
    (it,) = read_benchmark(keyed, media_root=folder).items
    assert (it.id, Path(it.path).name, it.reference) == ("201", "tw1.png", "no")
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}))
    one_line_error("list of objects", read_benchmark, flat)


def test_fixtures_are_deterministic(bench_files, tmp_path):
    again = write_fixtures(tmp_path)
    for name in ("textvqa", "gqa", "mvbench", "vdc"):
        assert again[name].read_text() == bench_files[name].read_text()
    assert (tmp_path / "tw0.png").read_bytes() == (bench_files["gqa"].parent / "tw0.png").read_bytes()
