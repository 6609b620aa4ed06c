"""ihsweep.status: every configuration's state, tokens and emergence, read from results/.

The runs' files are written here by hand in the layout the workflow writes (a finished,
probed run; a trained one; a running one; an interrupted one; a failed one; one not started),
with an emergence table and a law fit, and the table must say exactly that.
"""

import json
import os
import time

import pandas as pd
import pytest
import yaml
from ihsweep.config import prepare
from ihsweep.status import main, status_table
from test_config import SCHEMA

CONFIG = """
models: {m: {n_layer: 1, n_head: 1, d_model: 8, mlp: false, n_ctx: 64}}
datasets: {t: {family: natural, corpus: {source: kjv}, tokenizer: {kind: bpe, vocab_size: 300}}}
runs: [{data: t, model: m, batch_size: [1, 2, 4, 8, 16, 32], context_size: 10}]
training: {tokens: 640000}
checkpoints: {tokens: [320000, 640000]}
"""
LOG_LINE = "[{id}] step {step}/{total} | tokens {mtok:.2f}M | loss 3.0 | 1.0k tok/s\n"


def run_id(batch: int) -> str:
    return f"t/m/B{batch}-C10-s0"


def write_run(root, batch: int, *, done=False, probed=False, ckpt=None, log=None, age=0.0):
    run_dir = root / "results/runs" / run_id(batch)
    if ckpt is not None:
        (run_dir / "ckpt").mkdir(parents=True)
        (run_dir / "ckpt" / f"step_{ckpt // (batch * 10):06d}.json").write_text(
            json.dumps({"step": ckpt // (batch * 10), "tokens": ckpt})
        )
    if done:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text("{}")
    if probed:
        (run_dir / "probes").mkdir(parents=True)
        for table in ("heads", "model"):
            (run_dir / "probes" / f"{table}.parquet").write_bytes(b"")
    if log is not None:
        path = root / "results/logs/train" / f"{run_id(batch)}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log)
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prepared = prepare(yaml.safe_load(CONFIG), SCHEMA)
    (tmp_path / "config.yaml").write_text(CONFIG)
    line = LOG_LINE.format(id="x", step=100, total=320, mtok=0.21)
    write_run(tmp_path, 1, done=True, probed=True, ckpt=640000)
    write_run(tmp_path, 2, done=True, ckpt=640000)
    write_run(tmp_path, 4, ckpt=320000, log=line, age=10)
    interrupted = line + "[x] signal 15: state saved at step 50\n"
    write_run(tmp_path, 8, ckpt=320000, log=interrupted, age=900)
    write_run(tmp_path, 16, log=line + "Traceback (most recent call last):\n", age=900)
    (tmp_path / "results/natural").mkdir(parents=True)
    pd.DataFrame(
        {"run_id": [run_id(1), run_id(2)], "emerged": [True, False], "tokens_pt": [5000.0, None]}
    ).to_csv(tmp_path / "results/natural/emergence.csv", index=False)
    fit = {"ok": True, "log10_T": 3.0, "a": 1.0, "b": 0.0}  # U = 1000 / B updates
    (tmp_path / "results/natural/lawfit.json").write_text(json.dumps(fit))
    return prepared


def test_states_tokens_emergence_and_prediction(study, tmp_path):
    table = status_table(study, tmp_path).set_index("run_id")
    states = {b: table.loc[run_id(b), "state"] for b in (1, 2, 4, 8, 16, 32)}
    assert states == {
        1: "done", 2: "trained", 4: "running", 8: "interrupted", 16: "failed", 32: "missing",
    }  # fmt: skip
    assert table.loc[run_id(1), "tokens"] == 640000
    assert table.loc[run_id(4), "tokens"] == 320000  # checkpoint beyond the logged 210k
    assert table.loc[run_id(16), "tokens"] == 210000  # logged, never checkpointed
    assert table.loc[run_id(32), "tokens"] == 0
    assert table.loc[run_id(1), "emerged"] is True and table.loc[run_id(1), "tokens_pt"] == 5000
    assert table.loc[run_id(2), "emerged"] is False
    assert table.loc[run_id(4), "emerged"] is None
    # 1000 / B updates of B * 10 tokens: 10,000 tokens for every B.
    assert table["predicted_tokens"].tolist() == pytest.approx([10_000.0] * 6)
    assert (table["budget"] == 640000).all()


def test_command_prints_a_summary_and_writes_csv(study, tmp_path, capsys):
    assert main(["--csv", str(tmp_path / "status.csv")]) == 0
    out = capsys.readouterr().out
    assert "6 runs: " in out and "1 running" in out and "1 missing" in out
    assert len(pd.read_csv(tmp_path / "status.csv")) == 6
