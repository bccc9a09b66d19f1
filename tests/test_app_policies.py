"""The "Compare policies" mode through its API endpoint, /compare_policies (app/policy_compare.py): every policy on one
input, each checked against `ar`, the budget capped, bad input refused in one line with the app still serving."""

from __future__ import annotations

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from app.policy_compare import COMPARED, MAX_TOKENS

pytestmark = pytest.mark.timeout(300)


def compare_policies(client, image=None, video=None, prompt="Describe the image in detail.", max_new_tokens=48):
    return client.predict(image=None if image is None else handle_file(image),
                          video=None if video is None else handle_file(video), prompt=prompt,
                          max_new_tokens=max_new_tokens, api_name="/compare_policies")[-1]


def check(summary: dict, budget: int) -> None:
    policies = summary["policies"]
    assert list(policies) == list(COMPARED) and not summary["stopped"]
    ar = policies["ar"]["token_ids"]
    assert 0 < len(ar) <= budget and policies["ar"]["tau"] == 1.0
    for name in COMPARED[1:]:
        lane = policies[name]
        assert lane["matches_ar"] is True and lane["token_ids"] == ar, name
        assert lane["tokens_per_second"] > 0 and lane["tau"] >= 1.0
    assert "Every policy wrote exactly the target's tokens" in summary["verdict"]


def test_every_policy_on_an_image_and_a_video_matches_ar(client, media):
    check(compare_policies(client, image=media.image, prompt=media.image_prompt), 48)
    check(compare_policies(client, video=media.video, prompt=media.video_prompt, max_new_tokens=24), 24)


def test_the_budget_is_capped_in_this_mode(client, media):
    summary = compare_policies(client, image=media.image, prompt=media.image_prompt, max_new_tokens=512)
    assert summary["max_new_tokens"] == MAX_TOKENS
    check(summary, MAX_TOKENS)


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt="  "), "the prompt is empty"),
    (dict(image="broken_image"), "cannot read image"),
    (dict(video="empty_video"), "empty"),
    (dict(max_new_tokens=0), "less than minimum value 1"),
])
def test_bad_input_gets_one_line_and_the_app_keeps_serving(client, media, kwargs, message):
    kwargs = {k: getattr(media, v) if k in ("image", "video") else v for k, v in kwargs.items()}
    kwargs.setdefault("image", None if "video" in kwargs else media.image)
    with pytest.raises(AppError) as err:
        compare_policies(client, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value).strip()
    check(compare_policies(client, image=media.image, prompt=media.image_prompt, max_new_tokens=16), 16)


def test_the_download_holds_every_lane_with_its_steps(client, media):
    import json

    out = client.predict(image=handle_file(media.image), video=None, prompt=media.image_prompt, max_new_tokens=16,
                         api_name="/compare_policies")
    path = next(o["value"] for o in out if isinstance(o, dict) and str(o.get("value", "")).endswith(".json"))
    export = json.loads(open(path).read())
    assert export["format"] == "sage-policy-comparison/1"
    assert [lane["policy"] for lane in export["lanes"]] == list(COMPARED)
    ar = export["lanes"][0]["token_ids"]
    for lane in export["lanes"]:
        assert lane["token_ids"] == ar and lane["step_events"][0]["kind"] == "prefill"
        assert sum(len(e["new_token_ids"]) for e in lane["step_events"]) == len(ar)


def test_stop_ends_a_comparison_after_the_current_step():
    """The session's Stop switch: the comparison returns what it has and frees the device thread."""
    import threading

    from test_equivalence import sharp_case

    from app.policy_compare import run_all, verdict
    from sage_engine import SpecEngine

    pair, prep = sharp_case("qwen2.5-vl", "image", "noisy")
    engine, stop = SpecEngine(pair), threading.Event()
    stream = engine.stream

    def stop_in_chain(prepared, policy, *args, **kwargs):  # Stop pressed during the chain's lane
        for i, ev in enumerate(stream(prepared, policy, *args, **kwargs)):
            if policy == "chain" and i == 2:
                stop.set()
            yield ev

    engine.stream = stop_in_chain
    name = threading.current_thread().name
    lanes = run_all(engine, prep, 24, stop)
    assert [x.policy for x in lanes] == ["ar"] and threading.current_thread().name == name
    assert verdict(lanes) == "Stopped before every policy ran."
