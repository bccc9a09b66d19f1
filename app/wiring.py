"""Events, wired in one place: which component triggers which handler, with which queue."""

from __future__ import annotations

import gradio as gr

from .handlers import API_DESCRIPTION, Handlers
from .layout import Ui
from .view import View

# After Run on a phone: the results (both texts, then the scoreboard) scrolled onto the screen.
SHOW_RESULTS_ON_PHONE = """() => {
  if (window.innerWidth > 700) return;
  const show = () => document.querySelector('#ar-text')?.scrollIntoView({block: 'start'});
  show();
  for (const ms of [300, 1000, 2000]) setTimeout(show, ms);  // again once the charts below have been drawn
}"""

DEVICE = "device"  # one run per device at a time: every model-using event shares this concurrency id

# gr.Video's frontend toasts "Video not playable" as soon as the browser fails to decode an upload (e.g. 'mp4v').
# Once the page shows our playable preview of it (media.Previews), that toast is wrong: close it, or hide just
# that message when Gradio grouped it with other errors (now, and once more a moment later in case the browser
# reported the error late).
DISMISS_STALE_VIDEO_ERROR = """() => {
  const close = () => {
    const src = document.querySelector('#video video')?.currentSrc || '';
    const cleared = !document.querySelector('#video video');  // an unreadable upload, taken out: the status says why
    if (!src.includes('preview-') && !cleared) return;
    for (const text of document.querySelectorAll('[data-testid="toast-text"]')) {
      if (text.textContent.trim() !== 'Video not playable') continue;
      const body = text.closest('[data-testid="toast-body"]');
      const items = body ? body.querySelectorAll('[data-testid="toast-text"]').length : 0;
      if (items === 1) body.querySelector('[data-testid="toast-close"]')?.click();
      else (text.closest('.toast-message-item') || text).style.display = 'none';  // grouped with other errors
    }
  };
  close();
  setTimeout(close, 1000);
}"""


def wire(demo: gr.Blocks, ui: Ui, h: Handlers) -> None:
    # Run: arm the session's Stop switch and grey out both Run buttons at once (not queued), then the run itself
    # (queued per device), then the buttons back (.then runs after an error or a Stop too).
    c = ui.compare
    buttons = [ui.run, c.run]
    charts = [ui.fig_alpha, ui.fig_accepted, ui.fig_mapping, ui.fig_time]
    race = gr.on(
        triggers=[ui.run.click, ui.prompt.submit], fn=h.arm, inputs=ui.control, outputs=buttons, queue=False,
        api_visibility="private",
    ).then(
        fn=h.compare,
        inputs=[ui.image, ui.video, ui.prompt, ui.max_new_tokens, ui.policy, ui.preset, ui.control],
        inputs_kwargs=ui.knobs.as_kwargs(),
        outputs=View.outputs(ui),
        api_name="compare",
        api_description=API_DESCRIPTION,
        concurrency_id=DEVICE,
        concurrency_limit=1,
        show_progress_on=[ui.status],  # a progress overlay on the outputs would hide the streamed text
    )
    race.failure(fn=h.release, outputs=buttons, queue=False, api_visibility="private")  # a refused run (below)
    race.then(fn=h.release, outputs=buttons, queue=False, api_visibility="private").then(
        fn=h.story, inputs=[ui.run_state, ui.step], outputs=ui.story, api_visibility="private", queue=False,
        show_progress="hidden").then(
        fn=h.redraw_expert, inputs=[ui.run_state, ui.expert], outputs=charts, api_visibility="private",
        queue=False, show_progress="hidden").then(fn=None, js=SHOW_RESULTS_ON_PHONE, api_visibility="private",
                                                  queue=False)  # the charts came in below: the results again
    ui.run.click(None, js=SHOW_RESULTS_ON_PHONE, api_visibility="private", queue=False)
    ui.expert.change(h.redraw, [ui.run_state, ui.expert], charts, api_visibility="private", queue=False,
                     show_progress="hidden")
    # Compare policies: every policy on the same input, one queued job on the device like a run
    comparison = c.run.click(fn=h.arm, inputs=ui.control, outputs=buttons, queue=False,
                             api_visibility="private").then(
        fn=h.comparison.run, inputs=[ui.image, ui.video, ui.prompt, ui.max_new_tokens, ui.preset, ui.control],
        outputs=c.outputs(), api_name="compare_policies", concurrency_id=DEVICE, concurrency_limit=1,
        show_progress_on=[c.status])
    # the buttons back after the run: .then after a success or a Stop; Gradio 6.31's page does not run a .then after
    # a queued event that raised (a refused input), .failure does
    for done in (comparison.then, comparison.failure):
        done(fn=h.release, outputs=buttons, queue=False, api_visibility="private")
    c.point.change(h.comparison.show, [c.lanes, c.point], c.trees, api_visibility="private", concurrency_limit=None,
                   show_progress="hidden", trigger_mode="always_last")
    # Stop flips the switch; the decoding thread checks it every step and the run then reports what it has
    # (a Gradio cancel would kill the handler before it could say so).
    ui.stop.click(h.stop, ui.control, None, api_visibility="private", queue=False)
    ui.prev_step.click(h.previous_step, [ui.run_state, ui.step], ui.step, api_visibility="private", queue=False,
                       show_progress="hidden")
    ui.next_step.click(h.next_step, [ui.run_state, ui.step], ui.step, api_visibility="private", queue=False,
                       show_progress="hidden")
    ui.step.change(h.scrub, [ui.run_state, ui.step], [ui.fig_tree, ui.step, ui.story], api_visibility="private",
                   concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")
    ui.video.change(h.preview_frames, [ui.video, ui.preset], [ui.video, ui.frames, ui.status],
                    api_visibility="private").then(
        fn=None, js=DISMISS_STALE_VIDEO_ERROR, api_visibility="private", queue=False)
    ui.preset.change(h.describe_model, ui.preset, ui.model_info, api_visibility="private", queue=False)
    demo.load(h.on_load, ui.preset, [ui.model_info, ui.status], api_visibility="private", queue=False)
    ui.model_timer.tick(h.model_tick, [ui.preset, ui.status], [ui.model_info, ui.status, ui.model_timer],
                        api_visibility="private", queue=False, show_progress="hidden")
