"""Which updates do what: the learning rate of each, which are logged and which checkpoint.

A run's schedule is a pure function of its spec, so a resumed run keeps the one it started
with; the trainer (``ihsweep.training.loop``) asks it at every update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def lr_at(step: int, total_steps: int, lr: float, warmup_fraction: float) -> float:
    """Linear warmup over the first ``warmup_fraction`` of the run, then cosine decay to 0."""
    warmup = max(1, round(warmup_fraction * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True)
class Schedule:
    """The update schedule of a run of ``total_steps`` updates (steps count updates done)."""

    total_steps: int
    checkpoint_steps: frozenset[int]
    log_every: int
    lr: float
    warmup_fraction: float

    @classmethod
    def of(cls, spec: dict) -> Schedule:
        training = spec["training"]
        return cls(
            total_steps=spec["total_steps"],
            checkpoint_steps=frozenset(spec["checkpoint_steps"]),
            log_every=training["log_every"],
            lr=training["lr"],
            warmup_fraction=training["warmup_fraction"],
        )

    def lr_of(self, step: int) -> float:
        """The learning rate of the update that takes the run from ``step`` to ``step + 1``."""
        return lr_at(step, self.total_steps, self.lr, self.warmup_fraction)

    def checkpoints(self, step: int) -> bool:
        """Whether the weights after ``step`` updates are saved (and evaluated) as a checkpoint."""
        return step in self.checkpoint_steps

    def logs(self, step: int) -> bool:
        """Whether ``step`` writes a train-loss row to loss.csv (every ``log_every``, and last)."""
        return step % self.log_every == 0 or step == self.total_steps
