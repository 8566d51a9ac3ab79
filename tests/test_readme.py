"""The README's quick-start commands stay true: the test command is the one CI runs (`.ci/run`),
and what both install commands name (extras, the notebook to open) exists. That the examples run
under `jupyter nbconvert --execute` with default options is tests/test_examples.py's job."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CI_MARK = "# The README's test command (keep the two in step):"


def readme_commands() -> list[str]:
    """The one-line commands of the README's quick start (its first ```bash blocks)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [b.strip() for b in blocks if "\n" not in b.strip()]


def ci_test_command() -> str:
    """The line of .ci/run under its 'keep the two in step' comment."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert lines.count(CI_MARK) == 1, f".ci/run lost its line {CI_MARK!r}"
    return lines[lines.index(CI_MARK) + 1].strip()


def test_readme_test_command_is_the_one_ci_runs():
    # GIVEN the README's "install and run every test" command and .ci/run
    (command,) = [c for c in readme_commands() if c.endswith("python -m pytest")]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # WHEN the README's command is split into the venv it makes and what runs in it
    make_venv, activate, installed_and_tested = command.split(" && ", 2)
    # THEN CI runs the same install-and-test command, character for character ...
    assert installed_and_tested == ci_test_command()
    # ... in a fresh .venv made and activated the same way (with the python3 CI's image has)
    assert make_venv == "python3.11 -m venv .venv"
    assert "python3 -m venv .venv" in ci_lines and activate in ci_lines


def test_readme_install_commands_name_extras_and_files_that_exist():
    # GIVEN the README's two quick-start commands and the project's extras
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # (tomllib: 3.11 on)
    table = pyproject.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    extras = set(re.findall(r"^(\w+) = \[", table, flags=re.M))
    assert {"test", "examples"} <= extras, extras
    commands = readme_commands()
    assert len(commands) == 2, commands
    for command in commands:
        # THEN each extra it installs is declared ...
        for extra in re.findall(r'pip install -e "\.\[(\w+)\]"', command):
            assert extra in extras, (extra, extras)
        # ... and each notebook it opens is in the repository
        for notebook in re.findall(r"\S+\.ipynb", command):
            assert (ROOT / notebook).is_file(), notebook


def test_the_notebook_command_runs_as_root_as_written():
    # GIVEN the README's "install and open the notebooks" command
    (command,) = [c for c in readme_commands() if "jupyter lab" in c]
    # THEN it starts JupyterLab with --allow-root: as root JupyterLab exits without it, after
    # minutes of installing (issue 36); for other users the flag changes nothing
    assert "jupyter lab --allow-root " in command
