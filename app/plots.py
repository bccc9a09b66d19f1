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


ALPHA_AXIS = "α: how sure the draft was (1 − H/log k; 1 = sure)"
SHAPE_AXIS = "tree depth D / root width W (tokens)"


def alpha_figure(lane: Lane, expert: bool = False):
    """How sure the draft was at each step (alpha, left axis) and the tree SAGE planned from it (depth D and root
    width W, bars on the right axis): three series. `expert` adds the root's own alpha, D_max as the history moved it
    and, under the cost threshold, the node price (today's detail)."""
    title = "How sure the draft was (α), and the tree it planned: deep when sure, wide when not"
    steps = lane.decode_steps
    if not steps:
        return placeholder(title, WAITING)
    x = [s.step for s in steps]
    plain = [s.step for s in steps if s.depth == 0]
    data = [
        dict(type="bar", x=x, y=[s.depth for s in steps], name="depth D (tokens ahead)", marker=dict(color=GREEN),
             opacity=0.35, yaxis="y2", hovertemplate="D = %{y}<extra></extra>"),
        dict(type="bar", x=x, y=[s.width for s in steps], name="width W (root branches)", marker=dict(color=BLUE),
             opacity=0.35, yaxis="y2", hovertemplate="W = %{y}<extra></extra>"),
    ]
    if expert and any(s.d_max is not None for s in steps):
        data.append(dict(type="scatter", x=x, y=[s.d_max for s in steps], name="D_max (deepest allowed; history)",
                         yaxis="y2", mode="lines", line=dict(color=GREEN, dash="dash", shape="hv"),
                         hovertemplate="D_max = %{y}<extra></extra>"))
    data.append(dict(type="scatter", x=x, y=[s.alpha for s in steps], name="α (draft confidence)",
                     mode="lines+markers", line=dict(color=VIOLET, width=2), marker=dict(size=5),
                     hovertemplate="α = %{y:.2f}<extra></extra>"))
    if expert:
        data.append(dict(type="scatter", x=x, y=[s.root_alpha for s in steps], name="α of this step's root",
                         mode="lines", line=dict(color=PALE, width=1, dash="dot"),
                         hovertemplate="root α = %{y:.2f}<extra></extra>"))
    if expert and any(s.node_price is not None for s in steps):  # threshold "cost": what a node had to be worth
        data.append(dict(type="scatter", x=x, y=[s.node_price for s in steps],
                         name="node price (least path p a node needed)", mode="lines",
                         line=dict(color=ORANGE, width=1.5, dash="dash", shape="hv"),
                         customdata=[s.level_price for s in steps],
                         hovertemplate="node price %{y:.2f}; level price %{customdata:.2f} tokens<extra></extra>"))
    notes = []
    if plain:
        notes.append(dict(text=f"{len(plain)} plain steps (D = 0: no draft, the target alone)", showarrow=False,
                          xref="paper", x=0.99, xanchor="right", yref="paper", y=0.02, yanchor="bottom",
                          font=dict(size=11, color="#475569"), bgcolor="rgba(255,255,255,0.85)"))
    return figure(data, layout(title, barmode="group", bargap=0.15, annotations=notes,
                               xaxis=dict(title=dict(text="step (one target forward each)")),
                               yaxis=dict(title=dict(text=ALPHA_AXIS), range=[0, 1.02], tickformat=".1f"),
                               yaxis2=_right_axis(SHAPE_AXIS)))


def accepted_figure(lane: Lane, expert: bool = False):
    """Tokens each step added: accepted draft tokens (green) + the target's bonus token (blue); the nodes the target
    checked on the right axis; tau as a line."""
    title = "What each target forward wrote: draft tokens it accepted + 1 token of its own (bonus)"
    steps = lane.decode_steps
    if not steps:
        return placeholder(title, WAITING)
    x = [s.step for s in steps]
    n_acc = [min(len(s.accepted_tokens), len(s.new_token_ids)) for s in steps]
    tau = sum(len(s.new_token_ids) for s in steps) / len(steps)
    data = [
        dict(type="bar", x=x, y=n_acc, name="draft tokens accepted", marker=dict(color=GREEN),
             hovertemplate="accepted %{y}<extra></extra>"),
        dict(type="bar", x=x, y=[len(s.new_token_ids) - a for s, a in zip(steps, n_acc)],
             name="bonus (the target's own token)", marker=dict(color=BLUE), hovertemplate="bonus %{y}<extra></extra>"),
        dict(type="scatter", x=x, y=[len(s.tree.tokens) if s.tree else 0 for s in steps],
             name="tree nodes the target checked", mode="markers",
             marker=dict(color=SLATE, symbol="line-ew-open", size=12, line=dict(width=2)), yaxis="y2",
             hovertemplate="checked %{y} nodes<extra></extra>"),
    ]
    tau_line = dict(type="line", xref="paper", x0=0, x1=1, y0=tau, y1=tau, line=dict(color=VIOLET, dash="dash"))
    tau_note = dict(text=f"τ = {tau:.2f}: mean tokens per target forward", xref="paper", x=0.99, xanchor="right", y=tau,
                    yanchor="bottom", showarrow=False, font=dict(color=VIOLET), bgcolor="rgba(255,255,255,0.85)")
    return figure(data, layout(title, barmode="stack", bargap=0.2, shapes=[tau_line], annotations=[tau_note],
                               xaxis=dict(title=dict(text="step")),
                               yaxis=dict(title=dict(text="tokens written"), rangemode="tozero"),
                               yaxis2=_right_axis("tree nodes checked")))


def mapping_figure(lane: Lane, cfg: SageConfig, expert: bool = False):
    """SAGE's D(α) and W(α) (Eq. 10-11, rounded by the engine's own policy) with this run's steps: D(α), W(α) and the
    steps' depths (three series); `expert` adds the curves D_max moved to, and the steps' widths."""
    from sage_engine.policies import SagePolicy  # here, not at the top: the policies import torch, after the page

    steps = [s for s in lane.decode_steps if s.alpha is not None]
    alphas = [i / 100 for i in range(101)]
    d_maxes = sorted({s.d_max for s in steps if s.d_max is not None} or {cfg.d_max})
    moved = [dm for dm in d_maxes if dm != cfg.d_max] if expert else []
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
        points = (("this run's steps: D", [s.depth for s in steps], GREEN, "circle", "D"),
                  ("this run's steps: W", [s.width for s in steps], BLUE, "diamond", "W"))
        for name, ys, color, symbol, short in points[:2 if expert else 1]:
            data.append(dict(type="scatter", x=xs, y=ys, text=hover, mode="markers", name=name,
                             hovertemplate=f"%{{text}}: α = %{{x:.2f}}, {short} = %{{y}}<extra></extra>",
                             marker=dict(color=color, size=9, opacity=0.6, symbol=symbol,
                                         line=dict(color="white", width=1))))
    fixed = steps and lane.policy != "sage"
    title = "SAGE's rule: the surer the draft (α), the deeper and narrower the tree"
    if fixed:
        title += f" (this run, {lane.policy}, has a fixed shape)"
    return figure(data, layout(title, hovermode="closest",
                               xaxis=dict(title=dict(text="α: draft confidence (0 unsure, 1 sure)"),
                                          range=[-0.02, 1.02]),
                               yaxis=dict(title=dict(text=SHAPE_AXIS), rangemode="tozero")))


def _time_parts(x: Lane, expert: bool = False) -> tuple[float, dict[str, float]]:
    """A lane's wall time and its parts. Simple: the target model (reading the prompt and its forwards), the draft
    model (the same), everything else. `expert`: prefill, draft, target forwards, overhead, other (between steps)."""
    dec = x.decode_steps
    pre_target = sum(s.target_ms for s in x.steps if s.kind == "prefill") / 1e3
    pre_other = sum(s.draft_ms + s.other_ms for s in x.steps if s.kind == "prefill") / 1e3
    pre_draft = sum(s.draft_prefill_ms for s in dec) / 1e3  # the draft reads the prompt with its first drafted step
    dr, ver, oth = (sum(getattr(s, f) for s in dec) / 1e3 for f in ("draft_ms", "target_ms", "other_ms"))
    wall = x.seconds if x.seconds is not None else (x.arrivals[-1] if x.arrivals else 0.0)
    rest = max(0.0, wall - pre_target - pre_other - pre_draft - dr - ver - oth)
    if expert:
        forwards = "verify" if x.name == "spec" else "target forwards"
        return wall, {"prefill": pre_target + pre_other + pre_draft, "draft": dr, forwards: ver, "overhead": oth,
                      "other": rest}
    return wall, {"target model": pre_target + ver, "draft model": pre_draft + dr,
                  "everything else": pre_other + oth + rest}


TIME_COLORS = {"prefill": PALE, "draft": GREEN, "verify": BLUE, "target forwards": BLUE, "overhead": ORANGE,
               "other": "#e2e8f0", "target model": BLUE, "draft model": GREEN, "everything else": "#cbd5e1"}


def time_figure(record: RunRecord, expert: bool = False):
    """Where each lane's time went: the target model, the draft model, everything else (policy, tree, acceptance,
    cache compaction, between steps); `expert`: prefill, draft, verify, overhead and other apart."""
    title = "Where each lane's time went (seconds)"
    lanes = [x for x in (record.ar, record.spec) if x.steps]
    if not lanes:
        return placeholder(title, "run something first", 260)
    names = [lane_title(x.name, x.policy) for x in lanes]
    split = [_time_parts(x, expert) for x in lanes]
    keys = list(dict.fromkeys(k for _, parts in split for k in parts))
    data = [dict(type="bar", y=names, x=[parts.get(k, 0.0) for _, parts in split], name=k, orientation="h",
                 marker=dict(color=TIME_COLORS[k]), hovertemplate=f"{k}: %{{x:.2f}} s<extra></extra>") for k in keys]
    notes = [dict(y=name, x=wall, text=f" {wall:.2f} s", showarrow=False, xanchor="left",
                  font=dict(color=AMBER if x.name == "ar" else VIOLET))
             for name, x, (wall, _) in zip(names, lanes, split)]
    return figure(data, layout(title, 260, barmode="stack", hovermode="closest", annotations=notes,
                               legend=dict(traceorder="normal"),
                               margin=dict(l=10, r=60, t=96, b=40),
                               xaxis=dict(title=dict(text="seconds"), rangemode="tozero"),
                               yaxis=dict(autorange="reversed")))
