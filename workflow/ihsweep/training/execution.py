"""Where and how a training job runs: its device, CPU threads, allocator, micro-batch and the
step's fast paths (compiled, padded vocabulary, fused loss).

These are execution settings (config ``execution``), never part of a run's spec: they change
how fast a run trains, not what it computes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import math
from pathlib import Path

import torch

from ihsweep import cost
from ihsweep.config import Execution
from ihsweep.io import read_json_file
from ihsweep.training.model import GPTConfig
from ihsweep.training.step import StepPath


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


# --------------------------------------------------------------------------------------------
# The step's fast paths (execution: compile, vocab_padding, fused_loss)

STEP_SETTINGS = tuple(StepPath().settings())  # the settings a StepPath is made of


def step_path(execution: Execution, device: torch.device, batch_size: int, context: int):
    """The ``StepPath`` of a job with these execution settings (its compile, vocab_padding,
    fused_loss and device_profile) on ``device``."""
    measured = measured_paths(execution.device_profile, device)
    return resolve_step_path(dataclasses.asdict(execution), batch_size, context, measured)


# A measured speed-up below this does not change a job's path: run-to-run noise on one GPU
# reaches a few percent, and a path taken for noise is a path taken for nothing.
MIN_SPEEDUP = 1.1


def resolve_step_path(
    settings: dict, batch_size: int, context: int, measured: dict | None
) -> StepPath:
    """The job's ``StepPath`` from its ``execution`` settings ``compile``, ``vocab_padding``
    and ``fused_loss``. A set value is taken as it is. Those left ``auto`` take the values of
    the fastest path that ``measured`` (a ``bench/gpu_plan.py`` file's ``paths``, for the GPU
    this job got; ``measured_paths``) found correct and at least ``MIN_SPEEDUP`` times as fast
    as eager, in the same plan, at the measured cell nearest this job's B * C, among the paths
    that agree with the set values. A path with no row at that cell (not measured, or failed
    there) counts as not faster: no speed-up is borrowed from another cell. Without one (on the
    CPU, or with no measurement of this GPU) the plain path's: eager, V rows, chunked."""
    fixed = {key: settings[key] for key in STEP_SETTINGS if settings.get(key, "auto") != "auto"}
    plain = StepPath().settings()
    cell = nearest_cell((measured or {}).get("cells", []), batch_size * context)
    best, best_speedup = plain, 0.0
    for variant in (measured or {}).get("variants", {}).values():
        if not variant["correct"] or any(variant["settings"][k] != v for k, v in fixed.items()):
            continue
        speedup = variant["speedup"].get(cell, 0.0)
        if speedup >= MIN_SPEEDUP and speedup > best_speedup:
            best, best_speedup = variant["settings"], speedup
    return StepPath.of({**plain, **best, **fixed})


def nearest_cell(cells: list[str], tokens_per_step: int) -> str | None:
    """The cell ("BxC") whose B * C is nearest ``tokens_per_step`` (in ratio); None if none."""
    if not cells:
        return None

    def distance(cell: str) -> float:
        b, c = (int(n) for n in cell.split("x"))
        return abs(math.log(b * c / tokens_per_step))

    return min(cells, key=distance)


def measured_paths(device_profile: str | None, device: torch.device) -> dict | None:
    """The ``paths`` that ``bench/gpu_plan.py`` measured, from the profile file
    ``device_profile`` (``execution.device_profile``), if it measured this job's GPU (same
    device name); None on the CPU, for a built-in profile, or for another GPU."""
    if device.type != "cuda" or not device_profile or not Path(device_profile).is_file():
        return None
    remedy = "give execution.device_profile the JSON bench/gpu_plan.py wrote, or run it again"
    paths = read_json_file(device_profile, "device profile", remedy=remedy).get("paths")
    if not paths or paths.get("device") != torch.cuda.get_device_name(device):
        return None
    return paths
