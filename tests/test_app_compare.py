"""End-to-end tests of the Gradio demo's /compare endpoint through gradio_client against the launched app.

The app runs the real engine on a real (tiny) model pair: nothing is stubbed. With the embedded
tinyworld pair present, the image test also runs on it; the tiny random pair always runs. Here: the API's
signature, an image and a video streamed, the other policies, draft pruning, the JSON export, the SAGE knobs,
sampling, policy specs, and the queue's polling knobs. Shared fixtures: conftest.py; helpers: app_server.py.
"""

from __future__ import annotations

import json
import time
import urllib.request

import app_server
import pytest
from app_server import check_summary, figure, run
from gradio_client import handle_file

from sage_engine import SpecEngine

pytestmark = pytest.mark.timeout(300)

PLOTS = ["fig_alpha", "fig_accepted", "fig_tree", "fig_mapping", "fig_time"]


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


def test_queue_polls_calmly(server):
    """The private Gradio knobs calm_queue() sets still exist (a Gradio upgrade may rename them)."""
    from app.demo import PROGRESS_POLL_S, QUEUE_POLL_S

    queue = server.demo._queue
    assert queue.sleep_when_free == QUEUE_POLL_S and queue.progress_update_sleep_when_free == PROGRESS_POLL_S
