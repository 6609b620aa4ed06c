"""The whole DAG through the real ``snakemake`` command line, on a tiny study in a tmp folder.

One module-scoped fixture runs the study once (about 1.5 minutes on two busy cores: KJV, a
512-type BPE, a 2x2 grid of B x C plus one wider model, attention-only d=32 models, 60k tokens
per run), then runs Snakemake again and dry-runs config changes, before any test looks. The
tests inspect what it left; only the probe-cache test changes the folder, and it runs last.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from ihsweep.aggregate import FIGURES as NATURAL_FIGURES
from ihsweep.config import prepare

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
TIMEOUT = 900

CONFIG = """\
models:
  tiny: {n_layer: 2, n_head: 4, d_model: 32, mlp: false, n_ctx: 64}
  wide: {n_layer: 2, n_head: 4, d_model: 48, mlp: false, n_ctx: 64}
datasets:
  kjv-copy:
    family: natural
    corpus: {source: kjv}
    tokenizer: {kind: bpe, vocab_size: 512}
    repetition: {copy_fraction: 1.0, copy_length: [0.25, 0.5]}
runs:
  - {data: kjv-copy, model: tiny, batch_size: [4, 8], context_size: [16, 32], seed: 0}
  - {data: kjv-copy, model: wide, batch_size: 4, context_size: 16, seed: 0}
training: {tokens: 60000, lr: 0.003}
checkpoints: {start: 5000, linear_from: 20000, every: 20000}
lawfit: {bootstrap: 50}
"""
FIGURES = [
    f"results/natural/figures/{fig}.{ext}" for fig in NATURAL_FIGURES for ext in ("png", "pdf")
]
HEAD_COLUMNS = [
    "run_id", "data", "model", "batch_size", "context_size", "seed", "step", "tokens",
    "layer", "head", "ps", "la",
]  # fmt: skip
MODEL_COLUMNS = [
    "run_id", "data", "model", "n_params", "batch_size", "context_size", "seed", "step",
    "tokens", "ar_acc", "ar_rank", "ps_max", "la_max", "ps_la_corr", "train_loss", "val_loss",
]  # fmt: skip
RUN_FIELDS = ["data", "model", "batch_size", "context_size", "seed"]


def snakemake(workdir: Path, *args: str, configfiles: tuple[Path, ...] = ()) -> SimpleNamespace:
    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
        "--directory", str(workdir),
        *args,  # before --configfile, which takes every path that follows it
        "--configfile", str(workdir / "config.yaml"), *map(str, configfiles),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=workdir, env=dict(os.environ)
    )
    return SimpleNamespace(rc=proc.returncode, out=proc.stdout + proc.stderr, cmd=cmd)


def job_stats(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run, without the total; {} if none."""
    match = re.search(r"^Job stats:\n.*\n-+ +-+\n((?:\S+ +\d+\n)+)", output, re.MULTILINE)
    if not match:
        return {}
    rows = dict(line.split() for line in match.group(1).splitlines())
    counts = {job: int(n) for job, n in rows.items()}
    assert counts.pop("total") == sum(counts.values())
    return counts


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def logs_of(workdir: Path) -> str:
    """Every job log, for a failure message."""
    parts = []
    for log in sorted((workdir / "results" / "logs").rglob("*.log")):
        parts.append(f"--- {log.relative_to(workdir)}\n{log.read_text()[-2000:]}")
    return "\n".join(parts)


def run_study(workdir: Path, config: str) -> SimpleNamespace:
    """Write ``config`` as the folder's config.yaml and run it all; a failure shows every log."""
    (workdir / "config.yaml").write_text(config)
    result = snakemake(workdir)
    assert result.rc == 0, result.out[-6000:] + logs_of(workdir)
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> SimpleNamespace:
    workdir = tmp_path_factory.mktemp("study")
    first = run_study(workdir, CONFIG)
    before = mtimes(workdir / "results")
    second = snakemake(workdir)
    after = mtimes(workdir / "results")

    override = workdir / "min_rise.yaml"
    override.write_text("emergence: {min_rise: 0.2}\n")
    min_rise_file = snakemake(workdir, "-n", configfiles=(override,))
    execution = workdir / "execution.yaml"
    execution.write_text("training: {device: cpu, threads: 2, progress_seconds: 1}\n")
    execution_file = snakemake(workdir, "-n", configfiles=(execution,))
    assert mtimes(workdir / "results") == after, "a dry run changed results/"

    prepared = prepare(yaml.safe_load(CONFIG), SCHEMA)
    return SimpleNamespace(
        dir=workdir,
        study=prepared,
        first=first,
        second=second,
        mtimes_before=before,
        mtimes_after=after,
        min_rise_file=min_rise_file,
        execution_file=execution_file,
    )


def read_table(study, run, name: str) -> pd.DataFrame:
    return pd.read_parquet(study.dir / run.dir / "probes" / f"{name}.parquet")


# --------------------------------------------------------------------------------------------
# What the first run did and left


def test_first_run_ran_every_job_once(study):
    runs = study.study.runs
    assert len(runs) == 5
    assert job_stats(study.first.out) == {
        "tokenize": 1,
        "chunk": 2,
        "train": len(runs),
        "probe": len(runs),
        "run_figure": len(runs),
        "aggregate_natural": 1,
        "all": 1,
    }


def test_every_expected_output_exists(study):
    root = study.dir
    expected = ["results/natural/emergence.csv", "results/natural/lawfit.json", *FIGURES]
    for run in study.study.runs:
        expected += [f"{run.dir}/run.json", f"{run.dir}/probes/heads.parquet"]
        expected += [f"{run.dir}/probes/model.parquet"]
    missing = [path for path in expected if not (root / path).is_file()]
    assert not missing, missing
    for path in FIGURES:
        magic = (root / path).read_bytes()[:8]
        assert magic.startswith(b"\x89PNG" if path.endswith(".png") else b"%PDF"), path
        assert (root / path).stat().st_size > 1000, path
    fit = json.loads(
        (root / "results/natural/lawfit.json").read_text(),
        parse_constant=lambda name: pytest.fail(f"lawfit.json holds {name}"),
    )
    assert isinstance(fit, dict) and "ok" in fit


def test_runs_have_the_study_checkpoints(study):
    for run in study.study.runs:
        steps = study.study.checkpoint_steps(run)
        summary = json.loads((study.dir / run.dir / "run.json").read_text())
        assert summary["checkpoints"] == steps, run.id
        assert summary["steps"] == steps[-1] == study.study.total_steps(run)
        assert summary["tokens"] == steps[-1] * run.tokens_per_step
        saved = sorted((study.dir / run.dir / "ckpt").glob("step_*.json"))
        assert [int(p.stem.removeprefix("step_")) for p in saved] == steps, run.id


def test_model_tables(study):
    for run in study.study.runs:
        table = read_table(study, run, "model")
        assert list(table.columns) == MODEL_COLUMNS, run.id
        steps = study.study.checkpoint_steps(run)
        assert table["step"].tolist() == steps, run.id  # one row per checkpoint, in order
        assert (table["tokens"] == table["step"] * run.batch_size * run.context_size).all()
        assert (table["run_id"] == run.id).all()
        for field in RUN_FIELDS:
            assert (table[field] == getattr(run, field)).all(), (run.id, field)
        n_params = {
            json.loads(p.read_text())["n_params"]
            for p in (study.dir / run.dir / "ckpt").glob("step_*.json")
        }
        assert table["n_params"].unique().tolist() == sorted(n_params)
        for column in ("ar_acc", "ps_max", "la_max"):
            assert table[column].between(0, 1).all(), (run.id, column)
        assert (table["ar_rank"] >= 0).all()
        assert table[["train_loss", "val_loss"]].map(math.isfinite).all().all(), run.id
        assert table["ps_la_corr"].dropna().between(-1, 1).all()


def test_heads_tables_agree_with_model_tables(study):
    for run in study.study.runs:
        heads, model = read_table(study, run, "heads"), read_table(study, run, "model")
        assert list(heads.columns) == HEAD_COLUMNS, run.id
        n_layer = study.study.config["models"][run.model]["n_layer"]
        n_head = study.study.config["models"][run.model]["n_head"]
        assert len(heads) == len(model) * n_layer * n_head
        for (layer, head), rows in heads.groupby(["layer", "head"]):
            assert rows["step"].tolist() == model["step"].tolist(), (layer, head)
        assert sorted(heads["layer"].unique()) == list(range(n_layer))
        assert sorted(heads["head"].unique()) == list(range(n_head))
        assert heads[["ps", "la"]].stack().between(0, 1).all()
        by_step = heads.groupby("step")
        assert by_step["ps"].max().tolist() == pytest.approx(model["ps_max"].tolist())
        assert by_step["la"].max().tolist() == pytest.approx(model["la_max"].tolist())
        assert (heads["tokens"] == heads["step"] * run.tokens_per_step).all()


def test_emergence_table_has_one_row_per_run(study):
    table = pd.read_csv(study.dir / "results/natural/emergence.csv")
    runs = {run.id: run for run in study.study.runs}
    assert sorted(table["run_id"]) == sorted(runs)
    for row in table.itertuples():
        run = runs[row.run_id]
        assert (row.batch_size, row.context_size, row.model) == (
            run.batch_size,
            run.context_size,
            run.model,
        )
    assert set(table["metric"]) == {"ps_max"} and set(table["method"]) == {"breakpoint"}


# --------------------------------------------------------------------------------------------
# Reruns


def test_second_invocation_has_nothing_to_do(study):
    assert study.second.rc == 0, study.second.out[-3000:]
    assert "Nothing to be done" in study.second.out
    assert job_stats(study.second.out) == {}
    assert not re.search(r"^(local)?rule \w+:", study.second.out, re.MULTILINE)
    assert study.mtimes_after == study.mtimes_before


def test_changing_min_rise_in_a_configfile_reruns_only_aggregates_and_figures(study):
    run = study.min_rise_file
    assert run.rc == 0, run.out[-3000:]
    n_runs = len(study.study.runs)
    assert job_stats(run.out) == {"aggregate_natural": 1, "run_figure": n_runs, "all": 1}
    assert re.search(r"params have changed since last execution:\s+aggregate_natural", run.out)


def test_changing_only_execution_settings_reruns_nothing(study):
    run = study.execution_file
    assert run.rc == 0, run.out[-3000:]
    assert job_stats(run.out) == {}, run.out[-3000:]


def test_deleted_probe_tables_come_back_from_the_cache(study):
    """Runs last: it rewrites one run's probe tables (the same content, new mtimes)."""
    run = next(r for r in study.study.runs if r.model == "tiny" and r.batch_size == 8)
    probes = study.dir / run.dir / "probes"
    log = study.dir / "results" / "logs" / "probe" / f"{run.id}.log"
    n_ckpt = len(study.study.checkpoint_steps(run))
    assert len(re.findall(r"^probed step \d+", log.read_text(), re.MULTILINE)) == n_ckpt
    cache = {p.name: p.stat().st_mtime_ns for p in (probes / "cache").glob("*.parquet")}
    assert len(cache) == n_ckpt
    tables = {name: read_table(study, run, name) for name in ("heads", "model")}
    for name in tables:
        (probes / f"{name}.parquet").unlink()

    targets = [f"{run.dir}/probes/{name}.parquet" for name in tables]
    rerun = snakemake(study.dir, *targets)
    assert rerun.rc == 0, rerun.out[-3000:] + log.read_text()
    assert job_stats(rerun.out) == {"probe": 1}
    for name, before in tables.items():
        pd.testing.assert_frame_equal(read_table(study, run, name), before)
    assert "probed step" not in log.read_text()  # every checkpoint was a cache hit
    assert {p.name: p.stat().st_mtime_ns for p in (probes / "cache").glob("*.parquet")} == cache
