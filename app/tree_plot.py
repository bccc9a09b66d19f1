"""The draft tree of one speculative step as a Plotly figure.

Layout: depth on x (the root, i.e. the newest accepted token, at 0), siblings stacked on y
in draft-rank order. Labels never overlap: every leaf gets its own row, tall enough for a line of text, and a
label is cut (ending in "…") to the room its depth column has in a plot `width_px` wide: beside each node, or, in a
tree too deep for that, staggered above and below; too deep even for that, the title says the tokens are on hover
(`label_plan`).
Colours: accepted path (green), rejected (grey), the target's bonus
token (blue), the root (slate). Hover shows the draft probability and depth of a node and, when
sampling, how the target tested it (p, q, the uniform u, accept or reject). Under the tree, the
step told in words: the acceptance rule with this step's own numbers.
"""

from __future__ import annotations

import textwrap

from sage_engine import StepEvent

from .theme import BLUE, GREEN, GREY, SLATE, TOP_PX, figure, layout, token_label

BONUS_NODE = -2  # the bonus token is drawn as an extra child of the last accepted node


def _layout(parents: list[int], extra_parent: int | None) -> dict[int, float]:
    """y of every node (-1 = root, BONUS_NODE = bonus): leaves in DFS order, parents centred."""
    children: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    if extra_parent is not None:
        children.setdefault(extra_parent, []).insert(0, BONUS_NODE)
    y: dict[int, float] = {}
    next_leaf = 0.0
    stack: list[tuple[int, bool]] = [(-1, False)]
    while stack:  # iterative post-order DFS (trees can be 16 levels deep)
        node, seen = stack.pop()
        kids = children.get(node, [])
        if not kids:
            y[node], next_leaf = next_leaf, next_leaf + 1.0
        elif seen:
            y[node] = (y[kids[0]] + y[kids[-1]]) / 2.0
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(kids))
    return {n: -v for n, v in y.items()}  # first rank on top


def _hover(text: str, tok: int, depth: int, prob: float | None, cum: float | None, status: str) -> str:
    p = "" if prob is None else f"<br>draft p = {prob:.3f}, path p = {cum:.3f}"
    return f"<b>{token_label(text, 24)}</b> (id {tok})<br>depth {depth}{p}<br>{status}"


def _test(tv, i: int) -> str:
    """How the target tested node i under sampling (empty when greedy or untested)."""
    p = tv.target_p[i] if i < len(tv.target_p) else None
    if p is None:
        return ""
    q, u = _q(tv, i), tv.draw_u[i]
    if tv.rule == "ratio":
        return f"<br>target p = {p:.3f}, draft q = {q:.3f}, u = {u:.3f}: u·q = {u * q:.3f} vs p"
    return f"<br>target p = {p:.3f}, draft q = {q:.3f}; the target's draw at the parent: u = {u:.3f}"


def _q(tv, i: int) -> float:
    """The draft probability the target's test used for node i (older saved runs: the node's draft prob)."""
    q = tv.draft_q[i] if i < len(tv.draft_q) else None
    return tv.probs[i] if q is None else q


def _quote(text: str) -> str:
    return f"'{token_label(text, 12)}'"


def rule_story(ev: StepEvent, bonus_text: str) -> str:
    """The step in words: which rule accepted what, with this step's numbers (lines joined by <br>)."""
    tv, acc = ev.tree, list(ev.accepted_nodes)
    bonus = _quote(bonus_text)
    if tv.rule == "greedy":
        kept = ", ".join(_quote(tv.texts[i]) for i in acc) or "nothing"
        return (f"Greedy rule: a node is kept when it is the target's own argmax after its path. Kept: {kept}; "
                f"then the target's argmax {bonus} was not a drafted child: the bonus.")
    if tv.rule == "ratio":
        lines = ["Ratio rule (sampled draft): try each drafted child in draw order, keep it with probability "
                 "min(1, p/q), i.e. when u·q < p; a rejection leaves p ← max(0, p − q) for the next sibling."]
        tested = [i for i, p in enumerate(tv.target_p) if p is not None]
        for i in tested:
            p, q, u = tv.target_p[i], _q(tv, i), tv.draw_u[i]
            verdict = "accept" if i in acc else "reject"
            lines.append(f"{_quote(tv.texts[i])}: p {p:.3f}, q {q:.3f}, u {u:.3f}, u·q {u * q:.3f} → {verdict}")
        if tested and tested[-1] not in acc:
            lines.append(f"no child left: the target drew {bonus} from what remained of p, renormalised")
        else:
            lines.append(f"the target drew {bonus} from its own p after the last accepted token")
        return "<br>".join(lines)
    lines = ["Tree rule (sampling): at each node on the path the target draws from its own p; a draw that is a "
             "child descends, the first that is not ends the step."]
    for parent in [-1] + acc:
        kids = [i for i, par in enumerate(tv.parents) if par == parent and tv.target_p[i] is not None]
        if not kids:
            continue
        where = "root" if parent < 0 else _quote(tv.texts[parent])
        tried = ", ".join(f"{_quote(tv.texts[i])} p {tv.target_p[i]:.3f} q {tv.probs[i]:.3f}" for i in kids[:4])
        taken = next((i for i in kids if i in acc), None)
        drew = f"drew {_quote(tv.texts[taken])}, a child: descend" if taken is not None else f"drew {bonus}: emitted"
        lines.append(f"at {where} (u {tv.draw_u[kids[0]]:.3f}) {drew}; children: {tried}")
    return "<br>".join(lines)


# Label geometry: a row per leaf, ROW_PX tall (a line of LABEL_PX text fits with room to spare); a depth column is
# the plot's width over the x range, less the node's marker and a gap, at CHAR_PX per character (11-px text in a
# proportional font averages ~6 px; wide glyphs such as "W" are ~9, so 7.5 keeps a cut label inside its column).
LABEL_PX, ROW_PX, CHAR_PX, MARKER_PX = 11, 20, 7.5, 18
STAGGER_ROWS = 2.4  # staggered labels sit above and below their nodes: rows that far apart keep them clear
SIDE_PX = 40  # what the plot's side margins and axis take of its width
STORY_CHAR_PX = 6.5  # the story's 11-px text, per character on average
STORY_CHARS = 52  # the story's longest line: it fits a phone's plot (about 340 px), where the figure is scaled down
STORY_GAP_PX = 62  # from the plot area's bottom to the story: the x axis's tick labels and title sit above it
X_PAD_LEFT, X_PAD_RIGHT = 0.4, 1.2  # x range beyond the root and the deepest node (its label needs the room)
MAX_LABEL = 12  # characters of a node label at most ("␣background" whole)
RACE_WIDTH_PX = 640  # the race view's tree plot (3/5 of a 1100-px row); the compare view passes its own


def label_plan(max_depth: int, width_px: int) -> tuple[str, int]:
    """Where the node labels go in a plot `width_px` wide showing depths 0..max_depth, and how many characters
    each keeps, so that no two overlap (the plot's side margins and axis take ~40 px):
    ("side", n) right of every node, when a depth column holds n >= 3 characters beside its marker;
    ("stagger", n) centred above the nodes of even depths and below those of odd ones, so that labels on one side
    are two columns apart (deep narrow trees: sage's chains); ("hover", 0) when even that is under 3 characters."""
    column = (width_px - SIDE_PX) / (max_depth + X_PAD_LEFT + X_PAD_RIGHT)
    side = int((column - MARKER_PX) // CHAR_PX)
    if side >= 3:
        return "side", min(side, MAX_LABEL)
    stagger = int((2 * column - 8) // CHAR_PX)
    return ("stagger", min(stagger, MAX_LABEL)) if stagger >= 3 else ("hover", 0)


def tree_figure(ev: StepEvent, bonus_text: str = "", width_px: int = RACE_WIDTH_PX, compact: bool = False,
                title: str | None = None):
    """The verified tree of step `ev` (a decode step of a policy with a draft), for a plot about `width_px` wide
    (default: the race view's). `compact`: no legend, no story under the tree, a smaller title and a shorter axis
    title (the compare view's small multiples; they pass their own `title`)."""
    tv = ev.tree
    if tv is None:
        return empty_tree("no tree: this step drafted nothing")
    accepted = list(ev.accepted_nodes)
    acc, last = set(accepted), (accepted[-1] if accepted else -1)
    has_bonus = ev.bonus_token is not None
    y = _layout(tv.parents, last if has_bonus else None)
    depth = {-1: 0, **{i: d for i, d in enumerate(tv.depths)}}
    depth[BONUS_NODE] = depth[last] + 1
    deepest = max(depth.values())
    labels = label_plan(deepest, width_px)

    data = []
    for on_path in (False, True):
        xs, ys = [], []
        for i, p in enumerate(tv.parents):
            if (i in acc) == on_path:
                xs += [depth[p], depth[i], None]
                ys += [y[p], y[i], None]
        data.append(dict(type="scatter", x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                         line=dict(color=GREEN if on_path else "#94a3b8", width=3 if on_path else 1)))
    if has_bonus:
        data.append(dict(type="scatter", x=[depth[last], depth[BONUS_NODE]], y=[y[last], y[BONUS_NODE]],
                         mode="lines", hoverinfo="skip", showlegend=False, line=dict(color=BLUE, width=3, dash="dot")))
    data.append(_nodes("root (last accepted token)", SLATE, [0], [y[-1]], [tv.root_text],
                       [_hover(tv.root_text, tv.root_token, 0, None, None, "root: already in the output")], labels,
                       size=16))
    for name, color in (("accepted", GREEN), ("rejected", GREY)):
        idx = [i for i in range(len(tv.tokens)) if (i in acc) == (name == "accepted")]
        data.append(_nodes(f"draft, {name}", color, [depth[i] for i in idx], [y[i] for i in idx],
                           [tv.texts[i] for i in idx],
                           [_hover(tv.texts[i], tv.tokens[i], tv.depths[i], tv.probs[i], tv.cum_probs[i],
                                   name + _test(tv, i)) for i in idx], labels))
    if has_bonus:
        data.append(_nodes("target, bonus", BLUE, [depth[BONUS_NODE]], [y[BONUS_NODE]], [bonus_text],
                           [_hover(bonus_text, ev.bonus_token, depth[BONUS_NODE], None, None,
                                   "the target's own next token")], labels, symbol="star", size=18))
    where = labels[0]
    # two short lines: the figure is drawn for the race view's width, and a phone shows it about half as wide
    title = (title or f"Step {ev.step}: {len(tv.tokens)} drafted nodes, {len(accepted)} accepted<br>"
             f"+ 1 bonus; depth D={ev.depth}, root width W={ev.width}")
    title += "; tokens on hover" if where == "hover" else ""
    rows = round(max(y.values()) - min(y.values())) + 1  # the leaves: every node sits within a row of them
    story = "" if compact else _wrap(rule_story(ev, bonus_text), min(int((width_px - SIDE_PX) / STORY_CHAR_PX),
                                                                     STORY_CHARS))
    lines = story.count("<br>") + 1 if story else 0
    # the story under the x axis's ticks and title (about 45 px), never over them
    notes = [dict(text=story, showarrow=False, x=0, y=0, xref="paper", yref="paper", yshift=-STORY_GAP_PX,
                  align="left", xanchor="left", yanchor="top", font=dict(size=11, color="#334155"))] if story else []
    bottom = STORY_GAP_PX + 14 + 16 * lines
    row_px = ROW_PX * (STAGGER_ROWS if where == "stagger" else 1)
    top = TOP_PX + (0 if compact else 24)  # the title's second line
    out = layout(title, top + bottom + max(row_px * rows, 240), hovermode="closest", annotations=notes,
                 showlegend=not compact,
                 xaxis=dict(title=dict(text="depth" if compact else "depth (tokens ahead of the output)"), dtick=1,
                            zeroline=False,
                            range=[-X_PAD_LEFT, deepest + X_PAD_RIGHT]),
                 yaxis=dict(visible=False, range=[min(y.values()) - 0.5, max(y.values()) + 0.5]))
    out["margin"] = {**out["margin"], "b": bottom, "t": top}
    if compact:  # the compare view's small multiples: a smaller title
        out["title"]["font"] = {**out["title"]["font"], "size": 12}
    return figure(data, out)


def _wrap(story: str, chars: int) -> str:
    """The story's lines (joined by <br>) wrapped to `chars` characters (Plotly does not wrap annotations)."""
    return "<br>".join(part for line in story.split("<br>") for part in textwrap.wrap(line, chars) or [""])


def _nodes(name, color, xs, ys, texts, hovers, labels: tuple[str, int], symbol="circle", size=13) -> dict:
    """A trace of nodes, their labels cut and placed as `labels` (label_plan) says: none where it says hover."""
    where, chars = labels
    text = None if where == "hover" else [token_label(t, chars) for t in texts]
    position = ["top center" if round(x) % 2 == 0 else "bottom center" for x in xs] if where == "stagger" else \
        "middle right"
    return dict(type="scatter", x=xs, y=ys, mode="markers" if text is None else "markers+text", name=name, text=text,
                textposition=position, textfont=dict(size=LABEL_PX, color="#0f172a"), hovertext=hovers,
                hoverinfo="text", marker=dict(color=color, size=size, symbol=symbol,
                                              line=dict(color="#0f172a", width=1)))


def empty_tree(message: str):
    note = dict(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                font=dict(size=14, color="#64748b"))
    return figure([], layout("Draft tree", 380, annotations=[note], xaxis=dict(visible=False),
                             yaxis=dict(visible=False)))
