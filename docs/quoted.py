"""The measured figures the pages quote, each stated once: in docs/measurements.md's table.

    python docs/quoted.py          # rewrite every quoted figure from the table
    python docs/quoted.py --check  # list the quotes that differ from it; exit 1 if any

A page quotes a figure as ``<!--fig:NAME-->VALUE<!--/fig-->`` (the markers are HTML comments:
a rendered page shows the value alone); the table's rows are ``| NAME | VALUE | source |``
under the heading "The figures the pages quote". The dated records of measurements.md quote
nothing: they stay as measured. tests/test_quoted.py runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "docs" / "measurements.md"
HEADING = "## The figures the pages quote"
QUOTE = re.compile(r"<!--fig:([a-z0-9-]+)-->(.*?)<!--/fig-->")
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (.+?) \| .+ \|$", re.MULTILINE)


def quoting_files() -> list[Path]:
    """The pages and study files that may quote a figure."""
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "config.yaml",
        *sorted((REPO / "workflow" / "studies").glob("*.yaml")),
    ]


def figures(table: Path = TABLE) -> dict[str, str]:
    """{name: value} of the table; ValueError when it is missing or names a figure twice."""
    text = table.read_text()
    if HEADING not in text:
        raise ValueError(f"{table}: no section '{HEADING}'")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    found = {}
    for name, value in ROW.findall(section):
        if name in found:
            raise ValueError(f"{table}: figure {name!r} is named twice")
        found[name] = value
    return found


def requote(text: str, table: dict[str, str], where: str) -> str:
    """``text`` with every quote replaced by the table's value; ValueError for a name the
    table lacks."""

    def value(match: re.Match) -> str:
        name = match[1]
        if name not in table:
            raise ValueError(f"{where}: quotes figure {name!r}, which {TABLE.name} lacks")
        return f"<!--fig:{name}-->{table[name]}<!--/fig-->"

    return QUOTE.sub(value, text)


def differences(table: dict[str, str]) -> list[str]:
    """'file: name quoted as X, the table says Y' for every quote that differs."""
    found = []
    for path in quoting_files():
        for name, quoted in QUOTE.findall(path.read_text()):
            if table.get(name) != quoted:
                where = path.relative_to(REPO)
                found.append(
                    f"{where}: {name} quoted as {quoted!r}, the table says {table.get(name)!r}"
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python docs/quoted.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="list the differences, write nothing")
    args = parser.parse_args(argv)
    table = figures()
    if args.check:
        found = differences(table)
        print("\n".join(found) or "every quoted figure is the table's")
        return 1 if found else 0
    for path in quoting_files():
        text = path.read_text()
        new = requote(text, table, str(path.relative_to(REPO)))
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
