"""ihsweep.status: every configuration's state, tokens and emergence, read from results/.

The runs' files are written here for real in the layout the workflow writes: ``progress.json``
by the training loop's own writer (``write_progress``), checkpoints, run.json and probe tables
where the workflow puts them (``ihsweep.layout``): a finished, probed run; a trained one; a
running one; an interrupted one; a failed one with its error; one that said running and then
went silent (killed); one not started. With an emergence table and a law fit, the table must
say exactly that.
"""

import json
import time

import pandas as pd
import pytest
import yaml
from conftest import SCHEMA
from ihsweep import layout
from ihsweep.config import Run, prepare
from ihsweep.status import main, run_state, status_table
from ihsweep.training.loop import read_progress, write_progress

CONFIG = """
models: {m: {n_layer: 1, n_head: 1, d_model: 8, mlp: false, n_ctx: 64}}
datasets: {t: {family: natural, corpus: {source: kjv}, tokenizer: {kind: bpe, vocab_size: 300}}}
runs: [{data: t, model: m, batch_size: [1, 2, 4, 8, 16, 32, 64], context_size: 10}]
training: {tokens: 640000}
checkpoints: {tokens: [320000, 640000]}
"""
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BUDGET = 640000
ERROR = "FileNotFoundError: [Errno 2] No such file or directory: 'chunks.json'"


def run_of(batch: int) -> Run:
    return Run(data="t", model="m", batch_size=batch, context_size=10, seed=0)


def run_id(batch: int) -> str:
    return f"t/m/B{batch}-C10-s0"


def write_run(root, batch: int, *, progress=None, ckpt=None, done=False, probed=False, age=0.0):
    """A run folder as training and probing leave it. ``progress``: (state, tokens, extra) as
    written by ``write_progress``, its ``updated`` set ``age`` seconds into the past."""
    run = run_of(batch)
    run_dir = root / layout.run_dir(run)
    tokens_per_step = batch * 10
    if progress is not None:
        state, tokens, extra = progress
        total = BUDGET // tokens_per_step
        write_progress(run_dir, state, tokens // tokens_per_step, total, tokens_per_step, 1e3,
                       **extra)  # fmt: skip
        record = json.loads((run_dir / layout.PROGRESS_JSON).read_text())
        assert record["tokens"] == tokens and record["budget"] == BUDGET
        record["updated"] -= age
        (run_dir / layout.PROGRESS_JSON).write_text(json.dumps(record))
    if ckpt is not None:
        step = ckpt // tokens_per_step
        (run_dir / "ckpt").mkdir(parents=True)
        (run_dir / "ckpt" / f"step_{step:06d}.json").write_text(
            json.dumps({"step": step, "tokens": ckpt})
        )
    if done:
        (root / layout.run_file(layout.RUN_JSON, run)).write_text("{}")
    if probed:
        for table in layout.PROBE_TABLES:
            path = root / layout.probe_table(table, run)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prepared = prepare(yaml.safe_load(CONFIG), SCHEMA)
    (tmp_path / "config.yaml").write_text(CONFIG)
    write_run(tmp_path, 1, progress=("done", BUDGET, {}), ckpt=BUDGET, done=True, probed=True)
    write_run(tmp_path, 2, progress=("done", BUDGET, {}), ckpt=BUDGET, done=True, age=3600)
    write_run(tmp_path, 4, progress=("running", 210000, {}), ckpt=320000, age=10)
    write_run(tmp_path, 8, progress=("interrupted", 330000, {"signal": 15}), ckpt=320000, age=900)
    write_run(tmp_path, 16, progress=("failed", 160000, {"error": ERROR}), age=900)
    write_run(tmp_path, 32, progress=("running", 96000, {}), age=900)  # silent for 15 minutes
    (tmp_path / "results/natural").mkdir(parents=True)
    pd.DataFrame(
        {"run_id": [run_id(1), run_id(2)], "emerged": [True, False], "tokens_pt": [5000.0, None]}
    ).to_csv(tmp_path / "results/natural/emergence.csv", index=False)
    fit = {"ok": True, "log10_T": 3.0, "a": 1.0, "b": 0.0}  # U = 1000 / B updates
    (tmp_path / "results/natural/lawfit.json").write_text(json.dumps(fit))
    return prepared


def test_states_tokens_emergence_and_prediction(study, tmp_path):
    table = status_table(study, tmp_path).set_index("run_id")
    states = {b: table.loc[run_id(b), "state"] for b in BATCHES}
    assert states == {
        1: "done", 2: "trained", 4: "running", 8: "interrupted", 16: "failed", 32: "failed",
        64: "missing",
    }  # fmt: skip
    assert table.loc[run_id(1), "tokens"] == 640000
    assert table.loc[run_id(4), "tokens"] == 320000  # checkpoint beyond the recorded 210k
    assert table.loc[run_id(8), "tokens"] == 330000  # recorded beyond the last checkpoint
    assert table.loc[run_id(16), "tokens"] == 160000  # recorded, never checkpointed
    assert table.loc[run_id(32), "tokens"] == 96000
    assert table.loc[run_id(64), "tokens"] == 0
    assert table.loc[run_id(16), "error"] == ERROR  # why it failed, from progress.json
    silent = table.loc[run_id(32), "error"]  # said running, then nothing for 15 minutes
    assert silent == f"no progress for 15 min (killed?); see results/logs/train/{run_id(32)}.log"
    errors = {b: table.loc[run_id(b), "error"] for b in BATCHES if b not in (16, 32)}
    assert all(pd.isna(e) for e in errors.values()), errors  # only failed runs have a reason
    assert table.loc[run_id(1), "emerged"] is True and table.loc[run_id(1), "tokens_pt"] == 5000
    assert table.loc[run_id(2), "emerged"] is False
    assert table.loc[run_id(4), "emerged"] is None
    # 1000 / B updates of B * 10 tokens: 10,000 tokens for every B.
    assert table["predicted_tokens"].tolist() == pytest.approx([10_000.0] * 7)
    assert (table["budget"] == 640000).all()


def test_active_minutes_decide_when_a_silent_run_counts_as_failed(study, tmp_path):
    # The run of B = 32 said "running" 15 minutes ago: running within 20 minutes, failed in 10.
    table = status_table(study, tmp_path, active_minutes=20).set_index("run_id")
    assert table.loc[run_id(32), "state"] == "running"
    assert table.loc[run_id(4), "state"] == "running"
    table = status_table(study, tmp_path, active_minutes=0.1).set_index("run_id")
    assert table.loc[run_id(4), "state"] == "failed"  # 10 s silent, 6 s allowed


def test_run_state_from_progress_records(tmp_path):
    run = run_of(4)
    now = 1_000_000.0
    running = {"state": "running", "updated": now - 299.0}
    assert run_state(tmp_path, run, running, 5.0, now) == "running"
    assert run_state(tmp_path, run, {**running, "updated": now - 300.0}, 5.0, now) == "failed"
    for state in ("interrupted", "failed", "done"):  # as recorded, however old
        assert run_state(tmp_path, run, {"state": state, "updated": 0.0}, 5.0, now) == state
    assert run_state(tmp_path, run, {}, 5.0, now) == "missing"
    # run.json marks a run trained whatever progress.json says; the probe tables, done.
    write_run(tmp_path, 4, done=True, progress=("running", 210000, {}), age=3600)
    progress = read_progress(tmp_path / layout.run_dir(run))
    assert progress["state"] == "running"
    assert run_state(tmp_path, run, progress, 5.0, time.time()) == "trained"
    write_run(tmp_path, 4, probed=True)
    assert run_state(tmp_path, run, progress, 5.0, time.time()) == "done"


def test_damaged_progress_record_reads_as_none(tmp_path):
    assert read_progress(tmp_path / "absent") == {}
    (tmp_path / layout.PROGRESS_JSON).write_text('{"state": "runn')  # cut off mid-write
    assert read_progress(tmp_path) == {}


def test_command_prints_a_summary_and_writes_csv(study, tmp_path, capsys):
    assert main(["--csv", str(tmp_path / "status.csv")]) == 0
    out = capsys.readouterr().out
    assert "7 runs: " in out and "1 running" in out and "1 missing" in out
    assert "2 failed" in out and "1 interrupted" in out and "1 trained" in out
    assert ERROR in out
    written = pd.read_csv(tmp_path / "status.csv")
    assert len(written) == 7
    assert written.set_index("run_id").loc[run_id(16), "error"] == ERROR
