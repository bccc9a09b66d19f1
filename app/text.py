"""Words the app shows: the newcomer's explanation with its legend, the scoreboard, status lines."""

from __future__ import annotations

from html import escape

from sage_engine.evaluation.premise import premise

from .race import MAX_ROUNDS, TIMED_SPEC_STEPS
from .record import Divergence, RunRecord
from .theme import AMBER, BLUE, GREEN, GREY, ORANGE, SLATE, VIOLET, token_label

TITLE = "SAGE: adaptive speculative decoding for vision-language models"

INTRO = (
    "Upload an image or a video, ask a question, press **Run**. The same target model answers twice: once "
    "alone, one token per forward pass, and once helped by a small draft model that guesses a *tree* of "
    "continuations which the target checks in a single pass. Same answer, fewer target passes."
)

FAIRNESS = (
    "**Fair timing:** the two decoders **take turns** on the same input and device, never at the same time: one "
    "speculative step, then the autoregressive lane catches up to the same token. Both cover the same part of the "
    "answer within the same few tens of milliseconds, so a busy neighbour on a shared CPU slows both alike. Each "
    "lane's time is the sum of its own steps; a short race is decoded again, unseen, until its speculative lane has "
    f"taken {TIMED_SPEC_STEPS} steps in all, and each lane is timed by the mean of its rounds. **Target forwards** "
    "(one pass of the big model each) do not depend on the machine at all: the autoregressive lane needs one per "
    "token, the speculative lane one per step. The *race replay* below starts both together, each at the speed it "
    "measured."
)


def _chip(color: str, label: str, border: str | None = None) -> str:
    edge = f"border:1px solid {border};" if border else ""
    return (f'<span style="display:inline-block;width:0.9em;height:0.9em;border-radius:3px;background:{color};'
            f'{edge}vertical-align:-0.1em;margin:0 0.3em 0 0.8em"></span>{label}')


LEGEND = " ".join([
    _chip(GREEN, "draft token the target accepted"),
    _chip(BLUE, "the target's own (bonus) token"),
    _chip(GREY, "drafted, rejected", "#64748b"),
    _chip(SLATE, "tree root = newest output token"),
    _chip(ORANGE, "overhead"),
])

BASICS = (
    "**How it works.** A big *target* model writes one token per forward pass. A small *draft* model guesses a "
    "*tree* of next tokens; the target checks the whole tree in **one** pass and keeps the longest branch that is "
    "exactly what it would have written (at each node its *argmax*: its most likely next token), plus one token of "
    "its own, the *bonus*. Same answer, fewer target passes; **τ** is the mean number of tokens per target pass. "
    "**SAGE** shapes each tree by how sure the draft is, **α** (0 unsure … 1 sure): deep and narrow when sure, "
    "shallow and wide when not.")

CAPTION_ALPHA = (
    "**α** = 1 − H / log k: H is the entropy of the draft's k most likely next tokens (k = 10 by default), so α = 1 "
    "when the draft puts all its weight on one token and 0 when it cannot choose. **D** = tree depth (tokens "
    "guessed ahead), **W** = root width (alternatives tried for the first token). A step with D = 0 is a *plain "
    "step*: no draft, the target alone (SAGE does that while drafting does not pay). *Expert view* adds D_max (the "
    "deepest tree allowed; a history controller moves it) and the node price (the least path probability a node "
    "needed to be worth checking, from this machine's measured costs).")
CAPTION_ACCEPTED = (
    "Green: draft tokens the target accepted. Blue: the *bonus*, the target's own next token after the last accepted "
    "one (every step writes one). Ticks: the tree nodes the target checked in that pass. The dashed line is **τ**.")
CAPTION_TREE = (
    "The root (slate) is the newest token of the output. Each column is one token further ahead; each node is a "
    "draft guess. Green: the path the target accepted; grey: rejected; blue star: the bonus. Hover a node for its "
    "draft probability p and its path probability (the product of p along the path). A label's leading space "
    "shows as ␣. Under the tree, this step in words.")
CAPTION_MAPPING = (
    "SAGE's rule: depth **D(α) = D_min + α (D_max − D_min)** rises with α, root width **W(α) = W_min + (1 − α) "
    "(W_max − W_min)** falls. The points are this run's steps (their α and the depth they got).")
CAPTION_TIME = (
    "*Prefill* is a model reading the prompt (image tokens included) before its first token. The autoregressive lane "
    "spends its time in target forwards; the speculative lane also in the draft's forwards and in planning and "
    "bookkeeping (everything else).")

WHY_LOSE = f"""
**Why does a short or unfamiliar answer gain less?** Speculation pays only when the draft guesses right.
Every drafted step costs more than a plain one: the draft's forwards, and a target pass over several
tokens, which on a CPU costs more than a pass over one. The draft also has to read the prompt once (its
*prefill*) before its first guess. A short answer has few steps to earn that back; on a picture the draft
has not learnt, its guesses are mostly rejected. So by
default `sage` prices every node and draft level with this machine's measured costs and how often the
draft has recently been right, and when drafted steps keep losing to plain ones it decodes **plain steps**
(no draft) and retries the draft now and then. The note under the scoreboard says how many steps were plain,
and how well α predicted the accepted length (a correlation: +1 = the surer the draft, the more it got accepted;
where α hardly moved, the note says that instead).

**Why could the two outputs differ?** Greedy speculative decoding is exact in exact arithmetic. In bfloat16 or
float16, the target scoring a token inside a tree (many positions in one pass) can round differently from
scoring it alone, so when two candidate tokens are nearly tied the argmax can flip, and the texts part ways
from there. In float32 (this demo's default pair) they match token for token.

**Legend.** {LEGEND}
"""

TREE_VS_CHAIN = """
**When does a tree beat a chain?** A tree spends verification on alternatives: it pays where checking one more
token costs the target almost nothing (large models on GPUs, the paper's setting) and where the draft's
confidence tells its likely misses from its likely hits. On this CPU every extra token the target checks costs
time, and the embedded draft is right more than nine tokens in ten, so depth is what pays: type `chain:k=14` in the
policy box and race it against `sage` on the same picture: they come out close. *Policies:* `chain` (one line of k
guesses), `static` (a fixed 25-node tree), `eagle2` (grows the most probable nodes), `sage` (the shape follows α).
"""

SAMPLING = """
**Sampling (temperature above 0).** The target then draws each token from its own distribution p (tempered,
cut to the top-p nucleus) and the draft proposes from its distribution q, tempered the same way, so hotter
sampling lowers α and SAGE plans wider, shallower trees. The output keeps exactly the target's distribution
under either of two rules, both shown with this step's numbers under the draft tree (hover a node for its
p, q and u). *Tree rule* (`sage`, `static`, `eagle2`, `chain:draw=top`): at each node on the path the target
draws a token with a uniform u; if the draw is a drafted child it descends, otherwise the draw ends the step.
*Ratio rule* (`chain`): the draft samples its chain, and the target keeps a token x when u·q(x) < p(x), that
is with probability min(1, p/q); at the first rejection it draws from the leftover max(0, p − q).
"""

SCOREBOARD_CSS = """
.sb { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 10px; }
.card { border: 1px solid #e2e8f0; border-radius: 10px; padding: 10px 12px; background: #fff; }
.card .k { font-size: 12px; color: #64748b; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 26px; font-weight: 700; line-height: 1.25; }
.card .v small { font-size: 13px; font-weight: 500; color: #64748b; }
.card .s { font-size: 12px; color: #475569; }
.card.ok .v { color: #15803d; } .card.bad .v { color: #b91c1c; }
.sb-note { font-size: 13px; color: #475569; margin-top: 8px; }
@media (max-width: 900px) { .sb { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
"""


def _card(key: str, value: str, sub: str, cls: str = "", color: str | None = None) -> str:
    style = f' style="border-top:3px solid {color}"' if color else ""
    return (f'<div class="card {cls}"{style}><div class="k">{escape(key)}</div><div class="v">{value}</div>'
            f'<div class="s">{sub}</div></div>')


def _lane_card(title: str, lane, color: str, stopped: bool = False, timing: bool = False) -> str:
    if not lane.steps:
        return _card(title, "–", "not started: stopped" if stopped else "waiting", color=color)
    n = len(lane.token_ids)
    stats = lane.stats()
    if stats is None:
        doing = "stopped here" if stopped else "done; timing…" if timing else "decoding…"
        return _card(title, f"{n} <small>tokens</small>", doing, color=color)
    extra = f" · τ = {stats.mean_accepted:.2f}" if lane.name == "spec" else ""
    return _card(title, f"{stats.tokens_per_second:.1f} <small>tok/s</small>",
                 f"{n} tokens · {stats.seconds:.2f} s · {stats.target_forwards} target forwards{extra}", color=color)


def divergence_note(div: Divergence, token_text) -> str:
    def show(tok):
        return "end of output" if tok is None else f"'{escape(token_label(token_text(tok), 16))}' (id {tok})"

    return (f"The outputs part at token {div.index}: autoregressive {show(div.ar_token)} vs speculative "
            f"{show(div.spec_token)}. In bf16/fp16 the target scoring a token inside a tree can round "
            f"differently from scoring it alone; with a near tie the argmax flips. In float32 they match.")


DIFFERENT_DRAW = (
    "Same distribution, different draw. The chain samples its draft tokens from q and the target keeps each with "
    "probability min(1, p/q), drawing from the leftover max(0, p − q) at the first rejection: every token then "
    "has exactly the target's distribution (check it: <code>python -m sage_engine check-sampling --policy "
    "chain</code>), but the run spends its random numbers differently from the target alone, so one seed gives "
    "another sample. The tree policies and <code>chain:draw=top</code> let the target draw each token itself "
    "(accepting a drafted node when the draw lands on it): the same seed gives the identical text.")


def scoreboard(record: RunRecord | None, token_text=None) -> str:
    """The four cards: each lane's speed, the speedup with tau, and whether the outputs are identical."""
    if record is None:
        return '<div class="sb-note">Press Run to race the two decoders.</div>'
    ar_title, spec_title = "Autoregressive", f"Speculative ({record.spec.policy})"
    timing = bool(record.retiming)
    cards = [_lane_card(ar_title, record.ar, AMBER, record.stopped, timing),
             _lane_card(spec_title, record.spec, VIOLET, record.stopped, timing)]
    speedup, note = record.headline_speedup(), ""
    if record.stopped:  # a stopped run is not a race: its lanes were cut at different points
        cards.append(_card("Speedup", "–", "stopped: no race to compare"))
        cards.append(_card("Same output?", "–", "stopped before the end"))
    elif speedup is None and record.retiming:  # both texts are done; the race is decoded again to time it
        cards.append(_card("Speedup", "…", f"timing: round {record.retiming} of at most {MAX_ROUNDS}"))
        cards.append(_card("Same output?", "–", "after the timing"))
    elif speedup is None:
        cards.append(_card("Speedup", "–", "after both runs"))
        cards.append(_card("Same output?", "–", "after both runs"))
    else:
        stats = record.spec.stats()
        ar_forwards = record.ar.stats().target_forwards
        cpu, clock = record.cpu_speedup(), record.speedup()
        lines = []
        if cpu is not None:  # the lanes took turns: the CPU-time ratio is the headline, the clock's beside it
            lines.append(f"<span title='tokens per CPU second, speculative over autoregressive: what each lane cost "
                         f"the processor. A busy neighbour mostly makes a lane wait, which CPU time leaves out, so "
                         f"it moves less than the clock on a shared machine'>in CPU time</span> · by the clock "
                         f"{clock:.2f}×")
        else:
            lines.append("<span title='tokens per second, speculative over autoregressive, by the clock. The lanes "
                         "ran one after the other, not in turns: turns need a second engine whose target runs on the "
                         "backend the speculative lane's does, and its check turned that backend down; so a busy "
                         "neighbour may have slowed one lane more'>by the clock, the lanes one after the "
                         "other</span>")
        rounds = len(record.spec.rounds)
        if rounds > 1:
            lines.append(f"<span title='the speculative lane took {len(record.spec.decode_steps)} steps, fewer than "
                         f"{TIMED_SPEC_STEPS}, so the race was decoded {rounds} times in all (unseen after the first) "
                         f"and each lane is timed by the mean of its rounds: on a shared machine a few steps alone "
                         f"would time the neighbours as much as the decoders'>timed over {rounds} rounds</span>")
        lines.append(f"τ = {stats.mean_accepted:.2f} <span title='τ: the mean number of tokens each forward pass of "
                     f"the target wrote (accepted draft tokens + 1 bonus)'>tokens per target forward</span>")
        lines.append(f"<span title='one forward pass of the big model each: the autoregressive lane needs one per "
                     f"token, the speculative one per step; this does not depend on the machine'>target forwards: "
                     f"{stats.target_forwards} vs {ar_forwards} alone "
                     f"({ar_forwards / max(1, stats.target_forwards):.1f}× fewer, any machine)</span>")
        cards.append(_card("Speedup", f"{speedup:.2f}×" + ("" if speedup >= 1 else " <small>slower</small>"),
                           "<br>".join(lines), "ok" if speedup >= 1 else "bad"))
        div = record.divergence()
        n = len(record.ar.token_ids)
        if div is None:
            cards.append(_card("Same output?", "✓ identical", f"all {n} tokens match", "ok"))
        elif record.rule == "ratio":
            cards.append(_card("Same output?", "≈ same distribution", f"a different draw from token {div.index}",
                               "ok"))
            note = f'<div class="sb-note">{DIFFERENT_DRAW}</div>'
        else:
            cards.append(_card("Same output?", "✗ differs", f"from token {div.index} of {n}", "bad"))
            note = f'<div class="sb-note">{divergence_note(div, token_text or str)}</div>'
        note += run_note(record.spec)
        if speedup < 1:
            note = f'<div class="sb-note"><b>{escape(lost_line(record))}</b></div>' + note
    return f'<div class="sb">{"".join(cards)}</div>{note}'


# below this spread of α over a run's drafted steps its correlation with the accepted length is noise, not a finding
ALPHA_SPREAD_MIN = 0.1


def run_note(lane) -> str:
    """How the speculative lane spent its steps: drafted or plain, and how well α predicted acceptance."""
    decode = lane.decode_steps
    if not decode or lane.policy == "ar":
        return ""
    plain = sum(1 for s in decode if s.depth == 0)
    fit = premise([lane.steps])
    why = (f", {plain} plain (no draft, the target alone: drafting was not paying at those steps)" if plain else
           ", none plain")
    said = f"{len(decode) - plain} steps drafted a tree{why}."
    alphas = [s.root_alpha for s in decode if s.root_alpha is not None]
    if alphas and max(alphas) - min(alphas) < ALPHA_SPREAD_MIN:
        low, high = f"{min(alphas):.2f}", f"{max(alphas):.2f}"
        where = f"was {low} at every drafted step" if low == high else f"stayed between {low} and {high}"
        said += (f" α {where}: the draft was about as sure at every step, too narrow a range for α to predict the "
                 f"accepted length (a correlation over it would be noise).")
    elif fit.current_root is not None:
        said += (f" How well α predicted the accepted length over the {fit.steps} drafted steps: "
                 f"{fit.current_root:+.2f} (a correlation: +1 = the surer the draft, the more the target kept).")
    return f'<div class="sb-note">{said}</div>'


def status_running(record: RunRecord) -> str:
    if record.retiming:
        return (f"Timing the race: round {record.retiming}. Both texts are done; a short race is decoded again, "
                f"unseen, so that its speedup rests on more than a few steps of a shared machine "
                f"(at most {MAX_ROUNDS} rounds)")
    if record.alternated:
        return (f"Running: the two lanes take turns… autoregressive {_tokens(len(record.ar.token_ids))}, "
                f"speculative ({record.spec.policy}) {_tokens(len(record.spec.token_ids))}")
    if not record.ar.done:
        return f"Running 1/2: autoregressive decoding… {_tokens(len(record.ar.token_ids))}"
    return f"Running 2/2: speculative decoding ({record.spec.policy})… {_tokens(len(record.spec.token_ids))}"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def status_done(record: RunRecord) -> str:
    if record.stopped:
        return (f"**Stopped** after {_tokens(len(record.ar.token_ids))} (autoregressive) and "
                f"{_tokens(len(record.spec.token_ids))} (speculative).")
    return f"**Done.** {_outcome(record)}."


def _outcome(record: RunRecord) -> str:
    speedup = record.headline_speedup()
    same = ("token-identical" if record.divergence() is None else
            "the same distribution with a different draw (see the scoreboard)" if record.rule == "ratio" else
            "outputs differ (see the scoreboard)")
    if speedup is not None and speedup < 1:
        return f"{lost_line(record)} Outputs: {same}"
    faster = f"{speedup:.2f}× the autoregressive speed" if speedup is not None else ""
    if speedup is not None and record.cpu_speedup() is not None:
        faster += f" in CPU time ({record.speedup():.2f}× by the clock)"
    return f"Speculative ({record.spec.policy}) ran at {faster}, {same}"


SHORT_ANSWER = 24  # tokens: below this the draft's own prefill is rarely earned back


def loss_reasons(record: RunRecord) -> list[str]:
    """Why a speculative lane lost to the target alone, from its own steps (most telling first)."""
    lane, reasons = record.spec, []
    decode = lane.decode_steps
    stats = lane.stats()
    n = len(lane.token_ids)
    plain = sum(1 for s in decode if s.depth == 0)
    if decode and plain * 2 >= len(decode):
        reasons.append(f"{plain} of its {len(decode)} steps were plain steps (no draft: the target alone), because "
                       "drafting was not paying here, so it could at best match the target alone")
    if stats is not None and stats.mean_accepted < 2:
        alphas = [s.alpha for s in decode if s.alpha is not None]
        unsure = f", mean draft confidence α = {sum(alphas) / len(alphas):.2f}" if alphas else ""
        reasons.append(f"the draft was often wrong (τ = {stats.mean_accepted:.2f} tokens per target forward"
                       f"{unsure}): too few accepted tokens to pay for drafting and for checking a tree")
    if n < SHORT_ANSWER:
        reasons.append(f"the answer is short ({n} tokens): the draft's reading of the prompt and the first drafts "
                       "are not earned back")
    if not reasons:
        reasons.append("each drafted step (the draft's forwards and a target pass over the tree) cost more on this "
                       "machine than the tokens it saved")
    return reasons


def lost_line(record: RunRecord) -> str:
    """One sentence: the speculative lane was slower, by how much, and why."""
    speedup = record.headline_speedup() or 0.0
    return (f"Speculative ({record.spec.policy}) was slower than the target alone ({speedup:.2f}×) because "
            f"{'; and '.join(loss_reasons(record))}.")


CACHED = "**Cached result**"  # how a status line shown from the example cache starts


def status_cached(record: RunRecord, raced_at: str) -> str:
    """The status of an example shown from the cache: never passed off as a live race."""
    return (f"{CACHED} of an earlier run of this example (raced {raced_at} with {record.max_new_tokens} new tokens, "
            f"policy {record.spec.policy}, {record.preset}); timings measured then: press **Run** to race live. "
            f"{_outcome(record)}.")


def status_cached_fresh(record: RunRecord) -> str:
    """The status of the example click that raced live just now and stored the result."""
    return (f"{status_done(record)} Raced live just now (not streamed: a first example click runs to the end) "
            f"and stored: the next click on this example shows this run at once, labelled as cached.")


def no_step_slider(status: str) -> str:
    return f"{status} (The step slider is off for this cached run: its step data is missing; press **Run**.)"


def status_waiting(preset: str, seconds: float) -> str:
    return (f"Waiting: the model pair **{preset}** is still loading ({seconds:.0f} s so far); "
            "this run starts as soon as it is ready.")


READY = "Ready: upload an image or a video (or click an example), ask, press **Run**."
LOADING = "Loading the model pair"


def status_loading(preset: str, seconds: float) -> str:
    return (f"{LOADING} **{preset}** ({seconds:.0f} s so far): you can fill in the inputs and press Run meanwhile; "
            "the run starts once it is loaded.")


def is_loading_status(status: str | None) -> bool:
    return (status or "").startswith(LOADING)


def status_error(message: str) -> str:
    return f"**Cannot run:** {message}"  # gr.Markdown sanitises HTML itself
