"""The page, built in one place. Returns handles to every component; events are wired in wiring.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

import gradio as gr

from sage_engine import SageConfig
from sage_engine.config import ALPHA_SOURCES, SPECULATIVE_POLICIES  # config: the names without the policies (torch)

from . import plots, replay, text
from .components import StepSlider, UploadedImage
from .policy_compare import TREES, TREES_PER_ROW
from .race import RunControl
from .served import Preset
from .step_story import CSS as STORY_CSS
from .step_story import step_story
from .theme import TOKEN_COLORS
from .tree_plot import empty_tree

POLICIES = tuple(sorted(SPECULATIVE_POLICIES, key=lambda name: name != "sage"))  # the dropdown: sage first


def policy_choices(registered=()) -> tuple[str, ...]:
    """The dropdown's policies: the engine's own (sage first), then `registered`, the names a `--policy-module` file
    of app.py registered (sage_engine.register_policy)."""
    return POLICIES + tuple(n for n in registered if n not in POLICIES)
MAX_NEW_TOKENS = 512
DEFAULT_NEW_TOKENS = 192  # room for a whole description: a photo's about 120 tokens, a clip's up to about 170


@dataclass
class Knobs:
    """The SAGE knobs panel; names match SageConfig fields."""

    d_min: gr.Slider
    d_max: gr.Slider
    w_min: gr.Slider
    w_max: gr.Slider
    k: gr.Slider
    n_max: gr.Slider
    theta_scale: gr.Slider
    alpha_source: gr.Dropdown
    threshold: gr.Dropdown
    draw: gr.Dropdown  # under sampling: SAGE's tree from the draft's top candidates, or drawn from q
    draft_prune: gr.Checkbox  # not a SageConfig field: the engine's draft visual-token pruning
    temperature: gr.Slider  # sampling (sage_engine/core/sampling.py), for both lanes: 0 is greedy
    top_p: gr.Slider
    seed: gr.Slider  # both lanes draw with it, so they sample the same text

    def as_kwargs(self) -> dict[str, gr.components.Component]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class CompareUi:
    """The "Compare policies" mode (app/policy_compare.py): every policy on the same input."""

    run: gr.Button
    status: gr.Markdown
    bars: gr.Plot
    nodes: gr.Plot
    tokens: gr.Plot
    point: gr.Slider  # where in the answers the trees below are taken (percent of each answer)
    trees: list  # one gr.Plot per speculative policy
    verdict: gr.Markdown
    export: gr.DownloadButton  # every lane, with its step events
    lanes: gr.State
    summary: gr.JSON

    def outputs(self) -> list:
        return [self.status, self.bars, self.nodes, self.tokens, *self.trees, self.verdict, self.export, self.lanes,
                self.summary]


@dataclass
class Ui:
    """Every component an event reads or writes."""

    model_info: gr.Markdown
    model_timer: gr.Timer  # refreshes model_info while the pair loads behind the page, then stops
    image: UploadedImage
    video: gr.Video
    prompt: gr.Textbox
    max_new_tokens: gr.Slider
    policy: gr.Dropdown
    preset: gr.Dropdown
    knobs: Knobs
    run: gr.Button
    stop: gr.Button
    frames: gr.Gallery  # the sampled video frames, shown when a video is chosen
    examples_row: gr.Row  # where app/examples.py puts the example galleries (they need the outputs below)
    # outputs of a run, in the order of app.view.View
    status: gr.Markdown
    ar_text: gr.Textbox
    spec_text: gr.HighlightedText
    scoreboard: gr.HTML
    replay: gr.HTML
    fig_alpha: gr.Plot
    fig_accepted: gr.Plot
    fig_tree: gr.Plot
    fig_mapping: gr.Plot
    fig_time: gr.Plot
    step: gr.Slider
    expert: gr.Checkbox  # the charts with every series (today's detail) instead of three per axis
    story: gr.HTML  # the step shown, opened: told in words with its numbers (app/step_story.py)
    prev_step: gr.Button
    next_step: gr.Button
    export: gr.DownloadButton
    run_state: gr.State
    summary: gr.JSON
    control: gr.State  # the session's Stop switch (not an output)
    compare: CompareUi


def _knobs(cfg: SageConfig) -> Knobs:
    with gr.Accordion("SAGE knobs (the paper's formulas; defaults: priced by this machine) and draft pruning",
                      open=False):
        gr.Markdown("Depth D(α) = D_min + α(D_max − D_min), root width W(α) = W_min + (1 − α)(W_max − W_min).\n"
                    "Used by the `sage` policy only.")
        with gr.Row():
            d_min = gr.Slider(1, 8, cfg.d_min, step=1, label="D_min (depth when unsure)")
            d_max = gr.Slider(2, 16, cfg.d_max, step=1, label="D_max (depth when sure)")
        with gr.Row():
            w_min = gr.Slider(1, 8, cfg.w_min, step=1, label="W_min (width when sure)")
            w_max = gr.Slider(1, 16, cfg.w_max, step=1, label="W_max (width when unsure)")
        with gr.Row():
            k = gr.Slider(2, 50, cfg.k, step=1, label="k (top-k for the entropy)")
            n_max = gr.Slider(1, 128, cfg.n_max, step=1, label="N_max (nodes per tree)")
        with gr.Row():
            theta = gr.Slider(0.0, 0.5, cfg.theta_scale, step=0.01, label="θ scale (θ_l = θ·l/D)")
            source = gr.Dropdown(list(ALPHA_SOURCES), value=cfg.alpha_source,
                                 label="α for the next tree comes from")
        threshold = gr.Dropdown([("the paper's: θ_l and N_max", "paper"),
                                 ("priced by this machine (the default)", "cost")],
                                value=cfg.threshold, label="Which nodes are worth drafting", elem_id="knob-threshold",
                                info="priced: a node must pay for its verification and a level for its draft "
                                     "forward, with this machine's measured costs, and while drafting loses the "
                                     "policy takes plain steps (no draft); ours, not in the paper")
        prune = gr.Checkbox(False, label="Draft reads only 20% of the image tokens / 10% of the video tokens "
                                         "(the paper's draft-only pruning; every policy; the output is unchanged)")
        with gr.Accordion("How sampling stays exact", open=False):
            gr.Markdown(text.SAMPLING)
        gr.Markdown("Sampling, both lanes (0 = greedy). With the tree policies the target draws each token itself "
                    "at every tree node it reaches, so with the same seed both lanes write the same text; `chain` "
                    "samples its draft and keeps a token with probability min(1, p/q): the same distribution, a "
                    "different draw (SAGE can do either, below).")
        draw = gr.Dropdown([("top candidates (same text as AR)", "top"),
                            ("drawn from q (a different draw)", "sample")],
                           value=cfg.draw, label="When sampling, SAGE's draft", elem_id="knob-draw",
                           info="top: the tree from the draft's top candidates, the target draws at each node (same "
                                "seed, same text as the autoregressive lane); q: children drawn from the draft's q "
                                "without replacement, kept with probability min(1, p/q) (same distribution)")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, 0.0, step=0.05, label="temperature")
            top_p = gr.Slider(0.05, 1.0, 1.0, step=0.05, label="top-p")
            seed = gr.Slider(0, 9999, 0, step=1, label="seed")
    return Knobs(d_min, d_max, w_min, w_max, k, n_max, theta, source, threshold, draw, prune, temperature, top_p,
                 seed)


def _media() -> dict:
    """The image or video and the prompt: the first thing a visitor fills in."""
    with gr.Row():
        image = UploadedImage(type="filepath", image_mode=None, sources=["upload", "clipboard"], label="Image",
                              elem_id="image", height=200)
        video = gr.Video(sources=["upload"], format=None, include_audio=True, label="Video", elem_id="video",
                         height=200)
    frames = gr.Gallery(label="Video frames the model sees (sampled uniformly)", columns=8, rows=1, height=156,
                        elem_id="frames", allow_preview=False, interactive=False, visible=False, object_fit="contain",
                        buttons=[])
    prompt = gr.Textbox(label="Prompt", lines=2, placeholder="Ask something about the image or video",
                        elem_id="prompt")
    return dict(image=image, video=video, frames=frames, prompt=prompt)


def _settings(presets: Mapping[str, Preset], default_preset: str, policies: tuple[str, ...]) -> dict:
    """How the run decodes: its length, the speculative policy, the model pair."""
    with gr.Row():
        max_new = gr.Slider(1, MAX_NEW_TOKENS, DEFAULT_NEW_TOKENS, step=1, label="Max new tokens",
                            elem_id="max-new-tokens")
        policy = gr.Dropdown(list(policies), value="sage", label="Speculative policy", elem_id="policy",
                             allow_custom_value=True,  # or a spec with knobs, as bench takes it: chain:k=3
                             info="or type one with knobs, as the CLI takes it: chain:k=3, sage:n_max=16")
    preset = gr.Dropdown(list(presets), value=default_preset, label="Model pair (configured presets only)",
                         elem_id="preset", interactive=len(presets) > 1,
                         info=_pair_line(presets[default_preset]))
    return dict(max_new_tokens=max_new, policy=policy, preset=preset)


def _pair_line(p: Preset) -> str:
    return f"target {os.path.basename(p.target)} · draft {os.path.basename(p.draft)} · {p.dtype}"


def _texts() -> dict:
    gr.Markdown(text.FAIRNESS)
    with gr.Row(equal_height=True):
        ar_text = gr.Textbox(label="Autoregressive (target only)", lines=9, max_lines=14, interactive=False,
                             elem_id="ar-text")
        spec_text = gr.HighlightedText(label="Speculative (SAGE): coloured by who wrote each token",
                                       color_map=dict(TOKEN_COLORS), show_legend=True, combine_adjacent=False,
                                       elem_id="spec-text")
    scoreboard = gr.HTML(text.scoreboard(None), css_template=text.SCOREBOARD_CSS, elem_id="scoreboard",
                         js_on_load=None)
    with gr.Accordion("Why can speculation lose, or the two outputs differ? (and the colours)", open=False,
                      elem_id="why"):
        gr.Markdown(text.WHY_LOSE)
    replay_panel = gr.HTML(replay.replay_html(None), css_template=replay.CSS, js_on_load=replay.JS,
                           elem_id="replay")
    return dict(ar_text=ar_text, spec_text=spec_text, scoreboard=scoreboard, replay=replay_panel)


def _plots() -> dict:
    expert = gr.Checkbox(False, label="Expert view: every series (α of the root, D_max, node price; prefill, verify "
                                      "and overhead apart)", elem_id="expert")
    with gr.Row():
        with gr.Column():
            fig_alpha = gr.Plot(plots.placeholder("How sure the draft was (α), and the tree it planned",
                                                  "run something first"), elem_id="plot-alpha", show_label=False)
            gr.Markdown(text.CAPTION_ALPHA, elem_classes="caption")
        with gr.Column():
            fig_accepted = gr.Plot(plots.placeholder("What each target forward wrote", "run something first"),
                                   elem_id="plot-accepted", show_label=False)
            gr.Markdown(text.CAPTION_ACCEPTED, elem_classes="caption")
    with gr.Row():
        with gr.Column(scale=3):
            step = StepSlider(1, 2, 1, step=1, label="Step: scrub through the speculative run's draft trees",
                              elem_id="step", interactive=False)
            fig_tree = gr.Plot(empty_tree("the draft tree of a step appears here after a run"),
                               elem_id="plot-tree", show_label=False)
            gr.Markdown(text.CAPTION_TREE, elem_classes="caption")
            with gr.Row():
                prev_step = gr.Button("◀ previous step", size="sm", elem_id="prev-step")
                next_step = gr.Button("next step ▶", size="sm", elem_id="next-step")
            story = gr.HTML(step_story(None, "sage", None), css_template=STORY_CSS, elem_id="step-story")
        with gr.Column(scale=2):
            fig_mapping = gr.Plot(plots.placeholder("SAGE's rule: the surer the draft (α), the deeper the tree",
                                                    "run something first"), elem_id="plot-mapping", show_label=False)
            gr.Markdown(text.CAPTION_MAPPING, elem_classes="caption")
            fig_time = gr.Plot(plots.placeholder("Where each lane's time went", "run something first", 260),
                               elem_id="plot-time", show_label=False)
            gr.Markdown(text.CAPTION_TIME, elem_classes="caption")
    return dict(fig_alpha=fig_alpha, fig_accepted=fig_accepted, step=step, fig_tree=fig_tree,
                fig_mapping=fig_mapping, fig_time=fig_time, expert=expert, story=story, prev_step=prev_step,
                next_step=next_step)


def _compare() -> CompareUi:
    with gr.Accordion("Compare every policy on this input (ar, chain, static, eagle2, sage, the paper's SAGE)",
                      open=False, elem_id="compare-policies"):
        gr.Markdown(text.TREE_VS_CHAIN)
        gr.Markdown("Each policy decodes the input above in turn (at most 128 new tokens), checked token for token "
                    "against the target alone: the speed of each, how big its trees were and how much of them the "
                    "target kept, and the trees the policies drew at the same point of the answer.")
        with gr.Row():
            run = gr.Button("Compare policies", variant="primary", elem_id="compare-run")
            status = gr.Markdown("", elem_id="compare-status")
        bars = gr.Plot(plots.placeholder("Tokens/s per policy", "compare the policies first"), elem_id="compare-bars",
                       show_label=False)
        verdict = gr.Markdown("", elem_id="compare-verdict")
        with gr.Row():
            nodes = gr.Plot(plots.placeholder("Draft tree size per step", "compare the policies first"),
                            elem_id="compare-nodes", show_label=False)
            tokens = gr.Plot(plots.placeholder("Tokens per target forward", "compare the policies first"),
                             elem_id="compare-tokens", show_label=False)
        point = gr.Slider(0, 100, 50, step=1, label="Trees at this point of each answer (% of its tokens)",
                          elem_id="compare-point")
        gr.Markdown(f"**In the trees:** {text.LEGEND}; depth = tokens ahead of the output; hover a node for its token "
                    "and probability.", elem_id="compare-legend")
        trees = []
        for first in range(0, TREES, TREES_PER_ROW):  # rows of two: wide enough for a deep tree's labels
            with gr.Row():
                trees += [gr.Plot(empty_tree("compare the policies first"), elem_id=f"compare-tree-{i}",
                                  show_label=False) for i in range(first, min(first + TREES_PER_ROW, TREES))]
        export = gr.DownloadButton("Download the comparison (JSON: every policy's step events and stats)", value=None,
                                   interactive=False, elem_id="compare-export", variant="secondary")
        summary = gr.JSON(elem_id="compare-summary", visible=False)
    return CompareUi(run, status, bars, nodes, tokens, point, trees, verdict, export, gr.State(None), summary)


# the knobs panel's settings: `sage` priced by this machine (threshold "cost", i.e. `priced:sage`), what pays here
def build_layout(presets: Mapping[str, Preset], default_preset: str,
                 cfg: SageConfig = SageConfig(threshold="cost"), policies: tuple[str, ...] = POLICIES) -> Ui:
    """Create every component inside the current gr.Blocks; returns their handles."""
    gr.Markdown(f"# {text.TITLE}\n{text.INTRO}")
    gr.Markdown(text.BASICS, elem_id="basics")
    # the first screen (1440 x 900): the upload, the prompt, Run and the examples; the settings below them
    # on a phone the two columns dissolve into one list (demo.CSS): the settings then come after the results
    with gr.Row(elem_id="main-row"):
        with gr.Column(scale=4, min_width=320, elem_classes="main-col"):
            inputs = _media()
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            status = gr.Markdown("", elem_id="status")  # the page's load event says "loading" or "ready"
            model_info = gr.Markdown(elem_id="model-info")  # beside Run: a loading pair is seen without scrolling
            model_timer = gr.Timer(1.0)
            with gr.Group(elem_id="settings"):
                inputs.update(_settings(presets, default_preset, policies))
            with gr.Group(elem_id="knobs"):
                knobs = _knobs(cfg)
        with gr.Column(scale=7, min_width=480, elem_classes="main-col"):
            examples_row = gr.Row()  # filled by app/examples.py once every output exists
            outputs = _texts()
    figures = _plots()
    with gr.Row():
        export = gr.DownloadButton("Download the run (JSON: both decoders' step events and stats)", value=None,
                                   interactive=False, elem_id="export", variant="secondary")
    with gr.Accordion("JSON summary (the last output of the `compare` API endpoint)", open=False):
        summary = gr.JSON(elem_id="summary")
    compare = _compare()
    return Ui(model_info=model_info, model_timer=model_timer, examples_row=examples_row, knobs=knobs, run=run,
              stop=stop, status=status, compare=compare,
              export=export, run_state=gr.State(None), summary=summary, control=gr.State(RunControl()), **inputs,
              **outputs, **figures)

