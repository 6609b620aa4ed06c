"""Every fix command the code prints ("remove it and run `snakemake <file>`, then `snakemake`")
runs as printed: each template, filled with a real path of the default study, is run with -n in
a scratch clone, whose workflow profile gives Snakemake its cores."""

from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest
from conftest import REPO, job_stats
from ihsweep.config import StudyPaths, study_of_files
from ihsweep.data.chains import CHAIN_JSON
from ihsweep.data.chunks import REGENERATE
from ihsweep.data.natural import RETOKENIZE
from ihsweep.files.io import RERUN
from ihsweep.files.layout import RUN_JSON, aggregate_file, markov_dir, natural_dir
from test_doc_commands import clone_environment, scratch_clone

TEMPLATES = {"RERUN": RERUN, "REGENERATE": REGENERATE, "RETOKENIZE": RETOKENIZE}
COMMAND = re.compile(r"`(snakemake[^`]*)`")


def printed_strings() -> set[str]:
    """Every string of the package's code (docstrings aside) that names a snakemake command."""
    found = set()
    for path in (REPO / "workflow" / "ihsweep").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "`snakemake" in node.value and id(node) not in docstrings:
                    found.add(node.value)
    return found


def test_every_printed_snakemake_command_comes_from_a_tested_template():
    assert printed_strings() == set(TEMPLATES.values())


def printed_fixes() -> list[str]:
    """The fix lines the steps print, for real files of the default study."""
    study = study_of_files([REPO / "config.yaml"])
    paths = StudyPaths(study)
    run = study.runs[0]
    data = run.data
    grid = next(iter(study.grids))
    return [
        RERUN.format(path=paths.run_file(RUN_JSON, run), step="train"),
        RERUN.format(path=paths.probe_table("model", run), step="probe"),
        RERUN.format(path=aggregate_file("lawfit.json", natural_dir(study.name)), step="aggregate"),
        RERUN.format(
            path=aggregate_file("frontier.json", markov_dir(study.name)), step="aggregate"
        ),
        RERUN.format(path=f"{paths.chain_dir(grid)}/{CHAIN_JSON}", step="chain"),
        REGENERATE.format(folder=paths.chunk_dir(data, run.context_size)),
        RETOKENIZE.format(folder=paths.dataset_dir(data)),
    ]


@pytest.mark.slow
def test_every_printed_fix_command_runs_as_printed(tmp_path):
    clone = scratch_clone(tmp_path)
    env = clone_environment(clone)
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"  # the venv entered
    commands = sorted({c for fix in printed_fixes() for c in COMMAND.findall(fix)})
    assert "snakemake" in commands and len(commands) >= 7, commands
    failed = []
    for command in commands:
        done = subprocess.run(
            f"{command} -n", shell=True, cwd=clone, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        out = done.stdout + done.stderr
        if done.returncode != 0 or not job_stats(out):
            failed.append(f"{command} -n\n{out[-2000:]}")
    assert not failed, "\n\n".join(failed)
