"""Research tools for the tinyworld pair: small probes of a trained model, outside the product package.

Run them from the repository root, e.g. `python -m tools.attention_probe assets/models/tinyworld-target`.
- attention_probe.py: does each attention head look at the object a question asks about?
- place_probe.py: does each layer's state at a visual token say which row and column the token is in?
What they found on the pairs trained so far is in sage_engine/tinyworld/RUNS.md.
- reliability.py (with reliability_phases.py, reliability_report.py): the demo's slow checks as a public Space
  (load, soak, leaving mid-run), written to RELIABILITY.md: `python -m tools.reliability --out RELIABILITY.md`.
"""
