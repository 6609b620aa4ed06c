"""The cost model (``ihsweep.cost``): parameters, FLOPs, walltime and memory on hand-computed
cases; memory against what a real training job measures; the memory check that refuses a cell
before any job starts; ``python -m ihsweep.cost`` on the paper study.

The memory-bound case is an analog of the paper's largest cell at this machine's scale: GPT-2's
vocabulary, B 64 x C 64, whose full-batch logits (0.8 GB in fp32, ~3.2 GB with what the loss
keeps for backward) are beyond a 1.5 GB job, and a deep, narrow model (64 layers of width 64)
whose full-batch activations alone (~1.2 GB) are too; with ``micro_batch: auto`` the job
trains within 1.5 GB, measured.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, SCHEMA, write_chunks
from ihsweep import cost
from ihsweep.config import GPT2_VOCAB_SIZE, ConfigError
from ihsweep.cost.report import COLUMNS, cost_report, cost_table, format_cost
from ihsweep.cost.study import StudyCost
from ihsweep.steps.prepare import prepare
from ihsweep.training.model import GPT, GPTConfig

PAPER_MODEL = {"n_layer": 2, "n_head": 8, "d_model": 768, "mlp": True, "n_ctx": 1024}
PROFILE = {"peak_tflops": 100.0, "mfu": 0.5, "step_overhead_ms": 2.0, "memory_gb": 10}
EXECUTION = {"overhead_minutes": 10, "safety": 1.5, "train_mem_mb": 1500}


@pytest.mark.parametrize(
    "model",
    [
        PAPER_MODEL,
        {"n_layer": 2, "n_head": 4, "d_model": 64, "mlp": False, "n_ctx": 32},
        {"n_layer": 3, "n_head": 2, "d_model": 48, "mlp": True, "n_ctx": 100},
    ],
)
def test_parameter_count_is_the_models(model):
    vocab = 50257 if model["d_model"] == 768 else 300
    built = GPT(GPTConfig(vocab_size=vocab, **model))
    assert cost.parameter_count(model, vocab) == built.n_params()


def test_flops_per_token_of_the_paper_model_by_hand():
    # 6 * (2 layers * 12 * 768^2 + 50,257 * 768) + 12 * 2 * 768 * 1024
    by_hand = 6 * (2 * 12 * 768**2 + 50257 * 768) + 12 * 2 * 768 * 1024
    assert cost.flops_per_token(PAPER_MODEL, 50257, 1024) == by_hand == 335_393_280


def test_train_seconds_and_walltime_by_hand():
    # 1,000 updates of 4 passes at 2 ms = 8 s; 1e9 tokens * 3e8 FLOP / (100e12 * 0.5) = 6,000 s
    seconds = cost.train_seconds(1000, 4, 10**9, 3e8, PROFILE)
    assert seconds == pytest.approx(6008.0)
    # ceil(10 + 1.5 * 6,008 / 60) = ceil(160.2) = 161 minutes; a second attempt asks twice that
    assert cost.job_minutes(seconds, EXECUTION, 1) == 161
    assert cost.job_minutes(seconds, EXECUTION, 2) == 322


def test_early_stop_tokens_by_hand():
    # Checkpoints of a run at B * C = 1,000 tokens a step: 10k, 20k, ..., 100k (its budget).
    checkpoints = list(range(10_000, 100_001, 10_000))
    # 12k predicted, half a decade on: 37,947 tokens, the step nearest is 38: the 40k checkpoint.
    assert cost.early_stop_tokens(12_000, 0.5, checkpoints, 1000) == 40_000
    # A target on a checkpoint stops there (the step nearest 10^4.5 * 10^0.5 = 100k is 100).
    assert cost.early_stop_tokens(10**4.5, 0.5, checkpoints, 1000) == 100_000
    # 20,000 * 10^0.5 = 63,246 tokens: step 63, the 70k checkpoint; margin 0: at 20k itself.
    assert cost.early_stop_tokens(20_000, 0.5, checkpoints, 1000) == 70_000
    assert cost.early_stop_tokens(20_000, 0.0, checkpoints, 1000) == 20_000
    # Past the budget (50k * 3.16 = 158k): the last checkpoint, the budget.
    assert cost.early_stop_tokens(50_000, 0.5, checkpoints, 1000) == 100_000


def test_a_study_counts_each_runs_expected_stop_from_its_law():
    config = yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text())
    # U_pt = 10^6 / (B^1 C^0) updates, i.e. 10^6 * C tokens: at C 64, 64M tokens, + half a
    # decade = 202.4M, between the checkpoints at 200M and 300M; at C 1024, 1.024B is past the
    # 1B budget. A narrow window adds only the prediction itself to the paper's 30 checkpoints.
    law = {"a": 1.0, "b": 0.0, "log10_T": 6.0}
    config["checkpoints"]["densify"] = {"law": law, "window_decades": 0.01, "per_decade": 1}
    study = prepare(config, SCHEMA)
    costed = StudyCost(study)
    rows = {(r.batch_size, r.context_size): costed.row(r) for r in study.runs}
    small, large = rows[(8, 64)], rows[(8, 1024)]
    # The first checkpoint after 202.4M: 300M, at the step nearest it (B * C = 512 tokens a step).
    assert small["early_stop_tokens"] == round(300_000_000 / 512) * 512
    assert large["early_stop_tokens"] == large["tokens"] == 1_000_000_000 - 1_000_000_000 % 8192
    assert small["early_stop_device_hours"] == pytest.approx(
        small["device_hours"] * 0.3, rel=1e-3
    )  # tokens and updates both 30% of the budget's
    assert large["early_stop_device_hours"] == large["device_hours"]
    # The walltime asked for stays the full budget's.
    run = next(r for r in study.runs if (r.batch_size, r.context_size) == (8, 64))
    assert small["walltime_min"] == costed.train_minutes(run)
    assert costed.train_minutes(run) == cost.job_minutes(
        costed.train_seconds(run), study.config["execution"], 1
    )
    # Early stop off: every run at its budget, whatever the law says.
    config["training"]["stop_after_emergence"] = False
    off = StudyCost(prepare(config, SCHEMA))
    rows = [off.row(r) for r in off.study.runs]
    assert all(row["early_stop_tokens"] == row["tokens"] for row in rows)


def test_dataset_jobs_take_their_runtime_from_the_corpus_size(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(b"x" * 12_000_000)  # 12 MB at 2 MB/s = 6 s: ceil(10 + 1.5 * 0.1) = 11
    files = {"source": "files", "paths": [str(tmp_path / "*.txt")]}
    assert cost.corpus_bytes(files) == 12_000_000
    assert cost.tokenize_minutes(files, EXECUTION, 1) == 11
    hub = {"source": "huggingface", "max_documents": 20_000_000}  # 20 GB at 2 MB/s: 10,000 s
    assert cost.tokenize_minutes(hub, EXECUTION, 1) == math.ceil(10 + 1.5 * 10_000 / 60)
    assert cost.tokenize_minutes({**hub, "max_documents": None}, EXECUTION, 2) == 2 * 24 * 60
    assert cost.chunk_minutes(3e8, EXECUTION, 1) == math.ceil(10 + 1.5 * 60 / 60)


@pytest.mark.parametrize(
    "batch, micro, sizes",
    [(8, 8, [8]), (8, 100, [8]), (256, 64, [64] * 4), (10, 4, [4, 3, 3]), (5, 2, [2, 2, 1])],
)
def test_micro_batch_sizes_split_the_batch_evenly(batch, micro, sizes):
    assert cost.micro_batch_sizes(batch, micro) == sizes


def test_memory_estimate_by_hand():
    model = {"n_layer": 2, "n_head": 4, "d_model": 64, "mlp": False, "n_ctx": 64}
    parts = cost.peak_memory(model, 1000, 8, 64, "cpu")
    n_params = cost.parameter_count(model, 1000)
    assert parts["state"] == 16 * n_params
    assert parts["activations"] == 8 * 64 * (2 * 8 * 64 + 6 * 64) * 4
    assert parts["logits"] == 8 * 63 * 1000 * 16  # 504 positions: one loss chunk
    big = cost.peak_memory(model, 50257, 64, 64, "cpu")
    assert big["logits"] == (2**24 // 50257) * 50257 * 16  # one chunk of 333 positions
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")


def test_auto_picks_the_largest_micro_batch_that_fits():
    model = {"n_layer": 64, "n_head": 4, "d_model": 64, "mlp": True, "n_ctx": 64}
    limit = 1500 * cost.MB
    m = cost.pick_micro_batch(model, 50257, 64, 64, "cpu", limit)
    assert 1 <= m < 64
    estimates = [cost.peak_memory(model, 50257, k, 64, "cpu")["total"] for k in (m, m + 1)]
    fits = [estimate <= 0.85 * limit for estimate in estimates]
    assert fits == [True, False]
    assert cost.pick_micro_batch(model, 50257, 64, 64, "cpu", 100 * cost.MB) is None
    assert cost.pick_micro_batch(model, 50257, 8, 64, "cpu", 100 * cost.GB) == 8


# --------------------------------------------------------------------------------------------
# Which jobs ask for a GPU


def study_of(path: str, **execution):
    config = yaml.safe_load((REPO / path).read_text())
    config["execution"] = {**config.get("execution", {}), **execution}
    return prepare(config, SCHEMA)


def test_gpu_auto_asks_for_one_where_the_profile_predicts_3x():
    """execution.gpu: auto gives a run's jobs a GPU exactly where the study's profile predicts
    it at least GPU_MIN_SPEEDUP times as fast as the CPU profile (both recomputed here from
    the profiles' constants); a number forces every run; a CPU job's walltime is the CPU's."""
    for path in ("config.yaml", "workflow/studies/paper.yaml"):
        costed = StudyCost(study_of(path, gpu="auto"))
        gpu, cpu = costed.gpu_kind, cost.DEVICE_PROFILES["cpu"]
        for run in costed.study.runs:
            model, vocab = costed.study.model_of(run), costed.study.vocab_size_of(run.data)
            fpt = cost.flops_per_token(model, vocab, run.context_size)
            # one pass per update: these runs fit both devices whole
            per_update = [
                p["step_overhead_ms"] / 1e3
                + run.tokens_per_step * fpt / (p["peak_tflops"] * 1e12 * p["mfu"])
                for p in (cpu, gpu)
            ]
            assert costed.gpu_speedup(run) == pytest.approx(per_update[0] / per_update[1])
            want = int(per_update[0] / per_update[1] >= cost.GPU_MIN_SPEEDUP)
            assert costed.gpus(run) == want, run
            seconds = costed.study.total_steps(run) * per_update[want]
            assert costed.train_minutes(run) == cost.job_minutes(seconds, costed.execution, 1)
        assert {costed.gpus(run) for run in costed.study.runs} >= (
            {1} if path.endswith("paper.yaml") else set()
        )
        for forced in (0, 2):
            forced_cost = StudyCost(study_of(path, gpu=forced))
            assert {forced_cost.gpus(run) for run in forced_cost.study.runs} == {forced}


# --------------------------------------------------------------------------------------------
# Profiles


def test_device_profile_auto_and_from_a_benchmark_file(tmp_path):
    execution = {"device_profile": "auto", "device": "auto", "gpu": 1, "gpu_model": None}
    assert cost.device_profile(execution)["name"] == "a100-80gb"
    assert cost.device_profile({**execution, "gpu_model": "H100"})["name"] == "h100"
    assert cost.device_profile({**execution, "device": "cpu"})["name"] == "cpu"
    assert cost.device_profile({**execution, "gpu": 0})["memory_gb"] is None
    measured = tmp_path / "mine.json"
    measured.write_text(json.dumps({"profile": PROFILE, "cells": []}))
    got = cost.device_profile({**execution, "device_profile": str(measured)})
    assert {k: got[k] for k in PROFILE} == PROFILE
    measured.write_text(json.dumps({"profile": {"peak_tflops": 1}}))
    with pytest.raises(ValueError, match="not a device profile.*mfu"):
        cost.device_profile({**execution, "device_profile": str(measured)})


# --------------------------------------------------------------------------------------------
# The memory-bound analog of the paper's largest cell, through the config and a real job

ANALOG_MODEL = {"n_layer": 64, "n_head": 4, "d_model": 64, "mlp": True, "n_ctx": 64}
ANALOG_B, ANALOG_C = 64, 64
LIMIT_MB = 1500


def analog_config(micro_batch, family: str = "gpt2") -> dict:
    model = ANALOG_MODEL if family == "gpt2" else {**ANALOG_MODEL, "family": family}
    return {
        "models": {"deep": model},
        "datasets": {"web": {"family": "natural", "corpus": {"source": "kjv"}}},  # GPT-2 vocab
        "runs": [{"data": "web", "model": "deep", "batch_size": ANALOG_B, "context_size": 64}],
        "training": {"tokens": 2 * ANALOG_B * ANALOG_C, "log_every": 1, "val_batches": 1},
        "checkpoints": {"tokens": [2 * ANALOG_B * ANALOG_C]},
        "execution": {"device": "cpu", "train_mem_mb": LIMIT_MB, "micro_batch": micro_batch},
    }


def test_validation_refuses_the_analog_cell_without_micro_batches():
    with pytest.raises(ConfigError) as err:
        prepare(analog_config(ANALOG_B), SCHEMA)
    message = str(err.value)
    fragments = [
        "execution.micro_batch", "web/deep/B64-C64-s0", "at micro-batch 64",
        "1.5 GB (execution.train_mem_mb)", "set micro_batch: auto (it fits at",
    ]  # fmt: skip
    for fragment in fragments:
        assert fragment in message, message
    too_small = analog_config("auto")
    too_small["execution"]["train_mem_mb"] = 500
    with pytest.raises(ConfigError, match=r"runs\[0\]: run web/deep/B64-C64-s0 does not fit"):
        prepare(too_small, SCHEMA)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_analog_cell_trains_under_its_memory_limit_with_auto_micro_batches(family, tmp_path):
    study = prepare(analog_config("auto", family), SCHEMA)
    (run,) = study.runs
    costed = StudyCost(study)
    micro_batch = costed.micro_batch(run)
    assert 1 < micro_batch < ANALOG_B
    full_logits = ANALOG_B * (ANALOG_C - 1) * GPT2_VOCAB_SIZE * 4
    assert full_logits > LIMIT_MB * cost.MB / 2  # and ~4x that is what an unsplit loss keeps
    assert costed.peak_memory(run, ANALOG_B)["total"] > LIMIT_MB * cost.MB

    rng = np.random.default_rng(0)
    splits = {
        split: rng.integers(0, GPT2_VOCAB_SIZE, (n, ANALOG_C))
        for split, n in (("train", 4 * ANALOG_B), ("val", ANALOG_B))
    }
    data = write_chunks(tmp_path / "data", splits, GPT2_VOCAB_SIZE)
    command = [
        sys.executable, "-m", "ihsweep.steps.train", "--spec", json.dumps(study.train_spec(run)),
        "--data-dir", str(data), "--run-dir", str(tmp_path / "run"), "--device", "cpu",
        "--threads", "1", "--micro-batch", "auto", "--train-mem-mb", str(LIMIT_MB),
    ]  # fmt: skip
    # The peak of the job alone: a wrapper process reports its one child's ru_maxrss (KiB).
    wrapper = (
        "import resource, subprocess, sys; "
        "rc = subprocess.run(sys.argv[1:]).returncode; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
    )
    env = {"PYTHONPATH": str(REPO / "workflow"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *command], capture_output=True, text=True, env=env,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    peak = int(proc.stdout.split()[-1]) * 1024
    assert f"micro-batch(es) of at most {micro_batch} per update of B = 64" in proc.stdout
    assert (tmp_path / "run" / "run.json").exists()
    assert peak < LIMIT_MB * cost.MB, f"peak {peak / 1e9:.2f} GB"
    # The estimate is an upper bound, and not a loose one.
    estimate = costed.peak_memory(run, micro_batch)["total"]
    assert peak <= estimate <= 1.5 * peak


# --------------------------------------------------------------------------------------------
# The paper study


def test_cost_table_of_the_paper_study_lists_its_30_cells(tmp_path):
    table = tmp_path / "cost.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.cost", "--configfile", "workflow/studies/paper.yaml",
         "--csv", str(table)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    rows = pd.read_csv(table)
    assert len(rows) == 30 and rows.run_id.is_unique
    assert list(rows.columns) == COLUMNS
    assert (rows.tokens.between(0.999e9, 1e9)).all()
    assert (rows.updates == 10**9 // (rows.run_id.str.extract(r"B(\d+)-C(\d+)").astype(int)
                                      .prod(axis=1))).all()  # fmt: skip
    assert (rows.peak_gb <= 0.85 * rows.limit_gb).all() and (rows.walltime_min > 0).all()
    # The paper's 30 checkpoints and the densified ones around each prediction.
    assert rows.checkpoints.gt(30).all()
    # Early stop: every run's expected stop is within its budget, the small cells' far within.
    assert (rows.early_stop_tokens <= rows.tokens).all()
    assert (rows.early_stop_device_hours <= rows.device_hours).all()
    smallest = rows.set_index("run_id").loc["cc100/gpt2-2L/B8-C64-s0"]
    assert smallest.early_stop_tokens < 0.05 * smallest.tokens
    full, stop = rows.device_hours.sum(), rows.early_stop_device_hours.sum()
    assert stop < 0.5 * full
    assert "30 runs, 7,450,091 updates" in proc.stdout
    assert f"full budgets: 30.00B tokens, {full:.1f} GPU-hours" in proc.stdout
    stopped = rows.early_stop_tokens.sum() / 1e9
    assert f"with early stop: {stopped:.2f}B tokens" in proc.stdout
    assert f"{stop:.1f} GPU-hours: each run stops" in proc.stdout


def paper_studies() -> tuple[dict, dict]:
    """paper.yaml, and paper.yaml with its paper-full.yaml overlay, as prepared."""
    from ihsweep.config import load_configfiles

    studies = REPO / "workflow" / "studies"
    paper = load_configfiles([studies / "paper.yaml"])
    full = load_configfiles([studies / "paper.yaml", studies / "paper-full.yaml"])
    return prepare(paper, SCHEMA).config, prepare(full, SCHEMA).config


def differences(a, b, path=()):
    """Key paths where two nested configs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a.keys() | b.keys() for d in differences(a.get(k), b.get(k), (*path, k))]
    return [".".join(map(str, path))] if a != b else []


def test_paper_and_paper_full_differ_only_in_how_runs_end_and_their_checkpoints():
    paper, full = paper_studies()
    assert sorted(differences(paper, full)) == [
        "checkpoints.densify", "study", "training.stop_after_emergence",
    ]  # fmt: skip
    assert paper["training"]["stop_after_emergence"] == {"margin_decades": 0.5}
    assert (
        full["training"]["stop_after_emergence"] is False and full["checkpoints"]["densify"] is None
    )
    assert paper["study"] != full["study"]  # their aggregates in folders of their own


def test_paper_law_is_the_papers_earlier_law_restated_for_its_exponents():
    """log10 T of paper.yaml's law: N_pt = 10^5.7 sqrt(B C) tokens, the paper's earlier form, as
    U_pt = T / (B^0.37 C^0.62) updates by least squares in log10 over the study's 30 cells."""
    paper, _ = paper_studies()
    law = paper["checkpoints"]["densify"]["law"]
    assert (law["a"], law["b"]) == (0.37, 0.62)
    cells = [(r["batch_size"], r["context_size"]) for r in paper["runs"]]
    grid = [(b, c) for b in cells[0][0] for c in cells[0][1]]
    assert len(grid) == 30
    # log10 tokens = log10 T + (1 - a) log10 B + (1 - b) log10 C must match 5.7 + log10(B C) / 2
    residual = [
        5.7
        + 0.5 * math.log10(b * c)
        - (1 - law["a"]) * math.log10(b)
        - (1 - law["b"]) * math.log10(c)
        for b, c in grid
    ]
    assert law["log10_T"] == pytest.approx(np.mean(residual), abs=5e-4)


def test_a_smaller_gpu_splits_the_largest_paper_cell():
    config = yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text())
    config["execution"]["device_profile"] = "a10"  # 24 GB
    study = prepare(config, SCHEMA)
    largest = next(r for r in study.runs if (r.batch_size, r.context_size) == (256, 1024))
    smallest = next(r for r in study.runs if (r.batch_size, r.context_size) == (8, 64))
    costed = StudyCost(study)
    assert costed.micro_batch(largest) < 256 and costed.micro_batch(smallest) == 8
    assert costed.peak_memory(largest, costed.micro_batch(largest))["total"] <= 0.85 * 24e9
    need = costed.peak_memory(largest, 256)["total"] / cost.GB
    config["execution"]["micro_batch"] = 256
    with pytest.raises(ConfigError, match=rf"needs ~{need:.1f} GB at micro-batch 256.* 24.0 GB"):
        prepare(config, SCHEMA)


def test_make_cost_prints_the_table_and_the_dry_run_the_jobs_resources(tmp_path):
    """`make cost CONFIGFILES=...` (python -m ihsweep.cost) prints the cost table; a dry run,
    which cannot know it is one, prints none, only what each job asks a cluster for."""
    # The Makefile's target with this interpreter's environment, which is not reinstalled.
    venv = Path(sys.prefix)
    proc = subprocess.run(
        ["make", "-s", "cost", "CONFIGFILES=workflow/studies/paper.yaml", f"VENV={venv}",
         f"--assume-old={venv / '.installed'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    table_output = proc.stdout
    assert "cc100/gpt2-2L/B256-C1024-s0" in table_output
    assert "30 runs, 7,450,091 updates" in table_output
    # Both totals, as python -m ihsweep.cost prints them.
    study = prepare(yaml.safe_load((REPO / "workflow/studies/paper.yaml").read_text()), SCHEMA)
    costed = StudyCost(study)
    table = cost_table(costed)
    assert f"full budgets: 30.00B tokens, {table.device_hours.sum():.1f} GPU-hours" in table_output
    assert f"{table.early_stop_device_hours.sum():.1f} GPU-hours: each run stops" in table_output

    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", "workflow/studies/paper.yaml",
         "--directory", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "30 runs, 7,450,091 updates" not in output  # the table is make cost's alone
    # The dataset jobs ask for a runtime from the corpus size, not the profile's 60 minutes.
    minutes = costed.tokenize_minutes("cc100")  # 20M documents ~ 20 GB at 2 MB/s: 4.4 hours
    assert minutes > 4 * 60
    assert re.search(rf"rule tokenize:\n(.*\n)*?.*resources: .*runtime={minutes}\b", output)
    chunk = costed.chunk_minutes("cc100", 1024)
    assert re.search(rf"rule chunk:\n(.*\n)*?.*resources: .*runtime={chunk}, mem_mb=4000", output)


def shown(study) -> str:
    """The cost table of ``study`` on its own device profile, as the report formats it."""
    costed = StudyCost(study)
    return format_cost(cost_table(costed), costed)


def test_a_study_that_trains_on_the_cpu_is_shown_in_core_hours_and_host_memory():
    default = yaml.safe_load((REPO / "config.yaml").read_text())

    def study(**execution):  # prepare() expands the config it is given, so each gets a copy
        config = copy.deepcopy(default)
        config["execution"].update(execution)
        return prepare(config, SCHEMA)

    gpu_sized = study()  # device auto: the rule asks for a GPU, so the jobs are sized for one
    assert StudyCost(gpu_sized).profile["name"] == cost.DEFAULT_GPU_PROFILE
    cpu_sized = study(device="cpu")
    core_hours = cost_table(StudyCost(cpu_sized)).device_hours.sum()
    gpu_hours = cost_table(StudyCost(gpu_sized)).device_hours.sum()
    assert core_hours > 2 * gpu_hours
    # On a machine without a GPU, device auto trains on the CPU: the report speaks of it, and a
    # last line gives the GPU the cluster jobs are sized for.
    report, table = cost_report(gpu_sized, gpu_here=False)
    # What its cluster jobs ask for stays the study's own (execution.gpu: auto, run by run).
    cluster = ["walltime_min", "gpus", "gpu_speedup"]
    cpu_table = cost_table(StudyCost(cpu_sized))
    assert table.drop(columns=cluster).equals(cpu_table.drop(columns=cluster))
    assert list(table.gpus) == [StudyCost(gpu_sized).gpus(run) for run in gpu_sized.runs]
    assert list(table.walltime_min) == [
        StudyCost(gpu_sized).train_minutes(run) for run in gpu_sized.runs
    ]
    assert f"full budgets: 0.09B tokens, {core_hours:.1f} core-hours" in report
    assert "host_GB" in report and "GPU_GB" not in report and "/80" not in report
    assert table.device_hours.sum() == core_hours
    assert (
        f"on a GPU (device profile a100-80gb, which sizes cluster jobs): {gpu_hours:.1f}" in report
    )
    # With a GPU here, the GPU's table alone.
    report, _ = cost_report(gpu_sized, gpu_here=True)
    assert report == shown(gpu_sized)
    assert "GPU_GB" in report and "core-hours" not in report
    # Sized for the CPU, or for a GPU the user named, the table stands alone wherever it runs.
    for sized in (cpu_sized, study(device_profile="h200")):
        for here in (True, False):
            report, _ = cost_report(sized, gpu_here=here)
            assert report == shown(sized)
