"""docs/ARCHITECTURE.md matches the code: every module it names exists, the packages import each other only in the
layers it states, and its extension examples run."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_every_module_the_architecture_names_exists():
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", DOC)) | set(re.findall(r"`((?:[a-z_]+/)+)`", DOC))
    missing = []
    for name in named:
        found = (ROOT / "sage_engine" / name).exists() or (ROOT / name).exists() or (ROOT / "tests" / name).exists()
        missing += [] if found else [name]
    assert named and not missing, missing


EXAMPLES = re.findall(r"```python\n(.*?)```", DOC, re.S)


@pytest.mark.parametrize("code", EXAMPLES, ids=["policy", "family", "kind", "backend"][: len(EXAMPLES)])
def test_the_extension_examples_run(code, monkeypatch):
    from sage_engine import config, policies
    from sage_engine.backends import choose
    from sage_engine.models import families

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))  # the examples register into copies
    monkeypatch.setattr(choose, "REGISTERED", dict(choose.REGISTERED))
    monkeypatch.setattr(policies, "_POLICIES", dict(policies._POLICIES))
    monkeypatch.setattr(config, "POLICY_CONFIGS", dict(config.POLICY_CONFIGS))
    exec(compile(code, "docs/ARCHITECTURE.md", "exec"), {"__name__": "example"})


def test_there_are_four_examples():
    assert len(EXAMPLES) == 4


# The layers of docs/ARCHITECTURE.md ("Layout"): what each part of the code may import from sage_engine, sage_testing
# and app. The engine is core/, policies/, models/ and backends/ with config.py, errors.py and reference.py: its
# packages import each other (the engine runs a ModelPair on its backends; the checks and backends use the core's
# tree, cache and rules), but nothing above them.
ENGINE = {"core", "policies", "models", "backends", "config", "errors", "reference"}
MAY_IMPORT = {
    **{part: ENGINE for part in ENGINE},
    "tinyworld": ENGINE | {"tinyworld"},
    "sage_testing": ENGINE | {"sage_testing"},
    "run_flags": ENGINE | {"run_flags"},
    "evaluation": ENGINE | {"evaluation", "tinyworld", "run_flags"},
    "cli": ENGINE | {"evaluation", "tinyworld", "run_flags", "cli", "package"},
    "app": ENGINE | {"evaluation", "tinyworld", "run_flags", "cli", "package", "app"},
}
# beyond the layers: the doctor checks a device on the tiny pairs of sage_testing; suites_report.py is a command itself,
# and its default policies are the CLI's bench defaults
ALLOWED = {("sage_engine/evaluation/doctor/", "sage_testing"),
           ("sage_engine/evaluation/suites_report.py", "sage_engine.cli")}


def _part(module: str) -> str:
    """The part of the code `module` (a dotted name) belongs to."""
    parts = module.split(".")
    if parts[0] in ("app", "sage_testing"):
        return parts[0]
    if len(parts) == 1:
        return "package"  # sage_engine itself: its public names
    return {"__main__": "cli"}.get(parts[1], parts[1])


def _imports(path: Path) -> set[str]:
    """Every module of ours that `path` imports, at its top or inside a function, relative imports resolved."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    ours = {m for m in found if m.split(".")[0] in ("sage_engine", "sage_testing", "app")}
    # `from sage_engine import SpecEngine` names a public name, not a module: the package's
    return {m if m.count(".") != 1 or m.startswith(("app.", "sage_testing.")) or m.split(".")[1][0].islower()
            else "sage_engine" for m in ours}


def test_the_packages_import_only_the_layers_below_them():
    files = [*(ROOT / "sage_engine").rglob("*.py"), *(ROOT / "sage_testing").rglob("*.py"),
             *(ROOT / "app").rglob("*.py"), ROOT / "app.py"]
    wrong = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        part = "app" if rel == "app.py" else _part(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for module in _imports(path):
            target = _part(module)
            allowed = any(rel.startswith(where) and (module == what or module.startswith(what + "."))
                          for where, what in ALLOWED)
            if target not in MAY_IMPORT[part] and target != part and not allowed:
                wrong.append(f"{rel} ({part}) imports {module} ({target})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_layer_check_sees_a_wrong_import():
    """Negative controls: the engine importing evaluation, or the app the test pairs, is caught."""
    assert "evaluation" not in MAY_IMPORT["core"] and "evaluation" not in MAY_IMPORT["models"]
    assert "sage_testing" not in MAY_IMPORT["app"] and "sage_testing" not in MAY_IMPORT["evaluation"]
    assert _part("sage_engine.evaluation.bench") == "evaluation" and _part("sage_testing.tiny_pairs") == "sage_testing"
    assert _imports(ROOT / "sage_engine" / "core" / "engine.py") >= {"sage_engine.models.loading",
                                                                      "sage_engine.backends.choose"}


def test_only_the_doctor_builds_test_pairs_at_run_time():
    users = {str(p.relative_to(ROOT)) for p in (ROOT / "sage_engine").rglob("*.py")
             if any(m.startswith("sage_testing") for m in _imports(p))}
    assert users and all(u.startswith("sage_engine/evaluation/doctor/") for u in users), users
