"""What a training job tells the person watching it: its log's progress lines, or a bar.

``Progress`` decides when a progress line is due and writes it (``TerminalProgress`` draws a
bar instead when the job runs in a terminal, ``progress_of``); ``summary_line`` is the log's
last line. The run's files (``progress.json``, ``loss.csv``) are ``ihsweep.files.records``'.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from ihsweep.cost.report import format_eta


class Progress:
    """When to print a progress line: once ``seconds`` of wall time have passed since the last
    one, and at the last step, so a log reads at a steady pace whatever the run's speed (a
    fixed step interval floods the log of a small model and starves that of a large one)."""

    def __init__(self, seconds: float, step: int, clock=time.perf_counter):
        self.seconds, self.clock = seconds, clock
        self.start_time = self.last_time = clock()
        self.start_step = self.last_step = step
        self.losses: list[float] = []
        self.tokens_per_second: float | None = None  # of the last line's window
        self.last_loss = float("nan")  # the mean train loss of the last line's window

    def add(self, loss: float) -> None:
        self.losses.append(loss)

    def due(self, step: int, total_steps: int) -> bool:
        return step == total_steps or self.clock() - self.last_time >= self.seconds

    def line(self, step: int, total_steps: int, tokens_per_step: int, flops_per_token: float):
        """The line for ``step`` (losses and speed since the previous line); starts a new one."""
        now = self.clock()
        window = max(now - self.last_time, 1e-9)
        tps = (step - self.last_step) * tokens_per_step / window
        self.tokens_per_second = tps
        mean_tps = (step - self.start_step) * tokens_per_step / max(now - self.start_time, 1e-9)
        eta = (total_steps - step) * tokens_per_step / mean_tps if mean_tps > 0 else 0.0
        loss = float(np.mean(self.losses)) if self.losses else float("nan")
        self.last_time, self.last_step, self.losses = now, step, []
        self.last_loss = loss
        return (
            f"step {step}/{total_steps} | tokens {step * tokens_per_step / 1e6:.2f}M"
            f" | loss {loss:.4f} | {tps / 1e3:.1f}k tok/s"
            f" | {tps * flops_per_token / 1e9:.1f} GFLOP/s | ETA {format_eta(eta)}"
        )

    def show(self, label: str, line: str) -> None:
        """Print a line ``line()`` made: the log's progress line."""
        print(f"[{label}] {line}", flush=True)


def on_terminal() -> bool:
    """Whether a person watches the job (stderr is a terminal) rather than a log file."""
    return sys.stderr.isatty()


class TerminalProgress(Progress):
    """A progress bar on stderr (tqdm) for a job run in a terminal: tokens done of the
    budget, tokens/s, ETA and the last loss, in place of the log's progress lines. The bar
    moves at every update (tqdm paces its drawing); the loss is the mean of each progress
    line's window, as in the log, and progress.json is written at the same times."""

    def __init__(self, seconds: float, step: int, total_steps: int, tokens_per_step: int,
                 label: str, clock=time.perf_counter):  # fmt: skip
        from tqdm import tqdm  # here: a job in a log draws no bar

        super().__init__(seconds, step, clock)
        self.tokens_per_step = tokens_per_step
        self.bar = tqdm(
            total=total_steps * tokens_per_step, initial=step * tokens_per_step, desc=label,
            unit="tok", unit_scale=True, dynamic_ncols=True, file=sys.stderr,
        )  # fmt: skip

    def due(self, step: int, total_steps: int) -> bool:
        self.bar.update(step * self.tokens_per_step - self.bar.n)
        return super().due(step, total_steps)

    def show(self, label: str, line: str) -> None:
        self.bar.set_postfix(loss=f"{self.last_loss:.4f}")


def progress_of(seconds: float, step: int, total_steps: int, tokens_per_step: int, label: str):
    """The job's progress display: a bar in a terminal, timed lines in a log (Snakemake's)."""
    if on_terminal():
        return TerminalProgress(seconds, step, total_steps, tokens_per_step, label)
    return Progress(seconds, step)


@contextlib.contextmanager
def terminal_output():
    """When stdout and stderr are one terminal, the job's printed lines go through tqdm,
    which clears the bar, writes the line and draws the bar again below it (on stderr, the
    bar's file: tqdm clears only the bars of the file it writes to). Otherwise (a log, or
    stdout sent to a file) nothing changes."""
    if not (on_terminal() and sys.stdout.isatty()):
        yield
        return
    from tqdm.contrib import DummyTqdmFile

    with contextlib.redirect_stdout(DummyTqdmFile(sys.stderr)):
        yield


def summary_line(summary: dict, checkpoints: list[dict]) -> str:
    """The log's last line: how the run ended, what it reached (of its budget), its final
    losses and this session's speed."""
    train_loss, speed = summary["final_train_loss"], summary["tokens_per_second_this_session"]
    val_loss = f"{checkpoints[-1]['val_loss']:.4f}" if checkpoints else "n/a"
    ending = {"completed": "done", "stopped_early": "stopped early", "diverged": "diverged"}
    return (
        f"{ending[summary['outcome']]}: {summary['steps']} of {summary['total_steps']} steps,"
        f" {summary['tokens'] / 1e6:.2f}M of {summary['budget'] / 1e6:.2f}M tokens"
        f" | final train loss {'n/a' if train_loss is None else f'{train_loss:.4f}'}"
        f", val loss {val_loss}"
        f" | {summary['seconds_this_session']:.0f} s this session"
        + ("" if speed is None else f" at {speed / 1e3:.1f}k tok/s")
    )
