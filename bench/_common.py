"""Code shared by the benchmarks (no tool of its own). It imports no torch at import time:
bench/gpu_plan.py's parent process stays without it."""

from __future__ import annotations


def synchronize(device) -> None:
    """Wait for the device's queued work (CUDA); the CPU has none to wait for."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
