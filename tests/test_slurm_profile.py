"""The slurm profile and the paper-scale study, planned without a cluster (dry runs).

`snakemake --profile slurm --configfile workflow/studies/paper.yaml -n`, typed in the
repository root, must list the paper's whole job DAG with sensible cluster resources.
"""

import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, job_stats
from ihsweep.config import Run
from ihsweep.cost.study import StudyCost
from ihsweep.steps.prepare import prepare

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def paper_dry_run():
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "slurm",
         "--configfile", "workflow/studies/paper.yaml", "-n"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    print(f"paper-scale dry run: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_paper_study_is_the_full_grid(paper_dry_run):
    stats = job_stats(paper_dry_run)
    assert stats == {
        "tokenize": 1, "chunk": 5, "train": 30, "probe": 30, "run_figure": 30,
        "aggregate_natural": 1, "heldout_natural": 1, "all": 1,
    }  # fmt: skip
    # The slurm profile, and under it the workflow profile (scheduler timing) that every run reads.
    assert "Using profiles slurm and workflow specific profile profiles/default" in paper_dry_run


def resources_of(out: str, rule: str) -> list[str]:
    blocks = re.findall(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", out, re.MULTILINE)
    assert blocks, f"no {rule} job in the dry run"
    return blocks


def test_training_jobs_ask_for_a_gpu_memory_and_the_estimated_runtime(paper_dry_run):
    for line in resources_of(paper_dry_run, "train"):
        assert "mem_mb=32000" in line and "micro_batch=auto" in line
        assert "slurm_extra=--signal=USR1@300" in line
    # Each run asks for the cost model's walltime (ihsweep.cost), which differs across cells:
    # the small-B, small-C ones make more updates, each with its fixed overhead.
    study = prepare(yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text()))
    jobs = re.findall(
        r"^rule train:\n(?:    .*\n)*?    wildcards: data=(\S+), model=(\S+), batch=(\d+),"
        r" ctx=(\d+), seed=(\d+), rkey=[0-9a-f]{8}\n(?:    .*\n)*?    resources: .*runtime=(\d+)",
        paper_dry_run,
        re.MULTILINE,
    )
    assert len(jobs) == 30
    asked = {Run(d, m, int(b), int(c), int(s)): int(minutes) for d, m, b, c, s, minutes in jobs}
    costed = StudyCost(study)
    assert asked == {run: costed.train_minutes(run) for run in study.runs}
    assert asked[Run("cc100", "gpt2-2L", 8, 64, 0)] > asked[Run("cc100", "gpt2-2L", 256, 1024, 0)]
    for line in resources_of(paper_dry_run, "probe"):
        assert "runtime=30" in line


def dry_run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def run_jobs(out: str, rule: str) -> dict[Run, str]:
    """Each ``rule`` job's run and resources line in a dry run's output."""
    jobs = re.findall(
        rf"^rule {rule}:\n(?:    .*\n)*?    wildcards: data=(\S+), model=(\S+), batch=(\d+),"
        r" ctx=(\d+), seed=(\d+), rkey=.*\n(?:    .*\n)*?    resources: (.*)$",
        out,
        re.MULTILINE,
    )
    return {Run(d, m, int(b), int(c), int(s)): line for d, m, b, c, s, line in jobs}


@pytest.mark.parametrize("configfile", ["config.yaml", "workflow/studies/paper.yaml"])
def test_jobs_ask_for_a_gpu_where_the_profile_predicts_3x(configfile, paper_dry_run):
    """execution.gpu: auto in both studies: a run's training and probe jobs ask for the GPUs
    the cost model gives it (StudyCost.gpus, tested against the profiles in test_cost.py) and
    go to the profile's gpu_partition with one, to its slurm_partition without; every other
    job (tokenize, chunk, chain) to slurm_partition."""
    out = paper_dry_run if "paper" in configfile else dry_run("--configfile", configfile)
    profile = yaml.safe_load((REPO / "slurm/config.yaml").read_text())["default-resources"]
    cpu, gpu = profile["slurm_partition"], profile["gpu_partition"]
    assert cpu != gpu
    costed = StudyCost(prepare(yaml.safe_load((REPO / configfile).read_text())))
    for rule in ("train", "probe"):
        jobs = run_jobs(out, rule)
        assert set(jobs) == set(costed.study.runs)
        for run, line in jobs.items():
            gpus = costed.gpus(run)
            assert f" gpu={gpus}," in line, (run, line)
            assert f"slurm_partition={gpu if gpus else cpu}," in line, (run, line)
    if "paper" in configfile:
        assert {costed.gpus(run) for run in costed.study.runs} == {1}
    for rule in ("tokenize", "chunk", "chain"):
        for line in re.findall(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", out, re.M):
            assert f"slurm_partition={cpu}," in line and " gpu=" not in line
