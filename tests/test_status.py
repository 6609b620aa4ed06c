"""ihsweep.status: every configuration's state, tokens and emergence, read from results/.

The runs' files are written here for real in the layout the workflow writes: ``progress.json``
by the training loop's own writer (``write_progress``), checkpoints, run.json and probe tables
where the workflow puts them (``ihsweep.files.layout``): a finished, probed run; a trained one; a
running one; an interrupted one; a failed one with its error; one that said running and then
went silent (killed); one not started. With an emergence table and a law fit, the table must
say exactly that. Runs that ended early (stopped once emergence was confirmed, or diverged) and
predictions recorded with the run or made by today's fit must show in the table and its totals.
"""

import io
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import SCHEMA, write_chunks
from ihsweep.config import Run, StudyPaths, load_configfiles
from ihsweep.files import layout
from ihsweep.files.records import read_progress, write_progress
from ihsweep.report.provenance import (
    STUDY_JSON,
    StudyClaim,
    claim_clash,
    config_sha256,
    write_claim,
)
from ihsweep.status import main, run_state, status_table, totals
from ihsweep.status.command import CLEAR, watch
from ihsweep.status.live import (
    COST_MODEL,
    MEASURED,
    CostEstimate,
    Remaining,
    finish_seconds,
    study_eta_line,
    study_remaining,
)
from ihsweep.steps.prepare import prepare

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")

CONFIG = """
models: {m: {n_layer: 1, n_head: 1, d_model: 8, mlp: false, n_ctx: 64}}
probe: {min_layer: 0}
datasets: {t: {family: natural, corpus: {source: kjv}, tokenizer: {kind: bpe, vocab_size: 300}}}
runs: [{data: t, model: m, batch_size: [1, 2, 4, 8, 16, 32, 64], context_size: 10}]
training: {tokens: 640000}
checkpoints: {tokens: [320000, 640000]}
"""
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BUDGET = 640000
PATHS = StudyPaths(prepare(yaml.safe_load(CONFIG), SCHEMA))
ERROR = "FileNotFoundError: [Errno 2] No such file or directory: 'chunks.json'"


def run_of(batch: int) -> Run:
    return Run(data="t", model="m", batch_size=batch, context_size=10, seed=0)


def run_id(batch: int) -> str:
    return f"t/m/B{batch}-C10-s0"


def write_run(
    root, batch: int, *, progress=None, ckpt=None, done=False, probed=False, age=0.0, run_json=None
):
    """A run folder as training and probing leave it. ``progress``: (state, tokens, extra) as
    written by ``write_progress``, its ``updated`` set ``age`` seconds into the past;
    ``run_json``: the run.json written when ``done`` ({} when not given)."""
    run = run_of(batch)
    run_dir = root / PATHS.run_dir(run)
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
        (run_dir / "ckpt" / f"step_{step:06d}.safetensors").write_bytes(b"")  # not read
    if done:
        (root / PATHS.run_file(layout.RUN_JSON, run)).write_text(json.dumps(run_json or {}))
    if probed:
        for table in layout.PROBE_TABLES:
            path = root / PATHS.probe_table(table, run)
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
    (tmp_path / NATURAL).mkdir(parents=True)
    pd.DataFrame(
        {"run_id": [run_id(1), run_id(2)], "emerged": [True, False], "tokens_pt": [5000.0, None]}
    ).to_csv(tmp_path / NATURAL / "emergence.csv", index=False)
    fit = {"ok": True, "log10_T": 3.0, "a": 1.0, "b": 0.0}  # U = 1000 / B updates
    (tmp_path / NATURAL / "lawfit.json").write_text(json.dumps(fit))
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
    log = PATHS.run_log("train", run_of(32))
    assert log == PATHS.run_dir(run_of(32)).replace("results/runs/", "results/logs/train/") + ".log"
    assert silent == f"no progress for 15 min (killed?); see {log}"
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

    def state(progress: dict) -> str:
        return run_state(tmp_path, PATHS, run, progress, 5.0, now)

    assert state(running) == "running"
    assert state({**running, "updated": now - 300.0}) == "failed"
    for recorded in ("interrupted", "failed", "done"):  # as recorded, however old
        assert state({"state": recorded, "updated": 0.0}) == recorded
    assert run_state(tmp_path, PATHS, run, {}, 5.0, now) == "missing"
    # run.json marks a run trained whatever progress.json says; the probe tables, done.
    write_run(tmp_path, 4, done=True, progress=("running", 210000, {}), age=3600)
    progress = read_progress(tmp_path / PATHS.run_dir(run))
    assert progress["state"] == "running"
    assert run_state(tmp_path, PATHS, run, progress, 5.0, time.time()) == "trained"
    write_run(tmp_path, 4, probed=True)
    assert run_state(tmp_path, PATHS, run, progress, 5.0, time.time()) == "done"


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


DETAIL = "train loss nan at step 625 (lr 0.006)"


def record(batch: int, tokens: int, outcome: str, detail: str = "", predicted=None) -> dict:
    """A run.json as training writes it (the keys ihsweep.status reads)."""
    prediction = None if predicted is None else {"tokens": predicted, "source": "config"}
    return {
        "run_id": run_id(batch), "outcome": outcome, "outcome_detail": detail,
        "steps": tokens // (batch * 10), "tokens": tokens, "budget": BUDGET,
        "total_steps": BUDGET // (batch * 10), "prediction": prediction,
    }  # fmt: skip


@pytest.fixture
def ended(study, tmp_path):
    """The study with runs that ended three ways, predictions from run.json and the fit."""
    done = {"ckpt": None, "done": True}
    write_run(tmp_path, 1, run_json=record(1, BUDGET, "completed", predicted=5500.0), **done,
              probed=True)  # fmt: skip
    # Stopped early at its first checkpoint: the run's folder as it left it, not the fixture's.
    shutil.rmtree(tmp_path / PATHS.run_dir(run_of(2)))
    stopped = record(2, 320000, "stopped_early", "emergence confirmed", predicted=9000.0)
    progress = ("done", 320000, {"outcome": "stopped_early"})
    write_run(tmp_path, 2, run_json=stopped, progress=progress, ckpt=320000, done=True)
    # Diverged: one with its run.json (probed: a single NaN row), one from progress.json alone.
    diverged = ("diverged", 192000, {"outcome_detail": DETAIL})
    write_run(tmp_path, 64, run_json=record(64, 192000, "diverged", DETAIL), progress=diverged,
              **done, probed=True)  # fmt: skip
    write_run(tmp_path, 16, progress=("diverged", 100000, {"outcome_detail": DETAIL}))
    pd.DataFrame(
        {
            "run_id": [run_id(b) for b in (1, 2, 8, 16, 64)],
            "emerged": [True, True, True, False, False],
            "tokens_pt": [5000.0, 5000.0, 10500.0, None, None],
            "tokens_lo": [4000.0, 4500.0, 8000.0, None, None],
            "tokens_hi": [6000.0, 5500.0, 12000.0, None, None],
        }
    ).to_csv(tmp_path / NATURAL / "emergence.csv", index=False)
    return study


def test_outcomes_tokens_against_budget_and_predictions(ended, tmp_path):
    table = status_table(ended, tmp_path).set_index("run_id")
    row = {b: table.loc[run_id(b)] for b in BATCHES}
    assert [row[b].state for b in BATCHES] == [
        "done", "trained", "running", "interrupted", "diverged", "failed", "diverged",
    ]  # fmt: skip
    assert [row[b].outcome for b in (1, 2, 16, 64)] == [
        "completed",
        "stopped_early",
        "diverged",
        "diverged",
    ]
    assert all(pd.isna(row[b].outcome) for b in (4, 8, 32))  # not ended yet
    assert row[2].tokens == 320000 and row[2].budget == BUDGET  # stopped half way
    assert row[64].tokens == 192000 and row[16].tokens == 100000
    assert row[64].error == DETAIL and row[16].error == DETAIL  # where it diverged
    # The prediction recorded with the run wins; without one, today's fit (10,000 tokens).
    assert (row[1].predicted_tokens, row[1].prediction) == (5500.0, "run.json")
    assert (row[2].predicted_tokens, row[2].prediction) == (9000.0, "run.json")
    assert row[8].predicted_tokens == pytest.approx(10_000.0) and row[8].prediction == "lawfit"
    assert (row[8].tokens_lo, row[8].tokens_pt, row[8].tokens_hi) == (8000.0, 10500.0, 12000.0)
    # Inside [4000, 6000], outside [4500, 5500], inside [8000, 12000]; no emergence, no verdict.
    assert row[1].predicted_within is True and row[2].predicted_within is False
    assert row[8].predicted_within is True
    assert all(row[b].predicted_within is None for b in (4, 16, 32, 64))


def test_command_prints_outcomes_and_totals(ended, tmp_path, capsys):
    assert main(["--csv", str(tmp_path / "status.csv")]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("t/")}
    assert "stopped early" in lines[run_id(2)] and "0.32M/0.64M" in lines[run_id(2)]
    assert "0.01M (run.json)" in lines[run_id(2)] and " no " in lines[run_id(2)]
    assert "0.01M (lawfit)" in lines[run_id(8)] and "0.01M [0.01M, 0.01M]" in lines[run_id(8)]
    assert "diverged" in lines[run_id(64)] and DETAIL in lines[run_id(64)]
    assert "7 runs: " in out and "2 diverged," in out
    # Ended: 640k + 320k + 100k + 192k = 1.252M of 4 x 640k = 2.56M; the early stop saved
    # 320k (12.5%), the diverged runs left 540k + 448k = 0.988M unspent; with the running,
    # interrupted and silent runs 1.998M of 4.48M.
    assert (
        "tokens trained: 1.25M of 2.56M budget over the 4 ended runs, 12.5% saved by early"
        " stops; 2.00M of 4.48M over all 7; 1 stopped early; 2 diverged (0.99M unspent, not"
        " saved);"
        " the law predicted 2 of 3 emerged runs within their interval"
    ) in out
    written = pd.read_csv(tmp_path / "status.csv").set_index("run_id")
    assert written.loc[run_id(2), "outcome"] == "stopped_early"
    assert written.loc[run_id(1), "predicted_within"] == True  # noqa: E712 (numpy bool)


def test_totals_without_predictions_or_ended_runs(study, tmp_path):
    table = status_table(study, tmp_path)
    table["predicted_tokens"] = table["prediction"] = table["predicted_within"] = None
    line = totals(table.iloc[2:4])  # a running and an interrupted run: nothing has ended
    assert line == (
        "tokens trained: 0.00M of 0.00M budget over the 0 ended runs; 0.65M of 1.28M over all 2;"
        " 0 stopped early; 0 diverged"
    )


# --------------------------------------------------------------------------------------------
# Speed, share of the budget and ETA of the running runs; the study's ETA


def test_running_runs_show_speed_percent_and_eta(study, tmp_path, capsys):
    # B = 4 runs: its progress.json (write_progress's) says 210k tokens at 1k tokens/s, 10 s
    # ago, and a checkpoint holds 320k: 50% of 640k, (640k - 210k) / 1k - 10 = 420 s to go.
    table = status_table(study, tmp_path).set_index("run_id")
    running = table.loc[run_id(4)]
    assert running.tokens_per_second == 1000.0 and running.percent == 50.0
    assert running.eta_seconds == pytest.approx(420.0, abs=5.0)
    others = table.drop(index=run_id(4))
    assert others[["tokens_per_second", "percent", "eta_seconds"]].isna().all().all()
    assert main([]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if run_id(4) in ln)
    assert "1.0k tok/s" in line and "50%" in line and re.search(r" (6m5\ds|7m00s) ", line)


def test_finish_seconds_schedules_runs_into_job_slots():
    # One job: every run after the other. Two: the running run (100 s left) holds one slot;
    # 50 s, 30 s and 40 s queue into the slot that frees first: 50, 80, then 80 + 40 = 120.
    assert finish_seconds([100.0], [50.0, 30.0, 40.0], jobs=1) == 220.0
    assert finish_seconds([100.0], [50.0, 30.0, 40.0], jobs=2) == 120.0
    # Three running where one job was assumed: each keeps its slot.
    assert finish_seconds([10.0, 20.0, 30.0], [5.0], jobs=1) == 30.0
    assert finish_seconds([], [], jobs=4) == 0.0


def test_study_eta_line_says_what_is_measured_and_what_estimated(study, tmp_path):
    estimate = CostEstimate(study)
    left = [
        Remaining("a", 400_000, 400.0, MEASURED, True),
        Remaining("b", 300_000, 100.0, MEASURED, False),
        Remaining("c", 640_000, 200.0, COST_MODEL, False),
    ]
    line = study_eta_line(left, 0, 1, estimate)
    assert line.startswith("study ETA 11m40s (1 job at a time, as on one machine;")
    assert "3 unfinished runs, 1.34M tokens left" in line
    assert "2 at their measured speeds: 8m20s" in line
    assert f"1 by the cost model (device profile {estimate.profile_name}): 3m20s" in line
    assert study_eta_line(left, 0, 2, estimate).startswith("study ETA 6m40s (2 jobs at a time")


def test_study_remaining_counts_unfinished_runs_by_their_speed(study, tmp_path):
    """The fixture's unfinished runs: running (measured), interrupted (its last speed),
    failed twice (one silent, both with a recorded speed: write_progress wrote 1k tok/s) and
    one not started (the cost model's estimate for its whole budget)."""
    estimate = CostEstimate(study)
    table = status_table(study, tmp_path)
    left, unknown = study_remaining(study, table, tmp_path, estimate, time.time())
    assert unknown == 0
    told = {r.run_id: r for r in left}
    assert set(told) == {run_id(b) for b in (4, 8, 16, 32, 64)}
    assert told[run_id(8)].seconds == pytest.approx((BUDGET - 330000) / 1000.0)
    assert told[run_id(8)].source == MEASURED and not told[run_id(8)].running
    assert told[run_id(4)].running and told[run_id(4)].source == MEASURED
    missing = told[run_id(64)]
    assert missing.source == COST_MODEL and missing.tokens == BUDGET
    assert missing.seconds == pytest.approx(estimate.seconds(run_of(64), BUDGET))
    assert missing.seconds > 0


# --------------------------------------------------------------------------------------------
# Which study: the records of results/studies/*/study.json, --study and --directory

OTHER = CONFIG.replace("batch_size: [1, 2, 4, 8, 16, 32, 64]", "batch_size: [128]") + (
    "study: other\n"
)


def claim_study(root, name: str, files: list[str], started: str | None) -> None:
    """study.json as the Snakefile writes it (StudyClaim.of, write_claim), its start time
    set to ``started`` so that the order of two studies is known."""
    config = load_configfiles([root / f for f in files])
    definition = config_sha256(prepare(config, SCHEMA).config)
    claim = StudyClaim.of(name, [root / f for f in files], definition)
    write_claim(claim, root)
    record = json.loads(claim.path(root).read_text())
    assert record["directory"] == str(root) and record["configfiles"] == files
    record["started"] = started
    claim.path(root).write_text(json.dumps(record))


def header(out: str) -> str:
    return out.splitlines()[0]


def test_plain_status_reports_the_running_study(study, tmp_path, capsys):
    (tmp_path / "other.yaml").write_text(OTHER)
    # Nothing recorded: config.yaml's study, saying so.
    assert main([]) == 0
    assert header(capsys.readouterr().out).startswith(
        "study default (config.yaml, the default: no study is running;"
    )
    claim_study(tmp_path, "default", ["config.yaml"], "2026-12-01T10:00:00+00:00")
    claim_study(tmp_path, "other", ["other.yaml"], "2026-12-02T10:00:00+00:00")
    # default runs (B = 4), other has no run started: default, the only one running.
    assert main([]) == 0
    out = capsys.readouterr().out
    assert header(out) == (
        f"study default (the only study running): config config.yaml, directory {tmp_path},"
        " started 2026-12-01T10:00:00+00:00"
    )
    assert "studies recorded here (results/studies/*/study.json):" in out
    listed = [line for line in out.splitlines() if line.startswith("  ")]
    assert listed[:2] == [
        f"  other: other.yaml in {tmp_path}, started 2026-12-02T10:00:00+00:00; not running",
        f"  default: config.yaml in {tmp_path}, started 2026-12-01T10:00:00+00:00; running (1 run)",
    ]
    # other's run starts: both run, the one started last is shown, the other named.
    other = prepare(yaml.safe_load(OTHER), SCHEMA)
    run_dir = tmp_path / StudyPaths(other).run_dir(other.runs[0])
    write_progress(run_dir, "running", 10, 500, 1280, 2000.0)
    assert main([]) == 0
    assert header(capsys.readouterr().out).startswith(
        "study other (started last of the running ones; --study default): config other.yaml"
    )
    assert main(["--study", "default"]) == 0
    first = header(capsys.readouterr().out)
    assert first.startswith("study default (--study): config config.yaml")
    assert main(["--study", "nope"]) == 1
    assert re.search(
        r"no study 'nope' recorded .*\(recorded: other, default\)", capsys.readouterr().err
    )


def test_old_study_records_read_without_directory_or_start(study, tmp_path, capsys):
    """study.json written before the directory and start time were recorded."""
    old = {"study": "default", "configfiles": ["config.yaml"], "config_sha256": "0" * 64}
    path = tmp_path / layout.study_dir("default") / STUDY_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old))
    claim = StudyClaim.read(path)
    assert (claim.directory, claim.started) == (None, None)
    assert claim_clash(StudyClaim("default", ("other.yaml",), "1" * 64), tmp_path) is not None
    assert main(["--study", "default"]) == 0
    first = header(capsys.readouterr().out)
    # Its files, read from here, now define another hash than the record's all-zero one.
    assert first.startswith("study default (--study; its config files define another study now")
    assert f"directory {tmp_path}" in first


def test_directory_reads_the_study_of_another_folder(study, tmp_path, monkeypatch, capsys):
    assert main(["--csv", str(tmp_path / "here.csv")]) == 0
    here = capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main([]) == 1
    assert "no study is running and there is no config.yaml" in capsys.readouterr().err
    assert main(["--directory", str(tmp_path), "--csv", "there.csv"]) == 0
    there = capsys.readouterr().out
    assert header(there) == header(here) and f"directory {tmp_path}" in header(there)
    assert (elsewhere / "there.csv").is_file()  # --csv: where the command is typed
    assert (
        pd.read_csv(elsewhere / "there.csv")["state"].tolist()
        == pd.read_csv(tmp_path / "here.csv")["state"].tolist()
    )
    # --configfile is relative to where the command is typed, as snakemake's.
    (elsewhere / "mine.yaml").write_text(OTHER)
    assert main(["-d", str(tmp_path), "--configfile", "mine.yaml"]) == 0
    first = header(capsys.readouterr().out)
    assert first.startswith("study other (--configfile): config elsewhere/mine.yaml,")
    with pytest.raises(SystemExit):
        main(["--directory", str(tmp_path / "absent")])


def test_watch_draws_frames_until_ctrl_c():
    frames = iter(["frame 1", "frame 2"])

    def render() -> str:
        frame = next(frames, None)
        if frame is None:
            raise KeyboardInterrupt  # Ctrl-C while the third frame is read
        return frame

    out = io.StringIO()
    assert watch(render, 0.01, out) == 0
    text = out.getvalue()
    assert text.count("every 0.01 s until Ctrl-C\n") == 2
    assert text.index("frame 1") < text.index("frame 2") and CLEAR not in text  # not a terminal


LIVE = """
models: {m: {n_layer: 1, n_head: 1, d_model: 8, mlp: false, n_ctx: 64}}
probe: {min_layer: 0}
datasets: {t: {family: natural, corpus: {source: kjv}, tokenizer: {kind: bpe, vocab_size: 300}}}
runs: [{data: t, model: m, batch_size: [8, 16], context_size: 10}]
training: {tokens: 80000000}
checkpoints: {tokens: [80000000]}
study: live
"""


def frames_of(watcher: subprocess.Popen, count: int) -> list[str]:
    """The first ``count`` frames ``status --watch`` prints (it prints until Ctrl-C)."""
    text = ""
    while text.count("until Ctrl-C\n") <= count:  # a frame ends where the next one starts
        line = watcher.stdout.readline()
        assert line, f"status --watch ended: {text}"
        text += line
    return text.split("until Ctrl-C\n")[1 : count + 1]


@pytest.mark.slow
def test_watch_follows_a_run_training_now(tmp_path, monkeypatch):
    """A real training job of the study's first run; status --watch, started with no flag
    but --watch, finds the study by its study.json and shows the run's speed and ETA."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(LIVE)
    live = prepare(yaml.safe_load(LIVE), SCHEMA)
    claim_study(tmp_path, "live", ["config.yaml"], "2026-12-06T09:00:00+00:00")
    rng = np.random.default_rng(0)
    splits = {"train": rng.integers(0, 300, (256, 10)), "val": rng.integers(0, 300, (16, 10))}
    data = write_chunks(tmp_path / "data", splits, 300)
    first, second = live.runs
    run_dir = tmp_path / StudyPaths(live).run_dir(first)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "ihsweep.steps.train", "--spec", json.dumps(live.train_spec(first)),
         "--data-dir", str(data), "--run-dir", str(run_dir), "--device", "cpu", "--threads", "1",
         "--progress-seconds", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not read_progress(run_dir).get("tokens_per_second"):  # its first progress line
            assert trainer.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        watcher = subprocess.Popen([sys.executable, "-m", "ihsweep.status", "--watch", "1"],
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        frames = frames_of(watcher, 2)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=60) == 0
    finally:
        trainer.kill()
        trainer.wait()
    for frame in frames:
        lines = frame.splitlines()
        assert lines[0].startswith(
            f"study live (the only study running): config config.yaml, directory {tmp_path},"
        )
        row = next(line for line in lines if line.strip().startswith(first.id)).split()
        assert row[1] == "running" and row[3:5][1] == "tok/s" and row[3].endswith("k")
        assert re.fullmatch(r"\d+%", row[5]) and re.fullmatch(r"\d+[dhm]\d+[hms]", row[6])
        assert next(line for line in lines if second.id in line).split()[1] == "missing"
        eta = next(line for line in lines if line.startswith("study ETA "))  # the last line
        assert "2 unfinished runs" in eta
        assert "1 at its measured speed: " in eta and "1 by the cost model" in eta
