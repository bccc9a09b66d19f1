"""Every command the README shows runs as written: `generate` commands run, `render` renders (into a
temporary folder), and the commands that take minutes to hours (bench, report, train, eval, ship, card)
are parsed by their own command-line parsers, so a renamed or removed flag fails here."""

import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[list[str]]:
    """The `python -m sage_engine...` / `sage ...` lines of the README's bash blocks, as argv lists."""
    commands, in_bash = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        argv = shlex.split(line, comments=True)
        while argv and "=" in argv[0]:  # environment assignments (HF_HUB_OFFLINE=1)
            argv = argv[1:]
        if argv[:2] == ["python", "-m"] and argv[2].startswith("sage_engine"):
            commands.append(argv[2:])
        elif argv[:1] == ["sage"]:
            commands.append(["sage_engine", *argv[1:]])
    return commands


COMMANDS = readme_commands()


def test_the_readme_shows_each_kind_of_command():
    kinds = {(c[0], c[1]) for c in COMMANDS if len(c) > 1}
    assert {("sage_engine", "generate"), ("sage_engine", "bench"), ("sage_engine.tinyworld", "render"),
            ("sage_engine.tinyworld", "train")} <= kinds


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_readme_command_runs_as_written(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    module, args = argv[0], argv[1:]
    if module == "sage_engine":
        from sage_engine.cli import build_parser, main

        if args[0] == "generate":
            assert main(args) == 0, capsys.readouterr().err
        else:
            build_parser().parse_args(args)
    elif module == "sage_engine.tinyworld":
        from sage_engine.tinyworld.__main__ import build_parser, main

        if args[0] == "render":
            out = args.index("--out") + 1
            main([*args[:out], str(tmp_path / "fresh"), *args[out + 1:]])
            assert any((tmp_path / "fresh").glob("*.png")) and any((tmp_path / "fresh").glob("*.mp4"))
        else:
            build_parser().parse_args(args)
    elif module == "sage_engine.evaluation.suites_report":
        from sage_engine.evaluation.suites_report import build_parser

        build_parser().parse_args(args)
    else:
        pytest.fail(f"the README shows a command this test does not know: {' '.join(argv)}")


def test_the_readme_results_table_is_the_one_the_reports_give():
    """The README's table is written from docs/bench/ by `sage_engine.evaluation.suites_report --readme` (no hand
    edits)."""
    import json

    from sage_engine.evaluation.suites_markdown import README_END, README_START, readme_table

    text = (ROOT / "README.md").read_text()
    block = text[text.index(README_START) + len(README_START) : text.index(README_END)].strip()
    reports = {p.stem: json.loads(p.read_text()) for p in (ROOT / "docs" / "bench").glob("*.json") if p.stem != "meta"}
    assert block == readme_table(reports)


def test_the_readme_library_example_runs(monkeypatch, capsys):
    import re

    monkeypatch.chdir(ROOT)
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    assert "SpecEngine" in code
    exec(compile(code.replace("max_new_tokens=96", "max_new_tokens=24"), "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()


def test_the_readme_is_for_users():
    """At most 15 KB, and no run history (dates, run names, 'the run before')."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15 * 1024
    assert not re.search(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b|committed run|the run before|\brun [A-Z][0-9]\b", text)


def test_the_readme_doctor_table_is_the_one_the_cpu_report_gives():
    """The README's GPU section shows the doctor's first table from docs/doctor/cpu.json, written by
    `doctor --readme` (no hand edits)."""
    import json

    from sage_engine.evaluation.doctor.summary import README_END, README_START, headline

    report = json.loads((ROOT / "docs" / "doctor" / "cpu.json").read_text())
    block = (ROOT / "README.md").read_text().split(README_START)[1].split(README_END)[0].strip()
    assert block == "\n".join(headline(report))
    assert report["mismatches"] == [] and report["seconds"] < 180  # the CPU run: exact, in under 3 minutes
