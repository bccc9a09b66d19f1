"""What a stranger may send the demo: bad input gets a one-line message and the app keeps serving, odd but valid
input runs (through /compare on the launched app, also as raw JSON with NaN and Infinity), the SAGE knobs are
validated, and a video browsers cannot play gets a playable preview while the model reads the upload."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from dataclasses import fields

import app_server
import pytest
from app_server import check_summary, run
from gradio_client import handle_file
from gradio_client.exceptions import AppError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="session")
def hostile(tmp_path_factory) -> dict[str, str]:
    """Hostile and odd files (tests/hostile_media.py), by name."""
    import hostile_media as hm

    d = tmp_path_factory.mktemp("hostile")
    (d / "zero.png").write_bytes(b"")
    files = {"bomb": hm.png_bomb(d / "bomb.png"), "zero image": str(d / "zero.png"),
             "long video": hm.avi_declaring(d / "long.avi", 2_000_000_000),
             "big video": hm.video(d / "big.avi", "MJPG", frames=1, size=(4200, 4200)),
             "1-frame video": hm.video(d / "one.avi", "MJPG", frames=1),
             "mp4v video": hm.video(d / "mp4v.mp4", "mp4v")}
    return {**files, **hm.odd_images(d), **hm.wrong_extensions(d)}


BAD = [
    ("broken image", dict(image="broken_image"), "cannot read image"),
    ("huge image", dict(image="huge_image"), "image is too large"),
    ("decompression bomb", dict(image="bomb"), r"image is too large \(its header declares 900 megapixels"),
    ("zero-byte image", dict(image="zero image"), "image file is empty"),
    ("video named .png", dict(image="video named .png"), "cannot read image .*not an image format"),
    ("text named .png", dict(image="text named .png"), "cannot read image .*not an image format"),
    ("empty video", dict(video="empty_video"), "video file is empty"),
    ("broken video", dict(video="broken_video"), "cannot open video|no decodable frames"),
    ("video declaring 2e9 frames", dict(video="long video"), "video is too long"),
    ("4200x4200 video", dict(video="big video"), r"video frames are too large \(4200x4200"),
    ("empty prompt", dict(image="image", prompt="   "), "prompt is empty"),
    ("100k-character prompt", dict(image="image", prompt="what " * 20_000),
     r"prompt is too long \(99999 characters; the limit is"),
    ("bad knobs", dict(image="image", d_min=6, d_max=4), "D_min <= D_max"),
    ("out-of-range knob", dict(image="image", k=10**9), "k|maximum|bound"),
    ("huge max_new_tokens", dict(image="image", max_new_tokens=10**12), "max_new_tokens|maximum|bound"),
    ("negative max_new_tokens", dict(image="image", max_new_tokens=-5), "max_new_tokens|minimum|bound"),
]


@pytest.mark.parametrize("case,inputs,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_reported_and_app_keeps_serving(client, media, hostile, case, inputs, message):
    kwargs = dict(image=None, video=None, prompt="Describe it.", max_new_tokens=8, policy="sage")
    for key, value in inputs.items():
        path = (hostile.get(value) or getattr(media, value, None)) if key in ("image", "video") else None
        kwargs[key] = handle_file(path) if path else value
    job = client.submit(api_name="/compare", **kwargs)
    with pytest.raises(AppError, match=message) as error:
        job.result()
    said = str(error.value)
    assert "\n" not in said and "Traceback" not in said and "internal error" not in said, said
    outputs = job.outputs()
    if outputs:  # the handler ran (Gradio itself refuses some values, e.g. a slider out of bounds, before it)
        status = outputs[-1][0]
        assert "Cannot run" in status and re.search(message, status)  # also shown in the status box
    # the next request still works
    _, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                   max_new_tokens=4, policy="chain")
    check_summary(final, "chain")


ODD = [("greyscale", "image", None), ("rgba", "image", None), ("16-bit", "image", None), ("cmyk", "image", None),
       ("palette", "image", None), ("png named .mp4", "video", None), ("1-frame video", "video", None),
       ("mp4v video", "video", None), ("emoji", "image", "🐱 What colour is the 🔴 shape? 🤔"),
       ("right-to-left", "image", "ما لون الشكل؟ מה הצבע של הצורה?")]


@pytest.mark.parametrize("case,kind,prompt", ODD, ids=[o[0] for o in ODD])
def test_odd_but_valid_input_runs(client, media, hostile, case, kind, prompt):
    """Odd files and prompts a stranger may send: each runs, and the speculative ids equal the AR ids."""
    path = media.image if prompt else hostile[case]
    _, final = run(client, image=handle_file(path) if kind == "image" else None,
                   video=handle_file(path) if kind == "video" else None, prompt=prompt or "Describe it.",
                   max_new_tokens=8, policy="sage")
    check_summary(final)


def raw_compare(client, server, **values) -> tuple[str, str]:
    """POST /compare through Gradio's plain HTTP API with a JSON body written by hand, so that NaN and
    Infinity (which gradio_client refuses to encode) reach the server; returns (last event, its data)."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/compare"]["parameters"]
    defaults = dict(image=None, video=None, prompt="Describe it.", max_new_tokens=8, policy="sage")
    data = [values.get(p["parameter_name"], defaults.get(p["parameter_name"], p.get("parameter_default")))
            for p in info]
    body = json.dumps({"data": data}).encode()  # allow_nan: NaN, Infinity, -Infinity literals
    req = urllib.request.Request(f"{server.url}/gradio_api/call/compare", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        event_id = json.loads(r.read())["event_id"]
    with urllib.request.urlopen(f"{server.url}/gradio_api/call/compare/{event_id}", timeout=120) as r:
        lines = r.read().decode().splitlines()
    events = [(a.removeprefix("event: "), b.removeprefix("data: ")) for a, b in zip(lines, lines[1:])
              if a.startswith("event: ") and b.startswith("data: ")]
    return events[-1]


NON_FINITE = [("theta_scale", float("nan")), ("n_max", float("inf")), ("d_max", float("-inf")), ("k", float("nan")),
              ("max_new_tokens", float("nan")), ("max_new_tokens", float("inf"))]


@pytest.mark.parametrize("name,value", NON_FINITE, ids=[f"{n}={v}" for n, v in NON_FINITE])
def test_non_finite_numbers_sent_raw_are_one_line_errors(client, server, media, name, value):
    event, data = raw_compare(client, server, **{name: value})
    assert event == "error", (event, data[:300])
    message = json.loads(data) if data.startswith(("\"", "{")) else data
    message = message.get("error", message) if isinstance(message, dict) else message
    assert message and "\n" not in str(message) and "internal error" not in str(message), data
    print(f"\n{name}={value}: {message}")
    _, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                   max_new_tokens=4, policy="chain")
    check_summary(final, "chain")


def test_only_configured_presets(client, media):
    with pytest.raises(AppError, match="not in the list of choices"):
        client.predict(image=handle_file(media.image), video=None, prompt="hi", max_new_tokens=4, policy="sage",
                       preset="/etc/passwd", api_name="/compare")


@pytest.mark.parametrize("knobs,ok", [({}, True), ({"d_min": 3, "d_max": 8}, True), ({"d_min": 9, "d_max": 8}, False),
                                      ({"w_min": 5, "w_max": 2}, False), ({"k": 1}, False),
                                      ({"threshold": "cost"}, True), ({"threshold": "cheap"}, False)])
def test_sage_knobs_validated(knobs, ok):
    from app.arguments import sage_config
    from sage_engine import InputError, SageConfig

    if ok:
        assert sage_config(knobs) == SageConfig(**knobs)
    else:
        with pytest.raises(InputError):
            sage_config(knobs)


def test_unplayable_video_gets_a_playable_preview_and_the_model_reads_the_upload(tmp_path):
    """An 'mp4v' (MPEG-4 part 2) clip, OpenCV's default for .mp4, does not play in browsers: the page gets a VP8
    WebM preview; the preview maps back to the upload (also as Gradio's cached copy, same file name)."""
    import shutil

    import hostile_media as hm

    from app.media import Previews, browser_playable
    from sage_engine.models.media import sample_video

    mp4v = hm.video(tmp_path / "mp4v.mp4", "mp4v", frames=12, size=(640, 360))
    mjpg = hm.video(tmp_path / "mjpg.avi", "MJPG")
    vp8, vp9 = hm.video(tmp_path / "vp8.webm", "VP80"), hm.video(tmp_path / "vp9.webm", "VP90")
    assert not browser_playable(mp4v) and not browser_playable(mjpg)
    assert browser_playable(vp8) and browser_playable(vp9)
    previews = Previews(str(tmp_path / "previews"))
    t0 = time.perf_counter()
    preview = previews.make(mp4v)
    made_s = time.perf_counter() - t0
    assert preview and preview.endswith(".webm") and browser_playable(preview)
    clip, shown = sample_video(mp4v, 12), sample_video(preview, 12)
    assert shown.total_num_frames == clip.total_num_frames == 12 and (shown.width, shown.height) == (480, 270)
    assert previews.make(vp8) is None and previews.make(preview) is None  # playable already / ours
    cached = tmp_path / "gradio-cache" / "abc123" / os.path.basename(preview)
    cached.parent.mkdir(parents=True)
    shutil.copy(preview, cached)
    assert previews.original(str(cached)) == mp4v and previews.original(vp8) == vp8
    assert previews.make(mjpg) and previews.make(str(tmp_path / "missing.mp4")) is None
    print(f"\nmp4v 640x360 x 12 frames -> VP8 preview in {made_s * 1000:.0f} ms")
    # a run given the preview (what the page holds) decodes the upload
    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool
    from app.view import View

    tiny = {app_server.TINY.name: app_server.TINY}
    h = Handlers(PairPool(tiny, app_server.pair_factory), RunFiles(), app_server.TINY.name, previews=previews)
    *_, last = h.compare(None, str(cached), "What happens?", 4, "sage")
    final = dict(zip([f.name for f in fields(View)], last))
    assert final["run_state"].media["video"] == "mp4v.mp4"
