"""reStructuredText for the report's front page: escaped text, literals, links to report
results, bullet lists, list tables and figures shown inline as data URIs."""

from __future__ import annotations

import base64
import math
import re
import textwrap
from pathlib import Path

NB_HYPHEN = "\u2011"  # how "-" reads in -D, +D-C, -C: the lines of a narrow page break elsewhere


def number(value) -> str:
    """A finding's number to 3 significant digits; "n/a" for none, NaN or infinity."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"


def interval(ci) -> str:
    """A 95% interval ``[low, high]`` to 3 significant digits."""
    return f"[{ci[0]:.3g}, {ci[1]:.3g}]"


def text(plain: str) -> str:
    """Plain text as reStructuredText: inline-markup characters escaped (``|b_r|`` stays),
    and the minus of -D and -C a non-breaking hyphen, so that no line ends in "-"."""
    plain = re.sub(r"-(?=[DC](?!\w))", NB_HYPHEN, plain)
    return re.sub(r"([\\`*_|])", r"\\\1", plain)


def literal(code: str) -> str:
    return f"``{code}``"


def link(target: str) -> str:
    """A reference to a report result by file name (Snakemake's report defines the target)."""
    return f"`{target}`_"


def bullets(items: list[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def list_table(rows: list[list[str]]) -> str:
    """A ``list-table`` with the first row as its header; cells are plain text."""
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in rows:
        for i, cell in enumerate(row):
            lines.append(f"   {'* -' if i == 0 else '  -'} {text(cell)}".rstrip())
    return "\n".join(lines)


def inline_figure(png: Path, caption: str, target: str = "") -> str:
    """A figure shown on the page itself, as a data URI: Snakemake's report page is one file
    (or a zip) whose front page links no other file, and its own ``embeddedfigure`` directive
    links the path instead of embedding it. Wrapped, since docutils limits a line's length
    (it joins the lines of a URI without spaces). "" when the figure was not drawn."""
    if not png.exists():
        return ""
    uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    first, *rest = textwrap.wrap(uri, 96)
    lines = [f".. figure:: {first}", *(f"   {line}" for line in rest)]
    reference = f" ({link(target)})" if target else ""  # a result of the report, by name
    lines += ["   :width: 100%", f"   :alt: {caption}", "", f"   {caption}{reference}."]
    return "\n".join(lines)
