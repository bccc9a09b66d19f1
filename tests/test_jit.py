"""jit.py: compiled functions called from Python run compiled or, while compiling is deferred, as plain Python; the
disk cache is keyed by the compiled modules' sources; a deferred engine serves at once on uncompiled paths, and the
background compile leaves a complete cache that the next engine uses."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_equivalence import MAX_NEW, sharp_case

from sage_engine import SpecEngine
from sage_engine.core import jit, rules

pytestmark = pytest.mark.skipif(jit.numba is None, reason="Numba is not installed")
ROOT = Path(__file__).resolve().parents[1]


def test_a_compiled_rule_runs_compiled_or_as_python_with_the_same_numbers(monkeypatch):
    top = np.array([0.5, 0.2, 0.1, 0.05], np.float64)
    compiled = rules.confidence(top)
    calls = []
    monkeypatch.setattr(jit, "ACTIVE", False)
    monkeypatch.setattr(rules.confidence, "py_func", lambda row: calls.append(row) or rules.confidence.__wrapped__(row))
    assert rules.confidence(top) == compiled and len(calls) == 1  # the plain function ran


def test_the_cache_folder_follows_every_compiled_modules_source(monkeypatch, tmp_path):
    for name in jit.SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(jit.HERE / name, tmp_path / name)
    monkeypatch.setattr(jit, "HERE", tmp_path)
    before = jit.cache_dir()
    assert before == jit.cache_dir()
    with open(tmp_path / "core" / "rules.py", "a") as f:
        f.write("\n# an edit\n")
    assert jit.cache_dir() != before  # an edit of a called module starts a fresh cache


def test_a_deferred_engine_runs_uncompiled_paths_and_says_so(monkeypatch):
    pair, prep = sharp_case("qwen2.5-vl", "image", "noisy")
    reference = SpecEngine(pair).generate(prep, "ar", max_new_tokens=MAX_NEW, ignore_eos=True).token_ids
    monkeypatch.setattr(jit, "ACTIVE", False)
    engine = SpecEngine(pair)
    assert engine.compiled is False and engine.draft.tree_forward == "fused+numpy"
    assert any("compiles in the background" in n for n in engine.backends()["draft"]["notes"])
    res = engine.generate(prep, "sage", max_new_tokens=MAX_NEW, ignore_eos=True)
    assert res.token_ids == reference and res.stats.draft_paths.keys() <= {"python"}


@pytest.mark.timeout(300)
def test_the_background_compile_completes_the_cache(tmp_path):
    """What `defer_compile` starts: `python -m sage_engine.backends.warmup` compiles every function into the cache and
    marks it complete (a fresh cache folder: the whole compile, ~20 s)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "sage_engine.backends.warmup"], cwd=ROOT, env=env, check=True, timeout=280)
    marks = list(tmp_path.glob("numba-*/ready"))
    assert len(marks) == 1 and any(marks[0].parent.rglob("*.nbi"))


def test_a_second_warmup_leaves_the_compile_to_the_first(tmp_path, monkeypatch):
    """A warmup started while another holds the cache's lock (a server restarted before its first compile finished)
    exits at once without compiling or marking the cache: the first one finishes the job."""
    import fcntl

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    folder = jit.cache_dir()  # the warmup's folder: it reads the same variable
    folder.mkdir(parents=True)
    with open(folder / "compiling", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first warmup, still compiling
        subprocess.run([sys.executable, "-m", "sage_engine.backends.warmup"], cwd=ROOT, check=True, timeout=120)
        assert not list(tmp_path.glob("numba-*/ready")) and not list(tmp_path.rglob("*.nbi"))
