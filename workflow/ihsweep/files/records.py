"""A run's records: the files that say how its training went, their one writer and reader.

A run folder (``layout.run_dir``) holds, beside its checkpoints and resume states:

- ``run.json``, the completion record (the train rule's declared output), written once when the
  run ends (``write_run``; its keys are ``ihsweep.training.loop.Trainer.summary``'s);
- ``progress.json``, written while it trains and when a job ends without ending the run
  (``write_progress``); the record ``ihsweep.status`` reads of a run that trains elsewhere;
- ``loss.csv`` (``LossLog``);
- ``tensorboard/``: TensorBoard event files, derived from the above for
  ``tensorboard --logdir results/runs`` (``event_files``, ``read_scalars``, ``drop_events_from``;
  ``ihsweep.training.events`` writes them).

Training writes these only through this module and ``ihsweep.status`` reads them only through
it. No torch here: status reads the records of a study that is training elsewhere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ihsweep.files import layout
from ihsweep.files.io import atomic_path, write_json

# --------------------------------------------------------------------------------------------
# run.json: the completion record


def run_json(run_dir: str | Path) -> Path:
    return Path(run_dir) / layout.RUN_JSON


def write_run(run_dir: str | Path, summary: dict) -> None:
    """Write the completion record of a run that ended (completed, stopped early, diverged)."""
    write_json(run_json(run_dir), summary)


def read_run(run_dir: str | Path) -> dict | None:
    """The run's completion record, None when there is none (or it is damaged: it is written
    atomically, so that means the run has not finished)."""
    try:
        return json.loads(run_json(run_dir).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# progress.json: the record of a run while it trains


def progress_json(run_dir: str | Path) -> Path:
    return Path(run_dir) / layout.PROGRESS_JSON


def write_progress(
    run_dir: str | Path,
    state: str,
    step: int,
    total_steps: int,
    tokens_per_step: int,
    tokens_per_second: float | None,
    **extra,
) -> None:
    """The run's ``progress.json``, the one record ``ihsweep.status`` reads while it trains::

        {"state": "running" | "interrupted" | "failed" | "diverged" | "done", "step",
         "total_steps", "tokens", "budget", "tokens_per_second" (since the last record),
         "updated" (Unix time)}

    plus ``signal`` (interrupted), ``error`` (failed, diverged) or ``outcome`` (done). A record
    that says running but has not been updated for minutes belongs to a job that died without a
    word (killed, node lost).
    """
    record = {
        "state": state,
        "step": step,
        "total_steps": total_steps,
        "tokens": step * tokens_per_step,
        "budget": total_steps * tokens_per_step,
        "tokens_per_second": None if tokens_per_second is None else round(tokens_per_second, 1),
        "updated": round(time.time(), 3),
        **extra,
    }
    write_json(progress_json(run_dir), record)


def write_stopped(
    run_dir: str | Path, state: str, total_steps: int, tokens_per_step: int, **extra
) -> None:
    """The progress record of a job that ends without ending its run (``state``: interrupted or
    failed), at the last step it recorded."""
    step = read_progress(run_dir).get("step", 0)
    write_progress(run_dir, state, step, total_steps, tokens_per_step, None, **extra)


def read_progress(run_dir: str | Path) -> dict:
    """The run's ``progress.json`` ({} when training never started or the file is damaged)."""
    try:
        return json.loads(progress_json(run_dir).read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------------------------
# loss.csv


class LossLog:
    """The run's ``loss.csv`` (``step,tokens,split,loss,lr``): a train row every ``log_every``
    updates (the mean loss of that window, and the lr) and a val row at every checkpoint."""

    HEADER = "step,tokens,split,loss,lr\n"

    def __init__(self, run_dir: str | Path, tokens_per_step: int):
        self.path, self.tokens_per_step = Path(run_dir) / layout.LOSS_CSV, tokens_per_step

    def start(self, step: int) -> None:
        """Continue the log at ``step``: rows written after it go (they will be written again),
        and so does a last row cut short by a kill (no newline: its step may be cut too)."""
        if self.path.exists():
            lines = self.path.read_text().splitlines(keepends=True)
            kept = lines[:1] + [
                ln for ln in lines[1:] if ln.endswith("\n") and int(ln.split(",", 1)[0]) <= step
            ]
            if len(kept) != len(lines):
                with atomic_path(self.path) as tmp:
                    Path(tmp).write_text("".join(kept))
        else:
            self.path.write_text(self.HEADER)

    def train(self, step: int, loss: float, lr: float) -> None:
        self._append(f"{step},{step * self.tokens_per_step},train,{loss:.6f},{lr:.6g}\n")

    def val(self, step: int, loss: float) -> None:
        self._append(f"{step},{step * self.tokens_per_step},val,{loss:.6f},\n")

    def train_losses(self) -> list[tuple[int, float]]:
        rows = [line.split(",") for line in self.path.read_text().splitlines()[1:]]
        return [(int(r[0]), float(r[3])) for r in rows if r[2] == "train"]

    def _append(self, row: str) -> None:
        with open(self.path, "a") as f:
            f.write(row)


# --------------------------------------------------------------------------------------------
# TensorBoard event files: where they lie, how they read, and how a resume trims them

TRAIN_LOSS, VAL_LOSS, LR, SPEED = "loss/train", "loss/val", "lr", "tokens_per_second"
PROBE_PREFIX = "probe/"
EVENT_FILES = "events.out.tfevents.*"  # SummaryWriter's: <prefix>.<Unix second>.<host>.<pid>...


def train_events(run_dir: str | Path) -> Path:
    """The folder of the training job's event files."""
    return Path(layout.train_events_dir(run_dir))


def event_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob(EVENT_FILES))


def drop_events_from(folder: str | Path, step: int) -> None:
    """Rewrite each event file of ``folder`` without its events at ``step`` and after, and
    without a last record cut short by a kill; remove a file left with no scalar."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    for path in event_files(folder):
        records = [(raw, Event.FromString(raw)) for raw in RawEventFileLoader(str(path)).Load()]
        kept = [(raw, event) for raw, event in records if event.step < step]
        if not any(event.HasField("summary") for _, event in kept):
            path.unlink()
            continue
        whole = sum(len(raw) + 16 for raw, _ in records) == path.stat().st_size  # 16: framing
        if len(kept) < len(records) or not whole:
            with atomic_path(path) as tmp, open(tmp, "wb") as out:
                writer = RecordWriter(out)
                for raw, _ in kept:
                    writer.write(raw)


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of ``folder``'s event files as written, file by file in name order, no
    purge applied: tag -> [(step, value)]. A step twice under a tag is a step written twice."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(folder):
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
