"""Engine invariants on the event stream: accounting, streaming text, stop rules, timing fields."""

import json

import numpy as np
import pytest
import torch

from sage_engine import InputError, SpecEngine, prepare_input
from sage_engine.core import engine as engine_mod
from sage_engine.core.sampling import Sampling
from sage_testing.tiny_pairs import image, llava_pair, qwen25_pair


@pytest.fixture(scope="module")
def setup():
    pair = qwen25_pair("noisy", seed=2)
    return pair, SpecEngine(pair), prepare_input(pair, "describe the scene", images=[image(2)])


@pytest.mark.parametrize("policy", ["ar", "chain", "static", "eagle2", "sage"])
def test_stream_accounting_is_consistent(setup, policy):
    pair, engine, prep = setup
    res = engine.generate(prep, policy, max_new_tokens=30, ignore_eos=True)
    steps = res.steps
    assert steps[0].kind == "prefill" and steps[0].tree is None and len(steps[0].new_token_ids) == 1
    assert [s.step for s in steps] == list(range(len(steps)))
    assert sum(len(s.new_token_ids) for s in steps) == len(res.token_ids) == 30
    assert steps[-1].finished and steps[-1].finish_reason == "length"
    assert "".join(s.new_text for s in steps) == res.text == pair.tokenizer.decode(res.token_ids,
                                                                                  skip_special_tokens=True)
    for s in steps[1:]:
        n = len(s.tree.tokens)
        left = 30 - (s.total_tokens - len(s.new_token_ids))  # tokens the run could still emit at this step
        assert max(s.tree.depths, default=0) <= left - 1  # no node the budget could never emit
        assert left > 1 or s.draft_forwards == 0  # the last single token: a plain step
        assert s.new_text.startswith(s.accepted_text)  # the draft's part of the step's text comes first
        assert s.accepted_text == "" or s.accepted_tokens  # only accepted draft tokens write it
        if len(s.new_token_ids) > len(s.accepted_tokens):  # the bonus token was emitted
            assert s.bonus_text == pair.tokenizer.decode([s.bonus_token])
        assert s.new_token_ids[: len(s.accepted_tokens)] == s.accepted_tokens[: len(s.new_token_ids)]
        assert all(0 <= i < n for i in s.accepted_nodes)
        assert [s.tree.tokens[i] for i in s.accepted_nodes] == s.accepted_tokens
        assert all(s.tree.parents[i] < i for i in range(n))
        assert min(s.target_ms, s.draft_ms, s.other_ms) >= 0
        if policy == "ar" or s.depth == 0:  # ar, or a plain step of sage's cost threshold (no draft, or a try
            # whose probe turned it down: the draft read what it had missed, and no tree was drafted)
            assert n == 0 and len(s.new_token_ids) == 1 and s.draft_forwards <= (policy == "sage")
            assert (s.root_alpha is None) == (s.draft_forwards == 0)
        else:
            assert s.draft_forwards >= 1 and s.root_alpha is not None and 0 <= s.root_alpha <= 1
    assert res.stats.target_forwards == len(steps) - 1
    json.dumps(res.to_dict())  # events serialise


def test_stop_string_ends_the_run_at_the_string(setup):
    pair, engine, prep = setup
    free = engine.generate(prep, "ar", max_new_tokens=30, ignore_eos=True)
    stop = pair.tokenizer.decode(free.token_ids[8:10], skip_special_tokens=True)
    res = engine.generate(prep, "sage", max_new_tokens=30, stop=(stop,), ignore_eos=True)
    assert res.stats.finish_reason == "stop_string" and stop in res.text
    assert res.token_ids == free.token_ids[: len(res.token_ids)] and len(res.token_ids) <= 10


def test_sage_reports_its_tree_shape_and_controller(setup):
    _, engine, prep = setup
    res = engine.generate(prep, "sage:threshold=paper:alpha_source=prev_path", max_new_tokens=30, ignore_eos=True)
    decode = res.steps[1:]
    assert decode[0].alpha == 0.5  # first tree planned from alpha0
    for s in decode:  # the last steps draft no deeper than the tokens the budget still allows
        left = 30 - (s.total_tokens - len(s.new_token_ids))
        assert min(3, left - 1) <= s.depth <= min(12, left - 1) and 2 <= s.width <= 10 and s.d_max is not None
    assert all(len(s.tree.tokens) <= 64 for s in decode)


def test_engine_meters_every_step_and_the_cost_threshold_prices_from_it(setup, monkeypatch):
    from sage_engine import PricedConfig, make_policy
    from sage_engine.core import costs
    from sage_engine.policies import PricedPolicy
    # no step counts as stalled here (a busy machine can slow one past SPIKE x its peers; the meter then leaves it out
    # of the windows, and the rate below, over every step the meter was handed, would differ): stalls are tested in
    # test_policy.py
    monkeypatch.setattr(costs, "SPIKE", float("inf"))
    _, engine, prep = setup
    engine.costs.steps.clear()
    engine.costs.by_policy.clear()
    ar = engine.generate(prep, "ar", max_new_tokens=30, ignore_eos=True)
    timings = list(engine.costs.steps)
    assert len(timings) == ar.stats.target_forwards and {t.policy for t in timings} == {"ar"}
    assert all(t.nodes == 0 and t.tokens == 1 and t.draft_forwards == 0 and 0 < t.verify_ms <= t.wall_ms
               for t in timings)
    paper = engine.generate(prep, "sage:threshold=paper", max_new_tokens=30, ignore_eos=True)  # drafted steps
    assert len(paper.steps) > 4 and sum(not t.plain for t in engine.costs.steps) == len(paper.steps) - 1
    policy = PricedPolicy(make_policy("sage"), PricedConfig(fallback_steps=0))  # every step drafts (priced)
    quoted = []  # the prices each drafted step was shaped with, as the policy read them
    prices = PricedPolicy._prices
    monkeypatch.setattr(PricedPolicy, "_prices", lambda self, quote: quoted.append(prices(self, quote)) or quoted[-1])
    res = engine.generate(prep, policy, max_new_tokens=30, ignore_eos=True)
    assert res.token_ids == ar.token_ids  # prices shape the tree, never the output
    mine = engine.costs.by_policy[policy.key]
    assert [t.tokens for t in mine] == [len(s.accepted_tokens) + 1 for s in res.steps[1:]][-len(mine):]
    assert [t.nodes for t in mine] == [len(s.tree.tokens) for s in res.steps[1:]][-len(mine):]
    # the last drafted step was priced from the policy's rate over its window of steps before that one
    # (plain steps, which the cost threshold may take, draft nothing and carry no price)
    last = max(i for i, s in enumerate(res.steps[1:]) if s.depth > 0)
    before = [t for t in engine.costs.steps if t.policy == policy.key][:last][-engine.costs.policy_window:]
    price = quoted[-1]
    assert price is not None
    assert price.rate == pytest.approx(sum(t.tokens for t in before) / sum(t.wall_ms for t in before))
    # each step's event carries the prices its tree was shaped with (the app draws them); ar's carry none
    priced = [s for s in res.steps[1:] if s.node_price is not None]
    assert priced and res.steps[1 + last].node_price == price.node
    assert res.steps[1 + last].level_price == price.level
    assert all(s.node_price is None for s in res.steps[1:] if s.depth == 0)
    for s in priced:   # no node of a priced tree is below its step's node price (cumulative draft probability);
        # the prices are least-squares slopes of noisy wall times, clamped at zero (a free level is possible)
        assert all(c >= s.node_price - 1e-9 for c in s.tree.cum_probs) and s.node_price >= 0 <= s.level_price
    assert all(s.node_price is None and s.level_price is None for s in ar.steps)


@pytest.mark.parametrize("when", ["built", "first step"])
def test_the_runners_one_off_check_is_not_metered_as_a_step_cost(monkeypatch, when):
    """Each model's layers are checked against forward() once (runner.py): when the engine is built, or, for a model
    that cannot take a text-only prompt, on its first cached forward. Either way that time is not in what the cost
    meter and the policy judge drafted steps by (in the second case it is in the first step's event)."""
    import time

    from sage_engine.core.runner import ModelRunner
    real = ModelRunner._check_cached

    def slow_check(self, *args):
        time.sleep(0.05)
        return real(self, *args)

    monkeypatch.setattr(ModelRunner, "_check_cached", slow_check)
    if when == "first step":  # a model that takes no text-only prompt: neither check runs on one
        monkeypatch.setattr(ModelRunner, "check_layers", lambda self, ids: None)

        def needs_images(runner, *args):
            raise ValueError("this model needs its images")

        monkeypatch.setattr(engine_mod, "tree_refusal", needs_images)
        monkeypatch.setattr(engine_mod, "decode_refusal", lambda runner, media: None)  # it reads an image prompt
    pair = qwen25_pair("noisy", seed=2)
    engine = SpecEngine(pair)
    assert (engine.target.stack_checked and engine.draft.stack_checked) == (when == "built")
    res = engine.generate(prepare_input(pair, "describe the scene", images=[image(2)]), "chain", max_new_tokens=12,
                          ignore_eos=True)
    assert engine.target.check_ms >= 50 and engine.draft.check_ms >= 50
    first = res.steps[1]
    assert (first.other_ms >= 100) == (when == "first step")   # the event keeps every millisecond of its step
    assert engine.costs.steps[0].wall_ms < 50   # the meter does not count the check


def test_bad_requests_raise_input_errors(setup):
    pair, engine, prep = setup
    with pytest.raises(InputError, match="empty"):
        prepare_input(pair, "   ")
    with pytest.raises(InputError, match="at least 1"):
        list(engine.stream(prep, "sage", max_new_tokens=0))
    with pytest.raises(InputError, match="too long"):
        list(engine.stream(prepare_input(pair, "shape " * 1200), "ar", max_new_tokens=4))


@pytest.mark.parametrize("build", [qwen25_pair, llava_pair], ids=["qwen2.5-vl", "llava"])
def test_kept_prompt_gives_the_same_runs_without_running_the_prefill_again(build):
    """keep_prompt: runs on the same PreparedInput copy the prefilled caches (no model call for the prompt) and
    decode exactly what fresh prefills decode, greedy and sampled, for every kind of draft (a sampled tree with
    the paper's thresholds: under the ratio rule the draws depend on the tree's shape, which the default's cost
    prices take from timings)."""
    pair = build("noisy", seed=2)
    prep = prepare_input(pair, "describe the scene", images=[image(3)])
    fresh, kept = SpecEngine(pair), SpecEngine(pair, keep_prompt=True)
    calls = {"target": 0, "draft": 0}
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        model.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    runs = [("ar", None), ("sage", None), ("chain", Sampling(1.0, seed=4)),
            ("sage:draw=sample:threshold=paper", Sampling(0.8, seed=5)), ("eagle2", Sampling(1.0, top_p=0.9, seed=6))]
    for policy, sampling in runs:
        want = fresh.generate(prep, policy, 24, ignore_eos=True, sampling=sampling).token_ids
        assert kept.generate(prep, policy, 24, ignore_eos=True, sampling=sampling).token_ids == want, policy
    kept.generate(prep, "sage", 24, ignore_eos=True)  # both models have read the prompt and checked their stacks
    before = dict(calls)
    for policy, sampling in runs:
        kept.generate(prep, policy, 24, ignore_eos=True, sampling=sampling)
    stacked = kept.target.stack is not None and kept.draft.stack is not None
    assert not stacked or calls == before  # no prefill ran (tree steps call the decoder layers, not forward())
    other = prepare_input(pair, "describe the scene", images=[image(4)])
    assert kept.generate(other, "sage", 24, ignore_eos=True).token_ids == fresh.generate(
        other, "sage", 24, ignore_eos=True).token_ids  # another input: a real prefill


@pytest.mark.parametrize("source", ["prev_path", "current_root"])
def test_the_draft_gives_each_fed_node_an_alpha_only_for_a_policy_that_reads_them(setup, source):
    """`prev_path` plans the next tree from the accepted path's alphas (each the draft's confidence after that node,
    the root's included); other sources read only the root's, and the drafter skips the per-node ones."""
    from sage_engine import SageConfig, make_policy
    from sage_engine.core.rules import confidence

    pair, engine, prep = setup
    policy = make_policy("sage", SageConfig(threshold="paper", alpha_source=source, d_min=4, d_max=4))
    drafter = engine.drafter
    with torch.inference_mode():
        engine.target.prefill(prep.target_inputs)
        drafter.start(prep.for_draft(), 3)
        draft = drafter.grow(policy)
        tree = draft.tree
        fed = [n for n in range(len(tree)) if tree.draft_slots[n] >= 0]
        assert fed and tree.root_alpha is not None and draft.shape.depth == 4
        if source == "current_root":
            assert all(a is None for a in tree.alphas)
            return
        assert all((tree.alphas[n] is not None) == (n in fed) for n in range(len(tree)))
        node = fed[-1]  # its alpha: the draft's confidence after the path to it, read again by a plain forward
        path = tree.path_to(node)
        runner = drafter.runner
        runner.prefill(prep.for_draft())
        n = runner.seq_len
        tokens = [3] + [tree.tokens[i] for i in path]
        logits = runner.forward(tokens, list(range(n, n + len(tokens))), np.tril(np.ones((len(tokens),) * 2, bool)))
        top = torch.softmax(logits.logits[-1], -1).topk(policy.entropy_k).values.tolist()
        assert tree.alphas[node] == pytest.approx(confidence(np.array(top)), abs=1e-4)


def test_the_transcript_decodes_as_the_tokenizer_does(setup):
    """The transcript calls the Rust tokenizer's decode directly where transformers' decode is only that call, and
    transformers' decode where it does more (here: a clean-up of spaces); both give tokenizer.decode's text."""
    from sage_engine.core.transcript import text_decoder

    pair, _, _ = setup
    tok = pair.tokenizer
    fast = text_decoder(tok)
    assert fast.func == tok.backend_tokenizer.decode  # the direct call is taken for this tokenizer
    rng = np.random.default_rng(0)
    specials = sorted(set(tok.all_special_ids))
    for n in (1, 3, 9, 40):
        ids = [int(i) for i in rng.integers(0, len(tok), n)] + specials[: n % 4]
        assert fast(ids) == tok.decode(ids, skip_special_tokens=True)
    tok.clean_up_tokenization_spaces = True
    try:
        slow = text_decoder(tok)
        assert slow.func == tok.decode  # transformers' own decode, which then cleans up
        ids = tok.encode("a , b .", add_special_tokens=False)
        assert slow(ids) == tok.decode(ids, skip_special_tokens=True)
    finally:
        tok.clean_up_tokenization_spaces = False


def test_step_texts_and_tree_views_are_made_when_read_and_read_alike_in_any_order(setup):
    """The engine hands each event its texts and tree view unmade (events.Deferred): a consumer that reads none of
    them (the benchmark) pays nothing for them in the step; one that reads them, in any order and from another
    thread (the app's race), gets the texts that in-order reading gives."""
    import threading

    from sage_engine.core.events import Deferred

    pair, engine, prep = setup
    policy = "sage:threshold=paper"  # its shapes follow alpha alone: every run takes the same steps (the default's
    #                                 cost rule reads the machine's timings, so two runs may split the text apart)
    eager = engine.generate(prep, policy, max_new_tokens=30, ignore_eos=True)
    in_order = [(s.accepted_text, s.new_text) for s in eager.steps]
    lazy = engine.generate(prep, policy, max_new_tokens=30, ignore_eos=True)
    assert all(isinstance(vars(s)[f], Deferred) for s in lazy.steps[1:] for f in ("_new_text", "_tree"))
    assert [(s.accepted_text, s.new_text) for s in reversed(lazy.steps)][::-1] == in_order  # last step read first
    assert [s.tree for s in lazy.steps[1:]] == [s.tree for s in eager.steps[1:]]
    read = []

    def consume(events):
        for ev in events:
            read.append((ev.accepted_text, ev.new_text))

    events: list = []
    reader = threading.Thread(target=consume, args=(events,))
    stream = engine.stream(prep, policy, max_new_tokens=30, ignore_eos=True)
    for ev in stream:  # the reader decodes the first half while the run goes on
        events.append(ev)
        if len(events) == len(in_order) // 2:
            reader.start()
    reader.join()
    consume(events[len(read):])
    assert read == in_order
    import pickle

    fresh = engine.generate(prep, policy, max_new_tokens=30, ignore_eos=True).steps  # every field still unmade
    assert all(isinstance(vars(s)["_tree"], Deferred) for s in fresh[1:])
    copies = pickle.loads(pickle.dumps(fresh))  # a ZeroGPU worker pickles each event it hands over
    assert [(s.accepted_text, s.new_text) for s in copies] == in_order
    assert [s.tree for s in copies[1:]] == [s.tree for s in eager.steps[1:]]


def test_a_checked_runners_one_token_passes_skip_building_their_inputs_and_keep_the_output(setup, monkeypatch):
    """Once its layers are checked, a CPU runner's one-token pass (every plain step) writes the token and its
    position into a tensor pair made once (runner._one_token_pass) instead of building ids and positions from lists:
    same tokens as the general path."""
    pair, engine, prep = setup
    runner, taken = type(engine.target), []
    one = runner._one_token_pass
    monkeypatch.setattr(runner, "_one_token_pass", lambda self, *a: taken.append(1) or one(self, *a))
    fast = engine.generate(prep, "ar", max_new_tokens=12, ignore_eos=True).token_ids
    assert engine.target.stack_checked and len(taken) >= 11  # every plain step after the first
    taken.clear()
    monkeypatch.setattr(engine.target, "_cpu", False)  # the general path: ids and positions built from lists
    assert engine.generate(prep, "ar", max_new_tokens=12, ignore_eos=True).token_ids == fast
    assert not taken
