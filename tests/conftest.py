"""What the tests share: the repository, the tiny test studies and running Snakemake on them.

Tiny studies live as YAML files under tests/studies/ (``study_text(name)``); a test that runs
one writes it into a tmp folder as config.yaml and runs the real ``snakemake`` command line
there (``run_study``), so every path the DAG writes is ``ihsweep.files.layout``'s, under that
folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from ihsweep.config import SCHEMA  # noqa: F401  (tests import it from here)
from ihsweep.data.chunks import write_chunks  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[1]
STUDIES = Path(__file__).resolve().parent / "studies"
TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with the most slow tests first, each module's tests together and in their
    order. ``make test`` hands whole modules to its workers (``--dist loadscope``: a module's
    shared study or SLURM cluster is built once), in this order: the long ones start first
    instead of one of them running alone at the end."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    first_seen = {}
    for item in items:
        first_seen.setdefault(item.path, len(first_seen))
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


def study_text(name: str) -> str:
    """The YAML text of the tiny test study ``tests/studies/<name>.yaml``."""
    return (STUDIES / f"{name}.yaml").read_text()


def snakemake(
    workdir: Path,
    *args: str,
    configfiles: tuple[Path, ...] = (),
    timeout: int = TIMEOUT,
    checkout: Path = REPO,
) -> SimpleNamespace:
    """``snakemake`` on the Snakefile of ``checkout`` (the repository's unless a test copied
    it) in ``workdir``, with its config.yaml."""
    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(checkout / "Snakefile"), "--cores", "2",
        "--directory", str(workdir),
        *args,  # before --configfile, which takes every path that follows it
        "--configfile", str(workdir / "config.yaml"), *map(str, configfiles),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir, env=dict(os.environ)
    )
    return SimpleNamespace(rc=proc.returncode, out=proc.stdout + proc.stderr, cmd=cmd)


def job_stats(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run, without the total; {} if none."""
    match = re.search(r"^Job stats:\n.*\n-+ +-+\n((?:\S+ +\d+\n)+)", output, re.MULTILINE)
    if not match:
        return {}
    rows = dict(line.split() for line in match.group(1).splitlines())
    counts = {job: int(n) for job, n in rows.items()}
    assert counts.pop("total") == sum(counts.values())
    return counts


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def logs_of(workdir: Path) -> str:
    """Every job log, for a failure message."""
    parts = []
    for log in sorted((workdir / "results" / "logs").rglob("*.log")):
        parts.append(f"--- {log.relative_to(workdir)}\n{log.read_text()[-2000:]}")
    return "\n".join(parts)


def run_study(workdir: Path, config: str, *args: str) -> SimpleNamespace:
    """Write ``config`` as the folder's config.yaml and run it all; a failure shows every log."""
    (workdir / "config.yaml").write_text(config)
    result = snakemake(workdir, *args)
    assert result.rc == 0, result.out[-6000:] + logs_of(workdir)
    return result
