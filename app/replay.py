"""The race replay: both texts typed out at their measured speeds, started together, in the browser.

The server renders the final state with the timeline (arrival time and text length after every
step) in a data attribute; a small script attached once to the component animates it on click.
Nothing runs on the server during a replay.
"""

from __future__ import annotations

import json
from html import escape

from .record import Lane, RunRecord
from .theme import AMBER, VIOLET, lane_title

CSS = """
.race { border: 1px solid #e2e8f0; border-radius: 10px; padding: 10px 12px; background: #fff; }
.race-bar { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; margin-bottom: 8px; font-size: 13px; }
.race-bar button { background: #7c3aed; color: #fff; border: 0; border-radius: 6px; padding: 5px 12px;
  cursor: pointer; font-weight: 600; }
.race-bar button:disabled { background: #cbd5e1; cursor: default; }
.race-clock { font-variant-numeric: tabular-nums; color: #475569; }
.lane { margin: 6px 0 10px; }
.lane-head { display: flex; justify-content: space-between; font-size: 12px; color: #475569; }
.lane-track { height: 8px; background: #f1f5f9; border-radius: 4px; overflow: hidden; margin: 3px 0; }
.lane-fill { height: 100%; width: 0%; border-radius: 4px; }
.lane-text { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; max-height: 7.5em;
  overflow: auto; margin: 0; color: #0f172a; }
"""

# Attached once per page; handles every re-render of the component through event delegation.
JS = """
const fmt = (s) => s.toFixed(2) + ' s';
let timer = null;
element.addEventListener('click', (e) => {
  const button = e.target.closest('.race-play');
  if (!button) return;
  const root = element.querySelector('.race');
  const data = JSON.parse(root.dataset.timeline || '{}');
  if (!data.lanes) return;
  const speed = parseFloat(element.querySelector('.race-speed').value) || 1;
  const clock = element.querySelector('.race-clock');
  const end = Math.max(...data.lanes.map((l) => l.seconds));
  const t0 = performance.now();
  if (timer) cancelAnimationFrame(timer);
  const frame = () => {
    const boxes = root.querySelectorAll('.lane');
    if (!root.isConnected || boxes.length < data.lanes.length) { timer = null; return; }  // a new run redrew it
    const t = (performance.now() - t0) / 1000 * speed;
    data.lanes.forEach((lane, i) => {
      let k = -1;
      while (k + 1 < lane.times.length && lane.times[k + 1] <= t) k++;
      const chars = k < 0 ? 0 : lane.ends[k];
      const box = boxes[i];
      box.querySelector('.lane-text').textContent = lane.text.slice(0, chars);
      box.querySelector('.lane-fill').style.width = (100 * chars / Math.max(1, lane.text.length)) + '%';
      box.querySelector('.lane-time').textContent = t >= lane.seconds ? '✓ ' + fmt(lane.seconds) : fmt(t);
    });
    const slowed = speed !== 1 ? ' (slowed ' + (1 / speed) + '×)' : '';
    clock.textContent = 'replay clock ' + fmt(Math.min(t, end)) + slowed;
    if (t < end) timer = requestAnimationFrame(frame);
  };
  frame();
});
"""

SPEEDS = (("1", "real time"), ("0.5", "½ speed"), ("0.25", "¼ speed"), ("0.1", "1/10 speed"))


def _lane(x: Lane) -> dict:
    return {"title": lane_title(x.name, x.policy), "seconds": x.seconds or 0.0, "times": x.arrivals,
            "ends": x.text_ends, "text": x.text, "color": AMBER if x.name == "ar" else VIOLET}


def _lane_html(lane: dict, done: bool) -> str:
    fill = "100%" if done else "0%"
    tokens = escape(lane["text"]) if done else ""
    return (f'<div class="lane"><div class="lane-head"><b style="color:{lane["color"]}">{escape(lane["title"])}'
            f'</b><span class="lane-time">{lane["seconds"]:.2f} s</span></div>'
            f'<div class="lane-track"><div class="lane-fill" style="width:{fill};background:{lane["color"]}">'
            f'</div></div><pre class="lane-text">{tokens}</pre></div>')


def replay_html(record: RunRecord | None) -> str:
    """The replay panel; its button is enabled once both lanes finished (a stopped run is not raced: its lanes may
    have been cut at different points, even where both have ended)."""
    ready = record is not None and record.done and not record.stopped
    lanes = [_lane(record.ar), _lane(record.spec)] if ready else []
    timeline = escape(json.dumps({"lanes": lanes}), quote=True) if ready else ""
    options = "".join(f'<option value="{v}"{" selected" if v == "1" else ""}>{label}</option>' for v, label in SPEEDS)
    bar = (f'<div class="race-bar"><button class="race-play"{"" if ready else " disabled"}>▶ Replay the race'
           f'</button><select class="race-speed">{options}</select><span class="race-clock">'
           f'{"both start together, each at its measured speed" if ready else "available after a run"}</span></div>')
    body = "".join(_lane_html(x, True) for x in lanes)
    return f'<div class="race" data-timeline="{timeline}">{bar}{body}</div>'
