"""Plotly figures of a run, built from StepEvents only: confidence and tree shape per step,
tokens accepted per step, the alpha -> (depth, width) mapping, and where the time went.
"""

from __future__ import annotations

from dataclasses import replace

from sage_engine import SageConfig

from .record import Lane, RunRecord
from .theme import AMBER, BLUE, GREEN, ORANGE, PALE, SLATE, VIOLET, figure, lane_title, layout

WAITING = "waiting for the speculative run…"


def placeholder(title: str, message: str, height: int = 340):
    note = dict(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                font=dict(size=14, color="#64748b"))
    return figure([], layout(title, height, annotations=[note], xaxis=dict(visible=False),
                             yaxis=dict(visible=False)))


def _right_axis(title: str) -> dict:
    return dict(title=dict(text=title), overlaying="y", side="right", rangemode="tozero", showgrid=False,
                automargin=True, tickmode="auto", nticks=6, tickformat="d")


def alpha_figure(lane: Lane):
    """alpha (planned and measured) per step on the left axis; chosen depth D and width W on the right."""
    title = "Draft confidence α per step, and the tree shape it chose"
    steps = lane.decode_steps
    if not steps:
        return placeholder(title, WAITING)
    x = [s.step for s in steps]
    data = [
        dict(type="bar", x=x, y=[s.depth for s in steps], name="depth D", marker=dict(color=GREEN), opacity=0.35,
             yaxis="y2"),
        dict(type="bar", x=x, y=[s.width for s in steps], name="width W", marker=dict(color=BLUE), opacity=0.35,
             yaxis="y2"),
    ]
    if any(s.d_max is not None for s in steps):
        data.append(dict(type="scatter", x=x, y=[s.d_max for s in steps], name="D_max (history)", yaxis="y2",
                         mode="lines", line=dict(color=GREEN, dash="dash", shape="hv")))
    data += [
        dict(type="scatter", x=x, y=[s.alpha for s in steps], name="α used for the tree", mode="lines+markers",
             line=dict(color=VIOLET, width=2), marker=dict(size=5)),
        dict(type="scatter", x=x, y=[s.root_alpha for s in steps], name="α of this step's root", mode="lines",
             line=dict(color=PALE, width=1, dash="dot")),
    ]
    if any(s.node_price is not None for s in steps):  # threshold "cost": what a node had to be worth this step
        data.append(dict(type="scatter", x=x, y=[s.node_price for s in steps], name="node price (least cum. p)",
                         mode="lines", line=dict(color=ORANGE, width=1.5, dash="dash", shape="hv"),
                         customdata=[s.level_price for s in steps],
                         hovertemplate="node price %{y:.3f}<br>level price %{customdata:.2f} tokens<extra></extra>"))
    return figure(data, layout(title, barmode="group", bargap=0.15,
                               xaxis=dict(title=dict(text="step (one target forward each)")),
                               yaxis=dict(title=dict(text="confidence α = 1 − H/log k"), range=[0, 1.02]),
                               yaxis2=_right_axis("nodes")))


def accepted_figure(lane: Lane):
    """Tokens each step added: accepted draft tokens (green) + the target's bonus token (blue)."""
    title = "Tokens per target forward: accepted draft tokens + 1 bonus"
    steps = lane.decode_steps
    if not steps:
        return placeholder(title, WAITING)
    x = [s.step for s in steps]
    n_acc = [min(len(s.accepted_tokens), len(s.new_token_ids)) for s in steps]
    tau = sum(len(s.new_token_ids) for s in steps) / len(steps)
    data = [
        dict(type="bar", x=x, y=n_acc, name="draft, accepted", marker=dict(color=GREEN)),
        dict(type="bar", x=x, y=[len(s.new_token_ids) - a for s, a in zip(steps, n_acc)], name="target, bonus",
             marker=dict(color=BLUE)),
        dict(type="scatter", x=x, y=[len(s.tree.tokens) if s.tree else 0 for s in steps], name="nodes verified",
             mode="markers", marker=dict(color=SLATE, symbol="line-ew-open", size=12, line=dict(width=2)),
             yaxis="y2"),
    ]
    tau_line = dict(type="line", xref="paper", x0=0, x1=1, y0=tau, y1=tau, line=dict(color=VIOLET, dash="dash"))
    tau_note = dict(text=f"τ = {tau:.2f} tokens per forward", xref="paper", x=0.99, xanchor="right", y=tau,
                    yanchor="bottom", showarrow=False, font=dict(color=VIOLET), bgcolor="rgba(255,255,255,0.85)")
    return figure(data, layout(title, barmode="stack", bargap=0.2, shapes=[tau_line], annotations=[tau_note],
                               xaxis=dict(title=dict(text="step")),
                               yaxis=dict(title=dict(text="tokens added"), rangemode="tozero"),
                               yaxis2=_right_axis("nodes verified")))


def mapping_figure(lane: Lane, cfg: SageConfig):
    """SAGE's D(α) and W(α) (Eq. 10-11, rounded by the engine's own policy) with this run's points."""
    from sage_engine.policies import SagePolicy  # here, not at the top: the policies import torch, after the page

    steps = [s for s in lane.decode_steps if s.alpha is not None]
    alphas = [i / 100 for i in range(101)]
    d_maxes = sorted({s.d_max for s in steps if s.d_max is not None} or {cfg.d_max})
    moved = [dm for dm in d_maxes if dm != cfg.d_max]
    data = []
    for dm in [cfg.d_max] + moved:  # one legend entry for the curves the history controller moved to
        pol = SagePolicy(replace(cfg, d_max=dm))
        first_moved = bool(moved) and dm == moved[0]
        span = f"{min(moved)}…{max(moved)}" if len(moved) > 1 else f"{dm}"
        name = f"D(α), D_max={dm}" if dm == cfg.d_max else f"D(α), D_max moved to {span} (history)"
        data.append(dict(type="scatter", x=alphas, y=[pol.depth_for(a) for a in alphas], mode="lines",
                         name=name, hoverinfo="skip", legendgroup="moved" if dm != cfg.d_max else "d",
                         showlegend=dm == cfg.d_max or first_moved,
                         line=dict(color=GREEN, shape="hv", width=2 if dm == cfg.d_max else 1,
                                   dash="solid" if dm == cfg.d_max else "dot")))
    pol = SagePolicy(cfg)
    data.append(dict(type="scatter", x=alphas, y=[pol.width_for(a) for a in alphas], mode="lines", name="W(α)",
                     hoverinfo="skip", line=dict(color=BLUE, shape="hv", width=2)))
    if steps:
        xs, hover = [s.alpha for s in steps], [f"step {s.step}" for s in steps]
        for name, ys, color, symbol in (("this run: D", [s.depth for s in steps], GREEN, "circle"),
                                        ("this run: W", [s.width for s in steps], BLUE, "diamond")):
            data.append(dict(type="scatter", x=xs, y=ys, text=hover, mode="markers", name=name,
                             marker=dict(color=color, size=9, opacity=0.6, symbol=symbol,
                                         line=dict(color="white", width=1))))
    fixed = steps and lane.policy != "sage"
    title = "SAGE's tree shape as a function of α"
    if fixed:
        title += f" (this run, {lane.policy}, has a fixed shape)"
    return figure(data, layout(title, hovermode="closest",
                               xaxis=dict(title=dict(text="confidence α"), range=[-0.02, 1.02]),
                               yaxis=dict(title=dict(text="depth D / root width W"), rangemode="tozero")))


def _time_parts(x: Lane) -> tuple[float, dict[str, float]]:
    dec = x.decode_steps
    pre = (sum(s.target_ms + s.draft_ms + s.other_ms for s in x.steps if s.kind == "prefill")
           + sum(s.draft_prefill_ms for s in dec)) / 1e3  # the draft reads the prompt with its first drafted step
    dr, ver, oth = (sum(getattr(s, f) for s in dec) / 1e3 for f in ("draft_ms", "target_ms", "other_ms"))
    wall = x.seconds if x.seconds is not None else (x.arrivals[-1] if x.arrivals else 0.0)
    rest = max(0.0, wall - pre - dr - ver - oth)
    return wall, {"prefill": pre, "draft": dr, "verify": ver, "overhead": oth, "other": rest}


def time_figure(record: RunRecord):
    """Where each lane's wall time went: prefill (both models read the prompt), draft forwards, target verify
    forwards, overhead (policy, tree, acceptance, cache compaction) and other (time between steps)."""
    title = "Where the time went (seconds; the lanes ran one after the other)"
    lanes = [x for x in (record.ar, record.spec) if x.steps]
    if not lanes:
        return placeholder(title, "run something first", 260)
    names = [lane_title(x.name, x.policy) for x in lanes]
    split = [_time_parts(x) for x in lanes]
    colors = {"prefill": PALE, "draft": GREEN, "verify": BLUE, "overhead": ORANGE, "other": "#e2e8f0"}
    data = [dict(type="bar", y=names, x=[parts[k] for _, parts in split], name=k, orientation="h",
                 marker=dict(color=c), hovertemplate=f"{k}: %{{x:.3f}} s<extra></extra>") for k, c in colors.items()]
    notes = [dict(y=name, x=wall, text=f" {wall:.2f} s", showarrow=False, xanchor="left",
                  font=dict(color=AMBER if x.name == "ar" else VIOLET))
             for name, x, (wall, _) in zip(names, lanes, split)]
    return figure(data, layout(title, 260, barmode="stack", hovermode="closest", annotations=notes,
                               legend=dict(traceorder="normal"),
                               margin=dict(l=10, r=60, t=96, b=40),
                               xaxis=dict(title=dict(text="seconds"), rangemode="tozero"),
                               yaxis=dict(autorange="reversed")))
