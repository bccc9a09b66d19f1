"""What a run shows, no server: the view's fields in the API's output order, the divergence and speedup of a
record, the tree's layout, and the alpha and mapping figures."""

from __future__ import annotations

from dataclasses import fields

import plotly.graph_objects as go
import pytest
from app_server import OUT

pytestmark = pytest.mark.timeout(300)


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


def test_a_stopped_run_is_not_raced_even_where_both_lanes_ended():
    """Stop can land while the second lane is ending: both lanes then have their times, cut at different points, and
    the replay stays closed."""
    from app.record import Lane, RunRecord
    from app.replay import replay_html

    rec = RunRecord("p", "q", 8, "sage", {}, {}, ar=Lane("ar", "ar", token_ids=[1, 2, 3], seconds=1.0),
                    spec=Lane("spec", "sage", token_ids=[1], seconds=0.2))
    assert "each at its measured speed" in replay_html(rec)
    rec.stopped = True
    assert "available after a run" in replay_html(rec) and " disabled" in replay_html(rec)


def test_tree_layout_centres_parents():
    from app.tree_plot import BONUS_NODE, _layout

    #   root -> 0 -> {2, 3};  root -> 1;  bonus after node 0
    y = _layout([-1, -1, 0, 0], extra_parent=0)
    leaves = [BONUS_NODE, 2, 3, 1]
    assert len({y[n] for n in leaves}) == 4  # every leaf its own row
    assert y[0] == pytest.approx((y[BONUS_NODE] + y[3]) / 2) and y[BONUS_NODE] > y[2] > y[3] > y[1]


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
    names = [t.name for t in go.Figure(alpha_figure(Lane("spec", "sage", steps=plain), expert=True).to_dict()).data]
    fig = go.Figure(alpha_figure(Lane("spec", "sage", steps=priced), expert=True).to_dict())  # validated
    price, = [t for t in fig.data if t.name not in names]
    assert list(price.y) == [0.02, 0.04, 0.06] and list(price.customdata) == [0.5] * 3


@pytest.mark.parametrize("d_maxes", [(8, 8, 8), (8, 9, 10), (8, 7, 6)])
def test_mapping_figure_whether_or_not_d_max_moved(d_maxes):
    from app.plots import mapping_figure
    from app.record import Lane
    from sage_engine import SageConfig

    lane = Lane("spec", "sage", steps=[_event(i + 1, 0.5, 5, 6, dm) for i, dm in enumerate(d_maxes)])
    fig = go.Figure(mapping_figure(lane, SageConfig(d_max=d_maxes[0]), expert=True).to_dict())  # the run started there
    curves = [t for t in fig.data if t.name and t.name.startswith("D(α)")]
    assert len(curves) == len(set(d_maxes)) and sum(bool(t.showlegend is not False) for t in curves) <= 2


def test_point_3_each_chart_has_at_most_three_series_per_axis_and_readable_hovers_unless_expert():
    """Issue 81: the run's charts tell one story each (at most three series on an axis, hovers with at most two
    decimals and whole names); the expert view keeps today's detail (more series)."""
    import re
    from dataclasses import replace

    from app.plots import accepted_figure, alpha_figure, mapping_figure, time_figure
    from app.record import Lane, RunRecord
    from sage_engine import SageConfig

    steps = [replace(_event(i + 1, 0.3 + 0.2 * i, 5 + i, 6 - i, 8 + i), node_price=0.01, level_price=0.5)
             for i in range(3)]
    lane = Lane("spec", "sage", steps=steps, seconds=1.0, arrivals=[0.1, 0.2, 0.3])
    record = RunRecord("p", "q", 8, "sage", {}, {}, ar=Lane("ar", "ar", steps=steps, seconds=2.0), spec=lane)

    def figures(expert):
        return [go.Figure(f.to_dict()) for f in (alpha_figure(lane, expert), accepted_figure(lane, expert),
                                                 mapping_figure(lane, SageConfig(), expert),
                                                 time_figure(record, expert))]

    for fig in figures(False):
        per_axis = {}
        for t in fig.data:
            per_axis[getattr(t, "yaxis", None) or "y"] = per_axis.get(getattr(t, "yaxis", None) or "y", 0) + 1
        assert max(per_axis.values()) <= 3, (fig.layout.title.text, per_axis)
        for t in fig.data:
            assert not re.search(r":\.[3-9]f", t.hovertemplate or ""), (fig.layout.title.text, t.hovertemplate)
        assert fig.layout.hoverlabel.namelength == -1  # whole names in hovers
    assert sum(len(f.data) for f in figures(True)) > sum(len(f.data) for f in figures(False))
