"""Code shared by bench/device_profile.py and bench/trainer_vs_minimal.py (no tool of its own)."""

from __future__ import annotations

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); the CPU has none to wait for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
