"""The fault matrix's kill class: kill -9 at a named point of a training job, rerun, compare.

Two toy runs on one CPU thread, each first trained uninterrupted (the reference):
- ``plain``: 300 updates of B = 4 as two micro-batches of 2, a checkpoint every 30;
- ``early``: a run on periodic data that stops once its checkpoints confirm emergence (the
  early-stop rule probes every checkpoint).

For each point the job is started under ``bench/_kill_at.py``, which sends it SIGKILL at that
point; the same command is then run again (as a retry would), and the probe step after it. The
case passes when the point was reached and the resumed run equals the reference: every file of
``ckpt/`` byte for byte, ``loss.csv``, both probe tables, and ``run.json`` except its timing
fields; the TensorBoard scalars read back (each step once, tokens/s aside); and no temporary
file or lease is left.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import package_env

REPO = Path(__file__).resolve().parents[1]
KILL_AT = str(REPO / "bench" / "_kill_at.py")
TIMING_FIELDS = ("seconds_this_session", "tokens_per_second_this_session")
V = 64  # the toy vocabulary

# Points: TARGET[@return]#N[ in WITHIN] (bench/_kill_at.py). The plain run checkpoints at steps
# 30, 60, ...: the k-th call of save_checkpoint or save_resume_state is step 30k's.
LOOP, RESUME, IO = "ihsweep.training.loop", "ihsweep.training.resume", "ihsweep.files.io"
PLAIN_POINTS = {
    "a step in a log window (update 17)": f"{LOOP}:Trainer.after_update#17",
    "after update 30, before its checkpoint": f"{LOOP}:Trainer.after_update#30",
    "update 151": f"{LOOP}:Trainer.after_update#151",
    "second micro-batch of update 1": "torch.autograd:backward#2",
    "second micro-batch of update 62": "torch.autograd:backward#124",
    "evaluating checkpoint 90": f"{LOOP}:evaluate#3",
    "weights of checkpoint 60 written, not renamed": f"os:replace#3 in {LOOP}:save_checkpoint",
    "weights of checkpoint 60 renamed, its JSON not": f"os:replace#4 in {LOOP}:save_checkpoint",
    "checkpoint 90 written, its val row not": f"{LOOP}:save_checkpoint@return#3",
    "checkpoint 120 and val row written, state not": f"{LOOP}:save_state#4",
    "state 120 being serialised": f"torch:save#4 in {RESUME}:save_resume_state",
    # save_resume_state renames 2 files at the first save and 4 at each one after it
    "state 120: previous sidecar being renamed": f"os:replace#11 in {RESUME}:save_resume_state",
    "state 120: current state being moved": f"os:replace#12 in {RESUME}:save_resume_state",
    "state 120: new state being renamed": f"os:replace#13 in {RESUME}:save_resume_state",
    "state 120: sidecar not yet written": f"{RESUME}:write_json#4",
    "a loss.csv row (the 12th of 16)": "ihsweep.files.records:LossLog._append#12",
    "last update done, before run.json": f"{LOOP}:Trainer.finish#1",
    "progress done, run.json not written": "ihsweep.files.records:write_run#1",
}


def early_points(stop_index: int, stop_step: int) -> dict[str, str]:
    """The early run's points around the checkpoint that confirms its transition (the
    ``stop_index``-th, from 1, at ``stop_step``): a kill between that checkpoint and its state
    used to end the resumed run a checkpoint early."""
    k = stop_index
    return {
        "3 updates before the confirming checkpoint": f"{LOOP}:Trainer.after_update"
        f"#{stop_step - 3}",
        "confirming checkpoint written, state not": f"{LOOP}:save_checkpoint@return#{k}",
        "confirming state saved, before the rule": f"{LOOP}:Trainer.stops_early#{k}",
        "the rule probing the confirming checkpoint": f"ihsweep.probing.run:write_parquet#{k}",
        "the rule decided, before run.json": f"{LOOP}:Trainer.stops_early@return#{k}",
        "the rule two checkpoints earlier": f"{LOOP}:Trainer.stops_early#{max(k - 2, 1)}",
    }


@dataclass
class Case:
    name: str
    passed: bool
    detail: str


def toy_spec(batch: int, context: int, budget: int, checkpoint_tokens, stop: bool) -> dict:
    from ihsweep.config import SCHEMA
    from ihsweep.steps.prepare import prepare

    config = {
        "models": {
            "toy": {"n_layer": 2, "n_head": 2, "d_model": 32, "mlp": False, "n_ctx": context}
        },  # fmt: skip
        "datasets": {
            "toy": {
                "family": "natural",
                "corpus": {"source": "kjv"},
                "tokenizer": {"kind": "bpe", "vocab_size": 258},
            }
        },  # fmt: skip
        "runs": [
            {"data": "toy", "model": "toy", "batch_size": batch, "context_size": context, "seed": 0}
        ],  # fmt: skip
        "training": {"tokens": budget, "lr": 3e-3, "val_batches": 1},
        "checkpoints": {"tokens": checkpoint_tokens},
        "probe": {"n_sequences": 50, "min_layer": 0},
        "emergence": {"metric": "ps_max", "method": "breakpoint", "min_rise": 0.1},
    }
    if stop:
        config["training"]["stop_after_emergence"] = {"margin_decades": 0.5}
    study = prepare(config, SCHEMA)
    (run,) = study.runs
    return {"spec": study.train_spec(run), "probe": study.config["probe"]}


def periodic_data(root: Path, context: int, n_train: int, n_val: int = 64) -> Path:
    """Random tokens repeating with a period of 4..8: prefix matching rises within ~0.1M tokens."""
    from ihsweep.data.chunks import write_chunks

    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        x = rng.integers(0, V, size=(n, context))
        period = rng.integers(4, 9, size=n)
        for row, p in zip(x, period, strict=True):
            for t in range(p, context):
                row[t] = row[t - p]
        splits[split] = x
    return write_chunks(root, splits, V)


def train_argv(job: dict, run_dir: Path, micro_batch: str) -> list[str]:
    return ["-m", "ihsweep.steps.train", "--spec", json.dumps(job["spec"]), "--data-dir",
            str(job["data"]), "--run-dir", str(run_dir), "--device", "cpu", "--threads", "1",
            "--micro-batch", micro_batch, "--progress-seconds", "600"]  # fmt: skip


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], env=package_env(), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def probe(job: dict, run_dir: Path) -> subprocess.CompletedProcess:
    out = run_dir / "tables"
    return run(["-m", "ihsweep.steps.probe", "--run-dir", str(run_dir), "--probe",
                json.dumps(job["probe"]), "--device", "cpu", "--heads", str(out / "heads.parquet"),
                "--model-table", str(out / "model.parquet")])  # fmt: skip


def finished(job: dict, run_dir: Path, flags: tuple[str, ...] = ()) -> str | None:
    """Train (or resume) to the end and probe; None, or what failed."""
    for proc in (run([*train_argv(job, run_dir, job["micro_batch"]), *flags]),
                 probe(job, run_dir)):  # fmt: skip
        if proc.returncode != 0:
            return f"rc {proc.returncode}: {(proc.stdout + proc.stderr)[-400:]}"
    return None


def differences(run_dir: Path, reference: Path) -> list[str]:
    """What differs from the reference run, as defined above."""
    found = []
    names = sorted(p.relative_to(reference) for p in (reference / "ckpt").iterdir())
    got = sorted(p.relative_to(run_dir) for p in (run_dir / "ckpt").iterdir())
    if names != got:
        found.append(f"ckpt files {[str(n) for n in got]} != {[str(n) for n in names]}")
    files = [Path("loss.csv"), Path("tables/heads.parquet"), Path("tables/model.parquet")]
    for name in [n for n in names if n in got] + files:
        if (run_dir / name).read_bytes() != (reference / name).read_bytes():
            found.append(str(name))
    records = [json.loads((d / "run.json").read_text()) for d in (run_dir, reference)]
    for record in records:
        for field in TIMING_FIELDS:
            record.pop(field)
    if records[0] != records[1]:
        keys = sorted(k for k in records[1] if records[0].get(k) != records[1].get(k))
        found.append(f"run.json fields {keys}")
    leftovers = [p.name for p in run_dir.rglob("*") if p.name.endswith((".tmp", "lease.json"))]
    if leftovers:
        found.append(f"left behind: {leftovers}")
    return found + event_differences(run_dir, reference)


def event_differences(run_dir: Path, reference: Path) -> list[str]:
    """What differs in the TensorBoard scalars, read back (``ihsweep.training.events``): the
    folders, and per folder each tag's steps and values, tokens/s aside (a timing); and a step
    written twice under any tag, tokens/s included."""
    from ihsweep.files.records import SPEED, read_scalars

    found = []
    folders = [sorted(p.name for p in (d / "tensorboard").glob("*")) for d in (run_dir, reference)]
    if folders[0] != folders[1]:
        found.append(f"tensorboard folders {folders[0]} != {folders[1]}")
    for name in folders[1]:
        got, want = (read_scalars(d / "tensorboard" / name) for d in (run_dir, reference))
        twice = [tag for tag, values in got.items() if len({s for s, _ in values}) < len(values)]
        if twice:
            found.append(f"tensorboard/{name}: a step written twice under {twice}")
        tags = sorted(t for t in (got.keys() | want.keys()) - {SPEED} if got.get(t) != want.get(t))
        if tags:
            found.append(f"tensorboard/{name}: scalars {tags}")
    return found


def kill_case(index: int, name: str, point: str, job: dict, work: Path) -> Case:
    run_dir = work / f"run-{index}"
    killed = run([KILL_AT, point, *train_argv(job, run_dir, job["micro_batch"])])
    if killed.returncode != -signal.SIGKILL:
        why = "never reached" if killed.returncode == 3 else f"rc {killed.returncode}"
        return Case(name, False, f"{point}: {why} {killed.stderr[-300:]}")
    failure = finished(job, run_dir)
    if failure is not None:
        return Case(name, False, f"resume failed: {failure}")
    found = differences(run_dir, job["reference"])
    shutil.rmtree(run_dir)
    return Case(name, not found, "; ".join(found) or "equal to the uninterrupted run")


def prepare_data(work: Path) -> Path:
    """The plain run's data: random tokens, C = 32."""
    from ihsweep.data.chunks import write_chunks

    rng = np.random.default_rng(0)
    splits = {"train": rng.integers(0, V, (96, 32)), "val": rng.integers(0, V, (8, 32))}
    return write_chunks(work / "plain-data", splits, V)


def prepare_jobs(work: Path) -> dict[str, dict]:
    """The two toy runs, their data and their uninterrupted references."""
    plain = toy_spec(4, 32, 300 * 128, [k * 128 for k in range(30, 301, 30)], False)
    plain.update(data=prepare_data(work), micro_batch="2")
    budget = 500_000
    early = toy_spec(8, 16, budget, [round(budget * f) for f in np.geomspace(0.008, 1, 20)],
                     True)  # fmt: skip
    early.update(data=periodic_data(work / "early-data", 16, 4000), micro_batch="auto")
    jobs = {"plain": plain, "early": early}
    for label, job in jobs.items():
        job["reference"] = work / f"{label}-reference"
        failure = finished(job, job["reference"])
        if failure is not None:
            raise RuntimeError(f"the {label} reference run failed: {failure}")
    return jobs


def kill_cases(quick: bool) -> list[Case]:
    """Every point (``quick``: three of the plain run's and the early run's known one)."""
    with tempfile.TemporaryDirectory(prefix="ihsweep-kills-") as tmp:
        work = Path(tmp)
        jobs = prepare_jobs(work)
        early = jobs["early"]
        record = json.loads((early["reference"] / "run.json").read_text())
        if record["outcome"] != "stopped_early":
            raise RuntimeError(f"the early run did not stop early: {record['outcome_detail']}")
        stop_index = early["spec"]["checkpoint_steps"].index(record["steps"]) + 1
        early_at = early_points(stop_index, record["steps"])
        cases = [(n, p, jobs["plain"]) for n, p in PLAIN_POINTS.items()]
        cases += [(n, p, early) for n, p in early_at.items()]
        if quick:
            keep = {"update 151", "checkpoint 90 written, its val row not",
                    "state 120: new state being renamed",
                    "confirming checkpoint written, state not"}  # fmt: skip
            cases = [c for c in cases if c[0] in keep]
        return [kill_case(i, name, point, job, work) for i, (name, point, job) in enumerate(cases)]
