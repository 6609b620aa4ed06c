"""A run's resume state: what a killed job restarts from, and whether it may.

``state/resume.pt`` holds the model, optimiser, step and RNG state for exact resumption, and
why it was saved (``saved_on``: with its checkpoint, on signal N, at stop_after_step, or a
checkpoint's and a stop's reason), with the sidecar ``state/resume.json`` (``{"step",
"sha256"}``) written after it. Loaded with ``torch.load(weights_only=True)``, never with
unrestricted pickle. ``state/resume.prev.pt`` and ``state/resume.prev.json`` are the state
saved before that one, so a run always has its last two states: a damaged current state, or a
save killed half-way (``save_resume_state``), falls back to the one before it rather than to
step 0.

``resume`` restores a run from its newest good state: a damaged checkpoint is rewritten by
training through its step again, so the run resumes from the newest good state no later than
the earliest damaged checkpoint (from step 0 if there is none), naming each damaged file in the
log; a state saved under another spec (``spec_hash``) is discarded with the run's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ihsweep.files.io import atomic_path, write_json
from ihsweep.files.layout import LOSS_CSV, TENSORBOARD
from ihsweep.training.checkpoints import DamagedFile, file_sha256, list_checkpoints

REWRITE_STATE = "training falls back to the run's other state (or starts afresh)"
SAVED_WITH_CHECKPOINT = "with its checkpoint"  # why a resume state was saved, in its "saved_on"

# Logging cadence changes what is written, not what is computed: changing it keeps the state.
# (Device, threads and the progress interval are not in the spec at all: execution settings.)
EXECUTION_KEYS = ("log_every",)
# When a run stops (early once emergence is confirmed, or on divergence) decides how far it
# trains, not what any step computes: a run stopped early is the prefix of the full run, and
# changing these settings resumes it from its saved state instead of retraining it.
STOPPING_KEYS = ("stop_after_emergence", "divergence_tokens")


def spec_hash(spec: dict) -> str:
    ignored = (*EXECUTION_KEYS, *STOPPING_KEYS)
    training = {k: v for k, v in spec["training"].items() if k not in ignored}
    kept = {k: v for k, v in spec.items() if k != "early_stop"}
    blob = json.dumps({**kept, "training": training}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Resumed:
    """Where a job starts: ``step``, the train losses of the last log window (kept in the state
    so that a resumed run logs the same windowed means as an uninterrupted one), and the train
    loss of the checkpoint at ``step`` when that checkpoint was damaged and must be rewritten."""

    step: int = 0
    recent_losses: tuple[float, ...] = ()
    rewrite_train_loss: float | None = None


def resume(run_dir: Path, spec: dict, model, optim) -> Resumed:
    """Restore ``model``, ``optim`` and the RNG from the run's newest usable state."""
    run_id, fingerprint = spec["run_id"], spec_hash(spec)
    damaged: list[DamagedFile] = []
    list_checkpoints(run_dir, damaged)
    redo = min((d.step for d in damaged if d.step in spec["checkpoint_steps"]), default=None)
    state, damaged_states = load_resume_state(run_dir, max_step=redo)
    for err in damaged + damaged_states:
        print(f"[{run_id}] {err}", flush=True)
        for path in err.files:  # useless now; a damaged state must not become resume.prev
            path.unlink(missing_ok=True)
    if state is not None and state["spec_hash"] != fingerprint:
        print(f"[{run_id}] spec changed since the saved state: starting afresh", flush=True)
        discard_run_files(run_dir)
        state = None
    drop_checkpoints_after(run_dir, 0 if state is None else int(state["step"]), run_id)
    if state is None:
        return Resumed()
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng_cpu"])
    step, recent = int(state["step"]), tuple(state["recent_losses"].tolist())
    why = f" (state saved {state['saved_on']})" if "saved_on" in state else ""
    print(f"[{run_id}] resuming at step {step}/{spec['total_steps']}{why}", flush=True)
    # The state saved with a damaged checkpoint: the same weights give the same file, and its
    # train loss is the mean of the state's window, as when it was saved.
    rewrite = float(np.mean(recent)) if 0 < step == redo else None
    return Resumed(step, recent, rewrite)


def drop_checkpoints_after(run_dir: Path, step: int, run_id: str) -> None:
    """Remove the checkpoints newer than the state a run resumes from: a job killed between a
    checkpoint and its state, or a state that fell back to the previous one, leaves them. The
    resumed run writes them again with the same bytes; kept meanwhile, a stop rule or the
    completion record would see checkpoints the resumed run has not reached."""
    ahead = [m for m in list_checkpoints(run_dir, verify=False) if m["step"] > step]
    for meta in ahead:
        Path(meta["weights"]).with_suffix(".json").unlink()  # first: it marks a checkpoint
        Path(meta["weights"]).unlink(missing_ok=True)
    if ahead:
        print(f"[{run_id}] checkpoints of steps {', '.join(str(m['step']) for m in ahead)} are"
              f" newer than the saved state of step {step}: training writes them again",
              flush=True)  # fmt: skip


def read_resume_step(run_dir: Path) -> int:
    """The step of the newest resume state its sidecar records (0: none), for messages."""
    for prev in (False, True):
        try:
            return int(json.loads(resume_sidecar(run_dir, prev).read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return 0


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Remove what writes killed half-way left in a run folder (``atomic_path``'s temporary
    files); only the folder's one writer, which holds its lease, may call this."""
    leftovers = sorted(Path(run_dir).rglob(".*.tmp"))
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


def discard_run_files(run_dir: Path) -> None:
    """Delete what a run trained under another spec: checkpoints, states, probes, loss log and
    its TensorBoard events."""
    for sub in ("ckpt", "state", "probes", TENSORBOARD):
        shutil.rmtree(Path(run_dir) / sub, ignore_errors=True)
    (Path(run_dir) / LOSS_CSV).unlink(missing_ok=True)


def save_state(run_dir: Path, fingerprint: str, step: int, model, optim, window: list[float],
               saved_on: str) -> None:  # fmt: skip
    """Save the run's resume state after ``step`` updates (``fingerprint``: its ``spec_hash``;
    ``window``: the train losses of the current log window; ``saved_on``: why)."""
    save_resume_state(
        run_dir,
        {
            "step": step,
            "spec_hash": fingerprint,
            "model": model.state_dict(),
            "optim": optim.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "recent_losses": torch.tensor(window, dtype=torch.float64),
            "saved_on": saved_on,
        },
    )


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
