"""Colours and labels shared by the text colouring, the plots and the legend (one palette, one meaning each)."""

from __future__ import annotations

from types import MappingProxyType

from .record import ACCEPTED, BONUS, FIRST

GREEN = "#16a34a"  # the draft model: accepted draft tokens, draft time
BLUE = "#2563eb"  # the target model: bonus tokens, verify time
GREY = "#cbd5e1"  # drafted but rejected
SLATE = "#334155"  # the root of a tree (the newest accepted token)
ORANGE = "#f97316"  # overhead: policy, tree masks, acceptance, cache compaction
AMBER = "#d97706"  # the autoregressive lane
VIOLET = "#7c3aed"  # the speculative lane
PALE = "#94a3b8"  # prefill, secondary lines

TOKEN_COLORS = MappingProxyType({ACCEPTED: GREEN, BONUS: BLUE, FIRST: PALE})

def lane_title(lane: str, policy: str) -> str:
    if lane == "ar":
        return "Autoregressive (target only)"
    return f"Speculative ({policy.upper() if policy == 'sage' else policy})"


def token_label(text: str, limit: int = 10) -> str:
    """A token's text made visible on a plot: spaces, newlines and control bytes shown as symbols."""
    out = text.replace("\n", "⏎").replace("\t", "⇥")
    out = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in out)
    if out.startswith(" "):
        out = "␣" + out[1:]
    if not out:
        out = "∅"
    return out if len(out) <= limit else out[: limit - 1] + "…"


TOP_PX = 96  # the plots' top margin: the title and the legend above the plot area


def layout(title: str, height: int = 340, **extra) -> dict:
    """The common Plotly layout (a small white theme; plotly's named templates weigh ~8 KB per figure)."""
    axis = dict(gridcolor="#e5e7eb", zerolinecolor="#cbd5e1", linecolor="#cbd5e1", automargin=True)
    base = dict(
        title=dict(text=title, x=0.01, xanchor="left", y=1.0, yref="container", yanchor="top", pad=dict(t=10),
                   font=dict(size=14)), height=height,
        paper_bgcolor="white", plot_bgcolor="white", font=dict(family="Inter, system-ui, sans-serif", size=12,
                                                               color="#0f172a"),
        margin=dict(l=10, r=10, t=TOP_PX, b=40), hovermode="x unified",
        hoverlabel=dict(namelength=-1),  # a series' whole name in a hover, never "D_max (histo…"
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0, font=dict(size=11)),
        xaxis=dict(axis), yaxis=dict(axis),
        template=dict(layout=dict()),  # no named template: this layout is the whole theme
    )
    for key, value in extra.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


def figure(data: list[dict], layout_: dict):
    """A Plotly figure from plain trace and layout dicts, without plotly.py's per-property validation
    (paid on every streamed redraw, and costlier than building the figure); the tests validate the served figures."""
    import plotly.graph_objects as go

    return go.Figure(dict(data=data, layout=layout_), _validate=False)
