"""Damaged files (ihsweep.training.checkpoints): named, never tripped over.

A checkpoint records the sha256 of its weights and a resume state has a sidecar with its own, so
a file truncated or overwritten after it was written is found by name: training names it and
resumes from the newest good state no later than it (the run still ends bit for bit as an
uninterrupted one), probing refuses it with a one-line message instead of a safetensors
traceback, and a kill in the middle of saving a state always leaves one good state.

The runs are test_train's toy runs (its spec and dataset helpers), 90 updates with a checkpoint
every 30, in process on one CPU thread.
"""

from __future__ import annotations

import json
import re
import shutil
import types
from pathlib import Path

import pytest
import torch
from ihsweep.config import complete
from ihsweep.files.records import read_run
from ihsweep.probing.run import probe_checkpoint, probe_run
from ihsweep.steps import probe as probe_command
from ihsweep.training import resume
from ihsweep.training.checkpoints import (
    DamagedFile,
    checkpoint_paths,
    file_sha256,
    list_checkpoints,
    verify_checkpoint,
)
from ihsweep.training.loop import Outcome, train
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.resume import (
    load_resume_state,
    resume_path,
    resume_sidecar,
    save_resume_state,
)
from ihsweep.training.weights import load_checkpoint_weights, save_checkpoint
from safetensors.torch import load_file
from test_train import CPU, assert_same_tensors, make_dataset, make_spec

STEPS, EVERY = 90, 30  # checkpoints at 30, 60, 90


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


@pytest.fixture(scope="module")
def spec() -> dict:
    spec = make_spec(steps=STEPS, every=EVERY)
    assert spec["checkpoint_steps"] == [30, 60, 90]
    return spec


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir, spec) -> Path:
    """The uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    train(spec, data_dir, run_dir, CPU)
    return run_dir


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    """Every checkpoint (weights, torch.equal on each tensor, and metadata), the final state's
    model and loss.csv are those of the uninterrupted run."""
    got, want = list_checkpoints(run_dir), list_checkpoints(reference)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [30, 60, 90]
    for g, w in zip(got, want, strict=True):
        assert_same_tensors(load_file(g["weights"]), load_file(w["weights"]))
        strip = {"weights"}  # the path differs; all else, checksum and val loss too, is equal
        assert {k: v for k, v in g.items() if k not in strip} == {
            k: v for k, v in w.items() if k not in strip
        }, g["step"]
    state, damaged = load_resume_state(run_dir)
    assert damaged == [] and int(state["step"]) == STEPS
    assert_same_tensors(state["model"], load_file(want[-1]["weights"]))
    assert (run_dir / "loss.csv").read_text() == (reference / "loss.csv").read_text()


def stopped_run(spec, data_dir, run_dir: Path, step: int = 60) -> Path:
    """A run stopped at ``step`` (a checkpoint step): states at ``step`` and the one before."""
    assert train(spec, data_dir, run_dir, CPU, stop_after_step=step) is Outcome.INTERRUPTED
    assert json.loads(resume_sidecar(run_dir).read_text())["step"] == step
    assert json.loads(resume_sidecar(run_dir, prev=True).read_text())["step"] == step - EVERY
    return run_dir


# --------------------------------------------------------------------------------------------
# (a) training names the damaged files and resumes from the newest good state before them


@pytest.mark.parametrize("damaged_step", [60, 30])
def test_truncated_checkpoint_and_state_are_named_and_retrained_bit_for_bit(
    damaged_step, spec, data_dir, reference, tmp_path, capsys
):
    """Stopped at 60 (states at 60 and 30), its current state and one checkpoint truncated.
    Checkpoint 60: resume from the state at 30 and train through 60 again. Checkpoint 30: the
    state at 30 is the one saved with it, which rewrites it before training on from there."""
    run_dir = stopped_run(spec, data_dir, tmp_path / "run")
    weights, _ = checkpoint_paths(run_dir, damaged_step)
    truncate(weights)
    truncate(resume_path(run_dir))
    capsys.readouterr()

    # Stopped again just after the resume: the damaged files are gone (a checkpoint 30 already
    # rewritten), so is checkpoint 60 (damaged, or newer than the state it resumed from: not
    # yet rewritten), and the two states are the good one it resumed from and the new one.
    train(spec, data_dir, run_dir, CPU, stop_after_step=31)
    out = capsys.readouterr().out
    assert f"damaged checkpoint {weights}: sha256 mismatch" in out
    assert f"damaged resume state {resume_path(run_dir)}: sha256 mismatch" in out
    assert f"resuming at step 30/{STEPS}" in out
    assert ("rewrote the checkpoint of step 30" in out) == (damaged_step == 30)
    damaged = []
    steps = [m["step"] for m in list_checkpoints(run_dir, damaged)]
    assert damaged == [] and steps == [30]
    sidecars = [resume_sidecar(run_dir, prev) for prev in (False, True)]
    assert [json.loads(p.read_text())["step"] for p in sidecars] == [31, 30]
    assert load_resume_state(run_dir)[1] == []

    train(spec, data_dir, run_dir, CPU)
    summary = read_run(run_dir)
    out = capsys.readouterr().out
    assert "damaged" not in out and f"resuming at step 31/{STEPS}" in out
    assert summary["checkpoints"] == [30, 60, 90]
    assert_same_as_reference(run_dir, reference)
    assert not list(run_dir.rglob("*.tmp"))


def test_a_damaged_checkpoint_before_both_states_restarts_from_zero(
    spec, data_dir, reference, tmp_path, capsys
):
    """No state is as old as the damaged checkpoint: train from step 0 and rewrite it."""
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU, stop_after_step=77)  # states at 77 and 60
    meta_path = checkpoint_paths(run_dir, 30)[1]
    meta_path.write_text(meta_path.read_text()[:40])  # a JSON cut short
    capsys.readouterr()

    train(spec, data_dir, run_dir, CPU)
    out = capsys.readouterr().out
    assert f"damaged checkpoint {meta_path}: unreadable JSON" in out
    assert "resuming" not in out
    assert_same_as_reference(run_dir, reference)


# --------------------------------------------------------------------------------------------
# (b) what counts as damage


def small_model(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=64, n_ctx=32, n_layer=1, n_head=2, d_model=8, mlp=True))


def test_valid_weights_of_another_checkpoint_are_a_sha256_mismatch(tmp_path):
    save_checkpoint(tmp_path, 5, small_model(0), {"tokens": 5})
    save_checkpoint(tmp_path, 6, small_model(1), {"tokens": 6})
    five, six = (checkpoint_paths(tmp_path, s)[0] for s in (5, 6))
    shutil.copyfile(six, five)  # valid safetensors bytes, same names and shapes: not step 5's
    load_file(five)  # safetensors itself sees nothing wrong

    damaged = []
    assert [m["step"] for m in list_checkpoints(tmp_path, damaged)] == [6]
    (err,) = damaged
    assert isinstance(err, DamagedFile) and err.path == five and err.step == 5
    assert str(err) == (
        f"damaged checkpoint {five}: sha256 mismatch (truncated or overwritten);"
        " rerun the run's train job to rewrite it"
    )
    meta = json.loads(checkpoint_paths(tmp_path, 5)[1].read_text())
    with pytest.raises(DamagedFile, match="sha256 mismatch"):
        verify_checkpoint({**meta, "weights": str(five)})
    # Unverified, the listing would show both (what a caller sees with verify=False).
    assert [m["step"] for m in list_checkpoints(tmp_path, verify=False)] == [5, 6]


def test_what_else_is_damage_and_what_is_not(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, small_model(step), {"tokens": step})
    weights = {s: checkpoint_paths(tmp_path, s)[0] for s in (1, 2, 3, 4)}
    metas = {s: checkpoint_paths(tmp_path, s)[1] for s in (1, 2, 3, 4)}
    weights[1].unlink()  # missing weights
    metas[2].write_text("{not json")  # unparseable metadata
    legacy = json.loads(metas[3].read_text())  # written before checksums: accepted unverified
    assert legacy.pop("weights_sha256") is not None
    metas[3].write_text(json.dumps(legacy))
    (tmp_path / "ckpt" / "step_000009.safetensors").write_bytes(b"half-saved, no JSON yet")

    damaged = []
    assert [m["step"] for m in list_checkpoints(tmp_path, damaged)] == [3, 4]
    assert [(d.path, d.step) for d in damaged] == [(weights[1], 1), (metas[2], 2)]
    assert "the weights file is missing" in str(damaged[0])
    assert "unreadable JSON" in str(damaged[1])
    # A legacy checkpoint that safetensors cannot parse is refused by name when loaded.
    truncate(weights[3])
    (legacy_meta,) = [m for m in list_checkpoints(tmp_path) if m["step"] == 3]
    with pytest.raises(DamagedFile, match=re.escape(f"{weights[3]}: not a safetensors file")):
        load_checkpoint_weights(legacy_meta)


def test_resume_state_damage(tmp_path):
    model = small_model(0)
    save_resume_state(tmp_path, {"step": 1, "model": model.state_dict()})
    save_resume_state(tmp_path, {"step": 2, "model": model.state_dict()})
    state, damaged = load_resume_state(tmp_path)
    assert int(state["step"]) == 2 and damaged == []
    assert int(load_resume_state(tmp_path, max_step=1)[0]["step"]) == 1

    sidecar = resume_sidecar(tmp_path).read_text()
    torch.save({"step": 2, "model": small_model(1).state_dict()}, resume_path(tmp_path))
    state, damaged = load_resume_state(tmp_path)  # loads fine, but is not what was saved
    assert int(state["step"]) == 1
    assert [str(d) for d in damaged] == [
        f"damaged resume state {resume_path(tmp_path)}: sha256 mismatch with resume.json"
        " (truncated or overwritten); training falls back to the run's other state"
        " (or starts afresh)"
    ]
    resume_sidecar(tmp_path).write_text(sidecar)

    # No sidecar: a state from before sidecars (saving always leaves one), used unverified if
    # it loads, so that runs started before checksums resume instead of retraining.
    resume_sidecar(tmp_path).unlink()
    state, damaged = load_resume_state(tmp_path)
    assert int(state["step"]) == 2 and damaged == []
    assert int(load_resume_state(tmp_path, max_step=1)[0]["step"]) == 1
    truncate(resume_path(tmp_path))
    state, damaged = load_resume_state(tmp_path)
    assert int(state["step"]) == 1 and "torch.load failed" in str(damaged[0])
    save_resume_state(tmp_path, {"step": 2, "model": model.state_dict()})
    sidecar = resume_sidecar(tmp_path).read_text()

    resume_sidecar(tmp_path).write_text("[]")
    assert "unreadable sidecar" in str(load_resume_state(tmp_path)[1][0])

    # A file that matches its checksum but that torch.load refuses (here: not a pickle at all).
    resume_path(tmp_path).write_bytes(b"not a torch file")
    digest = file_sha256(resume_path(tmp_path))
    resume_sidecar(tmp_path).write_text(json.dumps({"step": 2, "sha256": digest}))
    state, damaged = load_resume_state(tmp_path)
    assert int(state["step"]) == 1 and "torch.load failed" in str(damaged[0])

    truncate(resume_path(tmp_path, prev=True))  # and now the previous one too: nothing left
    state, damaged = load_resume_state(tmp_path)
    assert state is None and len(damaged) == 2
    assert f"damaged resume state {resume_path(tmp_path, prev=True)}: sha256 mismatch" in str(
        damaged[1]
    )


# --------------------------------------------------------------------------------------------
# (c) probing refuses a damaged checkpoint by name


def test_probing_a_truncated_checkpoint_names_it(spec, data_dir, reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    shutil.rmtree(run_dir / "probes", ignore_errors=True)
    weights = checkpoint_paths(run_dir, 60)[0]
    truncate(weights)
    probe = complete("probe", {})
    message = f"damaged checkpoint {weights}: sha256 mismatch"

    with pytest.raises(DamagedFile, match=re.escape(message)):
        probe_run(run_dir, probe, torch.device("cpu"))
    meta = json.loads(checkpoint_paths(run_dir, 60)[1].read_text())
    with pytest.raises(DamagedFile, match=re.escape(message)):
        probe_checkpoint({**meta, "weights": str(weights)}, probe, torch.device("cpu"))

    capsys.readouterr()
    heads, table = tmp_path / "heads.parquet", tmp_path / "model.parquet"
    argv = ["--run-dir", str(run_dir), "--heads", str(heads), "--model-table", str(table),
            "--device", "cpu", "--threads", "1"]  # fmt: skip
    assert probe_command.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and "Safetensor" not in captured.err
    assert not heads.exists() and not table.exists()


# --------------------------------------------------------------------------------------------
# (d) a kill while a state is being saved leaves a good state


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so nothing on the way out handles it."""


def kill_during_rotation(monkeypatch, point: str, at_step: int) -> None:
    """Make the save of the state of ``at_step`` stop dead at ``point`` of the rotation."""
    real_replace, real_write_json = resume.os.replace, resume.write_json

    def replace(src, dst):
        if Path(src).name == "resume.pt" and point == "before_rename":
            raise Killed
        real_replace(src, dst)
        if Path(src).name == "resume.pt" and point == "after_rename":
            raise Killed

    def write_json(path, obj):
        if Path(path).name == "resume.json" and obj["step"] == at_step:
            raise Killed
        real_write_json(path, obj)

    monkeypatch.setattr(resume, "os", types.SimpleNamespace(replace=replace))
    if point == "before_sidecar":
        monkeypatch.setattr(resume, "write_json", write_json)


@pytest.mark.parametrize("point", ["before_rename", "after_rename", "before_sidecar"])
def test_a_kill_during_the_state_rotation_resumes_from_a_good_state(
    point, monkeypatch, spec, data_dir, reference, tmp_path, capsys
):
    """Killed while saving the state of step 60 (the one of 30 being rotated to resume.prev):
    whatever point it reached, the rerun resumes from 30 and ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    kill_during_rotation(monkeypatch, point, at_step=60)
    with pytest.raises(Killed):
        train(spec, data_dir, run_dir, CPU)
    monkeypatch.undo()
    files = {p.name for p in (run_dir / "state").iterdir() if not p.name.endswith(".tmp")}
    expected = {
        "before_rename": {"resume.pt", "resume.json", "resume.prev.json"},
        "after_rename": {"resume.json", "resume.prev.pt", "resume.prev.json"},  # no current .pt
        "before_sidecar": {"resume.pt", "resume.json", "resume.prev.pt", "resume.prev.json"},
    }[point]
    assert files == expected
    capsys.readouterr()

    train(spec, data_dir, run_dir, CPU)
    out = capsys.readouterr().out
    assert f"resuming at step 30/{STEPS}" in out
    # Only the last point leaves a file that fails its check (the new .pt, the old sidecar).
    assert ("damaged resume state" in out) == (point == "before_sidecar")
    assert_same_as_reference(run_dir, reference)


def test_only_the_previous_state_left_resumes_from_it(spec, data_dir, reference, tmp_path, capsys):
    run_dir = stopped_run(spec, data_dir, tmp_path / "run")  # states at 60 and 30
    resume_path(run_dir).unlink()
    resume_sidecar(run_dir).unlink()
    capsys.readouterr()
    train(spec, data_dir, run_dir, CPU)
    out = capsys.readouterr().out
    assert f"resuming at step 30/{STEPS}" in out and "damaged" not in out
    assert_same_as_reference(run_dir, reference)
