"""Measuring the engine: the benchmark (`bench.py`, its suites and BENCHMARKS.md's suites report), the paper's
experiments (`experiments/`), `sage doctor` (`doctor/`), `check-sampling` and transformers' own `generate()` as a
reference. It reads the engine; the engine never imports it.

Nothing is imported here: `sage_engine.evaluation.premise` stays importable without torch (the demo's page needs it).
"""
