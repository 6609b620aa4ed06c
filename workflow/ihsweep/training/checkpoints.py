"""Checkpoint files: the public weights and the private resume states of one run.

A run directory holds
- ``ckpt/step_{step:06d}.safetensors``: the model's ``state_dict`` (fp32, names as in
  ``ihsweep.training.model``), and ``ckpt/step_{step:06d}.json``: step, tokens, losses, the
  run spec and ``weights_sha256``, the sha256 of the .safetensors file as written.
  These are the files other tools read; the JSON is written last, so a checkpoint exists only
  once its JSON does.
- ``state/resume.pt``: model, optimiser, step and RNG state for exact resumption, and why it
  was saved (``saved_on``: with its checkpoint, on signal N, at stop_after_step, or a
  checkpoint's and a stop's reason), with the
  sidecar ``state/resume.json`` (``{"step", "sha256"}``) written after it. Loaded with
  ``torch.load(weights_only=True)``, never with unrestricted pickle.
- ``state/resume.prev.pt`` and ``state/resume.prev.json``: the state saved before that one, so a
  run always has its last two states: a damaged current state, or a save killed half-way
  (``save_resume_state``), falls back to the one before it rather than to step 0.

Every file is written to a temporary name in the same folder and renamed into place, so a
killed process never leaves a half-written file under a final name. A disk that fills, a copy
that stops short or a stray write can still damage a file after the fact; the checksums catch
that. A damaged file raises (or is reported as) ``DamagedFile``, whose message names the file
and what is wrong with it, instead of surfacing later as a library's traceback or as wrong
numbers. A checkpoint JSON written before the checksums existed (no ``weights_sha256``) is
accepted unverified. Training (``ihsweep.training.loop``) names and deletes the damaged files
and resumes from the newest good state no later than the earliest damaged checkpoint, so that
training again rewrites it; probing refuses a run with a damaged checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import load_file, save_file

from ihsweep.io import atomic_path, write_json

REWRITE_CHECKPOINT = "rerun the run's train job to rewrite it"
REWRITE_STATE = "training falls back to the run's other state (or starts afresh)"


class DamagedFile(Exception):
    """A checkpoint or resume state that cannot be trusted: ``path`` (the file at fault),
    ``problem`` (what is wrong), ``step`` (whose step it was, when known) and ``files`` (every
    file of that checkpoint or state, which a rewrite replaces)."""

    def __init__(self, kind: str, path: Path, problem: str, remedy: str, step: int | None,
                 files: tuple[Path, ...]):  # fmt: skip
        self.kind, self.path, self.problem, self.step = kind, Path(path), problem, step
        self.files = tuple(Path(f) for f in files)
        super().__init__(f"damaged {kind} {path}: {problem}; {remedy}")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_paths(run_dir: Path, step: int) -> tuple[Path, Path]:
    stem = Path(run_dir) / "ckpt" / f"step_{step:06d}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, meta: dict) -> None:
    weights, meta_path = checkpoint_paths(run_dir, step)
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(weights) as tmp:
        save_file(tensors, tmp, metadata={"step": str(step)})
        digest = file_sha256(tmp)  # of the bytes as written, before anything can touch them
    write_json(meta_path, {**meta, "step": step, "weights_sha256": digest})


def _damaged_checkpoint(meta_path: Path, path: Path, problem: str, step: int) -> DamagedFile:
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
        raise _damaged_checkpoint(meta_path, meta_path, f"unreadable JSON ({err})", step) from err
    meta["weights"] = str(meta_path.with_suffix(".safetensors"))
    return meta


def verify_checkpoint(meta: dict) -> None:
    """Raise ``DamagedFile`` unless the checkpoint's weights file is there, readable and, when
    its JSON records ``weights_sha256``, has exactly the bytes that were written."""
    _checked_weight_bytes(meta, keep=False)


def _checked_weight_bytes(meta: dict, keep: bool) -> bytes | None:
    weights = Path(meta["weights"])
    meta_path = weights.with_suffix(".json")

    def damaged(problem: str) -> DamagedFile:
        return _damaged_checkpoint(meta_path, weights, problem, meta["step"])

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


def load_checkpoint_weights(meta: dict) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (on the CPU), verified first: reads the file once, checks its
    sha256 and parses those same bytes, so a damaged file raises ``DamagedFile`` (a file too
    old to have a checksum does too, when safetensors cannot parse it)."""
    data = _checked_weight_bytes(meta, keep=True)
    try:
        return load_safetensors_bytes(data)
    except SafetensorError as err:
        weights = Path(meta["weights"])
        raise _damaged_checkpoint(
            weights.with_suffix(".json"), weights, f"not a safetensors file ({err})", meta["step"]
        ) from err


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
                raise _damaged_checkpoint(
                    meta_path, Path(meta["weights"]), "the weights file is missing", meta["step"]
                )
        except DamagedFile as err:
            if damaged is not None:
                damaged.append(err)
            continue
        metas.append(meta)
    return sorted(metas, key=lambda m: m["step"])


def load_weights(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, unverified (``load_checkpoint_weights`` checks them)."""
    return load_file(str(path), device=device)


# --------------------------------------------------------------------------------------------
# Resume states


def resume_path(run_dir: Path, prev: bool = False) -> Path:
    return Path(run_dir) / "state" / ("resume.prev.pt" if prev else "resume.pt")


def resume_sidecar(run_dir: Path, prev: bool = False) -> Path:
    return resume_path(run_dir, prev).with_suffix(".json")


def save_resume_state(run_dir: Path, state: dict) -> None:
    """Save ``state`` as the current resume state; the current one becomes the previous one.

    The order makes a kill at any point leave at least one good state: the new state is
    serialised to a temporary file first (a failure there changes nothing); then the current
    sidecar is copied to ``resume.prev.json`` (the current pair is still good), the current .pt
    is renamed to ``resume.prev.pt`` (now the previous pair is good), the new .pt is renamed into
    place and its sidecar written last (until then the current pair fails its checksum). A
    current .pt without a sidecar (unverifiable) is overwritten, not kept in place of a previous
    state that may be good."""
    pt, sidecar = resume_path(run_dir), resume_sidecar(run_dir)
    prev_pt, prev_sidecar = resume_path(run_dir, prev=True), resume_sidecar(run_dir, prev=True)
    with atomic_path(pt) as tmp:
        torch.save(state, tmp)
        digest = file_sha256(tmp)
        if pt.exists() and sidecar.exists():  # one without a sidecar is not worth keeping
            with atomic_path(prev_sidecar) as tmp_sidecar:
                Path(tmp_sidecar).write_bytes(sidecar.read_bytes())
            os.replace(pt, prev_pt)
    write_json(sidecar, {"step": int(state["step"]), "sha256": digest})


def load_resume_state(
    run_dir: Path, max_step: int | None = None
) -> tuple[dict | None, list[DamagedFile]]:
    """The newest good resume state (the current one, else the previous one) whose step is at
    most ``max_step``, or None; and a ``DamagedFile`` for each damaged state found.

    A state is damaged when its sidecar is missing or does not parse, its sha256 does not match
    the sidecar's, or ``torch.load`` fails. Both states are checksummed, so damage is reported
    even in a state too new to be used; only the one returned is loaded. A state whose .pt is
    absent is no state (not damage): ``save_resume_state`` moves the current .pt away before
    the new one arrives."""
    chosen, damaged = None, []
    for prev in (False, True):
        pt, sidecar = resume_path(run_dir, prev), resume_sidecar(run_dir, prev)
        if not pt.exists():
            continue
        try:
            if not sidecar.exists():  # written before states had sidecars: load it unverified
                chosen = chosen or _legacy_state(pt, sidecar, max_step)
                continue
            step = _verified_state_step(pt, sidecar)
            if chosen is None and (max_step is None or step <= max_step):
                chosen = _load_state(pt, sidecar, step)
        except DamagedFile as err:
            damaged.append(err)
    return chosen, damaged


def _legacy_state(pt: Path, sidecar: Path, max_step: int | None) -> dict | None:
    """A state without a sidecar: saving one always leaves a sidecar beside the new .pt (the
    old one until the new one is written, which then fails the checksum), so this is a state
    from before sidecars, and what torch.load accepts is used."""
    state = _load_state(pt, sidecar, None)
    return state if max_step is None or int(state["step"]) <= max_step else None


def _state_damage(pt: Path, sidecar: Path, path: Path, problem: str, step: int | None = None):
    return DamagedFile("resume state", path, problem, REWRITE_STATE, step, (pt, sidecar))


def _verified_state_step(pt: Path, sidecar: Path) -> int:
    """The step of a state whose .pt has the sha256 its sidecar records; else DamagedFile."""
    try:
        record = json.loads(sidecar.read_text())
        if not (isinstance(record, dict) and isinstance(record.get("step"), int)
                and isinstance(record.get("sha256"), str)):  # fmt: skip
            raise ValueError('not {"step": int, "sha256": str}')
    except FileNotFoundError as err:
        problem = f"its sidecar is missing, so {pt.name} cannot be verified"
        raise _state_damage(pt, sidecar, sidecar, problem) from err
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise _state_damage(pt, sidecar, sidecar, f"unreadable sidecar ({err})") from err
    step = record["step"]
    try:
        digest = file_sha256(pt)
    except OSError as err:
        raise _state_damage(pt, sidecar, pt, f"unreadable ({err})", step) from err
    if digest != record["sha256"]:
        problem = f"sha256 mismatch with {sidecar.name} (truncated or overwritten)"
        raise _state_damage(pt, sidecar, pt, problem, step)
    return step


def _load_state(pt: Path, sidecar: Path, step: int | None) -> dict:
    try:
        state = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as err:  # any failure to unpickle a checksummed file means damage
        problem = f"torch.load failed ({type(err).__name__}: {err})"
        raise _state_damage(pt, sidecar, pt, problem, step) from err
    if step is not None and int(state["step"]) != step:
        problem = f"holds step {int(state['step'])}, its sidecar says {step}"
        raise _state_damage(pt, sidecar, pt, problem, step)
    return state
