"""How fast a study goes and when it ends: each running run's speed, share of its budget and
ETA, and the study's ETA over its unfinished runs.

A run's speed is the one its ``progress.json`` records (tokens per second over the window
before its last record, ``ihsweep.files.records.write_progress``). A run that has no
recorded speed (not started, or stopped before its first progress line) is estimated by the
cost model (``ihsweep.cost``, the table ``python -m ihsweep.cost`` prints). The study's ETA
counts training only (probing and aggregates take seconds to minutes per run) and runs every
unfinished run to its budget: an early stop ends some sooner.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ihsweep.config import Run, Study, StudyPaths
from ihsweep.cost.report import format_eta, shown_cost
from ihsweep.cost.study import StudyCost
from ihsweep.files.records import read_progress

MEASURED, COST_MODEL = "measured", "cost model"
ENDED = ("done", "trained", "diverged")  # states of a run whose training is over


def run_speed(progress: dict) -> float | None:
    """Tokens per second the run's last progress record measured; None without one."""
    speed = progress.get("tokens_per_second")
    return float(speed) if speed else None


def run_eta(progress: dict, now: float) -> float | None:
    """Seconds the run still needs at its measured speed: the tokens left at its last record
    over that speed, less the time since the record. None without a measured speed."""
    speed = run_speed(progress)
    if speed is None:
        return None
    left = (int(progress["budget"]) - int(progress["tokens"])) / speed
    return max(0.0, left - (now - float(progress["updated"])))


def finish_seconds(running: Iterable[float], queued: Iterable[float], jobs: int) -> float:
    """When the last run ends, as Snakemake schedules them: ``jobs`` at a time (at least as
    many as are running), the running runs taking their slots from now, each queued run
    starting in the slot that frees first, in the given order."""
    slots = list(running)
    slots += [0.0] * max(0, jobs - len(slots))
    if not slots:
        return 0.0
    heapq.heapify(slots)
    for seconds in queued:
        heapq.heappush(slots, heapq.heappop(slots) + seconds)
    return max(slots)


@dataclass(frozen=True)
class Remaining:
    """What one unfinished run has left: tokens, and seconds by ``source`` (``MEASURED``:
    its own recorded speed; ``COST_MODEL``: the study's device profile)."""

    run_id: str
    tokens: int
    seconds: float
    source: str
    running: bool


class CostEstimate:
    """The cost model's training time for the runs that have no measured speed, on the device
    profile ``python -m ihsweep.cost`` shows for the study (its GPU profile, or the CPU's
    where the jobs would train on the CPU here). ``error`` says why there is none."""

    def __init__(self, study: Study):
        self.costed: StudyCost | None = None
        self.error: str | None = None
        try:
            self.costed = shown_cost(StudyCost(study))
        except ValueError as err:  # an unreadable device profile: validate names it
            self.error = f"no cost estimate (execution.device_profile: {err})"

    @property
    def profile_name(self) -> str:
        return "" if self.costed is None else str(self.costed.profile["name"])

    def seconds(self, run: Run, tokens: int) -> float | None:
        if self.costed is None:
            return None
        return self.costed.train_seconds(run, tokens)


def remaining(run: Run, row: dict, progress: dict, estimate: CostEstimate, now: float):
    """The run's ``Remaining`` from its status row and progress record; None when it cannot
    be told (no measured speed and no cost model)."""
    tokens = max(0, int(row["budget"]) - int(row["tokens"]))
    running = row["state"] == "running"
    if running and (eta := run_eta(progress, now)) is not None:
        return Remaining(run.id, tokens, eta, MEASURED, True)
    if (speed := run_speed(progress)) is not None:  # interrupted or failed: its last speed
        return Remaining(run.id, tokens, tokens / speed, MEASURED, running)
    seconds = estimate.seconds(run, tokens)
    if seconds is None:
        return None
    return Remaining(run.id, tokens, seconds, COST_MODEL, running)


def study_eta_line(left: list[Remaining], unknown: int, jobs: int, estimate: CostEstimate):
    """The study's ETA line: when its unfinished runs end at ``jobs`` at a time, and how
    much of it is measured and how much the cost model's."""
    if not left and not unknown:
        return "study ETA: nothing left to train"
    running = [r.seconds for r in left if r.running]
    queued = [r.seconds for r in left if not r.running]
    slots = max(jobs, len(running))
    eta = finish_seconds(running, queued, slots)
    parts = []
    for source in (MEASURED, COST_MODEL):
        part = [r for r in left if r.source == source]
        if part:
            what = (
                ("at its measured speed" if len(part) == 1 else "at their measured speeds")
                if source == MEASURED
                else f"by the cost model (device profile {estimate.profile_name})"
            )
            seconds = sum(r.seconds for r in part)
            parts.append(f"{len(part)} {what}: {format_duration(seconds)}")
    if unknown:
        parts.append(f"{unknown} with no estimate ({estimate.error})")
    if len(running) > jobs:
        assumed = f"{slots} jobs at a time, as many as are running"
    elif jobs == 1:
        assumed = "1 job at a time, as on one machine; --jobs N for more"
    else:
        assumed = f"{jobs} jobs at a time"
    return (
        f"study ETA {'at least ' * bool(unknown)}{format_duration(eta)} ({assumed}; training"
        " only, every run to its budget):"
        f" {len(left) + unknown} unfinished runs, {sum(r.tokens for r in left) / 1e6:.2f}M"
        " tokens left; " + "; ".join(parts)
    )


def study_remaining(study: Study, table, root: Path, estimate: CostEstimate, now: float):
    """(``Remaining`` of each unfinished run that can be told, how many cannot) from the
    status table's rows and the runs' progress records."""
    paths, left, unknown = StudyPaths(study), [], 0
    rows = {row["run_id"]: row for row in table.to_dict("records")}
    for run in study.runs:
        row = rows[run.id]
        if row["state"] in ENDED:
            continue
        progress = read_progress(root / paths.run_dir(run))
        told = remaining(run, row, progress, estimate, now)
        left += [told] if told is not None else []
        unknown += told is None
    return left, unknown


def format_duration(seconds: float) -> str:
    """``1d02h``, else as the log's ETA (``3h05m``, ``4m07s``): two units, the larger first."""
    s = int(max(0, seconds))
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    return format_eta(s)
