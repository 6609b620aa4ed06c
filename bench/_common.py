"""Code shared by the benchmarks (no tool of its own). It imports no torch at import time:
bench/gpu_plan.py's parent process stays without it."""

from __future__ import annotations

import os
from pathlib import Path

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"


def package_env() -> dict:
    """This process's environment with this checkout's package first on PYTHONPATH, for the
    child processes a benchmark starts (they import ihsweep from this checkout, installed or
    not)."""
    path = os.pathsep.join(filter(None, [str(WORKFLOW), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def synchronize(device) -> None:
    """Wait for the device's queued work (CUDA); the CPU has none to wait for."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
