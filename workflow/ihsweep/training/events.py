"""TensorBoard event files beside a run's own files: the curves of ``loss.csv``, the speed of the
progress lines and the probe tables, for ``tensorboard --logdir results/runs``.

They are derived: no step reads them, and each writer can make them again from the run.
- ``TrainEvents``, the training job's (``layout.train_events_dir``): ``loss/train`` and ``lr`` at
  every train row of ``loss.csv``, ``loss/val`` at every val row, ``tokens_per_second`` at every
  progress line; each at its update step.
- ``write_probe_events``, the probe step's (``layout.probe_events_dir``): rewritten whole from
  the model table at every probe run, so a rerun never adds a second copy.

Where they lie, their tags and how they read are ``ihsweep.files.records``'. A resumed session drops
what the session before it wrote after the state it resumes from, as ``LossLog.start`` drops
rows of ``loss.csv``: it rewrites the older files without those events,
so that every reader sees each step once (tbparse too, which reads file by file), and opens its
own file with ``purge_step``, so that a TensorBoard that already showed them drops them too.
The writer is flushed before every resume state is saved, so that what a state covers is on
disk when a kill comes after it. Nothing here changes any other file of the run.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ihsweep.files.records import (
    LR,
    PROBE_PREFIX,
    SPEED,
    TRAIN_LOSS,
    VAL_LOSS,
    drop_events_from,
    event_files,
)

if TYPE_CHECKING:
    import pandas as pd

FLUSH_SECONDS = 30  # where a file system buffers writes (a local file is appended to at once)


class TrainEvents:
    """The training job's event file: one per session, in ``folder``."""

    def __init__(self, folder: str | Path):
        self.folder, self.writer = Path(folder), None

    def start(self, step: int) -> None:
        """Continue the events at ``step``: the ones after it go (they will be written again),
        all of them at step 0 (the session starts the run afresh, a step-0 checkpoint too)."""
        purge_step = step + 1 if step > 0 else 0
        drop_events_from(self.folder, purge_step)
        self.writer = open_writer(self.folder, purge_step)

    def train(self, step: int, loss: float, lr: float) -> None:
        self.writer.add_scalar(TRAIN_LOSS, loss, step)
        self.writer.add_scalar(LR, lr, step)

    def val(self, step: int, loss: float) -> None:
        self.writer.add_scalar(VAL_LOSS, loss, step)

    def speed(self, step: int, tokens_per_second: float) -> None:
        self.writer.add_scalar(SPEED, tokens_per_second, step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def write_probe_events(folder: str | Path, table: pd.DataFrame, metrics: list[str]) -> None:
    """Rewrite ``folder``'s events whole from a probe model table: ``probe/<metric>`` at each
    row's ``step``, for each of ``metrics`` (columns of ``table``). Non-finite values are left
    out (the one row of a run that diverged before its first checkpoint)."""
    folder = Path(folder)
    older = event_files(folder)
    writer = open_writer(folder, purge_step=0)
    try:
        for row in table.sort_values("step").itertuples(index=False):
            for metric in metrics:
                value = float(getattr(row, metric))
                if math.isfinite(value):
                    writer.add_scalar(PROBE_PREFIX + metric, value, int(row.step))
    finally:
        writer.close()
    for path in older:  # after the new file exists: a kill in between leaves both, purged
        path.unlink(missing_ok=True)


def open_writer(folder: Path, purge_step: int):
    """A ``SummaryWriter`` on a new file of ``folder`` that purges steps from ``purge_step``.
    TensorBoard reads a folder's files in name order and a purge drops what it read before it,
    so the new file must sort after the older ones: its name starts with the second it was
    made, and this waits for the second after the newest file's."""
    from torch.utils.tensorboard import SummaryWriter  # ~0.15 s: paid by the writers only

    newest = max((int(path.name.split(".")[3]) for path in event_files(folder)), default=0)
    while (wait := newest + 1 - time.time()) > 0:
        time.sleep(wait)
    return SummaryWriter(str(folder), purge_step=purge_step, flush_secs=FLUSH_SECONDS)
