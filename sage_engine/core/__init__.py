"""The engine core: one decode step's stages and what they hand on.

`engine.py` runs the loop (draft, verify, accept, compact, observe); `draft.py`, `verify.py`, `sampling.py` and
`runner.py` are its stages and one model's cache; `tree.py`, `rules.py`, `policy_io.py`, `passes.py` and `cache.py`
the data and rules they share; `costs.py` (with `cost_windows.py`) the meter that prices `priced:` policies;
`telemetry.py`, `events.py` and `transcript.py` what a run reports. docs/ARCHITECTURE.md draws the step.

Nothing is imported here: `sage_engine.core.events` stays importable without torch (the demo's page needs it).
"""
