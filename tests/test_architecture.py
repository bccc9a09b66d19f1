"""docs/ARCHITECTURE.md matches the code: every module it names exists, and its extension examples run."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_every_module_the_architecture_names_exists():
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", DOC)) | set(re.findall(r"\b([a-z_]+/)`", DOC))
    missing = []
    for name in named:
        found = (ROOT / "sage_engine" / name).exists() or (ROOT / name).exists() or (ROOT / "tests" / name).exists()
        missing += [] if found else [name]
    assert named and not missing, missing


EXAMPLES = re.findall(r"```python\n(.*?)```", DOC, re.S)


@pytest.mark.parametrize("code", EXAMPLES, ids=["policy", "family", "kind", "backend"][: len(EXAMPLES)])
def test_the_extension_examples_run(code, monkeypatch):
    from sage_engine import config, families, policies
    from sage_engine.backends import choose

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))  # the examples register into copies
    monkeypatch.setattr(choose, "REGISTERED", dict(choose.REGISTERED))
    monkeypatch.setattr(policies, "_POLICIES", dict(policies._POLICIES))
    monkeypatch.setattr(config, "POLICY_CONFIGS", dict(config.POLICY_CONFIGS))
    exec(compile(code, "docs/ARCHITECTURE.md", "exec"), {"__name__": "example"})


def test_there_are_four_examples():
    assert len(EXAMPLES) == 4
