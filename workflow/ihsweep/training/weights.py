"""The weights of a checkpoint: written as safetensors with their sha256, read back checked.

``ihsweep.training.checkpoints`` (no torch) lists and verifies checkpoints; this module moves
their tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import load_file, save_file

from ihsweep.files.io import atomic_path, write_json
from ihsweep.training.checkpoints import (
    checked_weight_bytes,
    checkpoint_paths,
    damaged_checkpoint,
    file_sha256,
)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, meta: dict) -> None:
    weights, meta_path = checkpoint_paths(run_dir, step)
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(weights) as tmp:
        save_file(tensors, tmp, metadata={"step": str(step)})
        digest = file_sha256(tmp)  # of the bytes as written, before anything can touch them
    write_json(meta_path, {**meta, "step": step, "weights_sha256": digest})


def load_checkpoint_weights(meta: dict) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (on the CPU), verified first: reads the file once, checks its
    sha256 and parses those same bytes, so a damaged file raises ``DamagedFile`` (a file too
    old to have a checksum does too, when safetensors cannot parse it)."""
    data = checked_weight_bytes(meta, keep=True)
    try:
        return load_safetensors_bytes(data)
    except SafetensorError as err:
        weights = Path(meta["weights"])
        raise damaged_checkpoint(
            weights.with_suffix(".json"), weights, f"not a safetensors file ({err})", meta["step"]
        ) from err


def load_weights(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, unverified (``load_checkpoint_weights`` checks them)."""
    return load_file(str(path), device=device)
