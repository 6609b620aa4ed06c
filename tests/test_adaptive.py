"""Runs that end before their budget: divergence fails fast, and (``training.stop_after_emergence``)
a run stops once its emergence is confirmed.

The toy runs of tests/test_train.py (2 layers, d=32, C = 32, random tokens with a copied segment
or with a random period). A run that stops early is the prefix of the full run: the learning-rate
schedule follows the budget, the stopping settings stay out of the state's fingerprint, so a run
trained on after its stop (the option turned off) resumes from the stopped state.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SCHEMA
from ihsweep.analysis.emergence import emergence_table, replay_stop, run_point
from ihsweep.analysis.lawfit import fit_law
from ihsweep.files.layout import PROGRESS_JSON, RUN_JSON
from ihsweep.files.records import read_run
from ihsweep.probing.run import probe_run, with_run_record
from ihsweep.steps import probe as probe_command
from ihsweep.steps.prepare import prepare
from ihsweep.steps.stop_rule import stop_rule_of
from ihsweep.training import loop
from ihsweep.training.checkpoints import list_checkpoints
from ihsweep.training.loop import Outcome, train
from ihsweep.training.resume import spec_hash
from ihsweep.training.stops import DivergenceWatch
from test_train import (
    CPU,
    TIMEOUT,
    assert_same_tensors,
    final_weights,
    make_dataset,
    make_spec,
    subprocess_env,
    toy_config,
    train_cmd,
    wait_for_step,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


# --------------------------------------------------------------------------------------------
# Divergence


def test_non_finite_loss_stops_the_run_at_once_and_records_diverged(data_dir, tmp_path):
    """An absurd learning rate without clipping: the loss is NaN from the second update on.
    The run stops at the first loss it reads (log_every = 10), names the step and the learning
    rate, writes no checkpoint of NaN weights, and ends successfully (a retry would diverge
    again) with run.json and progress.json saying diverged; the probe step then lists it."""
    spec = make_spec(steps=120, every=30, lr=1e6, grad_clip=None, log_every=10)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        train_cmd(spec, data_dir, run_dir),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[{spec['run_id']}] diverged: train loss nan at step 2 (lr 1e+06)" in proc.stdout
    record = json.loads((run_dir / RUN_JSON).read_text())
    assert record["outcome"] == "diverged" and record["steps"] == 10
    assert record["outcome_detail"] == "train loss nan at step 2 (lr 1e+06)"
    assert record["budget"] == 120 * 4 * 32 and record["final_train_loss"] is None
    progress = json.loads((run_dir / PROGRESS_JSON).read_text())
    assert progress["state"] == "diverged" and "nan at step 2" in progress["error"]
    assert list_checkpoints(run_dir) == []  # diverged before the first checkpoint

    tables = {name: tmp_path / f"{name}.parquet" for name in ("heads", "model")}
    argv = ["--run-dir", str(run_dir), "--heads", str(tables["heads"])]
    assert (
        probe_command.main([*argv, "--model-table", str(tables["model"]), "--device", "cpu"]) == 0
    )
    model = pd.read_parquet(tables["model"])
    assert len(model) == 1 and model.loc[0, "tokens"] == 0 and math.isnan(model.loc[0, "ps_max"])
    assert model.loc[0, "outcome"] == "diverged"
    assert pd.read_parquet(tables["heads"]).empty
    row = emergence_table(model, {"metric": "ps_max", "method": "sigmoid", "min_rise": 0.1})
    assert row.loc[0, "reason"] == "diverged: train loss nan at step 2 (lr 1e+06)"


def test_a_loss_above_the_uniform_prediction_for_the_stretch_is_divergence(data_dir, tmp_path):
    """lr 10 without clipping: the loss stays finite but far above ln V = ln 64. With
    divergence_tokens = 2,560 (20 updates of 128 tokens) the run stops at step 20 and keeps the
    checkpoints it wrote before it; with the setting false it trains on (only NaN stops it)."""
    common = {"steps": 120, "every": 10, "lr": 10.0, "grad_clip": None, "log_every": 10}
    spec = make_spec(**common, divergence_tokens=2560)
    train(spec, data_dir, tmp_path / "run", CPU)
    summary = read_run(tmp_path / "run")
    assert summary["outcome"] == "diverged" and summary["steps"] == 20
    assert f"above ln(vocabulary) = {math.log(64):.4f}" in summary["outcome_detail"]
    assert "for 2560 tokens, at step 20 (lr " in summary["outcome_detail"]
    # Step 20's checkpoint would hold the diverged model: only the one before is kept.
    assert [m["step"] for m in list_checkpoints(tmp_path / "run")] == [10]
    off = make_spec(**common, divergence_tokens=False)
    assert train(off, data_dir, tmp_path / "on", CPU) is Outcome.COMPLETED
    # The stopping settings are not part of the run: its fingerprint is the same.
    assert spec_hash(spec) == spec_hash(off) == spec_hash(make_spec(**common))


def test_lr_1e3_under_the_default_rule_diverges_in_one_line_and_is_censored(data_dir, tmp_path):
    """The default config's clipping and divergence rule, at lr 1e3: the loss climbs far above
    ln V and stays finite. The default rule (2 ln V for 5% of the updates) ends the run at the
    first logged loss past that stretch, in one line naming the run, the loss and the rule; the
    probe step lists it and the emergence table and the law fit leave it out as diverged."""
    spec = make_spec(steps=120, every=30, lr=1e3, log_every=10)
    assert spec["training"]["divergence_tokens"] is None and spec["training"]["grad_clip"] == 1.0
    run_dir = tmp_path / "run"
    proc = subprocess.run(train_cmd(spec, data_dir, run_dir), env=subprocess_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = f"[{spec['run_id']}] diverged: train loss "
    lines = [line for line in proc.stdout.splitlines() if line.startswith(said)]
    assert len(lines) == 1 and not proc.stderr, proc.stdout + proc.stderr
    assert f"above 2 ln(vocabulary) = {2 * math.log(64):.4f}" in lines[0], lines[0]
    record = json.loads((run_dir / RUN_JSON).read_text())
    assert record["outcome"] == "diverged" and record["steps"] == 10  # 6 updates: 5% of 120
    tables = {name: tmp_path / f"{name}.parquet" for name in ("heads", "model")}
    argv = ["--run-dir", str(run_dir), "--heads", str(tables["heads"])]
    assert (
        probe_command.main([*argv, "--model-table", str(tables["model"]), "--device", "cpu"]) == 0
    )
    model = pd.read_parquet(tables["model"])
    assert (model["outcome"] == "diverged").all()
    rule = {"metric": "ps_max", "method": "sigmoid", "min_rise": 0.1}
    row = emergence_table(model, rule)
    assert row.loc[0, "reason"].startswith("diverged: train loss ")
    assert not row.loc[0, "emerged"]


def test_a_non_finite_validation_loss_writes_no_checkpoint_and_records_diverged(
    data_dir, tmp_path, monkeypatch
):
    """Weights broken by the last update before a checkpoint show first in its validation loss
    (injected here): the run ends as diverged instead of failing in the JSON encoder."""
    evaluate = loop.evaluate
    calls = []

    def broken_at_second_checkpoint(*args):
        calls.append(1)
        return math.nan if len(calls) == 2 else evaluate(*args)

    monkeypatch.setattr(loop, "evaluate", broken_at_second_checkpoint)
    train(make_spec(steps=60, every=20), data_dir, tmp_path / "run", CPU)
    summary = read_run(tmp_path / "run")
    assert summary["outcome"] == "diverged" and summary["steps"] == 40
    assert summary["outcome_detail"].startswith("validation loss nan at step 40 (lr ")
    assert [m["step"] for m in list_checkpoints(tmp_path / "run")] == [20]


def test_divergence_watch_counts_from_the_last_loss_at_or_below_uniform():
    watch = DivergenceWatch(math.e**2, patience_tokens=100, tokens_per_step=10, logged=[(5, 1.0)])
    assert watch.check_finite(7, [1.0, 2.0]) is None
    assert watch.check_finite(7, [1.0, math.inf])[0] == 8
    assert watch.check_logged(10, 2.5) is None  # above 2 since step 5: 50 tokens
    assert watch.check_logged(14, 2.5) is None  # 90 tokens
    assert watch.check_logged(15, 2.5)[0] == 15  # 100 tokens above since step 5
    watch = DivergenceWatch(math.e**2, patience_tokens=100, tokens_per_step=10, logged=[])
    assert watch.check_logged(5, 1.9) is None and watch.check_logged(14, 3.0) is None
    assert watch.check_logged(15, 3.0)[0] == 15
    assert DivergenceWatch(10, False, 10, [], total_steps=100).check_logged(10**6, 1e9) is None
    # The default rule: above 2 ln V for 5% of the updates, counted from the last loss below.
    default = DivergenceWatch(math.e**2, None, 10, [], total_steps=200)
    assert default.ceiling == 4 and default.patience == 10
    assert default.check_logged(5, 3.9) is None and default.check_logged(14, 4.1) is None
    assert default.check_logged(15, 4.1)[0] == 15


# --------------------------------------------------------------------------------------------
# Stopping once emergence is confirmed

V = 64
# (B, C): the law needs at least 4 runs. Measured on this data (500k tokens): the prefix-
# matching score rises from its onset at 7k-18k tokens in one or two stages; the onset (the
# breakpoint rule) was found at C 8 to 16, the sigmoid's midpoint at C = 12 only at the end of
# the budget (the second stage), and at C >= 18 nothing rose. At C = 8 the rise starts at the
# first checkpoints, so its onset is barely observed: not a cell to compare onsets at.
STUDY_CELLS = [(B, C) for B in (8, 12, 16) for C in (12, 16)]
STUDY_BUDGET = 500_000  # tokens
EMERGENCE = {"metric": "ps_max", "method": "breakpoint", "min_rise": 0.1}
MARGIN = 0.5  # decades past the interval's upper end: the schema default


def periodic_chunks(root, context: int, n_train: int = 4000, n_val: int = 64):
    """Random tokens repeating with a random period of 4..8 tokens, whatever C (the periodic
    data of test_train, with the same local structure at every C): on the toy model, prefix
    matching rises within ~0.1M tokens at lr 3e-3."""
    from conftest import write_chunks

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


def periodic_study(batch: int, context: int, stop) -> tuple[dict, dict]:
    """The spec of one toy run on periodic data, and the study's emergence block."""
    config = toy_config(
        batch=batch,
        checkpoint_tokens=[round(STUDY_BUDGET * f) for f in np.geomspace(0.008, 1, 20)],
        mlp=False,
        tokens=STUDY_BUDGET,
        lr=3e-3,
        val_batches=1,
        stop_after_emergence=stop,
    )
    config["runs"][0]["context_size"] = context
    # Every head: on periodic data the toy's prefix matching rises first in a layer-0 head that
    # looks back by position (the periods, 4-8, bracket the probe's s - 1); these tests are
    # about when a run stops, not about which head rose.
    config["probe"] = {"n_sequences": 50, "min_layer": 0}
    config["emergence"] = EMERGENCE
    study = prepare(config, SCHEMA)
    (run,) = study.runs
    return study.train_spec(run), study.config["probe"]


def model_table(run_dir, probe: dict) -> pd.DataFrame:
    _, table = probe_run(run_dir, probe, torch.device("cpu"))
    return with_run_record(table, json.loads((run_dir / RUN_JSON).read_text()))


@pytest.mark.slow
def test_stopped_runs_find_the_points_and_the_law_of_the_full_runs(tmp_path, capsys):
    """Six toy runs (B 8, 12, 16 x C 12, 16) with stop_after_emergence: each stops early, its
    point lies within the interval of the same run trained to the budget, and the law fitted
    on the stopped runs has exponents within the full runs' 95% intervals. The full runs are
    the stopped ones trained on with the option off: a stopped run is the prefix of the full
    run (the same weights at every shared checkpoint), so they resume, not retrain."""
    stopped, full = [], []
    for batch, context in STUDY_CELLS:
        data = periodic_chunks(tmp_path / f"data-C{context}", context)
        run_dir = tmp_path / f"B{batch}-C{context}"
        spec, probe = periodic_study(batch, context, {"margin_decades": MARGIN})
        train(spec, data, run_dir, CPU, stop_rule=stop_rule_of(spec))
        summary = read_run(run_dir)
        assert summary["outcome"] == "stopped_early", summary
        assert (
            summary["tokens"] < STUDY_BUDGET / 2
            and summary["budget"] == spec["total_steps"] * batch * context
        )
        assert summary["outcome_detail"].startswith("emergence confirmed: ps_max breakpoint point")
        stopped.append(model_table(run_dir, probe))
        capsys.readouterr()

        spec_full, _ = periodic_study(batch, context, False)
        assert spec_hash(spec_full) == spec_hash(spec)
        train(spec_full, data, run_dir, CPU, stop_rule=stop_rule_of(spec_full))
        summary = read_run(run_dir)
        assert summary["outcome"] == "completed" and summary["tokens"] == summary["budget"]
        assert f"resuming at step {stopped[-1]['step'].max()}/" in capsys.readouterr().out
        full.append(model_table(run_dir, probe))
        # The replay of the rule on the full run (python -m ihsweep.margins) stops where
        # training stopped, with the same point.
        replay = replay_stop(full[-1], EMERGENCE, MARGIN)
        assert replay["stopped"] and replay["tokens_trained"] == stopped[-1]["tokens"].max()
        assert replay["tokens_pt"] == run_point(stopped[-1], EMERGENCE)["tokens_pt"]
    stopped_points = emergence_table(pd.concat(stopped), EMERGENCE).set_index("run_id")
    full_points = emergence_table(pd.concat(full), EMERGENCE).set_index("run_id")
    assert stopped_points["emerged"].all() and full_points["emerged"].all()
    assert (stopped_points["outcome"] == "stopped_early").all()
    assert (stopped_points["tokens_trained"] < full_points["tokens_trained"]).all()
    # Two estimates of one onset from nested series. Measured at the default margin: all six
    # stopped points inside, at 51k-181k of the 500k tokens; at margin 0.3, B 12 C 12 stopped at
    # 31k on the first stage of a two-stage rise (onset 8k), outside the full run's [15k, 43k].
    table = pd.DataFrame(
        {"stopped": stopped_points["tokens_pt"], "full": full_points["tokens_pt"],
         "lo": full_points["tokens_lo"], "hi": full_points["tokens_hi"]}
    )  # fmt: skip
    assert table["stopped"].between(table["lo"], table["hi"]).all(), table

    law_stopped = fit_law(stopped_points.reset_index(), n_boot=500, seed=0)
    law_full = fit_law(full_points.reset_index(), n_boot=500, seed=0)
    assert law_stopped["ok"] and law_full["ok"], (law_stopped["reason"], law_full["reason"])
    for exponent in ("a", "b"):
        lo, hi = law_full[f"{exponent}_ci"]
        assert lo <= law_stopped[exponent] <= hi, (exponent, law_stopped[exponent], lo, hi)


@pytest.mark.slow
def test_a_killed_early_stopping_run_stops_at_the_same_step_bit_for_bit(tmp_path):
    """SIGKILL part-way, rerun: the resumed run makes the same decision at the same step and
    ends with the same weights and completion record as the uninterrupted run; the probe step
    afterwards probes nothing again (every checkpoint is in the cache training filled)."""
    data = periodic_chunks(tmp_path / "data", 16)
    spec, probe = periodic_study(8, 16, {"margin_decades": MARGIN})
    reference = tmp_path / "reference"
    proc = subprocess.run(train_cmd(spec, data, reference), env=subprocess_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = json.loads((reference / RUN_JSON).read_text())
    assert want["outcome"] == "stopped_early"
    stop_step = want["steps"]
    kill_after = spec["checkpoint_steps"][spec["checkpoint_steps"].index(stop_step) - 3] + 5

    run_dir, log = tmp_path / "run", tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(train_cmd(spec, data, run_dir), env=subprocess_env(),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_for_step(proc, run_dir, kill_after, log)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (run_dir / RUN_JSON).exists()
    proc = subprocess.run(train_cmd(spec, data, run_dir), env=subprocess_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0 and "resuming at step" in proc.stdout, proc.stdout + proc.stderr
    got = json.loads((run_dir / RUN_JSON).read_text())
    assert (got["outcome"], got["steps"], got["outcome_detail"]) == (
        "stopped_early",
        stop_step,
        want["outcome_detail"],
    )
    assert got["checkpoints"] == want["checkpoints"]
    assert_same_tensors(final_weights(run_dir), final_weights(reference))
    assert (run_dir / "loss.csv").read_text() == (reference / "loss.csv").read_text()

    tables = {name: tmp_path / f"{name}.parquet" for name in ("heads", "model")}
    argv = ["--run-dir", str(run_dir), "--probe", json.dumps(probe), "--device", "cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.steps.probe", *argv, "--heads", str(tables["heads"]),
         "--model-table", str(tables["model"])],
        env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "probed step" not in proc.stdout  # training probed every checkpoint already
    model = pd.read_parquet(tables["model"])
    assert model["step"].tolist() == want["checkpoints"]
    assert (model["outcome"] == "stopped_early").all()
    assert model["budget"].iat[0] == spec["total_steps"] * 8 * 16 > model["tokens"].max()
