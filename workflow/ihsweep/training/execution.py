"""Where and how a training job runs: its device, CPU threads, allocator and micro-batch.

These are execution settings (config ``execution``), never part of a run's spec: they change
how fast a run trains, not what it computes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

from ihsweep import cost
from ihsweep.training.model import GPTConfig


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prepare_device(name: str, threads: int) -> torch.device:
    """The job's device, set up: CPU threads and a tuned allocator, or TF32 matmuls on CUDA."""
    device = pick_device(name)
    if device.type == "cpu":
        torch.set_num_threads(threads)
        keep_freed_memory()
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Tune glibc's allocator for a CPU training loop; returns whether it applied (glibc only).

    A step allocates and frees the same tensors every time. By default glibc serves those of
    128 kB and more with fresh mmap()s (raising that threshold only as far as the sizes it has
    seen freed) and returns the top of its heap to the system once 128 kB are free there, so
    every step faults its larger tensors in again, page by page: ~1,000-3,000 page faults a step
    at vocabulary 2,048 (B 16, C 32), ~25% of its time. Serving everything below 32 MB (glibc's
    largest threshold) from the heap and keeping up to 1 GB of it free brings that to ~10 and
    changes no result; the peak memory stays the step's (``tests/test_cost.py`` measures it)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS) or no libc found
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def resolve_micro_batch(
    setting: int | str, cfg: GPTConfig, batch_size: int, context: int, device, memory_mb: int
) -> int:
    """The micro-batch of ``execution.micro_batch`` on the device this job got: a number (at
    most B), or for ``auto`` the largest the memory estimate fits (``ihsweep.cost``) into the
    GPU's memory, or on the CPU into the job's ``memory_mb``."""
    if device.type == "cuda":
        limit = torch.cuda.get_device_properties(device).total_memory
    else:
        limit = memory_mb * cost.MB
    model = cfg.to_dict()
    picked = cost.choose_micro_batch(
        setting, model, cfg.vocab_size, batch_size, context, device.type, limit
    )
    if picked is None:
        need = cost.peak_memory(model, cfg.vocab_size, 1, context, device.type)["total"]
        raise MemoryError(
            f"even one sequence needs ~{need / cost.GB:.1f} GB, more than "
            f"{cost.MEMORY_MARGIN:.0%} of this {device.type} job's {limit / cost.GB:.1f} GB"
        )
    return picked
