"""The cost meter (core/costs.py, core/cost_windows.py) and SAGE's fall-back to plain steps (policies/fallback.py):
prices, rates, the judge of drafted against plain steps, the try after plain steps and its probe."""

import numpy as np
import pytest
from test_policy import frontier

from sage_engine.config import PricedConfig, SageConfig
from sage_engine.core.policy_io import StepOutcome
from sage_engine.core.tree import DraftTree
from sage_engine.policies import PricedPolicy, SagePolicy, make_policy
from sage_engine.policies.fallback import PROBING


def primed_meter(key="sage"):
    """A meter whose steps cost 4 ms + 0.2 ms per node + 1.1 ms per draft forward, and on which `key`
    decodes 5 tokens per 20 ms step (25 nodes, 10 draft forwards)."""
    from sage_engine.core.costs import CostMeter, StepTiming
    meter = CostMeter()
    for name, nodes, forwards in [("ar", 0, 0), ("chain", 5, 6), ("eagle2", 64, 7), ("static", 25, 6),
                                  ("other", 8, 3), (key, 25, 10), (key, 25, 10), (key, 25, 10)]:
        wall = 4 + 0.2 * nodes + 1.1 * forwards
        meter.record(StepTiming(name, 5 if name == key else 2, nodes, wall, 3 + 0.1 * nodes, 1.1 * forwards, forwards))
    return meter


def test_cost_meter_measures_rate_node_and_level_prices():
    from sage_engine.core.costs import CostMeter, StepTiming
    meter = CostMeter(min_steps=3)
    assert meter.break_even("sage") is None  # nothing measured: the paper's thresholds alone
    for _ in range(3):
        meter.record(StepTiming("sage", 1, 4, 6.0, 5.0, 1.0, 2))
    assert meter.break_even("sage") is None  # every step the same size: the prices cannot be told apart
    price = primed_meter().break_even("sage")
    assert price.rate == pytest.approx(5 / 20) and price.node_ms == pytest.approx(0.2)
    assert price.level_ms == pytest.approx(1.1)
    assert price.node == pytest.approx(0.05) and price.level == pytest.approx(0.275)
    assert primed_meter().break_even("sage:other") is None  # rates are kept per policy setting


def test_moments_fit_equals_least_squares_over_the_last_window_of_steps():
    """The meter's running sums give numpy's least-squares fit over exactly the last `window` drafted steps: steps
    that left the window are subtracted out, and a window whose regressors are collinear has no fit."""
    from sage_engine.core.costs import DRAFT, FORWARDS, NODES, VERIFY, WALL, Moments
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(50):  # nodes, forwards, wall, verify, draft ms (0.1 a forward and noise)
        nodes, forwards = int(rng.integers(1, 30)), int(rng.integers(1, 9))
        steps.append((nodes, forwards, float(rng.uniform(2, 20)), float(rng.uniform(1, 5)),
                      0.1 * forwards + float(rng.uniform(0, 0.5))))
    moments = Moments(window=16)
    ones = np.ones(16)
    for i, step in enumerate(steps):
        moments.add(step)
        if i in (19, 22, 36):  # read between steps too: the queued steps are taken in when the sums are read
            window = np.array(steps[i - 15 : i + 1])
            want = np.linalg.lstsq(np.column_stack([ones, window[:, 0]]), window[:, 3], rcond=None)[0]
            assert moments.fit(y=VERIFY, x=(NODES,)) == pytest.approx(want, rel=1e-9), i
    last = np.array(steps[-16:])
    want = np.linalg.lstsq(np.column_stack([ones, last[:, 0], last[:, 1]]), last[:, 2], rcond=None)[0]
    assert moments.n == 16 and moments.fit(y=WALL, x=(NODES, FORWARDS)) == pytest.approx(want, rel=1e-9)
    want = np.linalg.lstsq(np.column_stack([ones, last[:, 0]]), last[:, 3], rcond=None)[0]
    assert moments.fit(y=VERIFY, x=(NODES,)) == pytest.approx(want, rel=1e-9)

    def line(x, y):  # a least-squares line, its slope kept >= 0 (the intercept then the mean)
        slope, intercept = np.polyfit(x, y, 1)
        return (intercept, slope) if slope >= 0 else (y.mean(), 0.0)

    node = line(last[:, 0], last[:, 2] - last[:, 4])  # the node price's line: wall less draft on nodes
    level = line(last[:, 1], last[:, 4])  # the level price's: draft on forwards
    assert node[1] == 0 and level[1] > 0  # one of each kind in this window: a slope kept at 0, one fitted
    assert moments.line(y=WALL, x=(NODES,), minus=DRAFT) == pytest.approx(node, rel=1e-9)
    assert moments.line(y=DRAFT, x=(FORWARDS,)) == pytest.approx(level, rel=1e-9)
    same = Moments(window=4)
    for nodes in (3, 3, 3, 3, 9, 9):  # a window of 4: the first two steps have left it, (3, 3, 9, 9) remain
        same.add((nodes, 2 * nodes, 1.0 + nodes, 1.0, 0.5))
    assert same.fit(y=WALL, x=(NODES,)) == pytest.approx([1.0, 1.0])
    assert same.fit(y=WALL, x=(NODES, FORWARDS)) is None  # forwards = 2 x nodes: collinear


def test_node_and_level_prices_hold_where_tree_size_and_depth_grow_together():
    """Chain steps (5 nodes, 6 draft forwards) and SAGE steps whose nodes and forwards rise together (correlation
    ~0.97) at 0.1 ms a node and 0.07 ms a draft forward, plus up to ~1 ms of the machine's noise: the meter's prices
    (each a line through the part of the step measured apart, `CostMeter.prices_ms`) stay within 0.03 ms of both in
    every one of 20 windows, where one least-squares fit of the wall time on both counts is off by over 0.05 ms
    (half or more) in several."""
    from sage_engine.core.costs import CostMeter, StepTiming
    joint_off = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        meter, rows = CostMeter(), []
        for i in range(96):
            nodes = int(rng.integers(8, 13)) if i % 2 else 5
            forwards = nodes + int(rng.integers(-1, 2)) if i % 2 else 6
            draft = 0.07 * forwards + float(rng.normal(0, 0.01))
            wall = 2.0 + 0.1 * nodes + draft + abs(float(rng.normal(0, 0.5)))
            meter.record(StepTiming("sage" if i % 2 else "chain", 5, nodes, wall, 1.8 + 0.08 * nodes, draft, forwards))
            rows.append((1.0, nodes, forwards, wall))
        node_ms, level_ms = meter.prices_ms()
        assert node_ms == pytest.approx(0.1, abs=0.03) and level_ms == pytest.approx(0.07, abs=0.03), seed
        rows = np.array(rows)
        joint = np.linalg.lstsq(rows[:, :3], rows[:, 3], rcond=None)[0][1:]
        joint_off += bool(abs(joint[0] - 0.1) > 0.05 or abs(joint[1] - 0.07) > 0.05)
    assert joint_off >= 5


def test_cost_threshold_prices_nodes_and_levels():
    probs = [[0.5, 0.2, 0.1, 0.04, 0.03, 0.02, 0.016, 0.01, 0.005, 0.004]]
    paper = SagePolicy(SageConfig(threshold="paper"))
    quote = primed_meter(key=paper.key).quote(paper.key)  # a meter does nothing under the paper's threshold
    tree = DraftTree()
    shape = paper.shape(None, quote)
    assert len(paper.expand(shape, 1, tree, frontier([-1], probs))) == 6 and shape.price is None

    cost = priced()
    quote = primed_meter(key=cost.key).quote(cost.key)  # node price 0.25 tok/ms * 0.2 ms = 0.05, level 0.275
    shape = cost.shape(None, quote)
    assert shape.price is not None and shape.price.node == pytest.approx(0.05)
    tree = DraftTree()
    grow = cost.expand(shape, 1, tree, frontier([-1], probs))
    assert tree.probs == [0.5, 0.2, 0.1] and grow == [0, 1, 2]  # 0.04 and below do not pay for themselves
    # level 2 under a parent of cum 0.5: both children pay for themselves (0.2, 0.06 > 0.05) but together
    # (0.26) not for another draft forward (0.275): kept, not expanded
    two = [[0.4, 0.12] + [0.01] * 8]
    tree = DraftTree()
    parent = tree.add(7, -1, 0.5)
    assert cost.expand(shape, 2, tree, frontier([parent], two)) == []
    assert tree.cum_probs[1:] == pytest.approx([0.2, 0.06])
    tree = DraftTree()
    parent = tree.add(7, -1, 0.5)
    assert len(paper.expand(paper.shape(None), 2, tree, frontier([parent], two))) == 2  # the paper expands both
    with pytest.raises(ValueError, match="threshold"):
        SagePolicy(SageConfig(threshold="fast"))


def test_sage_is_unpriced_and_priced_sage_is_a_wrapper_asked_for_by_name():
    """`sage` reads no quote (the same trees whatever the machine's load); `priced:sage`, and sage's knob
    threshold=cost, wrap it; a SagePolicy cannot be made priced by its settings alone."""
    probs = [[0.5, 0.2, 0.1, 0.04, 0.03, 0.02, 0.016, 0.01, 0.005, 0.004]]
    sage = make_policy("sage")
    quote = primed_meter(key=sage.key).quote(sage.key)
    assert sage.shape(0.5, quote) == sage.shape(0.5, None) and sage.skip_draft(quote) is False
    for spec in ("priced:sage", "sage:threshold=cost"):
        pol = make_policy(spec)
        assert isinstance(pol, PricedPolicy) and pol.name == "priced:sage" and pol.cfg.threshold == "paper"
    pol = make_policy("priced:sage")
    shape = pol.shape(None, primed_meter(key=pol.key).quote(pol.key))
    assert shape.price is not None and len(pol.expand(shape, 1, DraftTree(), frontier([-1], probs))) == 3
    assert isinstance(make_policy("priced:chain"), PricedPolicy) and make_policy("priced:chain").top_k == 1
    alone = SagePolicy(SageConfig(threshold="cost"))  # the knob is make_policy's: the class itself is unpriced
    assert alone.shape(None, primed_meter(key=alone.key).quote(alone.key)).price is None
    with pytest.raises(ValueError, match="fallback_z"):
        PricedConfig(fallback_z=float("nan"))
    with pytest.raises(ValueError, match="fallback_window >= 1"):
        PricedConfig(fallback_window=0)


def priced(**knobs) -> PricedPolicy:
    """`priced:sage` with these PricedConfig knobs."""
    return PricedPolicy(SagePolicy(SageConfig()), PricedConfig(**knobs))


def plain_meter(rate_tok_per_ms=1.0, n=5):
    """A meter that has seen `n` plain steps (one target forward, one token) at `rate_tok_per_ms`."""
    from sage_engine.core.costs import CostMeter, StepTiming
    meter = CostMeter()
    for _ in range(n):
        meter.record(StepTiming("ar", 1, 0, 1.0 / rate_tok_per_ms, 0.9 / rate_tok_per_ms, 0.0, 0))
    return meter


def drafted(policy, quote, tokens, wall_ms):
    """One drafted step of `policy`: it asks whether to draft, then learns what the step made and cost."""
    assert policy.skip_draft(quote) is False
    policy.observe(StepOutcome(DraftTree(), [], tokens, wall_ms))


def test_cost_threshold_falls_back_to_plain_steps_while_drafting_loses_and_retries():
    pol = priced(fallback_steps=2, fallback_window=4)
    q = plain_meter(1.0).quote(pol.key)  # plain steps make 1 token per ms
    drafted(pol, q, 2, 4.0)
    drafted(pol, q, 2, 4.0)  # two drafted steps at 0.5 tokens per ms: losing
    assert [pol.skip_draft(q) for _ in range(2)] == [True, True]  # fallback_steps plain steps
    assert pol.plain_shape().depth == 0
    pol.observe(StepOutcome(DraftTree(), [], 1, 1.0, drafted=False))  # a plain step teaches the policy nothing
    assert pol.fallback.drafted == [(2, 4.0), (2, 4.0)]
    drafted(pol, q, 3, 4.0)  # the try (drafted whatever the window says); still losing: 7 / 12 ms
    assert [pol.skip_draft(q) for _ in range(4)] == [True] * 4  # the wait doubles
    drafted(pol, q, 20, 4.0)  # a winning try: 27 tokens in 16 ms over the window
    drafted(pol, q, 3, 3.0)  # so the policy drafts on, and the wait is back to fallback_steps
    assert pol.fallback.wait == 2
    drafted(pol, q, 5, 400.0)  # a step another process slowed 100x is left out of the judgement
    drafted(pol, q, 5, 4.0)
    assert pol.fallback.wait == 2
    # the same history never falls back unpriced, nor without a quote
    for other, meter in [(SagePolicy(SageConfig()), plain_meter(1.0)), (priced(), None)]:
        quote = None if meter is None else meter.quote(other.key)
        for _ in range(4):
            drafted(other, quote, 1, 10.0)


def test_the_rate_bound_adds_the_ratio_estimators_standard_errors():
    from sage_engine.core.costs import robust_rate
    steady = [(2, 3.5)] * 4
    assert robust_rate(steady, 1.0) == pytest.approx(robust_rate(steady)) == pytest.approx(2 / 3.5)  # no spread
    varied = [(8, 3.5), (1, 3.5), (1, 3.5), (1, 3.5)]  # 11 tokens in 14 ms; residuals 5.25, -1.75 x 3
    assert robust_rate(varied) == pytest.approx(11 / 14)
    assert robust_rate(varied, 1.0) == pytest.approx(11 / 14 + (36.75 / 12) ** 0.5 / 3.5)
    assert robust_rate(varied, 2.0) == pytest.approx(11 / 14 + 2 * (36.75 / 12) ** 0.5 / 3.5)
    assert robust_rate(varied[:1], 1.0) == pytest.approx(8 / 3.5)  # one step: no spread to measure


@pytest.mark.parametrize("z,falls_back", [(1.0, False), (0.0, True)])
def test_varied_drafted_steps_lose_only_on_evidence(z, falls_back):
    """Steps of 8, 1, 1 and 1 tokens at 3.5 ms measure 0.79 tokens per ms against plain steps' 1.0, but one standard
    error above, 1.29: the default (z = 1) drafts on; steps that make 2 tokens every time lose under any z."""
    for steps, loses in [((8, 1, 1, 1), falls_back), ((2, 2, 2, 2), True)]:
        pol = priced(fallback_steps=2, fallback_window=4, fallback_z=z)
        q = plain_meter(1.0).quote(pol.key)
        for tokens in steps:  # the run's last four drafted steps
            pol.observe(StepOutcome(DraftTree(), [], tokens, 3.5))
        assert pol.skip_draft(q) is loses


def test_a_run_starts_plain_when_the_policys_last_drafted_steps_lost():
    from sage_engine.core.costs import StepTiming
    meter = plain_meter(1.0)
    key = priced().key
    for _ in range(4):  # earlier runs: drafted steps at 0.4 tokens per ms
        meter.record(StepTiming(key, 2, 6, 5.0, 3.0, 1.5, 4, 3.0))
    pol = priced()
    assert [pol.skip_draft(meter.quote(key)) for _ in range(16)] == [True] * 16  # the longest wait (8 x fallback_steps)
    assert pol.skip_draft(meter.quote(key)) is False  # then a try


def probe_meter():
    """Plain steps at 1 token per ms; drafted steps that take 0.25 ms per node and per draft forward more."""
    from sage_engine.core.costs import StepTiming
    meter = plain_meter(1.0)
    for nodes, forwards in [(1, 1), (4, 2), (8, 5), (0, 1), (6, 3)]:
        meter.record(StepTiming("sage", 2, nodes, 1.0 + 0.25 * (nodes + forwards), 1.0, 0.25 * forwards, forwards))
    return meter


def drafted_wall_ms(meter, nodes: int, forwards: int) -> float:
    """The meter's fitted wall time of a drafted step verifying `nodes` nodes after `forwards` draft forwards."""
    base, per_unit = meter.drafted_line()
    return base + per_unit * (nodes + forwards)


def test_a_chain_pays_when_its_expected_tokens_beat_plain_steps_at_the_fitted_wall_times():
    from sage_engine.core.costs import StepTiming
    from sage_engine.core.policy_io import Probe
    quote = probe_meter().quote("sage")
    assert drafted_wall_ms(quote.meter, 2, 2) == pytest.approx(2.0)
    assert drafted_wall_ms(quote.meter, 0, 0) == pytest.approx(1.0)
    assert quote.chain_pays(0.6, 8) is True  # depth 1: 1.6 tokens in 1.5 ms beat 1 token per ms
    assert quote.chain_pays(0.3, 8) is False  # 1 + 0.3 + 0.09 + ... < 1 + 0.5 D for every depth
    assert quote.chain_pays(0.45, 1) is False and quote.chain_pays(0.45, 8) is False  # 1.45 / 1.5, 1.65 / 2.0, ...
    assert plain_meter(1.0).quote("sage").chain_pays(0.9, 8) is None  # no drafted step measured yet
    slow = probe_meter()  # more drafted steps with a fixed cost of their own (0.5 ms, whatever their size)
    for nodes, forwards in [(2, 2), (10, 6), (0, 1), (5, 5)] * 10:
        slow.record(StepTiming("sage", 2, nodes, 1.5 + 0.25 * (nodes + forwards), 1.0, 0.25 * forwards, forwards))
    assert 1.9 < drafted_wall_ms(slow, 1, 1) < 2.0  # the line's intercept moved up by most of it (45 steps, 40 slow)
    assert slow.quote("sage").chain_pays(0.6, 8) is False  # 1.6 tokens in ~2 ms no longer beat plain steps
    assert Probe().agreement == 0.5 and Probe(4, 4).agreement == pytest.approx(0.9)
    assert Probe(30, 0).agreement == pytest.approx(0.5 / 31)


def test_a_try_drafts_only_when_the_drafts_agreement_with_the_plain_tokens_would_pay():
    from sage_engine.core.policy_io import Probe
    pol = priced(fallback_steps=2, fallback_window=4)
    q = probe_meter().quote(pol.key)
    drafted(pol, q, 1, 4.0)
    drafted(pol, q, 1, 4.0)  # losing: 2 tokens in 8 ms
    assert [pol.skip_draft(q) for _ in range(2)] == [True, True]
    assert pol.skip_draft(q) is False  # the try: the draft reads the two plain tokens it missed
    turned_down = pol.shape(0.9, q, Probe(2, 0))  # it guessed neither
    assert turned_down.depth == 0 and turned_down.price is None
    pol.observe(StepOutcome(DraftTree(), [], 1, 1.3))  # the read's step is not a drafted step to judge
    assert pol.fallback.drafted == [(1, 4.0), (1, 4.0)]
    assert [pol.skip_draft(q) for _ in range(3)] == [True] * 3  # this step and 3 more were plain: the wait doubled
    assert pol.skip_draft(q) is False  # the next try
    shape = pol.shape(0.9, q, Probe(4, 4))  # the draft agrees again
    assert shape.depth > 0  # so it drafts: the try
    pol.observe(StepOutcome(DraftTree(), [], 9, 3.0))
    assert pol.skip_draft(q) is False  # it drafts on: the try has drafted one step of the window it is judged on
    # no pairs (the draft had missed nothing plain steps made) or no measured costs: the try drafts, as before
    for probe, quote in [(Probe(), q), (Probe(3, 0), plain_meter(1.0).quote(pol.key))]:
        other = priced()
        other.fallback.state = PROBING  # a try after plain steps
        assert other.shape(0.9, quote, probe).depth > 0


@pytest.mark.parametrize("tokens,falls_back", [(1, True), (3, False)])
def test_a_try_the_probe_lets_through_is_judged_on_a_window_of_its_own_steps(tokens, falls_back):
    """After the probe's yes, the try drafts fallback_window (4) steps before the window judges it: two one-token
    steps do not send it back to plain steps; four of them do (4 tokens in 16 ms against plain steps' 1 per ms),
    four of 3 tokens at 2.5 ms (1.2 per ms) draft on."""
    from sage_engine.core.policy_io import Probe
    pol = priced(fallback_steps=2, fallback_window=4)
    q = probe_meter().quote(pol.key)
    drafted(pol, q, 1, 4.0)
    drafted(pol, q, 1, 4.0)  # losing: 2 tokens in 8 ms
    assert [pol.skip_draft(q) for _ in range(2)] == [True, True]
    assert pol.skip_draft(q) is False  # the try
    assert pol.shape(0.9, q, Probe(6, 4)).depth > 0  # the probe lets it through
    wall = 4.0 if tokens == 1 else 2.5
    pol.observe(StepOutcome(DraftTree(), [], tokens, wall))
    for _ in range(3):  # the rest of its window: drafted whatever the first steps made
        drafted(pol, q, tokens, wall)
    assert pol.fallback.drafted[-4:] == [(tokens, wall)] * 4
    assert pol.skip_draft(q) is falls_back  # then judged on those four steps alone
    if falls_back:
        assert pol.fallback.wait == 8  # a losing try doubled the wait (4 -> 8)


def test_plain_rate_is_measured_or_estimated_from_the_verify_intercept():
    from sage_engine.core.costs import CostMeter, StepTiming
    assert plain_meter(0.5).plain_rate() == pytest.approx(0.5)
    spiky = plain_meter(0.5, n=6)
    spiky.record(StepTiming("ar", 1, 0, 400.0, 399.0, 0.0, 0))  # another process took the core once
    assert spiky.plain_rate() == pytest.approx(0.5)  # steps over 3x the median step's time are left out
    meter = CostMeter()
    assert meter.plain_rate() is None
    for nodes in (4, 8, 16, 4):  # drafted steps whose verification costs 2 ms + 0.1 ms per node
        meter.record(StepTiming("sage", 3, nodes, 9.0, 2.0 + 0.1 * nodes, 3.0, 4))
    assert meter.plain_rate() == pytest.approx(1 / 2.0)  # one token per a tree of no node's verification


def test_trust_is_accepted_per_forecast_token_and_scales_the_prices():
    from sage_engine.core.costs import StepTiming
    meter = primed_meter(key="sage")
    assert meter.trust("sage") == 1.0  # no forecast recorded: trusted as is
    for accepted, forecast in [(1, 4.0), (2, 4.0), (1, 4.0)]:
        meter.record(StepTiming("sage", accepted + 1, 25, 20.0, 5.5, 10.0, 10, forecast))
    assert meter.trust("sage") == pytest.approx(4 / 12)
    price = meter.break_even("sage")
    assert price.trust == pytest.approx(1 / 3) and price.node == pytest.approx(3 * price.rate * price.node_ms)


def test_a_stall_over_the_last_run_does_not_make_the_next_run_start_plain():
    from sage_engine.core.costs import STALL_RUN, StepTiming
    meter = plain_meter(1.0)
    key = priced().key
    sizes = [(8, 6), (4, 3), (10, 8), (6, 5)]

    def run(n, tokens=6, slower=1.0):  # n drafted steps of the sizes above, each `slower` x its usual 1.5-3.7 ms
        for nodes, forwards in (sizes * n)[:n]:
            wall = slower * (1.0 + 0.15 * (nodes + forwards))
            meter.record(StepTiming(key, tokens, nodes, wall, slower, 0.1 * slower * forwards, forwards, 5.0))

    run(40)  # earlier runs
    run(8, slower=4.0)  # the last run: the same steps, all 4x as long: as measured they would lose to plain steps
    assert meter.stalls == 8 and len(meter.steps) == 5 + 48 and meter.drafted_rate(key) > 1.0  # 5 plain steps first
    assert priced().skip_draft(meter.quote(key)) is False  # the next run drafts from its first step
    before = meter.prices_ms()
    run(4, slower=4.0)
    assert meter.prices_ms() == pytest.approx(before)  # nor are the prices the policy shapes trees with moved
    meter.record(StepTiming("ar", 1, 0, 5.0, 4.5, 0.0, 0))  # a plain step 5x the plain steps' time: left out too
    assert meter.stalls == 13 and meter.plain_rate() == pytest.approx(1.0)
    run(STALL_RUN)
    run(STALL_RUN + 8, slower=4.0)  # a longer slowdown is the machine's speed now: taken in after STALL_RUN steps
    assert meter.drafted_rate(key) < 1.0 and priced().skip_draft(meter.quote(key)) is True
    run(8, tokens=1)  # and a draft that really loses (1 token a step at the usual speed) starts the next run plain
    assert meter.drafted_rate(key) < 1.0 and priced().skip_draft(meter.quote(key)) is True


def test_a_step_the_meter_found_stalled_does_not_judge_the_draft():
    pol = priced(fallback_steps=2, fallback_window=4)
    q = plain_meter(1.0).quote(pol.key)  # plain steps make 1 token per ms
    for _ in range(4):  # 0.05 tokens per ms, each slowed by something else (the engine passes the meter's verdict)
        assert pol.skip_draft(q) is False
        pol.observe(StepOutcome(DraftTree(), [], 2, 40.0, stalled=True))
    assert pol.fallback.drafted == [] and pol.skip_draft(q) is False
    pol.observe(StepOutcome(DraftTree(), [], 2, 40.0))
    drafted(pol, q, 2, 40.0)  # the same steps, not stalled: the draft loses
    assert pol.skip_draft(q) is True


def test_a_window_keeps_the_sums_its_last_steps_give():
    """A policy's window keeps its steps' tokens, wall time and (steps with a forecast) forecast summed as steps
    come and go, equal to the sums over the steps it holds, also where its sums are made again (every maxlen)."""
    from sage_engine.core.cost_windows import Window
    from sage_engine.core.costs import StepTiming
    rng = np.random.default_rng(1)
    window = Window(5)
    for i in range(23):
        forecast = 0.0 if i % 3 == 0 else float(rng.uniform(0.5, 6))
        window.append(StepTiming("sage", int(rng.integers(1, 9)), 4, float(rng.uniform(2, 9)), 1.0, 0.5, 2, forecast))
        held = list(window)
        assert len(held) == min(i + 1, 5)
        assert window.tokens == sum(s.tokens for s in held)
        assert window.wall == pytest.approx(sum(s.wall_ms for s in held), rel=1e-12)
        seen = [s for s in held if s.forecast > 0]
        assert window.forecast_steps == len(seen) and window.forecast_tokens == sum(s.tokens for s in seen)
        assert window.forecast == pytest.approx(sum(s.forecast for s in seen), rel=1e-12)


def test_node_and_level_prices_are_the_machines_learnt_from_every_policys_steps():
    """The documented choice (costs.py): what the machine charges is fitted over every policy's drafted steps, what a
    policy earns is its own. A chain's steps alone price a node and a draft level for a SAGE run that has drafted
    three steps of its own."""
    from sage_engine.core.costs import CostMeter, StepTiming

    meter = CostMeter()
    for i in range(40):  # 4 ms + 0.2 ms a node + 1 ms a draft forward; a chain of k drafts k nodes in k forwards
        k = 1 + i % 6
        meter.record(StepTiming("chain", 2, k, 4.0 + 1.2 * k, 3.0 + 0.2 * k, 1.0 * k, k))
    for _ in range(3):  # SAGE's own rate: 6 tokens in 12 ms
        meter.record(StepTiming("sage", 6, 10, 12.0, 5.0, 6.0, 5))
    price = meter.quote("sage").break_even()
    assert price.rate == pytest.approx(0.5)  # SAGE's own steps
    assert price.node_ms == pytest.approx(0.2, abs=0.05) and price.level_ms == pytest.approx(1.0, abs=0.1)
