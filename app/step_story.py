"""One step, opened: a speculative step told as a short story in plain words, each sentence with this step's numbers
(the draft's first guesses as bars -> its uncertainty -> alpha -> D and W by SAGE's formulas -> the tree level by level
-> the verify pass's tree mask -> the accepted path and the bonus -> what the caches keep). HTML from a StepEvent only.
"""

from __future__ import annotations

from html import escape

from sage_engine import SageConfig, StepEvent

from .theme import BLUE, GREEN, GREY, SLATE, token_label

CSS = """
.story { border: 1px solid #e2e8f0; border-radius: 10px; padding: 10px 14px; background: #fff; font-size: 14px; }
.story h4 { margin: 0 0 6px; font-size: 15px; }
.story ol { margin: 0; padding-left: 1.3em; }
.story li { margin: 6px 0; }
.story .f { font-family: ui-monospace, monospace; font-size: 12.5px; color: #334155; }
.story .bars { margin: 4px 0; }
.story .bar { display: flex; align-items: center; gap: 6px; font-size: 12.5px; }
.story .bar span.t { width: 7em; text-align: right; font-family: ui-monospace, monospace; overflow: hidden; }
.story .bar span.b { height: 10px; border-radius: 3px; }
.story table.mask { border-collapse: collapse; font-size: 11px; margin: 4px 0; }
.story table.mask td, .story table.mask th { border: 1px solid #e2e8f0; width: 1.6em; height: 1.4em; padding: 0 2px;
  text-align: center; font-family: ui-monospace, monospace; white-space: nowrap; }
.story table.mask th { font-weight: 500; color: #475569; max-width: 6em; overflow: hidden; }
"""

MASK_NODES = 12  # nodes shown in the mask matrix (a 64-node tree's matrix would not fit a card)


def _tok(text: str) -> str:
    return f"<b>'{escape(token_label(text, 14))}'</b>"


def _bars(ev: StepEvent) -> str:
    """The root's drafted children (the draft's first guesses it kept), as bars of their draft probability."""
    tv = ev.tree
    kids = sorted((i for i, p in enumerate(tv.parents) if p == -1), key=lambda i: -tv.probs[i])
    acc = set(ev.accepted_nodes)
    rows = []
    for i in kids[:8]:
        p = tv.probs[i]
        color = GREEN if i in acc else GREY
        rows.append(f'<div class="bar"><span class="t">{escape(token_label(tv.texts[i], 12))}</span>'
                    f'<span class="b" style="width:{max(2, round(200 * p))}px;background:{color}"></span>'
                    f'<span>p = {p:.2f}</span></div>')
    return f'<div class="bars">{"".join(rows)}</div>'


def _shape(ev: StepEvent, policy: str, cfg: SageConfig | None) -> str:
    """D and W: SAGE's formulas with this step's numbers, or the policy's fixed shape."""
    if not policy.startswith("sage") or cfg is None or ev.alpha is None:
        return (f"The policy <b>{escape(policy)}</b> does not read α: its tree has a fixed shape here, depth "
                f"<b>D = {ev.depth}</b>, root width <b>W = {ev.width}</b>.")
    a, d_max = ev.alpha, ev.d_max if ev.d_max is not None else cfg.d_max
    d = cfg.d_min + a * (d_max - cfg.d_min)
    w = cfg.w_min + (1 - a) * (cfg.w_max - cfg.w_min)
    said = (f"SAGE turns α into the tree's shape. Depth: <span class='f'>D = D_min + α (D_max − D_min) = "
            f"{cfg.d_min} + {a:.2f} × ({d_max} − {cfg.d_min}) = {d:.1f}</span>; root width: <span class='f'>W = "
            f"W_min + (1 − α)(W_max − W_min) = {cfg.w_min} + {1 - a:.2f} × ({cfg.w_max} − {cfg.w_min}) = "
            f"{w:.1f}</span>. This step: <b>D = {ev.depth}</b>, <b>W = {ev.width}</b>")
    if ev.depth < round(d):
        said += " (less deep than the formula: the answer's budget, or the price of a level, stopped it)"
    return said + ". D_max, the deepest tree allowed, is moved by a history controller as steps accept more or fewer."


def _levels(ev: StepEvent) -> str:
    tv, acc = ev.tree, set(ev.accepted_nodes)
    levels = []
    for depth in range(1, max(tv.depths, default=0) + 1):
        nodes = [i for i, d in enumerate(tv.depths) if d == depth]
        kept = next((i for i in nodes if i in acc), None)
        shown = ", ".join(escape(token_label(tv.texts[i], 10)) for i in nodes[:5]) + (" …" if len(nodes) > 5 else "")
        verdict = f"the target kept {_tok(tv.texts[kept])}" if kept is not None else "none kept"
        levels.append(f"level {depth}: {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({shown}); {verdict}")
    dropped = max(0, tv.drafted_nodes - len(tv.tokens))
    tail = (f" The draft proposed {tv.drafted_nodes} nodes; {dropped} were dropped before the check (too unlikely "
            f"for their level's threshold θ_l, beyond N_max nodes, or not worth their price)." if dropped else "")
    return "<br>".join(levels[:10]) + ("<br>…" if len(levels) > 10 else "") + tail


def _mask(ev: StepEvent) -> str:
    """The verify pass's tree mask: row i (a node) may attend to column j when j is the root, i itself or an ancestor
    of i (besides the prompt and the output, which every row sees)."""
    tv = ev.tree
    n = min(len(tv.tokens), MASK_NODES)
    names = [token_label(tv.root_text, 6)] + [token_label(t, 6) for t in tv.texts[:n]]
    ancestors = []
    for i in range(n):
        line, j = {i}, tv.parents[i]
        while j >= 0:
            line.add(j)
            j = tv.parents[j]
        ancestors.append(line)
    head = "".join(f"<th title='{escape(x, quote=True)}'>{escape(x)}</th>" for x in names)
    rows = [f"<tr><th>{escape(names[0])}</th><td style='background:{SLATE};color:#fff'>■</td>"
            + "<td></td>" * n + "</tr>"]
    for i in range(n):
        cells = [f"<td style='background:{SLATE};color:#fff'>■</td>"]
        for j in range(n):
            cells.append(f"<td style='background:{GREEN if j in set(ev.accepted_nodes) else '#cbd5e1'}'>■</td>"
                         if j in ancestors[i] else "<td></td>")
        rows.append(f"<tr><th>{escape(names[i + 1])}</th>{''.join(cells)}</tr>")
    more = f" (the first {n} of {len(tv.tokens)} nodes)" if len(tv.tokens) > n else ""
    return f"<table class='mask'><tr><th></th>{head}</tr>{''.join(rows)}</table>{more}"


def step_story(ev: StepEvent | None, policy: str, cfg: SageConfig | None) -> str:
    """Step `ev` of the speculative lane as a story with its numbers (HTML)."""
    if ev is None:
        return '<div class="story">Run something first: each step of the speculative lane is told here.</div>'
    head = f"<h4>Step {ev.step}, opened</h4>"
    bonus = ev.bonus_text or ""
    if ev.tree is None or not ev.tree.tokens:
        return (f'<div class="story">{head}A <b>plain step</b>: no draft (drafting was not paying at this point), '
                f"so the target ran one forward pass alone and wrote its <i>argmax</i> (its most likely next token) "
                f"{_tok(bonus)}: one token for one forward.</div>")
    tv, acc = ev.tree, list(ev.accepted_nodes)
    steps = [f"<li><b>The draft's first guesses</b> after {_tok(tv.root_text)} (the newest token of the output), "
             f"with their draft probability p (green: the one the target kept):{_bars(ev)}</li>"]
    if ev.entropy is not None and ev.alpha is not None:
        steps.append(f"<li><b>How unsure the draft was</b>: the entropy H of its k most likely next tokens, over "
                     f"its largest possible value log k, is <span class='f'>H / log k = {ev.entropy:.2f}</span> "
                     f"(0: one token takes it all; 1: all k alike). So its confidence is <span class='f'>α = 1 − "
                     f"H / log k = {ev.alpha:.2f}</span>: {'sure' if ev.alpha >= 0.7 else 'unsure'}.</li>")
    steps.append(f"<li>{_shape(ev, policy, cfg)}</li>")
    steps.append(f"<li><b>The tree, level by level</b> (a level is one token further ahead):<br>{_levels(ev)}</li>")
    steps.append(f"<li><b>One verify pass</b>: the target reads all {len(tv.tokens)} nodes at once. The <i>tree "
                 f"mask</i> says which earlier positions each node may look at: only the root and its own path "
                 f"(■; besides the prompt and the output), so the branches do not see each other:{_mask(ev)}</li>")
    path = " → ".join(_tok(tv.texts[i]) for i in acc) or "nothing"
    if tv.rule != "greedy":  # sampling: the target draws instead of taking its argmax (the tree's story has numbers)
        steps.append(f"<li><b>The target's verdict</b> (sampling, the {escape(tv.rule)} rule: under the tree, with "
                     f"this step's numbers): it kept {path} and then drew {_tok(bonus)} itself, the <b>bonus</b>. "
                     f"This step wrote {len(ev.new_token_ids)} tokens with one target forward.</li>")
    else:
        steps.append(f"<li><b>The target's verdict</b>: at every node it computes its own <i>argmax</i>. Its argmax "
                     f"matched the draft along {path} ({len(acc)} token{'s' if len(acc) != 1 else ''}); after that "
                     f"it wanted {_tok(bonus)}, which it writes itself: the <b>bonus</b> token (blue). This step "
                     f"wrote {len(ev.new_token_ids)} tokens with one target forward.</li>")
    rejected = len(tv.tokens) - len(acc)
    steps.append(f"<li><b>The caches</b>: both models keep the prompt, the output and these {len(ev.new_token_ids)} "
                 f"tokens; the entries of the {rejected} rejected node{'s' if rejected != 1 else ''} are "
                 f"dropped.</li>")
    legend = (f"<span style='color:{GREEN}'>■</span> accepted · <span style='color:{BLUE}'>■</span> bonus · "
              f"<span style='color:{GREY}'>■</span> rejected")
    return f'<div class="story">{head}<ol>{"".join(steps)}</ol><div class="f">{legend}</div></div>'
