"""Every command of README.md's and docs/'s code blocks runs as written from a fresh clone after
`make install`: the commands are read from the pages themselves, and each --help, -n (dry run),
where, status and cost command runs in a scratch copy of the repository whose .venv is the
running one. The rest (they train, delete, submit, open an editor or never end) are listed with
the reason they are not run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ASSIGNMENTS = re.compile(r"""(\w+=("[^"]*"|'[^']*'|\S+)\s*)+""")
# What a command must name to run here: it prints help, plans (a dry run) or reads.
RUNS = re.compile(r"(^|\s)(--help|-n)(\s|$)|ihsweep\.(where|status|cost)\b|\bmake cost\b")
# Why a command that names one of those is still not run, by a pattern it contains.
NOT_RUN = {
    r"--watch": "redraws until Ctrl-C",
    r"(^|\s)rm\s": "deletes results, then trains",
    r"--profile slurm": "submits SLURM jobs",
    r"\$EDITOR": "opens an editor",
    r"--study\s": "reports a study that an earlier run recorded",
    r"--directory\s+/": "reads a folder of the reader's",
}
# A program of the venv run without .venv/bin/ (first in a command, after a pipe, a ; or &&,
# in $(...) or a variable's value): it runs only inside an activated venv.
BARE = re.compile(
    r"""(?:^|[;&|(="']\s*)(python|snakemake|pytest|tensorboard|ruff|snakefmt)(?![\w-])"""
)


def without_comment(line: str) -> str:
    """``line`` up to a # that starts a shell comment (outside quotes, after a blank)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def doc_commands() -> list[tuple[str, str, str]]:
    """(page, the shell variables its block set before, command) of every code block line."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text()):
            setup = []
            for line in re.sub(r"\\\n", " ", block).splitlines():
                command = without_comment(line).strip()
                if ASSIGNMENTS.fullmatch(command):
                    setup.append(command)
                elif command:
                    found.append((page.relative_to(REPO).as_posix(), "; ".join(setup), command))
    return found


def why_not_run(command: str) -> str | None:
    if not RUNS.search(command):
        return "not a --help, -n, where, status or cost command"
    return next((why for pattern, why in NOT_RUN.items() if re.search(pattern, command)), None)


def scratch_clone(root: Path) -> Path:
    """The repository's files (tracked, and new ones git does not ignore) under ``root``, with
    a .venv that is the running venv, as `make install` leaves it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    clone = root / "clone"
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    venv, prefix = clone / ".venv", Path(sys.prefix)
    (venv / "bin").mkdir(parents=True)
    shutil.copy(prefix / "pyvenv.cfg", venv)  # python finds its packages through it
    for part in ("lib", "lib64", "include"):
        if (prefix / part).exists():
            (venv / part).symlink_to(prefix / part)
    for program in (prefix / "bin").iterdir():
        (venv / "bin" / program.name).symlink_to(program)
    (venv / ".installed").touch()  # newer than pyproject.toml and the lock: make installs nothing
    return clone


def clone_environment(clone: Path) -> dict[str, str]:
    """The clone's package, not the one the running venv installed."""
    return dict(os.environ, PYTHONPATH=str(clone / "workflow"))


def test_the_docs_commands_use_the_venvs_programs():
    bare = [
        f"{page}: {command}"
        for page, setup, command in doc_commands()
        if BARE.search(f"{setup}; {command}") and "-m venv" not in command
    ]
    assert not bare, "put .venv/bin/ before the venv's programs:\n" + "\n".join(bare)


def test_the_commands_are_read_from_every_page_with_their_variables():
    commands = doc_commands()
    assert len({page for page, _, _ in commands}) >= 6
    setups = {setup for _, setup, command in commands if command.startswith("$S --report")}
    assert setups == {'S=.venv/bin/snakemake W=".venv/bin/python -m ihsweep.where"'}
    assert without_comment("a 'b # c' # d") == "a 'b # c' "


@pytest.mark.slow
def test_every_help_dry_run_where_status_and_cost_command_runs_as_written(tmp_path, capsys):
    clone = scratch_clone(tmp_path)
    ran, skipped, failed = [], [], []
    for page, setup, command in doc_commands():
        why = why_not_run(command)
        if why:
            skipped.append(f"  {page}: {command}  ({why})")
            continue
        done = subprocess.run(
            ["bash", "-c", f"set -eo pipefail; {setup}\n{command}"], cwd=clone,
            env=clone_environment(clone), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        ran.append(command)
        if done.returncode != 0:
            failed.append(f"{page}: {command}\n{(done.stdout + done.stderr)[-2000:]}")
    with capsys.disabled():
        print(f"\nran {len(ran)} commands of the docs; skipped {len(skipped)}:")
        print("\n".join(skipped))
    assert len(ran) >= 8, ran
    assert not failed, "\n\n".join(failed)
