"""Checkpoint files: list, read and verify a run's checkpoints (no torch).

A run directory holds
- ``ckpt/step_{step:06d}.safetensors``: the model's ``state_dict`` (fp32, names as in
  ``ihsweep.training.model``), and ``ckpt/step_{step:06d}.json``: step, tokens, losses, the
  run spec and ``weights_sha256``, the sha256 of the .safetensors file as written
  (``ihsweep.training.weights`` writes and loads the tensors). These are the files other tools
  read; the JSON is written last, so a checkpoint exists only once its JSON does.
- ``state/``: the resume states (``ihsweep.training.resume``).

Every file is written to a temporary name in the same folder and renamed into place, so a
killed process never leaves a half-written file under a final name. A disk that fills, a copy
that stops short or a stray write can still damage a file after the fact; the checksums catch
that. A damaged file raises (or is reported as) ``DamagedFile``, whose message names the file
and what is wrong with it, instead of surfacing later as a library's traceback or as wrong
numbers. A checkpoint JSON written before the checksums existed (no ``weights_sha256``) is
accepted unverified. Training (``ihsweep.training.resume``) names and deletes the damaged files
and resumes from the newest good state no later than the earliest damaged checkpoint, so that
training again rewrites it; probing refuses a run with a damaged checkpoint. Reading needs no
torch, so ``ihsweep.status`` lists checkpoints without loading it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ihsweep.files.io import DamagedFile, file_sha256

__all__ = ["DamagedFile", "file_sha256"]  # their home is ihsweep.files.io; imported from here too

# Training again from the newest good state before a damaged checkpoint rewrites it with the
# same bits (ihsweep.training.resume); `snakemake --forcerun <run.json>` does it for a finished
# run (docs/architecture.md, "Damaged files").
REWRITE_CHECKPOINT = "rerun the run's train job to rewrite it"


# --------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_paths(run_dir: Path, step: int) -> tuple[Path, Path]:
    stem = Path(run_dir) / "ckpt" / f"step_{step:06d}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def damaged_checkpoint(meta_path: Path, path: Path, problem: str, step: int) -> DamagedFile:
    files = (meta_path.with_suffix(".safetensors"), meta_path)
    return DamagedFile("checkpoint", path, problem, REWRITE_CHECKPOINT, step, files)


def read_checkpoint(meta_path: Path) -> dict:
    """The metadata of one checkpoint, with its ``weights`` path; raises ``DamagedFile`` when
    the JSON does not parse. (Reads the JSON only: ``verify_checkpoint`` checks the weights.)"""
    meta_path = Path(meta_path)
    step = int(meta_path.stem.removeprefix("step_"))
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
            raise ValueError("not a checkpoint's metadata (no integer step)")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise damaged_checkpoint(meta_path, meta_path, f"unreadable JSON ({err})", step) from err
    meta["weights"] = str(meta_path.with_suffix(".safetensors"))
    return meta


def verify_checkpoint(meta: dict) -> None:
    """Raise ``DamagedFile`` unless the checkpoint's weights file is there, readable and, when
    its JSON records ``weights_sha256``, has exactly the bytes that were written."""
    checked_weight_bytes(meta, keep=False)


def checked_weight_bytes(meta: dict, keep: bool) -> bytes | None:
    weights = Path(meta["weights"])
    meta_path = weights.with_suffix(".json")

    def damaged(problem: str) -> DamagedFile:
        return damaged_checkpoint(meta_path, weights, problem, meta["step"])

    if not weights.exists():
        raise damaged("the weights file is missing")
    try:
        if keep:
            data = weights.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
        else:
            data, digest = None, file_sha256(weights)
    except OSError as err:
        raise damaged(f"unreadable ({err})") from err
    recorded = meta.get("weights_sha256")
    if recorded is not None and digest != recorded:
        raise damaged("sha256 mismatch (truncated or overwritten)")
    return data


def list_checkpoints(
    run_dir: Path, damaged: list[DamagedFile] | None = None, verify: bool = True
) -> list[dict]:
    """Metadata of every good checkpoint of a run, by step, each with its ``weights`` path.

    Damaged checkpoints are left out; each one's ``DamagedFile`` is appended to ``damaged``
    when a list is given. ``verify=False`` skips the checksums (it still needs a readable JSON
    and a weights file), for callers that read many runs and only want the steps reached."""
    metas = []
    for meta_path in sorted((Path(run_dir) / "ckpt").glob("step_*.json")):
        if not meta_path.stem.removeprefix("step_").isdigit():
            continue  # not a name save_checkpoint writes
        try:
            meta = read_checkpoint(meta_path)
            if verify:
                verify_checkpoint(meta)
            elif not Path(meta["weights"]).exists():
                raise damaged_checkpoint(
                    meta_path, Path(meta["weights"]), "the weights file is missing", meta["step"]
                )
        except DamagedFile as err:
            if damaged is not None:
                damaged.append(err)
            continue
        metas.append(meta)
    return sorted(metas, key=lambda m: m["step"])
