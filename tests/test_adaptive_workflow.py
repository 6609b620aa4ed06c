"""The DAG with runs that end before their budget, through the real ``snakemake`` command line.

tests/studies/adaptive.yaml turns on ``training.stop_after_emergence`` (so every training job
probes its own checkpoints) and gives one run an absurd learning rate. The diverged run fails
alone: its job succeeds with a completion record that says diverged, the sweep goes on, and the
probe tables, emergence table, law fit, report page and status list it as diverged. No
checkpoint is probed twice: the probe step finds every checkpoint in the cache training filled.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime

import pandas as pd
import pytest
import yaml
from conftest import REPO, job_stats, run_study, snakemake, study_text
from ihsweep.config import StudyPaths
from ihsweep.files import layout
from ihsweep.report.provenance import STUDY_JSON, StudyClaim
from ihsweep.steps.prepare import prepare

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")

pytestmark = pytest.mark.slow

CONFIG = study_text("adaptive")
DIVERGED = "kjv-copy/tiny/B8-C16-s0"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("adaptive")
    first = run_study(workdir, CONFIG)
    second = snakemake(workdir)
    return workdir, prepare(yaml.safe_load(CONFIG)), first, second


def test_every_job_ran_once_and_the_diverged_run_did_not_stop_the_sweep(study):
    workdir, prepared, first, second = study
    runs = len(prepared.runs)
    stats = job_stats(first.out)
    assert stats["train"] == stats["probe"] == stats["run_figure"] == runs
    assert stats["aggregate_natural"] == 1
    assert "Nothing to be done" in second.out and job_stats(second.out) == {}


def test_the_diverged_run_is_named_with_its_step_and_learning_rate(study):
    workdir, prepared, _, _ = study
    paths = StudyPaths(prepared)
    (run,) = [r for r in prepared.runs if r.id == DIVERGED]
    log = (workdir / paths.run_log("train", run)).read_text()
    assert re.search(rf"\[{re.escape(DIVERGED)}\] diverged: train loss nan at step \d+ \(lr ", log)
    record = json.loads((workdir / paths.run_file(layout.RUN_JSON, run)).read_text())
    assert record["outcome"] == "diverged" and record["steps"] < record["total_steps"]
    model = pd.read_parquet(workdir / paths.probe_table("model", run))
    assert (model["outcome"] == "diverged").all()


def test_tables_law_fit_and_report_list_the_diverged_run(study):
    workdir, prepared, _, _ = study
    emergence = pd.read_csv(workdir / layout.aggregate_file("emergence.csv", NATURAL))
    row = emergence.set_index("run_id").loc[DIVERGED]
    assert row["outcome"] == "diverged" and not row["emerged"]
    assert row["reason"].startswith("diverged: train loss nan at step")
    others = emergence[emergence["run_id"] != DIVERGED]
    assert (others["outcome"] == "completed").all()
    assert (others["tokens_trained"] == others["budget"]).all()  # none emerged, none stopped
    fit = json.loads((workdir / layout.aggregate_file("lawfit.json", NATURAL)).read_text())
    assert fit["diverged_run_ids"] == [DIVERGED]
    page = (workdir / layout.aggregate_file("emergence.html", NATURAL)).read_text()
    assert "diverged" in page and DIVERGED in page


def test_training_probed_every_checkpoint_so_the_probe_step_probed_none(study):
    workdir, prepared, _, _ = study
    paths = StudyPaths(prepared)
    for run in prepared.runs:
        train_log = (workdir / paths.run_log("train", run)).read_text()
        probe_log = (workdir / paths.run_log("probe", run)).read_text()
        n_ckpt = len(json.loads((workdir / paths.run_file(layout.RUN_JSON, run)).read_text())[
            "checkpoints"
        ])  # fmt: skip
        assert len(re.findall(r"^probed step \d+", train_log, re.MULTILINE)) == n_ckpt, run.id
        assert "probed step" not in probe_log, run.id


def test_status_says_diverged_and_counts_tokens_against_the_budget(study):
    workdir, prepared, _, _ = study
    env = {"PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.status", "--configfile", "config.yaml"],
        cwd=workdir, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith(DIVERGED)]
    assert " diverged " in line and "nan at step" in line
    assert "1 diverged" in proc.stdout and "tokens trained" in proc.stdout


def test_study_json_says_where_and_when_the_study_ran_and_status_reads_it(study, tmp_path):
    """Snakemake ran the study with --directory: study.json records that folder and the start,
    and status, typed elsewhere with --directory and --study, reads the study from it."""
    workdir, prepared, _, _ = study
    claim = StudyClaim.read(workdir / layout.study_dir(prepared.name) / STUDY_JSON)
    assert claim.directory == str(workdir) and claim.configfiles == ("config.yaml",)
    assert datetime.fromisoformat(claim.started).tzinfo is not None
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.status", "--directory", str(workdir), "--study",
         prepared.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"study {prepared.name} (--study): config config.yaml, directory {workdir},"
        f" started {claim.started}"
    )
    assert f"{len(prepared.runs)} runs: " in proc.stdout and "1 diverged" in proc.stdout
    assert "study ETA: nothing left to train" in proc.stdout


def test_stopping_replay_reads_the_study_and_leaves_out_the_diverged_run(study, tmp_path):
    # No run of this study emerges within its 60k tokens (test_emergence has the known answer):
    # each completed run replays at every margin, to its budget, with nothing moved.
    workdir, prepared, _, _ = study
    table_csv = tmp_path / "replay.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.margins", "--configfile", "config.yaml",
         "--margins", "0.1", "0.3", "1.0", "--csv", str(table_csv)],
        cwd=workdir, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO / "workflow")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(table_csv)
    completed = sorted(run.id for run in prepared.runs if run.id != DIVERGED)
    assert sorted(set(table["run_id"])) == completed and len(table) == 3 * len(completed)
    assert table["replayable"].all() and not table["replay_emerged"].any()
    assert (table["replay_tokens_trained"] == table["tokens_trained"]).all()
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [row[:5] for row in rows] == [[m, "2", "0", "0", "0"] for m in ("0.1", "0.3", "1")]
