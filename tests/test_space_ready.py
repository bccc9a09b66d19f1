"""Ready to push to a Hugging Face Space: every file the Hub would refuse in plain git goes through LFS/Xet.

The Hub refuses a pushed file over 10 MB, and any binary file, that is not stored through LFS/Xet. This
reads only `.gitattributes` (through `git check-attr`), so it runs whether or not git-lfs is installed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HUB_LIMIT = 10 * 1024 * 1024


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def tracked() -> list[Path]:
    try:
        files = git("ls-files", "-z").split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in files if f and (ROOT / f).is_file()]


def lfs_covered(files: list[Path]) -> dict[str, bool]:
    out = git("check-attr", "filter", "--", *[str(f.relative_to(ROOT)) for f in files]) if files else ""
    return {line.rsplit(": filter: ", 1)[0]: line.endswith(": filter: lfs") for line in out.splitlines()}


def is_binary(path: Path) -> bool:
    """git's own test: a NUL byte in the first 8000 bytes."""
    with open(path, "rb") as f:
        return b"\0" in f.read(8000)


def test_every_large_or_binary_file_goes_through_lfs(tracked):
    large = [f for f in tracked if f.stat().st_size > HUB_LIMIT]
    binary = [f for f in tracked if is_binary(f)]
    assert any("model.safetensors" in f.name for f in large + binary), "expected the embedded weights here"
    covered = lfs_covered(sorted(set(large + binary)))
    missing = [name for name, ok in covered.items() if not ok]
    assert not missing, f"not covered by an LFS pattern in .gitattributes: {missing}"


def test_the_check_itself_catches_a_plain_file(tracked):
    """The negative control: a name no pattern covers is reported as not LFS."""
    covered = lfs_covered([ROOT / "weights.unknown-ext", ROOT / "x" / "model.safetensors"])
    assert covered == {"weights.unknown-ext": False, "x/model.safetensors": True}


def test_readme_front_matter_describes_a_gradio_space():
    text = (ROOT / "README.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert front, "README.md must start with the Space's YAML front matter"
    fields = dict(line.split(": ", 1) for line in front.group(1).splitlines() if ": " in line)
    assert fields["sdk"] == "gradio" and (ROOT / fields["app_file"]).is_file()
    import gradio

    assert fields["sdk_version"] == gradio.__version__  # the Space runs the Gradio the tests ran


def test_the_page_says_what_the_embedded_pair_knows():
    """Beside the model pair: what tinyworld was trained on and what it does with other pictures."""
    import app_server

    from app.handlers import Handlers
    from app.media import RunFiles
    from app.pool import PairPool

    table = {"tinyworld": app_server.TINYWORLD}
    handlers = Handlers(PairPool(table, app_server.pair_factory), RunFiles(), "tinyworld")
    info = handlers.describe_model("tinyworld")  # not loaded: the note is there before the first run too
    assert info.startswith("**tinyworld**") and "scenes of coloured shapes" in info
    assert "in any other picture or clip" in info and "never objects" in info
    assert "\n" in info and info.count("\n") == 1  # one line for the pair, one sentence for what it knows
