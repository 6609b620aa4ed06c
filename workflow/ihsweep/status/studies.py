"""Which study ``python -m ihsweep.status`` reports: the studies a ``results/`` records.

Every study the workflow started has ``results/studies/<study>/study.json``
(``ihsweep.report.provenance.StudyClaim``): its config files, the folder it ran in and when it last
started. A study is running when one of its runs is (a fresh ``progress.json``, as the table's
``running`` state). Without ``--configfile`` or ``--study``, status reports the running study;
with several, the one started last; with none, the default study of ``config.yaml``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ihsweep.config import ConfigError, Study, StudyPaths, load_configfiles, read_study
from ihsweep.files import layout
from ihsweep.files.records import read_progress
from ihsweep.report.provenance import STUDY_JSON, StudyClaim, config_sha256
from ihsweep.status.table import run_state

DEFAULT_CONFIG = Path("config.yaml")


@dataclass(frozen=True)
class Recorded:
    """One study.json found: its claim, the study its config files define now (None, with the
    ``problem``, when they cannot be read), and how many of its runs are running."""

    claim: StudyClaim
    study: Study | None
    problem: str | None
    running: int

    def describe(self) -> str:
        files = " ".join(self.claim.configfiles) or "no config file"
        where = f" in {self.claim.directory}" if self.claim.directory else ""
        started = f", started {self.claim.started}" if self.claim.started else ""
        runs = f"{self.running} run" + "s" * (self.running > 1)
        state = f"running ({runs})" if self.running else "not running"
        state = self.problem or state
        return f"{self.claim.study}: {files}{where}{started}; {state}"


@dataclass(frozen=True)
class Chosen:
    """The study status reports, and why that one (the header's first line says both)."""

    study: Study
    configfiles: tuple[str, ...]
    directory: str
    started: str | None
    why: str

    def header(self) -> str:
        files = " ".join(self.configfiles) or "no config file"
        started = f", started {self.started}" if self.started else ""
        return (
            f"study {self.study.name} ({self.why}): config {files}, directory {self.directory}"
            f"{started}"
        )


def study_of_claim(claim: StudyClaim) -> tuple[Study | None, str | None]:
    """The study the claim's config files define now, or why there is none. Files edited since
    it started, or ``--config`` overrides it was started with, make another definition."""
    try:
        study = read_study(load_configfiles(claim.configfile_paths()))
    except ConfigError as err:
        return None, f"its config files cannot be read now: {err}"
    if study.name != claim.study or config_sha256(study.config) != claim.config_sha256:
        return study, (
            f"its config files define another study now (edited, or started with --config:"
            f" pass the same --config to status); {study.name} as they read now"
        )
    return study, None


def running_runs(study: Study, root: Path, active_minutes: float, now: float) -> int:
    """How many of the study's runs are running (fresh progress.json, no run.json)."""
    paths = StudyPaths(study)
    states = (
        run_state(root, paths, run, read_progress(root / paths.run_dir(run)), active_minutes, now)
        for run in study.runs
    )
    return sum(state == "running" for state in states)


def recorded_studies(root: Path, active_minutes: float) -> list[Recorded]:
    """Every study.json under ``root``'s results/studies/, started last first; an unreadable
    one is left out (the next start of its study rewrites it)."""
    now, found = time.time(), []
    for path in (root / layout.study_dir("*")).parent.glob(f"*/{STUDY_JSON}"):
        try:
            claim = StudyClaim.read(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        study, problem = study_of_claim(claim)
        running = 0 if study is None else running_runs(study, root, active_minutes, now)
        found.append(Recorded(claim, study, problem, running))
    return sorted(found, key=lambda r: r.claim.started or "", reverse=True)


def chosen_of(record: Recorded, why: str) -> Chosen:
    claim = record.claim
    directory = claim.directory or str(Path.cwd())
    why = why + (f"; {record.problem}" if record.problem else "")
    return Chosen(record.study, claim.configfiles, directory, claim.started, why)


def by_name(found: list[Recorded], name: str) -> Chosen:
    """The study recorded as ``name`` (``--study``); ValueError naming the recorded ones."""
    for record in found:
        if record.claim.study == name:
            if record.study is None:
                raise ValueError(f"study {name!r}: {record.problem}")
            return chosen_of(record, "--study")
    names = ", ".join(r.claim.study for r in found) or "none"
    raise ValueError(
        f"no study {name!r} recorded under {layout.study_dir('*')}/{STUDY_JSON} (recorded:"
        f" {names}); run status in (or --directory) the folder the study ran in"
    )


def running_or_default(found: list[Recorded], default: Study | None) -> Chosen:
    """The running study (the one started last of several), else config.yaml's; ValueError
    when there is neither a running study nor a config.yaml."""
    running = [r for r in found if r.running and r.study is not None]
    if len(running) == 1:
        return chosen_of(running[0], "the only study running")
    if running:
        others = ", ".join(r.claim.study for r in running[1:])
        return chosen_of(running[0], f"started last of the running ones; --study {others}")
    if default is not None:
        why = "config.yaml, the default: no study is running; --study NAME for another"
        return Chosen(default, (str(DEFAULT_CONFIG),), str(Path.cwd()), None, why)
    raise ValueError(
        f"no study is running and there is no {DEFAULT_CONFIG} in {Path.cwd()}: give"
        " --configfile, --study NAME or --directory DIR (the folder the study runs in)"
    )
