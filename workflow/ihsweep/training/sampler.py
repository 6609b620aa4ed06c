"""The batches of a run: whole chunks in a seeded order, a pure function of (seed, step)."""

from __future__ import annotations

import numpy as np
import torch


class ChunkSampler:
    """Batches of whole chunks in a seeded random order, one fresh permutation per epoch.

    The batch of step i depends only on (seed, i), so resuming needs nothing but the step.
    """

    def __init__(self, chunks: np.ndarray, batch_size: int, seed: int):
        self.chunks, self.batch_size, self.seed = chunks, batch_size, seed
        # The same memory as a plain array: indexing a np.memmap goes through its subclass hooks.
        self._array = np.asarray(chunks)
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._perm = epoch, rng.permutation(len(self.chunks))
        return self._perm

    def batch(self, step: int) -> torch.Tensor:
        """Chunks ``step * B`` to ``(step + 1) * B - 1`` of the endless sequence of epochs."""
        n, size = len(self.chunks), self.batch_size
        epoch, offset = divmod(step * size, n)
        if offset + size <= n:  # within one epoch (most steps): a slice of its permutation
            rows = self._permutation(epoch)[offset : offset + size]
        else:  # across epochs
            flat = np.arange(step * size, (step + 1) * size)
            rows = np.empty(size, dtype=np.int64)
            for epoch in np.unique(flat // n):
                sel = flat // n == epoch
                rows[sel] = self._permutation(int(epoch))[flat[sel] % n]
        return torch.from_numpy(self._array[rows].astype(np.int64))
