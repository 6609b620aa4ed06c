"""Why a run stops before its budget: a signal, divergence, or a rule handed to the trainer.

- ``StopRequested``: SIGINT (Ctrl-C), SIGTERM or SIGUSR1 (sent by SLURM before a walltime
  kill or on preemption) becomes a flag checked between steps; the trainer saves the resume
  state at the next step and raises ``Interrupted``, which the step turns into its exit code,
  so the retry resumes.
- ``DivergenceWatch``: a non-finite loss, or losses above the uniform prediction's for too
  long; ``Diverged``: a checkpoint would hold diverged weights.
- ``StopRule``: decides at a checkpoint, from what lies in the run's folder, whether the run
  has what it trains for. The trainer knows nothing of probes: the rule that probes its
  checkpoints and applies the emergence rule (``ihsweep.steps.stop_rule``) is built above it.
"""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Protocol

import torch


class StopRule(Protocol):
    def __call__(self, run_dir: Path, device: torch.device) -> str | None:
        """Why the run stops at its newest checkpoint (None: it trains on)."""


class StopRequested:
    """Turns SIGINT (Ctrl-C), SIGTERM and SIGUSR1 into a flag checked between steps, so the
    state is saved at a clean step. A second signal stops at once (``ForcedStop``): the run
    resumes from its last saved state. A context manager: it gives the previous handlers
    back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum = None
        self.previous = {}

    def __enter__(self) -> StopRequested:
        self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame):
        if self.signum is not None:
            raise ForcedStop(signum)
        self.signum = signum


class Interrupted(Exception):
    """The job stopped on a signal with the run's state saved: the retry resumes from it."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = int(signum)


class ForcedStop(BaseException):
    """A second signal: stop now, between any two bytecodes. Not an ``Exception``: nothing may
    catch it on the way out but the trainer's own exit (temporary files go on the way)."""

    def __init__(self, signum: int):
        super().__init__(f"signal {int(signum)} again")
        self.signum = int(signum)


class Diverged(Exception):
    """Raised when a checkpoint would hold diverged weights (a non-finite validation loss)."""

    def __init__(self, step: int, why: str):
        super().__init__(f"{why} at step {step}")
        self.step, self.why = step, why


# The default divergence rule (``training.divergence_tokens: null``): a logged train loss above
# twice the uniform prediction's, 2 ln V, for 5% of the run's updates. An initialised model
# predicts ~ln V and a learning one goes below; on i.i.d. uniform tokens the loss stays at
# ln V, so the ceiling is set well above it; lr 1e3 sends the loss to ~1e9.
DEFAULT_CEILING_FACTOR = 2.0
DEFAULT_PATIENCE_FRACTION = 0.05


class DivergenceWatch:
    """Whether a run has diverged: a non-finite train loss (checked on every loss the moment
    it reaches the host, at most ``log_every`` updates after it was computed), or logged train
    losses above a ceiling for a stretch: by default (``training.divergence_tokens: null``)
    above 2 ln(vocabulary size) for 5% of the run's ``total_steps``; with a number of tokens,
    above ln(vocabulary size) for that many; with false, never. ln V is the loss of the
    uniform prediction an initialised model makes; a model that stays worse than that is not
    learning. It counts from the last logged loss at or below the ceiling, which ``loss.csv``
    keeps, so a resumed run decides the same."""

    def __init__(self, vocab_size, patience_tokens, tokens_per_step, logged, total_steps=None):
        uniform = math.log(vocab_size)
        self.ceiling, self.ceiling_name = uniform, "ln(vocabulary)"
        self.ceiling_is = "the uniform prediction's loss"
        self.patience = None
        if patience_tokens is None and total_steps is not None:
            self.ceiling = DEFAULT_CEILING_FACTOR * uniform
            self.ceiling_name = f"{DEFAULT_CEILING_FACTOR:g} ln(vocabulary)"
            self.ceiling_is = f"{DEFAULT_CEILING_FACTOR:g}x the uniform prediction's loss"
            self.patience = max(1, math.ceil(DEFAULT_PATIENCE_FRACTION * total_steps))
        elif patience_tokens not in (None, False):
            self.patience = patience_tokens / tokens_per_step
        self.tokens_per_step = tokens_per_step
        self.last_good = max((s for s, loss in logged if loss <= self.ceiling), default=0)

    def check_finite(self, first_step: int, losses: list[float]) -> tuple[int, str] | None:
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                return first_step + i, f"train loss {loss}"
        return None

    def check_logged(self, step: int, loss: float) -> tuple[int, str] | None:
        if loss <= self.ceiling:
            self.last_good = step
            return None
        if self.patience is not None and step - self.last_good >= self.patience:
            tokens = (step - self.last_good) * self.tokens_per_step
            return step, (
                f"train loss {loss:.4g}, above {self.ceiling_name} = {self.ceiling:.4f}"
                f" ({self.ceiling_is}) for {tokens} tokens,"
            )
        return None
