"""End-to-end tests of the Gradio demo through gradio_client against the launched app.

The app runs the real engine on a real (tiny) model pair: nothing is stubbed. With the embedded
tinyworld pair present, the image test also runs on it; the tiny random pair always runs.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from dataclasses import fields

import app_server
import plotly.graph_objects as go
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from sage_engine import RunStats, SpecEngine, make_policy

pytestmark = pytest.mark.timeout(300)

OUT = ["status", "ar_text", "spec_text", "scoreboard", "replay", "fig_alpha", "fig_accepted", "fig_tree",
       "fig_mapping", "fig_time", "step", "export", "summary"]  # the API's outputs (gr.State is not one)
STATS_KEYS = {f.name for f in fields(RunStats)}
PLOTS = ["fig_alpha", "fig_accepted", "fig_tree", "fig_mapping", "fig_time"]


@pytest.fixture(scope="session")
def server():
    return app_server.launch()


@pytest.fixture(scope="session")
def client(server):
    return Client(server.url, verbose=False)


@pytest.fixture(scope="session")
def media(tmp_path_factory):
    return app_server.media(str(tmp_path_factory.mktemp("app_media")))


def run(client, **kwargs) -> tuple[list[dict], dict]:
    """Submit /compare; every streamed update and the final one, as dicts keyed by output name."""
    job = client.submit(api_name="/compare", **kwargs)
    final = job.result()
    updates = [dict(zip(OUT, u)) for u in job.outputs()]
    return updates, dict(zip(OUT, final))


def is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def figure(value) -> go.Figure:
    """The served Plotly figure, validated by plotly.py (the app builds figures unvalidated)."""
    assert isinstance(value, dict) and value.get("type") == "plotly", value
    return go.Figure(json.loads(value["plot"]))


def check_summary(final: dict, policy: str = "sage") -> dict:
    s = final["summary"]
    assert set(s) >= {"ar", "speculative"}
    assert set(s["ar"]) >= {"text", "token_ids", "stats"} and set(s["speculative"]) >= {"policy", "text",
                                                                                          "token_ids", "stats"}
    assert set(s["ar"]["stats"]) == STATS_KEYS and set(s["speculative"]["stats"]) == STATS_KEYS
    assert s["speculative"]["policy"] == policy
    assert s["ar"]["token_ids"], "no tokens decoded"
    assert s["speculative"]["token_ids"] == s["ar"]["token_ids"]  # greedy speculative == target greedy (fp32)
    assert s["speculative"]["text"] == s["ar"]["text"] and s["identical"] is True
    assert s["ar"]["stats"]["mean_accepted"] == pytest.approx(1.0)  # AR: one token per target forward
    return s


def test_api_signature(client):
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/compare"]
    names = [p["parameter_name"] for p in info["parameters"]]
    assert names[:5] == ["image", "video", "prompt", "max_new_tokens", "policy"]
    assert all(p["parameter_has_default"] for p in info["parameters"][3:])
    assert info["returns"][-1]["component"] == "Json"


@pytest.mark.parametrize("preset", app_server.presets())
def test_image_streams_and_matches(client, media, preset, monkeypatch):
    # each decode step slowed by 10 ms: the test pairs answer 40 tokens in a few hundredths of a second, too fast for
    # the pacer to afford an update besides the first token's (the server runs in this process)
    real_stream = SpecEngine.stream

    def slowed(self, *args, **kwargs):
        for event in real_stream(self, *args, **kwargs):
            time.sleep(0.01)
            yield event

    monkeypatch.setattr(SpecEngine, "stream", slowed)
    updates, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                         max_new_tokens=40, policy="sage", preset=preset)
    check_summary(final)
    # streamed: text arrived before the final update, and it grew
    partial = [u["ar_text"] for u in updates[:-1] if isinstance(u["ar_text"], str) and u["ar_text"]]
    assert len(updates) > 2 and partial, "no streamed text before the end"
    assert final["ar_text"] == final["summary"]["ar"]["text"]
    spec_text = "".join(seg["token"] for seg in final["spec_text"])
    assert spec_text == final["summary"]["speculative"]["text"]
    labels = {seg["class_or_confidence"] for seg in final["spec_text"]}
    assert "target, bonus" in labels and labels <= {"draft, accepted", "target, bonus", "target, prefill"}
    for name in PLOTS:
        assert figure(final[name]).data, f"{name} has no traces"
    tree = figure(final["fig_tree"])
    assert any(t.name == "target, bonus" for t in tree.data) and tree.layout.title.text.startswith("Step ")
    steps = final["summary"]["speculative"]["stats"]["target_forwards"]
    assert final["step"]["maximum"] == max(2, steps) and 1 <= final["step"]["value"] <= steps
    assert "identical" in final["scoreboard"] and "Replay the race" in final["replay"]


def test_video_example(client, server, media):
    updates, final = run(client, image=None, video=handle_file(media.video), prompt=media.video_prompt,
                         max_new_tokens=32, policy="sage", preset=server.default_preset)
    check_summary(final)
    assert len(updates) > 2
    for name in PLOTS:
        figure(final[name])


@pytest.mark.parametrize("policy", ["chain", "static", "eagle2"])
def test_other_policies(client, media, policy):
    _, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                   max_new_tokens=16, policy=policy)
    check_summary(final, policy)


def test_draft_pruning_keeps_the_output_and_changes_what_the_draft_saw(client, server, media):
    runs = {prune: run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                       max_new_tokens=24, policy="sage", threshold="paper", draft_prune=prune)[1]
            for prune in (False, True)}
    check_summary(runs[True])
    assert runs[True]["summary"]["speculative"]["token_ids"] == runs[False]["summary"]["ar"]["token_ids"]
    exports = {prune: export_of(server, final) for prune, final in runs.items()}
    assert exports[True]["policy_config"]["draft_pruning"] and not exports[False]["policy_config"]["draft_pruning"]
    first = {prune: next(s for s in x["speculative"]["steps"] if s["kind"] == "decode")
             for prune, x in exports.items()}
    assert first[True]["root_alpha"] != first[False]["root_alpha"]  # the draft read fewer visual tokens


def test_export_download(client, server, media):
    _, final = run(client, image=handle_file(media.image), video=None, prompt=media.image_prompt,
                   max_new_tokens=12, policy="sage", threshold="paper")  # every step drafts: a tree to export
    path = final["export"]["value"]
    with urllib.request.urlopen(f"{server.url}/gradio_api/file={path}") as r:
        run_json = json.loads(r.read())
    assert run_json["format"] == "sage-run/1" and run_json["policy"] == "sage"
    for lane in ("ar", "speculative"):
        steps = run_json[lane]["steps"]
        assert steps[0]["kind"] == "prefill" and all("arrival_s" in s for s in steps)
        assert [t for s in steps for t in s["new_token_ids"]] == final["summary"][lane]["token_ids"]
    assert run_json["speculative"]["steps"][1]["tree"]["tokens"]
    assert run_json["policy_config"]["d_max"] == 16  # the default start (SageConfig; the paper: 8)


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


def export_of(server, final) -> dict:
    with urllib.request.urlopen(f"{server.url}/gradio_api/file={final['export']['value']}") as r:
        return json.loads(r.read())


def test_the_speculative_lane_uses_the_draft_and_each_knob_changes_its_trees(client, server, media):
    """On the default pair's own example the draft is accepted (tau > 1, accepted draft text); D_max, N_max and
    k each change what the trees look like, and none of them changes the output."""
    base = dict(image=handle_file(media.image), video=None, prompt=media.image_prompt, max_new_tokens=40,
                policy="sage", threshold="paper")  # the paper's rule drafts every step
    runs = {name: run(client, **base, **knobs)[1] for name, knobs in [
        ("default", {}), ("shallow", dict(d_min=2, d_max=2)), ("few nodes", dict(n_max=3)), ("k=2", dict(k=2))]}
    ids = {name: final["summary"]["speculative"]["token_ids"] for name, final in runs.items()}
    assert all(i == runs["default"]["summary"]["ar"]["token_ids"] for i in ids.values())
    steps = {name: [s for s in export_of(server, final)["speculative"]["steps"] if s["kind"] == "decode"]
             for name, final in runs.items()}
    default = steps["default"]
    assert runs["default"]["summary"]["speculative"]["stats"]["mean_accepted"] > 1
    assert any(s["accepted_text"] for s in default)
    # every step drafts, but a run's last single token is a plain step (no draft forward)
    assert all(s["draft_forwards"] > 0 for s in default[:-1])
    assert default[-1]["draft_forwards"] > 0 or len(default[-1]["new_token_ids"]) == 1
    assert max(max(s["tree"]["depths"], default=0) for s in default) > 2
    assert all(max(s["tree"]["depths"], default=0) <= 2 for s in steps["shallow"])
    assert max(len(s["tree"]["tokens"]) for s in default) > 3
    assert all(len(s["tree"]["tokens"]) <= 3 for s in steps["few nodes"])
    alphas = {name: [s["root_alpha"] for s in steps[name]] for name in ("default", "k=2")}
    assert alphas["default"][0] != alphas["k=2"][0]  # alpha is the entropy over the top k


def test_the_app_samples_both_lanes_with_the_same_seed(client, server, media):
    base = dict(image=handle_file(media.image), video=None, prompt=media.image_prompt, max_new_tokens=32,
                policy="sage", threshold="paper")
    greedy = run(client, **base)[1]["summary"]
    sampled = {seed: run(client, **base, temperature=1.0, top_p=0.9, seed=seed)[1] for seed in (3, 4)}
    for final in sampled.values():
        assert final["summary"]["identical"]  # the speculative lane drew what the target alone drew
        assert export_of(server, final)["policy_config"]["sampling"]["temperature"] == 1.0
    texts = {seed: final["summary"]["ar"]["token_ids"] for seed, final in sampled.items()}
    assert texts[3] != texts[4] or texts[3] != greedy["ar"]["token_ids"]  # it samples
    _, chain = run(client, **{**base, "policy": "chain"}, temperature=1.0, top_p=0.9, seed=3)
    assert chain["summary"]["rule"] == "ratio" and sampled[3]["summary"]["rule"] == "tree"
    assert chain["summary"]["sampling"] == {"temperature": 1.0, "top_p": 0.9, "seed": 3}
    _, drawn = run(client, **base, draw="sample", temperature=1.0, top_p=0.9, seed=3)
    assert drawn["summary"]["rule"] == "ratio"  # SAGE's children drawn from q: the ratio rule verifies them
    if not chain["summary"]["identical"]:  # the ratio rule's draw: the scoreboard says why, not "differs"
        assert "same distribution" in chain["scoreboard"] and "differs" not in chain["scoreboard"]
    tree = figure(chain["fig_tree"])
    story = tree.layout.annotations[-1].text
    assert story.startswith("Ratio rule") and "u·q" in story  # the step's own numbers under its tree
    assert any("target p = " in h for trace in tree.data for h in (trace.hovertext or ()))
    for bad, message in [(dict(temperature=-1), "minimum"), (dict(top_p=0.0), "minimum")]:  # the sliders refuse
        with pytest.raises(Exception, match=message):
            run(client, **base, **bad)


def test_the_app_takes_the_policy_specs_bench_and_generate_take(client, server, media):
    base = dict(image=handle_file(media.image), video=None, prompt=media.image_prompt, max_new_tokens=24)
    for spec, most_nodes in [("chain:k=3", 3), ("sage:n_max=3:threshold=paper", 3), ("eagle2:total_nodes=5", 5)]:
        _, final = run(client, **base, policy=spec)
        summary = final["summary"]
        assert summary["speculative"]["policy"] == spec and summary["identical"], spec
        steps = [s for s in export_of(server, final)["speculative"]["steps"] if s["kind"] == "decode"]
        assert max(len(s["tree"]["tokens"]) for s in steps) == most_nodes, spec  # the spec's knob took effect
    for bad, message in [("beam", "unknown policy"), ("chain:k=x", "must be an integer"), ("sage:k=1", "k >= 2"),
                         ("ar", "unknown policy"), ("/etc/passwd", "unknown policy")]:
        with pytest.raises(Exception, match=message):
            run(client, **base, policy=bad)
    assert run(client, **base, policy="sage")[1]["summary"]["identical"]  # and the next request works


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


# ---------------------------------------------------------------- pure pieces, no server


def test_view_fills_the_api_outputs_in_order():
    from app.view import View

    names = [f.name for f in fields(View)]
    assert [n for n in names if n != "run_state"] == OUT  # the JSON summary is the last API output


def test_divergence_and_speedup():
    from app.record import Lane, RunRecord

    rec = RunRecord("p", "q", 8, "sage", {}, {}, ar=Lane("ar", "ar", token_ids=[1, 2, 3], seconds=1.0),
                    spec=Lane("spec", "sage", token_ids=[1, 2, 4], seconds=0.5))
    div = rec.divergence()
    assert (div.index, div.ar_token, div.spec_token) == (2, 3, 4)
    rec.spec.token_ids = [1, 2]
    assert rec.divergence().spec_token is None  # one output ended early
    rec.spec.token_ids = [1, 2, 3]
    assert rec.divergence() is None


def test_tree_layout_centres_parents():
    from app.tree_plot import BONUS_NODE, _layout

    #   root -> 0 -> {2, 3};  root -> 1;  bonus after node 0
    y = _layout([-1, -1, 0, 0], extra_parent=0)
    leaves = [BONUS_NODE, 2, 3, 1]
    assert len({y[n] for n in leaves}) == 4  # every leaf its own row
    assert y[0] == pytest.approx((y[BONUS_NODE] + y[3]) / 2) and y[BONUS_NODE] > y[2] > y[3] > y[1]


@pytest.mark.parametrize("knobs,ok", [({}, True), ({"d_min": 3, "d_max": 8}, True), ({"d_min": 9, "d_max": 8}, False),
                                      ({"w_min": 5, "w_max": 2}, False), ({"k": 1}, False),
                                      ({"threshold": "cost"}, True), ({"threshold": "cheap"}, False)])
def test_sage_knobs_validated(knobs, ok):
    from app.handlers import sage_config
    from sage_engine import InputError, SageConfig

    if ok:
        assert sage_config(knobs) == SageConfig(**knobs)
    else:
        with pytest.raises(InputError):
            sage_config(knobs)


def test_stop_switch_ends_the_race_early():
    """The Stop switch, on the real engine: the decoding thread quits within a step or two."""
    from tiny_models import image, qwen25_pair

    from app.device import DeviceThread
    from app.race import Race, RunControl, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import SpecEngine, make_policy, prepare_input

    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    control = RunControl()
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 500, DeviceThread(), control.switch).start()
    record, transcriber = RunRecord("p", "q", 500, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber()
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
        if record.ar.steps:
            control.stop()
    assert race.stopped and not record.ar.done and not record.spec.steps
    assert 1 <= len(record.ar.token_ids) < 100
    control.arm()
    assert not control.switch.is_set()


def test_race_warms_up_untimed_before_its_lanes(monkeypatch):
    """A race decodes WARM_TOKENS plain tokens of its input before the two timed lanes, and none of their events reach
    the record: the autoregressive lane, which goes first, no longer pays for a machine that sat idle."""
    from tiny_models import image, qwen25_pair

    from app import race as race_module
    from app.device import DeviceThread
    from app.race import Race, Transcriber, consume
    from app.record import Lane, RunRecord
    from sage_engine import SpecEngine, make_policy, prepare_input

    calls = []
    real_stream = SpecEngine.stream

    def spy(self, prepared, policy, max_new_tokens, *args, **kwargs):
        calls.append((policy if isinstance(policy, str) else policy.name, max_new_tokens))
        return real_stream(self, prepared, policy, max_new_tokens, *args, **kwargs)

    monkeypatch.setattr(SpecEngine, "stream", spy)
    pair = qwen25_pair("noisy")
    prepared = prepare_input(pair, "describe the image", images=[image(0)])
    race = Race(SpecEngine(pair), prepared, make_policy("sage"), 12, DeviceThread()).start()
    record, transcriber = RunRecord("p", "q", 12, "sage", {}, {}, spec=Lane("spec", "sage")), Transcriber()
    for batch in race.batches(every=lambda: 0.01):
        consume(record, transcriber, batch)
    assert calls == [("ar", race_module.WARM_TOKENS), ("ar", 12), ("sage", 12)]
    assert record.ar.done and record.spec.done and len(record.ar.token_ids) == len(record.spec.token_ids) == 12
    assert record.ar.token_ids == record.spec.token_ids


def test_default_threads_follow_the_cpus_the_process_may_use(monkeypatch):
    """The app's decoding threads come from the CPUs a container lets it use, not from os.cpu_count(), which gives the
    host's (a CPU Space's count, 16, against its quota of 2): here a limit joblib's count honours as it does a cgroup
    quota."""
    from app import device

    monkeypatch.setattr(os, "cpu_count", lambda: 16)  # the host's cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "2")
    assert (device.usable_cpus(), device.default_threads()) == (2, 1)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "5")
    assert (device.usable_cpus(), device.default_threads()) == (5, 4)


def test_all_model_work_runs_on_one_device_thread(monkeypatch, media):
    """Loading, engine building, input preparation and both lanes of every run happen on the pool's one device
    thread, never on the calling (server) thread: each thread that starts torch's parallel work keeps an OpenMP
    team, and a second team slows decoding (app/device.py). A queued race whose visitor left never starts."""
    import threading

    import app.handlers as handlers_module
    from app.device import DeviceThread
    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool
    from app.race import Race, RunControl

    seen: dict[str, set] = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.get_ident())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(handlers_module, "prepare_input", spy("prepare", handlers_module.prepare_input))
    monkeypatch.setattr(SpecEngine, "__init__", spy("engine", SpecEngine.__init__))
    monkeypatch.setattr(SpecEngine, "stream", spy("decode", SpecEngine.stream))
    table = app_server.presets()
    pool = PairPool({"tiny-random": table["tiny-random"]}, spy("load", app_server.pair_factory))
    h = Handlers(pool, RunFiles(), "tiny-random")
    for prune in (False, True):  # two engines (draft pruning on and off), two runs
        rows = list(h.compare(media.image, None, media.image_prompt, 8, "sage", "tiny-random", RunControl(),
                              draft_prune=prune))
        assert rows
    assert set(seen) == {"load", "engine", "prepare", "decode"}
    threads = set().union(*seen.values())
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert pool.device.call(threading.get_ident) in threads
    assert pool.device.call(pool.device.on_device) and not pool.device.on_device()

    device = DeviceThread()
    gate = threading.Event()
    device.submit(gate.wait, 10)  # the device is busy with another visitor's run
    loaded = pool.get("tiny-random")
    queued = Race(loaded.engine(), h._prepare(loaded.pair, "q", media.image, None)[1], make_policy("ar"), 4, device)
    queued.start().stop(wait=0.1)  # the visitor leaves while the race waits for the device
    gate.set()
    assert queued._job.cancelled() and device.call(lambda: 1) == 1


def test_pacer_keeps_updates_within_their_share():
    """Streamed updates are paid from a budget of `share` x wall time; the first token always shows."""
    from app.pacing import Pacer

    p = Pacer(share=0.04, text_every=0.25, plot_every=1.0, text_cost=0.005, plot_cost=0.05, start=0.0)
    assert p.text_due(0.01)  # the first token, whatever it costs
    p.sent_update(0.02, 0.03)
    assert not p.text_due(0.2)  # too soon (text_every)
    assert not p.text_due(0.3)  # spacing met, but 0.02 + 0.02 > 4% of 0.3 s
    assert p.text_due(1.0)  # 0.04 <= 0.04
    assert not p.plot_due(1.0)  # a 0.05 s figure on top would overspend: a short run keeps its figures for the end
    # a long run: spent 0.02 + 0.02 (the update at 1.0 s); the figure comes once 4% of the elapsed time covers it
    p.sent_update(0.02, 1.0)
    assert not p.plot_due(2.5) and p.plot_due(2.8)  # 0.04 + 0.02 + 0.05 <= 4% of 2.8 s
    p.plotted(0.05, 2.8)
    p.sent_update(0.02, 2.8)
    assert not p.plot_due(3.5)  # plot_every holds it back
    assert not p.plot_due(4.0)  # and so does the budget: 0.11 + 0.07 > 0.16
    assert p.plot_due(4.5)
    # the speculative lane starts: what the autoregressive lane left unspent is not its to spend
    assert p.text_due(5.0)
    p.new_lane(5.0)
    assert not p.text_due(5.3)  # 0.02 > 4% of its 0.3 s
    assert p.text_due(5.5)  # 0.02 <= 4% of its 0.5 s


def _event(step: int, alpha: float, depth: int, width: int, d_max: int):
    from sage_engine import StepEvent

    return StepEvent(step=step, kind="decode", policy="sage", alpha=alpha, entropy=1 - alpha, root_alpha=alpha,
                     depth=depth, width=width, d_max=d_max, tree=None, accepted_nodes=[], accepted_tokens=[],
                     bonus_token=7, new_token_ids=[7], new_text="x", target_ms=1.0, draft_ms=1.0, other_ms=0.1,
                     draft_forwards=1, total_tokens=step + 1)


def test_alpha_figure_draws_the_node_price_only_when_the_steps_carry_one():
    from dataclasses import replace

    from app.plots import alpha_figure
    from app.record import Lane

    plain = [_event(i + 1, 0.5, 5, 6, 8) for i in range(3)]
    priced = [replace(e, node_price=0.02 * (i + 1), level_price=0.5) for i, e in enumerate(plain)]
    names = [t.name for t in go.Figure(alpha_figure(Lane("spec", "sage", steps=plain)).to_dict()).data]
    fig = go.Figure(alpha_figure(Lane("spec", "sage", steps=priced)).to_dict())  # validated
    price, = [t for t in fig.data if t.name not in names]
    assert list(price.y) == [0.02, 0.04, 0.06] and list(price.customdata) == [0.5] * 3


@pytest.mark.parametrize("d_maxes", [(8, 8, 8), (8, 9, 10), (8, 7, 6)])
def test_mapping_figure_whether_or_not_d_max_moved(d_maxes):
    from app.plots import mapping_figure
    from app.record import Lane
    from sage_engine import SageConfig

    lane = Lane("spec", "sage", steps=[_event(i + 1, 0.5, 5, 6, dm) for i, dm in enumerate(d_maxes)])
    fig = go.Figure(mapping_figure(lane, SageConfig(d_max=d_maxes[0])).to_dict())  # validated; the run started there
    curves = [t for t in fig.data if t.name and t.name.startswith("D(α)")]
    assert len(curves) == len(set(d_maxes)) and sum(bool(t.showlegend is not False) for t in curves) <= 2


def test_queue_polls_calmly(server):
    """The private Gradio knobs calm_queue() sets still exist (a Gradio upgrade may rename them)."""
    from app.demo import PROGRESS_POLL_S, QUEUE_POLL_S

    queue = server.demo._queue
    assert queue.sleep_when_free == QUEUE_POLL_S and queue.progress_update_sleep_when_free == PROGRESS_POLL_S


def test_zero_gpu_contract(monkeypatch, media):
    """On a ZeroGPU Space, `spaces.GPU` runs the decorated call in a forked worker: arguments and every yielded
    row are pickled across. A stand-in `spaces` with that contract (pickle in, pickle out) runs a real race."""
    import pickle
    import sys
    import types

    from app.gpu import on_gpu
    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool

    fn = lambda: None  # noqa: E731
    assert on_gpu()(fn) is fn  # no ZeroGPU: the identity

    calls = []

    def GPU(duration):
        def decorate(task):
            def worker(*args, **kwargs):
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))  # fails on a threading.Event
                calls.append((duration, args, kwargs))
                for row in task(*args, **kwargs):
                    yield pickle.loads(pickle.dumps(row))
            return worker
        return decorate

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    table = app_server.presets()
    h = Handlers(PairPool({"tiny-random": table["tiny-random"]}, app_server.pair_factory), RunFiles(), "tiny-random")
    from app.race import RunControl

    rows = list(h.compare(media.image, None, media.image_prompt, 16, "sage", "tiny-random", RunControl()))
    assert len(calls) == 1 and calls[0][0] > 0
    assert calls[0][1][6] is None  # the Stop switch stays in the main process
    from app.view import View

    final = dict(zip([f.name for f in fields(View)], rows[-1]))
    assert final["summary"]["speculative"]["token_ids"] == final["summary"]["ar"]["token_ids"]


def test_cached_example_races_once_then_replays(client, server, media):
    """An example cached lazily: the first call races it live (status "Done", raced just now) and stores it; the
    second returns the stored run at once, says it is cached, and carries the same tokens and the same timings."""
    from app.examples import EXAMPLE_API
    from app.media import load_examples
    from app.record import RunRecord

    n = sum(e.media == "image" for e in load_examples())
    if not n:
        pytest.skip("no image examples in assets/examples")
    index = n - 1  # the last image example (test_browser clicks the first: each test sees its own first click)
    calls = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = dict(zip(OUT, client.predict(index, api_name=EXAMPLE_API["image"])))
        calls.append((time.perf_counter() - t0, out))
    (t_live, live), (t_cached, cached) = calls
    print(f"\nimage example {index}: first call (live race) {t_live:.2f} s, second call (cache) {t_cached:.2f} s")
    assert "Done" in live["status"] and "Raced live just now" in live["status"]
    assert "Cached result" not in live["status"]
    assert cached["status"].startswith("**Cached result**") and "Done" not in cached["status"]
    assert "timings measured then" in cached["status"] and "press **Run** to race live" in cached["status"]
    s = check_summary(live)
    assert s["preset"] == server.default_preset and len(s["ar"]["token_ids"]) <= 96  # the layout's defaults
    assert cached["summary"]["speculative"]["token_ids"] == s["speculative"]["token_ids"]
    assert cached["summary"] == s  # the same run, timings included: shown, not raced again
    assert t_cached < 3.0
    steps = s["speculative"]["stats"]["target_forwards"]
    for out in (live, cached):
        assert out["step"]["interactive"] is (steps > 1) and out["step"]["maximum"] == max(2, steps)
        assert out["export"]["interactive"] is True and figure(out["fig_tree"]).data
    # the run behind the step slider is rebuilt from the cached run file
    path = cached["export"]["value"]
    with urllib.request.urlopen(f"{server.url}/gradio_api/file={path}") as r:
        rebuilt = RunRecord.from_export(json.loads(r.read()))
    assert rebuilt.summary() == s and len(rebuilt.spec.decode_steps) == steps
    for st in rebuilt.spec.decode_steps:   # a bonus token unless EOS / the budget cut the step inside its draft path
        has_bonus = len(st.new_token_ids) > min(len(st.accepted_tokens), len(st.new_token_ids))
        assert st.tree is not None and (st.bonus_text is not None) == has_bonus, st.step
    assert sum(st.bonus_text is None for st in rebuilt.spec.decode_steps) <= 1   # the last step only


def test_cached_example_without_its_run_file_degrades():
    """A stored example whose run file cannot be read (an old or damaged cache) is still shown, labelled as
    cached, with the step slider switched off and a status that says why."""
    from app.examples import NAMES, ExampleRuns

    stored = {n: None for n in NAMES}
    stored.update(status="**Cached result** of an earlier run of this example", spec_text=[], export=None)
    out = dict(zip(NAMES, ExampleRuns(None).present([stored[n] for n in NAMES], fresh=False)))
    assert out["status"].startswith("**Cached result**") and "step slider is off" in out["status"]
    assert out["step"] == {"__type__": "update", "interactive": False} and out["run_state"] is None


def test_cache_examples_modes(monkeypatch, tmp_path):
    """`off` builds plain example galleries (a click only fills the inputs); anything else is refused."""
    from gradio.helpers import Examples

    from app import build_demo
    from app.examples import LazyExamples

    made = []
    monkeypatch.setattr(Examples, "create", lambda self: made.append(self))
    monkeypatch.setenv("GRADIO_EXAMPLES_CACHE", str(tmp_path))
    table = {app_server.TINY.name: app_server.TINY}
    build_demo(table, pair_factory=app_server.pair_factory, cache_examples="off")
    assert made and not any(isinstance(x, LazyExamples) for x in made)
    assert all(x.cache_examples is False for x in made)
    made.clear()
    build_demo(table, pair_factory=app_server.pair_factory, cache_examples="lazy")
    assert made and all(isinstance(x, LazyExamples) and x.cache_examples == "lazy" for x in made)
    assert all(str(x.cached_folder).startswith(str(tmp_path)) for x in made)
    with pytest.raises(ValueError, match="lazy, off"):
        build_demo(table, pair_factory=app_server.pair_factory, cache_examples="eager")


def test_example_cache_key_follows_the_weights(tmp_path):
    """Retrained weights under the same preset paths must not show runs cached with the old ones."""
    import os

    from app.examples import fingerprint
    from sage_engine.presets import Preset

    target, draft = tmp_path / "t", tmp_path / "d"
    for d in (target, draft):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"old weights")
    image = tmp_path / "x.png"
    image.write_bytes(b"png")
    preset = Preset("local", "qwen2_5_vl", str(target), str(draft), None, None, None, None, True, "test")
    rows = [[str(image), "Describe."]]
    before = fingerprint(preset, rows)
    assert fingerprint(preset, rows) == before
    (draft / "model.safetensors").write_bytes(b"new weights!")
    os.utime(draft / "model.safetensors", ns=(1, 1))
    assert fingerprint(preset, rows) != before


def test_unplayable_video_gets_a_playable_preview_and_the_model_reads_the_upload(tmp_path):
    """An 'mp4v' (MPEG-4 part 2) clip, OpenCV's default for .mp4, does not play in browsers: the page gets a VP8
    WebM preview; the preview maps back to the upload (also as Gradio's cached copy, same file name)."""
    import shutil

    import hostile_media as hm

    from app.media import Previews, browser_playable
    from sage_engine.media import sample_video

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
