"""build_demo(): the Gradio Blocks app. Layout (layout.py) and events (wiring.py) meet here, once."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gradio as gr

from .examples import CACHE_MODES, add_examples
from .handlers import Handlers
from .layout import build_layout, policy_choices
from .media import Example, RunFiles, load_examples
from .pool import PairFactory, PairPool, load_preset
from .served import Preset, pick, served
from .text import TITLE
from .wiring import wire

CSS = """
/* Gradio's field is a wrapping flex box with word-break: break-all, which cuts words anywhere; here it is a block
   of inline chunks that breaks lines only at the text's own spaces (a word longer than the line alone may break).
   Its template puts spaces between and inside the chunks, outside their .text: at font size 0 and nowrap they are
   neither seen nor a place to break; only .text has a size and keeps its own spaces (pre-wrap). */
#spec-text .textfield { font-size: 0; line-height: 1.9; display: block; white-space: nowrap; word-break: normal;
  overflow-wrap: break-word; }
#spec-text .line-break { display: block; }  /* a newline of the text (a flex-basis in Gradio's own layout) */
/* the coloured chunks flow as text: inline, so a line breaks between words, never inside one or at a chunk's edge */
#spec-text .token-container, #spec-text .token, #spec-text .text { display: inline; }
/* the chunk's colour (Gradio sets it on .token, whose box has no height at font size 0) is painted behind its text */
#spec-text .token { padding: 0; margin: 0; border-radius: 0; white-space: nowrap; }
#spec-text .text { font-size: 14px; white-space: pre-wrap; background-color: inherit; padding: 2px 0;
  -webkit-box-decoration-break: clone; box-decoration-break: clone; }
#ar-text textarea { font-size: 14px; }
/* the frame strip's label floats over the strip's top edge: one line, and the thumbnails start below it */
#frames [data-testid="block-label"] { max-width: calc(100% - 16px); white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; }
/* every sampled frame in one row, however narrow (Gradio's columns are at least 100 px: a phone hid the fourth) */
#frames .grid-container { padding-top: 36px; grid-template-columns: repeat(var(--grid-cols), minmax(0, 1fr)); }
#status { min-height: 2.2em; }
.caption { font-size: 13px; color: #475569; }
/* a phone: one list (inputs, Run, examples, results, then the settings); short text boxes, so that after Run both
   texts and the speedup fit one screen; no plot toolbar over the titles */
@media (max-width: 700px) {
  html, body { overflow-anchor: none; }  /* the results stay where Run scrolled them while the page grows below */
  #main-row { flex-direction: column; flex-wrap: nowrap; }
  #main-row > .main-col { display: contents; }
  #settings, #knobs { order: 10; }
  #ar-text textarea { max-height: 9.5em; }
  #spec-text .textfield { max-height: 140px; overflow-y: auto; }  /* ten lines (its own font size is 0) */
  #spec-text .legend { display: none; }
  .modebar-container { display: none !important; }
  #scoreboard .card .v { font-size: 20px; }
}
/* a refused run: the status box's own "Cannot run: ..." line says it; Gradio's "Error" pill would cover that line */
#status [data-testid="status-tracker"]:has(.error), #compare-status [data-testid="status-tracker"]:has(.error) {
  display: none !important; }
"""

# Gradio's client closes each finished event stream through a stand-in EventSource whose close() logs
# "Method not implemented." (twice per race: the run and the buttons' release); that line alone is dropped. The
# second script keeps the speculative text's line breaks at its own spaces (defect 1 of issue 81).
HEAD = """<script>
(() => { const warn = console.warn.bind(console);
  console.warn = (...args) => {
    if (args.length === 1 && args[0] === 'Method not implemented.') return;
    warn(...args);
  };
})();
/* The speculative text's chunks (#spec-text, Gradio's HighlightedText) are separated by whitespace of its template,
   outside their .text. Chrome breaks a line there even at font size 0 and white-space: nowrap, which cuts a word
   whose tokens came from different sources ("bri" | "ghtest"). Those whitespace-only text nodes are emptied as they
   appear (left in place: the template's own updates still find them), so that a line breaks only at the text's own
   spaces. */
(() => {
  const empty = (field) => {
    const walk = document.createTreeWalker(field, NodeFilter.SHOW_TEXT);
    while (walk.nextNode()) {
      const t = walk.currentNode;
      const inText = t.parentElement && t.parentElement.classList.contains('text');
      if (t.data && !/\\S/.test(t.data) && !inText) t.data = '';
    }
  };
  const watch = () => {
    const field = document.querySelector('#spec-text');
    if (!field) return setTimeout(watch, 200);
    empty(field);
    new MutationObserver(() => empty(field)).observe(field, {childList: true, subtree: true, characterData: true});
  };
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', watch); else watch();
})();
</script>"""


PRELOAD_MODES = ("off", "now", "background")


def build_demo(presets: Mapping[str, Preset] | None = None, default_preset: str | None = None,
               pair_factory: PairFactory = load_preset, examples: list[Example] | None = None,
               preload: str = "off", text_every: float = 0.25, plot_every: float = 1.0, queue_size: int = 32,
               pool_capacity: int = 1, cache_examples: str = "lazy",
               setup: Callable[[], None] | None = None, policies: tuple[str, ...] = ()) -> gr.Blocks:
    """The demo over `presets` (default: app.served.SERVED; the UI offers only these; the first is the default
    unless `default_preset` names another). `pair_factory(preset) -> ModelPair` loads a pair;
    tests pass one that builds tiny models. `preload`: "off" loads the default pair on first use, "now" before
    returning (a ZeroGPU Space must place it before launch), "background" in a thread while the page is served (a
    run meanwhile waits and says so); `text_every` / `plot_every`: minimum seconds between streamed text / figure
    updates (the first token shows at once; all streamed updates together cost at most 4% of a race's wall time:
    app/pacing.py); `pool_capacity` is how many pairs stay loaded at once. `cache_examples`: "lazy" (an example's
    first click races it with the defaults and stores the result; later clicks show it, labelled as cached:
    app/examples.py) or "off" (a click only fills the inputs). `setup`: queued first on the device thread, so that
    every pair load comes after it (PairPool's `setup`; app.py: torch's thread count and Numba's background compile).
    `policies`: names registered with sage_engine.register_policy (app.py's --policy-module) that the dropdown and
    the API offer after the engine's own."""
    if preload not in PRELOAD_MODES:
        raise ValueError(f"preload must be one of {', '.join(PRELOAD_MODES)} (got {preload!r})")
    if cache_examples not in CACHE_MODES:
        raise ValueError(f"cache_examples must be one of {', '.join(CACHE_MODES)} (got {cache_examples!r})")
    presets = served() if presets is None else presets
    preset = pick(presets, default_preset)
    pool = PairPool(presets, pair_factory, capacity=pool_capacity, setup=setup)
    choices = policy_choices(policies)
    handlers = Handlers(pool, RunFiles(), preset.name, text_every=text_every, plot_every=plot_every, policies=choices)
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        ui = build_layout(presets, preset.name, policies=choices)
        add_examples(ui, load_examples() if examples is None else examples, handlers, cache_examples)
        wire(demo, ui, handlers)
    demo.queue(max_size=queue_size)
    calm_queue(demo)
    if preload == "background":
        pool.load_in_background(preset.name)
    elif preload == "now":
        pool.preload(preset.name)
    return demo


QUEUE_POLL_S = 0.02  # Gradio's default on Linux: 0.001
PROGRESS_POLL_S = 0.1  # Gradio's default: 0.01


def calm_queue(demo: gr.Blocks) -> None:
    """Make Gradio's queue loops poll less often.

    On Linux the queue checks for work every 1 ms and for progress every 10 ms (gradio/queueing.py,
    `sleep_when_free`, `progress_update_sleep_when_free`); every wake-up takes the GIL from the decoding
    thread. Measured on the tinyworld pair (2 CPU cores): 15-25% fewer tokens/s with the server merely
    running; at 20 ms / 100 ms the loss is within noise and a run starts at most 20 ms later. These are
    private attributes: if a Gradio upgrade renames them, nothing breaks and test_app_compare.py says so.
    """
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = QUEUE_POLL_S
    if queue is not None and hasattr(queue, "progress_update_sleep_when_free"):
        queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def launch_options(max_file_size: str | int = "64mb") -> dict:
    """Keyword arguments for `demo.launch()` (Gradio 6 takes theme and css there, not in Blocks)."""
    return dict(max_file_size=max_file_size, css=CSS, head=HEAD, theme=gr.themes.Soft(primary_hue="violet"),
                footer_links=["api", "gradio"])
