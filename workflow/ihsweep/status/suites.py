"""A study's checkpoint suites: each suite's revisions and which of them are probed.

A suite is probed, not trained (``ihsweep.probing.suite``): its probe job caches each revision's
result as it goes (``StudyPaths.revision_cache``) and writes the suite's tables at the end, so a
revision is probed once its cache file is there, and the suite is ``done`` once its model table
is there with every revision probed; before, ``probed k of n``, or ``missing`` with none.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from ihsweep.config import Study, StudyPaths
from ihsweep.config.revisions import revision_names

COLUMNS = ["suite", "model", "batch_size", "context_size", "revisions", "probed", "state"]
WIDTH = 100  # of the revision lists


def probe_states(study: Study, root: Path = Path(".")) -> dict[str, dict[str, bool]]:
    """{suite: {revision: probed}}, each suite's revisions in its order."""
    paths = StudyPaths(study)
    return {
        name: {
            revision: (root / paths.revision_cache(name, revision)).is_file()
            for revision in revision_names(suite)
        }
        for name, suite in study.suites.items()
    }


def suite_state(study: Study, suite: str, probed: dict[str, bool], root: Path) -> str:
    table = root / StudyPaths(study).suite_table("model", suite)
    if table.is_file() and all(probed.values()):
        return "done"
    count = sum(probed.values())
    return f"probed {count} of {len(probed)}" if count else "missing"


def suites_table(study: Study, states: dict[str, dict[str, bool]], root: Path) -> pd.DataFrame:
    """One row per suite: its model, B and C, and its revisions' probe state."""
    rows = []
    for name, suite in study.suites.items():
        probed = states[name]
        rows.append(
            {
                "suite": name,
                "model": suite["model"],
                "batch_size": suite["batch_size"],
                "context_size": suite["context_size"],
                "revisions": len(probed),
                "probed": sum(probed.values()),
                "state": suite_state(study, name, probed, root),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def revision_lines(states: dict[str, dict[str, bool]]) -> list[str]:
    """Per suite, its revisions probed and not yet, wrapped."""
    lines = []
    for name, probed in states.items():
        for label, done in (("probed", True), ("not yet", False)):
            names = [revision for revision, state in probed.items() if state is done]
            if names:
                text = f"{name} {label}: {' '.join(names)}"
                lines += textwrap.wrap(text, WIDTH, subsequent_indent="    ")
    return lines


def format_suites(study: Study, root: Path = Path(".")) -> str:
    """The suites' table, each suite's revisions by state, and the counts."""
    states = probe_states(study, root)
    table = suites_table(study, states, root)
    done = (table["state"] == "done").sum()
    summary = (
        f"{len(table)} checkpoint suites (probed, not trained): {done} done; "
        f"{table['probed'].sum()} of {table['revisions'].sum()} revisions probed"
    )
    return "\n".join([table.to_string(index=False), *revision_lines(states), summary])
