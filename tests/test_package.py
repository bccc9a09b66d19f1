"""The installable package: pyproject's package list is complete, the wheel carries the embedded pair, and
the `sage` command is `python -m sage_engine`."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_of_sage_engine_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for part in ("sage_engine", "sage_testing")
             for p in (ROOT / part).rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    assert PYPROJECT["tool"]["setuptools"]["package-dir"]["sage_assets"] == "assets"


def test_sage_command_is_the_cli():
    assert PYPROJECT["project"]["scripts"]["sage"] == "sage_engine.cli:main"
    from sage_engine.cli import main

    assert main(["generate", "--prompt", "x", "--policy", "beam"]) == 2  # the same parser and errors


def test_requirements_and_pyproject_pin_the_same_versions():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.lower()] = version
    for dep in PYPROJECT["project"]["dependencies"]:
        name, version = dep.split("==")
        assert pins.get(name.lower()) == version, dep


def test_the_wheel_carries_the_package_and_the_embedded_pair(tmp_path):
    src = tmp_path / "src"  # a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    for part in ("sage_engine", "sage_testing", "assets"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, timeout=600)
    wheel, = tmp_path.glob("sage_engine-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in ("tinyworld-target", "tinyworld-draft"):
        for file in ("model.safetensors", "config.json", "tokenizer.json"):
            assert f"sage_assets/models/{model}/{file}" in names
    assert "sage_engine/tinyworld/world.py" in names and "sage_engine/cli.py" in names
    assert "sage_engine/core/engine.py" in names and "sage_testing/tiny_pairs.py" in names  # `sage doctor` builds them
    assert not any(n.startswith("sage_engine/") and "tiny_" in n for n in names)  # the test pairs are no engine module
    assert not any(n.startswith(("tests/", "app/")) for n in names)
