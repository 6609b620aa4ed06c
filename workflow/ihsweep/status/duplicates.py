"""The status lines of a study's checkpoint suites' duplicate revisions: one line per group, as
the probe step found them (``duplicates.csv``, ``ihsweep.probing.fingerprints``), under a
heading; nothing for a study without suites or before any suite was probed."""

from __future__ import annotations

from pathlib import Path

from ihsweep.analysis.duplicates import read_duplicates
from ihsweep.config import Study, StudyPaths
from ihsweep.files import layout
from ihsweep.files.io import DamagedFile


def duplicate_lines(study: Study, root: Path) -> list[str]:
    """The heading and one line per duplicate group of each suite probed so far; a damaged
    duplicates.csv is named in its line."""
    lines, paths = [], StudyPaths(study)
    for suite, spec in study.suites.items():
        path = root / paths.suite_file(layout.DUPLICATES, suite)
        if not path.is_file():
            continue
        try:
            groups = read_duplicates([path])
        except DamagedFile as err:
            lines.append(f"  {err}")
            continue
        kept = " (kept in the fit: keep_duplicates)" if spec["keep_duplicates"] else ""
        lines += [f"  {line}{kept}" for line in groups["line"]]
    if not lines:
        return []
    return ["duplicate revisions (left out of the emergence fit unless kept):", *lines]
