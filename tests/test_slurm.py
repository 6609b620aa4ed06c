"""The study on a real single-node SLURM cluster, through the real `slurm` profile.

The cluster (tests/slurm_cluster.py) runs munged, slurmctld and slurmd on this machine with two
fake GPUs and the partitions the profile names, so the only test-cluster overrides
are fast status polling. Every Snakemake command here is ``snakemake --profile <repo>/slurm``,
with the job command lines, sbatch calls and retries of a real cluster. Skipped, with the reason,
where the SLURM binaries are missing or the tests do not run as root.

- the smallest study completes, with every rule except the local ones running as a SLURM job;
- force-retraining one configuration as docs/running.md says (delete its folder) reruns only its
  train, probe and figure jobs and the aggregate, under SLURM;
- scancel of a running training job, with SIGTERM (a plain scancel, or preemption) or with
  SIGUSR1 (what the profile asks SLURM to send before the walltime): training saves its state
  at the next step, the retry resumes from exactly that step and ends with the weights of an
  uninterrupted run, bit for bit;
- kill -9 of the Snakemake driver and of its training job: docs/running.md's recovery (unlock, then
  the same command again; the profile sets rerun-incomplete) finishes the study, resuming the
  killed run and not retraining the finished one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import REPO, job_stats, study_text
from ihsweep.config import Run, StudyPaths
from ihsweep.files import layout
from ihsweep.training.checkpoints import list_checkpoints
from ihsweep.training.weights import load_weights
from slurm_cluster import LocalSlurm, missing_requirements

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements())),
]

# Test-cluster overrides only: poll the queue every second instead of every 30 s.
FAST_POLLING = (
    "--seconds-between-status-checks", "1", "--slurm-init-seconds-before-status-checks", "1",
)  # fmt: skip
TIMEOUT = 900

SMALL = study_text("slurm")
# Long enough to interrupt: ~6k updates, a checkpoint (and resume state) every 100k tokens, a
# progress line every second (the tests read the step from the log; at the default 15 s a fast
# machine's first line can come after the last step).
LONG = (
    SMALL.replace("training: {tokens: 20000,", "training: {tokens: 1500000,")
    .replace(
        "checkpoints: {tokens: [5000, 10000, 20000]}",
        "checkpoints: {start: 50000, linear_from: 100000, every: 100000}",
    )
    .replace("execution: {", "execution: {progress_seconds: 1, ")
)
assert "tokens: 1500000" in LONG and "every: 100000" in LONG and "progress_seconds: 1" in LONG, (
    "tests/studies/slurm.yaml changed"
)
# The resume line of a retried training job: its step and why its state was saved.
RESUMED = re.compile(r"resuming at step (\d+)/\d+ \(state saved (.*)\)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield slurm
    slurm.stop()


def driver_cmd(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
        "--directory", str(workdir), "--profile", str(REPO / "slurm"), *FAST_POLLING, *args,
        "--configfile", str(workdir / "config.yaml"),
    ]  # fmt: skip


def snakemake(workdir: Path, *args: str) -> SimpleNamespace:
    """``snakemake --profile slurm`` in ``workdir`` (conftest's ``snakemake`` runs locally)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        driver_cmd(workdir, *args), capture_output=True, text=True, timeout=TIMEOUT, cwd=workdir
    )
    out = proc.stdout + proc.stderr
    return SimpleNamespace(rc=proc.returncode, out=out, seconds=time.monotonic() - t0)


def start_driver(workdir: Path, *args: str) -> subprocess.Popen:
    log = open(workdir / "driver.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        driver_cmd(workdir, *args), stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        start_new_session=True,
    )  # fmt: skip


def new_study(tmp_path: Path, config: str) -> Path:
    (tmp_path / "config.yaml").write_text(config)
    return tmp_path


def run_at(ctx: int) -> Run:
    """The study's run at context size ``ctx`` (both studies here train B = 8 on kjv)."""
    return Run("kjv", "tiny", 8, ctx, 0)


def paths_of(workdir: Path) -> StudyPaths:
    """The keyed paths of the study in ``workdir``'s config.yaml."""
    from ihsweep.steps.prepare import prepare

    return StudyPaths(prepare(yaml.safe_load((workdir / "config.yaml").read_text())))


def run_dir(workdir: Path, ctx: int) -> Path:
    return workdir / paths_of(workdir).run_dir(run_at(ctx))


def train_log(workdir: Path, ctx: int) -> str:
    path = workdir / paths_of(workdir).run_log("train", run_at(ctx))
    return path.read_text() if path.exists() else ""


def latest_step(log: str) -> int:
    steps = re.findall(r"\] step (\d+)/", log)
    return int(steps[-1]) if steps else 0


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the driver exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def running_train_job(cluster: LocalSlurm, wildcards_end: str = "") -> str | None:
    """The id of a running training job (the plugin's comment: rule_train_wildcards_...)."""
    for job in cluster.jobs():
        comment = job["comment"]
        if job["state"] == "RUNNING" and comment.startswith("rule_train"):
            if comment.endswith(wildcards_end):
                return job["id"]
    return None


def submitted_ids(out: str) -> list[str]:
    return re.findall(r"submitted with SLURM jobid (\d+)", out)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_weights(list_checkpoints(run_dir)[-1]["weights"])


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ: {different}"


@pytest.fixture(scope="module")
def small(cluster, tmp_path_factory):
    workdir = new_study(tmp_path_factory.mktemp("slurm-small"), SMALL)
    first = snakemake(workdir)
    assert first.rc == 0, first.out[-6000:]
    return SimpleNamespace(dir=workdir, first=first)


def test_smallest_study_completes_under_slurm(small):
    out = small.first.out
    stats = job_stats(out)
    assert stats == {
        "tokenize": 1, "chunk": 2, "train": 2, "probe": 2, "run_figure": 2,
        "aggregate_natural": 1, "heldout_natural": 1, "all": 1,
    }  # fmt: skip
    # Every non-local job went through sbatch; the aggregate ran beside the driver.
    assert len(submitted_ids(out)) == stats["tokenize"] + stats["chunk"] + 2 * 2
    assert "localrule aggregate_natural" in out and "localrule run_figure" in out
    assert all((small.dir / f).is_file() for f in layout.natural_outputs(NATURAL))
    for ctx in (16, 32):
        run = json.loads((run_dir(small.dir, ctx) / layout.RUN_JSON).read_text())
        assert run["tokens"] == 20000 // (8 * ctx) * 8 * ctx
    print(f"smallest study under SLURM: {small.first.seconds:.0f} s for {sum(stats.values())} jobs")


def test_deleting_one_run_reruns_only_its_jobs_under_slurm(small):
    keep = run_dir(small.dir, 16)
    kept = {p: p.stat().st_mtime_ns for p in keep.rglob("*") if p.is_file()}
    # docs/running.md's recipe: delete the run folder (its saved state and its figure too).
    subprocess.run(["rm", "-r", str(run_dir(small.dir, 32))], check=True)
    rerun = snakemake(small.dir)
    assert rerun.rc == 0, rerun.out[-6000:]
    assert job_stats(rerun.out) == {
        "train": 1, "probe": 1, "run_figure": 1, "aggregate_natural": 1, "heldout_natural": 1,
        "all": 1,
    }  # fmt: skip
    assert "wildcards: data=kjv, model=tiny, batch=8, ctx=32, seed=0" in rerun.out
    assert "ctx=16" not in rerun.out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept


@pytest.mark.parametrize(
    ("scancel_args", "signum"),
    [([], signal.SIGTERM), (["--signal=USR1"], signal.SIGUSR1)],
    ids=["scancel", "walltime-warning"],  # SIGTERM; the profile's --signal=USR1@300, by hand
)
def test_scancel_mid_training_resumes_from_saved_state(cluster, tmp_path, scancel_args, signum):
    workdir = new_study(tmp_path, LONG.replace("context_size: [16, 32]", "context_size: 32"))
    driver = start_driver(workdir)
    try:
        job = wait_for(
            lambda: latest_step(train_log(workdir, 32)) >= 1500 and running_train_job(cluster),
            TIMEOUT, "training to pass step 1500 under SLURM", driver,
        )  # fmt: skip
        subprocess.run(["scancel", *scancel_args, job], check=True)
        assert driver.wait(timeout=TIMEOUT) == 0, (workdir / "driver.log").read_text()[-6000:]
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGINT)  # cancels its SLURM jobs
            driver.wait(timeout=60)
    log = train_log(workdir, 32)
    # Snakemake starts the retry's log afresh; the resume line says why its state was saved.
    resumed = RESUMED.findall(log)
    assert len(resumed) == 1 and int(resumed[0][0]) >= 1500, log[-3000:]
    assert resumed[0][1].endswith(f"on signal {int(signum)}"), log[-3000:]
    print(f"scancel {scancel_args} at step >= 1500: the retry resumed at step {resumed[0][0]}")

    # The same run uninterrupted, on this machine without SLURM: the same weights, bit for bit.
    interrupted = run_dir(workdir, 32)
    spec = list_checkpoints(interrupted)[0]["spec"]
    reference = tmp_path / "reference"
    subprocess.run(
        [
            sys.executable, "-m", "ihsweep.steps.train", "--spec", json.dumps(spec),
            "--data-dir", str(workdir / paths_of(workdir).chunk_dir("kjv", 32)),
            "--run-dir", str(reference),
            "--device", "cpu", "--threads", "1",
        ],
        check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )  # fmt: skip
    assert_same_weights(final_weights(interrupted), final_weights(reference))


def test_killed_driver_and_job_recover_as_documented(cluster, tmp_path):
    # One job at a time: one run finishes (job and all) before the other one trains.
    workdir = new_study(tmp_path, LONG)
    run_json = {ctx: run_dir(workdir, ctx) / layout.RUN_JSON for ctx in (16, 32)}

    def one_done_other_training():
        for done, other in ((16, 32), (32, 16)):
            key = paths_of(workdir).run_key(run_at(other))
            job = running_train_job(cluster, f"_{other}_0_{key}")
            if run_json[done].exists() and job and latest_step(train_log(workdir, other)) >= 1000:
                return done, other, job
        return None

    driver = start_driver(workdir, "--jobs", "1")
    try:
        done, killed, job = wait_for(
            one_done_other_training, TIMEOUT, "one run to finish and the other to train", driver
        )
    finally:
        driver.kill()  # kill -9 of the driver: it cannot cancel its jobs
        driver.wait()
    subprocess.run(["scancel", "--signal=KILL", job], check=True)  # and kill -9 of its job
    cluster.wait_until_empty()
    finished_mtime = run_json[done].stat().st_mtime_ns

    locked = snakemake(workdir)
    assert locked.rc != 0 and "LockException" in locked.out  # what the user sees first
    unlock = snakemake(workdir, "--unlock")
    assert unlock.rc == 0, unlock.out[-3000:]
    recovery = snakemake(workdir)
    assert recovery.rc == 0, recovery.out[-6000:]
    assert job_stats(recovery.out)["train"] == 1
    # The one train job is the killed run's (the finished run's probe may come first).
    train_job = (
        r"^rule train:\n(?:    .*\n)*?    wildcards: .*batch=8, ctx=(\d+), seed=0, rkey=\w+$"
    )
    assert re.findall(train_job, recovery.out, re.MULTILINE) == [str(killed)]
    assert run_json[done].stat().st_mtime_ns == finished_mtime  # not retrained
    # The state may be a checkpoint's or one saved on SIGTERM (seen here: slurmstepd terminates
    # the step's other processes when its killed task is gone).
    log = train_log(workdir, killed)
    resumed = RESUMED.findall(log)
    assert len(resumed) == 1 and int(resumed[0][0]) > 0, log[-3000:]
    step, why = resumed[0]
    print(f"kill -9 of driver and job; the recovery resumed the killed run at step {step} ({why})")
