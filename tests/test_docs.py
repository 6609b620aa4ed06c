"""The docs stay inside the repository: every relative link in README.md and docs/ resolves (the
file, and the heading an anchor names), no tracked file refers to the external spec or to
``../shared``, which a clone does not have, and the README's commands are those CI and the
Makefile run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SCHEMA

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation but - and _ dropped, spaces
    to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def relative_links(page) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()  # fmt: skip
    for name in names:
        path = REPO / name
        if name == "tests/test_docs.py" or not path.is_file():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file


def test_no_tracked_file_refers_to_the_external_spec_or_to_shared():
    found = [
        f"{name}:{number}: {line.strip()[:80]}"
        for name, text in tracked_text_files()
        for number, line in enumerate(text.splitlines(), 1)
        if re.search(r"\bSPEC\b|\.\./shared|shared/notes|SPEC\.md", line)
    ]
    assert not found, "\n".join(found)


def test_the_readmes_commands_are_those_ci_and_the_makefile_run():
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    shown = re.findall(r"^\s*(?:\$ )?make ([a-z][\w-]*)", readme, re.MULTILINE)
    assert {"demo", "test"} <= set(shown)
    assert set(shown) <= targets, set(shown) - targets
    ci_commands = re.findall(r"^make ([a-z][\w-]*)", ci, re.MULTILINE)
    assert ci_commands == ["test"] and "make test" in readme


def schema_keys(node) -> set[str]:
    """Every key name the config schema defines, at any depth."""
    keys = set()
    if isinstance(node, dict):
        keys |= set(node.get("properties", {}))
        for sub in node.values():
            keys |= schema_keys(sub)
    elif isinstance(node, list):
        for sub in node:
            keys |= schema_keys(sub)
    return keys


def test_the_configuration_page_names_every_key_of_the_schema():
    page = (REPO / "docs" / "configuration.md").read_text()
    schema = yaml.safe_load(SCHEMA.read_text())
    missing = sorted(k for k in schema_keys(schema) if not re.search(rf"`[^`\n]*\b{k}`", page))
    assert not missing, f"docs/configuration.md does not name {missing}"


def documented_commands() -> list[str]:
    """Every ``python -m ihsweep.X`` the docs, the README and the package's docstrings name."""
    texts = [page.read_text() for page in PAGES]
    texts += [path.read_text() for path in (REPO / "workflow" / "ihsweep").rglob("*.py")]
    return sorted(
        {
            name
            for text in texts
            for name in re.findall(r"python -m (ihsweep(?:\.\w+)+)\b(?!\.?[<{])", text)
        }
    )


@pytest.mark.slow
def test_every_documented_command_answers_help():
    """A module moved or renamed leaves no command in the docs that no longer runs."""
    commands = documented_commands()
    assert {"ihsweep.status", "ihsweep.where", "ihsweep.cost", "ihsweep.steps.train"} <= set(
        commands
    )
    for module in commands:
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, f"python -m {module} --help: {proc.stderr[-2000:]}"
        assert "usage:" in proc.stdout, module
