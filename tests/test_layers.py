"""The package's design, checked: its layers (import-linter's contracts in pyproject.toml), the
reading tools' imports, and the size limits of its modules and functions.

The contracts run on the package as it is, and on copies of it with one rule broken, so that a
test that checks them can fail: a module outside every layer, training importing probing, a
cycle between two modules of a package, status loading torch.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "workflow" / "ihsweep"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def lint_imports(root: Path, package_parent: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with ``root``'s pyproject.toml on the package under ``package_parent``."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_package_keeps_its_contracts():
    proc = lint_imports(REPO, REPO / "workflow")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 kept, 0 broken" in proc.stdout


def documented_layers() -> list[list[str]]:
    """The modules column of docs/architecture.md's layer table, one list per row."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("| layer (top to bottom) |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    cells = [re.split(r"(?<!\\)\|", row) for row in rows]
    return [sorted(re.findall(r"`(\w+)`", row[2])) for row in cells]


def test_architecture_md_lists_the_contracts_layers():
    """The page's table holds the contract's layers, in order, one row each."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    layers = [sorted(name.strip() for name in layer.split("|")) for layer in contract["layers"]]
    assert documented_layers() == layers


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the package and of pyproject.toml, to break one rule in."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        PACKAGE, tmp_path / "src" / "ihsweep", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def add_line(path: Path, line: str) -> None:
    before = path.read_text() if path.exists() else '"""A module no layer holds."""\n'
    path.write_text(before + f"\n{line}\n")


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("stray.py", "X = 1", "Each layer imports only the layers below it BROKEN"),
        ("training/loop.py", "from ihsweep.probing import scores  # noqa",
         "Each layer imports only the layers below it BROKEN"),
        ("config/schema.py", "from ihsweep.config import study  # noqa",
         "No import cycle between the modules of any package BROKEN"),
        ("status/table.py", "import torch  # noqa", "load no torch BROKEN"),
    ],
)  # fmt: skip
def test_a_broken_rule_breaks_its_contract(package_copy, module, line, broken):
    add_line(package_copy / "src" / "ihsweep" / module, line)
    proc = lint_imports(package_copy, package_copy / "src")
    assert proc.returncode != 0 and broken in proc.stdout, proc.stdout[-3000:]


def test_importing_status_loads_no_torch():
    """``python -m ihsweep.status`` reads JSON files of a study training elsewhere: no torch."""
    code = "import sys, ihsweep.status, ihsweep.cost.report; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_no_module_or_function_over_its_size_limit():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {length}")
    assert not too_long, too_long


def test_the_package_imports_no_benchmark():
    """bench/ holds tools that use the package; the package never imports them."""
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            if any(name == "bench" or name.startswith("bench.") for name in names):
                importers.append(str(path.relative_to(REPO)))
    assert not importers, importers
