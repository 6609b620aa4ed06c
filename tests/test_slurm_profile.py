"""The slurm profile and the paper-scale study, planned without a cluster (dry runs).

`snakemake --profile slurm --configfile workflow/studies/paper.yaml -n`, typed in the
repository root, must list the paper's whole job DAG with sensible cluster resources.
"""

import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, job_stats

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
        "aggregate_natural": 1, "all": 1,
    }  # fmt: skip
    assert "Using profile slurm" in paper_dry_run


def resources_of(out: str, rule: str) -> list[str]:
    blocks = re.findall(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", out, re.MULTILINE)
    assert blocks, f"no {rule} job in the dry run"
    return blocks


def test_training_jobs_ask_for_a_gpu_memory_and_the_estimated_runtime(paper_dry_run):
    for line in resources_of(paper_dry_run, "train"):
        assert "gpu=1" in line and "mem_mb=32000" in line
        assert "slurm_extra=--signal=USR1@300" in line
        # 1e9 tokens at 300k tokens/s: 55.6 min * 1.5 + 15 = 98.3 -> 99 minutes, attempt 1.
        assert "runtime=99" in line
        assert "slurm_partition=gpu" in line  # the profile's default, marked for editing
    for line in resources_of(paper_dry_run, "probe"):
        assert "gpu=1" in line and "runtime=30" in line
