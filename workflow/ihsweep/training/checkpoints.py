"""Checkpoint files: the public weights and the private resume state of one run.

A run directory holds
- ``ckpt/step_{step:06d}.safetensors``: the model's ``state_dict`` (fp32, names as in
  ``ihsweep.training.model``), and ``ckpt/step_{step:06d}.json``: step, tokens, losses, the
  run spec.
  These are the files other tools read; the JSON is written last, so a checkpoint exists only
  once its JSON does.
- ``state/resume.pt``: model, optimiser, step and RNG state for exact resumption. Loaded with
  ``torch.load(weights_only=True)``, never with unrestricted pickle.

Every file is written to a temporary name in the same folder and renamed into place, so a
killed process never leaves a half-written file under a final name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ihsweep.io import atomic_path, write_json


def checkpoint_paths(run_dir: Path, step: int) -> tuple[Path, Path]:
    stem = Path(run_dir) / "ckpt" / f"step_{step:06d}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, meta: dict) -> None:
    weights, meta_path = checkpoint_paths(run_dir, step)
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(weights) as tmp:
        save_file(tensors, tmp, metadata={"step": str(step)})
    write_json(meta_path, {**meta, "step": step})


def list_checkpoints(run_dir: Path) -> list[dict]:
    """Metadata of every complete checkpoint of a run, by step."""
    metas = []
    for meta_path in sorted((Path(run_dir) / "ckpt").glob("step_*.json")):
        meta = json.loads(meta_path.read_text())
        meta["weights"] = str(meta_path.with_suffix(".safetensors"))
        metas.append(meta)
    return sorted(metas, key=lambda m: m["step"])


def load_weights(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    return load_file(str(path), device=device)


def resume_path(run_dir: Path) -> Path:
    return Path(run_dir) / "state" / "resume.pt"


def save_resume_state(run_dir: Path, state: dict) -> None:
    with atomic_path(resume_path(run_dir)) as tmp:
        torch.save(state, tmp)


def load_resume_state(run_dir: Path) -> dict | None:
    path = resume_path(run_dir)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
