"""The "Compare policies" mode: every policy on the visitor's own input, one after the other on the device thread.

The paper's claim is that a tree shaped by the draft's confidence beats a fixed tree and a plain chain. Here each
policy decodes the same prepared input (greedy, at most MAX_TOKENS new tokens), timed as the race times a lane, each
checked token for token against `ar`; then a bar chart of tokens/s and tau, the tree size and accepted tokens of each
step, the trees the policies drew at the same point of the answer (one scrubber), and a line saying which policy won
and why.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import gradio as gr

from sage_engine import SageError, StepEvent
from sage_engine.config import PAPER_SAGE as PAPER

from .media import BOTH_MEDIA, check_media
from .race import RACING, WARM_TOKENS, RunControl
from .theme import figure
from .tree_plot import empty_tree, tree_figure

if TYPE_CHECKING:  # these import torch: the app imports them after its page is served (app/__init__.py)
    from sage_engine import PreparedInput, SpecEngine

COMPARED = ("ar", "chain", "static", "eagle2", "sage", PAPER)
MAX_TOKENS = 128  # this mode's budget: six decodes of one input


@dataclass
class PolicyLane:
    """One policy's decode of the input."""

    policy: str
    token_ids: list[int] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    seconds: float = 0.0
    identical: bool | None = None  # its tokens are ar's (None: ar itself, or stopped before the end)

    @property
    def decode_steps(self) -> list[StepEvent]:
        return [s for s in self.steps if s.kind == "decode"]

    @property
    def tau(self) -> float:
        decode = self.decode_steps
        return sum(len(s.new_token_ids) for s in decode) / len(decode) if decode else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        return {"token_ids": self.token_ids, "tau": self.tau, "tokens_per_second": self.tokens_per_second,
                "seconds": self.seconds, "steps": len(self.decode_steps), "matches_ar": self.identical}

    def export(self) -> dict:
        """The lane for download: its summary and every step event (tree included)."""
        return {**self.summary(), "policy": self.policy, "step_events": [s.to_dict() for s in self.steps]}


def run_all(engine: SpecEngine, prepared: PreparedInput, max_new_tokens: int,
            stop: threading.Event) -> list[PolicyLane]:
    """Decode `prepared` with every policy of COMPARED in turn (run on the device thread; a Stop ends it after the
    current step). Each lane is timed from the call to `stream()` to its last event, after an untimed warm-up."""
    thread = threading.current_thread()
    idle_name, thread.name = thread.name, RACING  # a decoding job, as a race is (one at a time on the device)
    lanes: list[PolicyLane] = []
    try:
        engine.generate(prepared, "ar", WARM_TOKENS)
        for policy in COMPARED:
            lane = PolicyLane(policy)
            t0 = time.perf_counter()
            for ev in engine.stream(prepared, policy, max_new_tokens):
                lane.steps.append(ev)
                lane.token_ids.extend(ev.new_token_ids)
                if stop.is_set():
                    return lanes
            lane.seconds = time.perf_counter() - t0
            lanes.append(lane)
    finally:
        thread.name = idle_name
        reference = next((x for x in lanes if x.policy == "ar"), None)
        for lane in lanes:
            if lane.policy != "ar" and reference is not None:
                lane.identical = lane.token_ids == reference.token_ids
    return lanes


def bars_figure(lanes: list[PolicyLane]):
    """Tokens/s per policy, tau written on each bar."""
    names = [x.policy.replace(PAPER, "sage (paper)") for x in lanes]
    return figure([{"type": "bar", "x": names, "y": [round(x.tokens_per_second, 1) for x in lanes],
                    "text": [f"tau {x.tau:.2f}" for x in lanes], "textposition": "outside",
                    "marker": {"color": ["#9aa0a6" if x.policy == "ar" else "#7c4dff" for x in lanes]}}],
                  {"title": {"text": "Tokens/s per policy (tau on each bar)"}, "height": 320,
                   "yaxis": {"title": {"text": "tokens/s"},
                             "range": [0, 1.15 * max([x.tokens_per_second for x in lanes] + [1.0])]},
                   "margin": {"t": 50, "b": 60}})


def steps_figure(lanes: list[PolicyLane], what: str):
    """Per policy, over the answer's steps: the tree's size ("nodes") or the tokens a step added ("tokens")."""
    traces = []
    for x in lanes:
        if x.policy == "ar":
            continue
        ys = [len(s.tree.tokens) if what == "nodes" else len(s.new_token_ids) for s in x.decode_steps]
        traces.append({"type": "scatter", "mode": "lines+markers", "name": x.policy.replace(PAPER, "sage (paper)"),
                       "x": list(range(1, len(ys) + 1)), "y": ys})
    title = ("How big each policy's tree was, step by step (nodes the target checked)" if what == "nodes" else
             "What each target forward wrote, per policy (tokens per step)")
    return figure(traces, {"title": {"text": title, "x": 0.01, "xanchor": "left", "y": 1.0, "yref": "container",
                                     "yanchor": "top", "pad": {"t": 10}, "font": {"size": 14}},
                           "height": 320, "xaxis": {"title": {"text": "step of the answer"}},
                           "yaxis": {"title": {"text": "nodes" if what == "nodes" else "tokens"}},
                           "hoverlabel": {"namelength": -1}, "hovermode": "x unified",
                           "margin": {"t": 80, "b": 50},  # the legend above the plot, clear of the axis title
                           "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0}})


def step_at(lane: PolicyLane, fraction: float) -> StepEvent | None:
    """The lane's decode step that was writing the answer's token at `fraction` (0..1) of its length."""
    decode = lane.decode_steps
    if not decode or not lane.token_ids:
        return None
    target = fraction * len(lane.token_ids)
    for s in decode:
        if s.total_tokens >= target:
            return s
    return decode[-1]


def trees_at(lanes: list[PolicyLane], percent: float) -> list:
    """Each speculative policy's tree at the same point of its answer (percent of its tokens), in COMPARED's order;
    an empty figure for a policy that did not run."""
    by_policy = {x.policy: x for x in lanes}
    out = []
    for i, policy in enumerate(COMPARED[1:]):
        name, lane = policy.replace(PAPER, "sage (paper)"), by_policy.get(policy)
        ev = None if lane is None else step_at(lane, percent / 100)
        if ev is None or ev.tree is None:
            out.append(empty_tree(f"{name}: no tree"))
            continue
        title = f"{name}, step {ev.step}: {len(ev.tree.tokens)} nodes, {len(ev.accepted_tokens)} accepted"
        alone = i == TREES - 1 and TREES % TREES_PER_ROW == 1  # the last tree has its row to itself
        width = TREES_PER_ROW * TREE_WIDTH_PX + ROW_GAP_PX if alone else TREE_WIDTH_PX
        out.append(tree_figure(ev, ev.bonus_text or "", width_px=width, compact=True, title=title))
    return out


def verdict(lanes: list[PolicyLane]) -> str:
    """Which policy won, and why in plain words: deeper accepted paths, or cheaper steps."""
    spec = [x for x in lanes if x.policy != "ar"]
    ar = next((x for x in lanes if x.policy == "ar"), None)
    if not spec or ar is None or ar.tokens_per_second <= 0:
        return "Stopped before every policy ran."
    ranked = sorted(spec, key=lambda x: -x.tokens_per_second)
    best, second = ranked[0], ranked[1] if len(ranked) > 1 else None
    speed = best.tokens_per_second / ar.tokens_per_second
    exact = (" Every policy wrote exactly the target's tokens." if all(x.identical for x in spec) else
             " A policy parted from the target's tokens (see the JSON summary).")
    line = f"**{best.policy}** was fastest here: {speed:.2f}x the target alone"
    if speed < 1:
        return line + ": on this input no draft paid for itself (it rarely guessed the target's next token)." + exact
    if second is None:
        return line + "." + exact
    ms = {x.policy: 1e3 * x.seconds / max(1, len(x.decode_steps)) for x in (best, second)}
    if best.tau >= 1.1 * second.tau:
        why = (f"its accepted paths were deeper (tau {best.tau:.2f} tokens a target forward against "
               f"{second.tau:.2f} for {second.policy})")
    else:
        why = (f"its steps were cheaper ({ms[best.policy]:.1f} ms against {ms[second.policy]:.1f} for "
               f"{second.policy}, at a similar tau)")
    return f"{line}, because {why}." + exact


TREES = len(COMPARED) - 1  # one tree plot per speculative policy
TREES_PER_ROW = 2  # side by side; five in a row left each ~200 px, too narrow for a 64-node tree's labels
TREE_WIDTH_PX = 520  # one of them on a ~1100-px page
ROW_GAP_PX = 40  # between two plots of a row


class PolicyComparison:
    """The `/compare_policies` handler: one comparison is one queued job on the device, like a race."""

    def __init__(self, handlers, new_tokens):
        self.h = handlers  # its pool and input preparation
        self.new_tokens = new_tokens  # the budget's check, the race's own

    def run(self, image, video, prompt, max_new_tokens, preset=None, control=None) -> tuple:
        """Every policy on this input; returns the mode's outputs, the last the JSON summary (the API's answer)."""
        try:
            if not (prompt or "").strip():
                raise SageError("the prompt is empty: type a question about the image or video")
            n = min(MAX_TOKENS, self.new_tokens(max_new_tokens))
            if image and video:
                raise SageError(BOTH_MEDIA)
            loaded = self.h.pool.get(preset or self.h.default_preset)
            if not loaded.text_only:
                check_media(image, video)
            video = self.h.previews.original(video)
            _, prepared = self.h.pool.device.call(self.h._prepare, loaded.pair, prompt, image, video)
            engine = loaded.engine(None)
            engine.check_trees("sage")  # every compared policy but ar drafts: one line before any decodes
            stop = (control or RunControl()).switch
            lanes = self.h.pool.device.call(run_all, engine, prepared, n, stop)
        except SageError as e:  # the user's to fix: one line
            raise gr.Error(str(e), print_exception=False) from None
        except Exception as e:  # a bug: the log keeps it, the page says so and keeps serving
            logging.getLogger("sage.app").exception("policy comparison failed")
            raise gr.Error(f"internal error ({type(e).__name__}): {e}", print_exception=False) from None
        summary = {"max_new_tokens": n, "stopped": len(lanes) < len(COMPARED), "verdict": verdict(lanes),
                   "policies": {x.policy: x.summary() for x in lanes}}
        status = ("**Stopped.**" if summary["stopped"] else
                  f"**Done.** {len(lanes)} policies on this input, {n} new tokens at most, one after the other.")
        download = self.h.files.write({"format": "sage-policy-comparison/1", "prompt": prompt, "max_new_tokens": n,
                                       "verdict": summary["verdict"], "lanes": [x.export() for x in lanes]})
        return (status, bars_figure(lanes), steps_figure(lanes, "nodes"), steps_figure(lanes, "tokens"),
                *trees_at(lanes, 50.0), verdict(lanes), gr.DownloadButton(value=download, interactive=True), lanes,
                summary)

    @staticmethod
    def show(lanes, percent) -> tuple:
        """The trees at `percent` of each answer (the scrubber)."""
        return tuple(trees_at(lanes or [], float(percent or 0)))
