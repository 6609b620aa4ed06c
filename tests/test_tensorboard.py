"""TensorBoard event files beside a run (ihsweep.training.events): the training job's curves equal
loss.csv and the progress lines, the probe step's equal the probe tables, and a resumed run
shows each step once, with the values of an uninterrupted run.

The events are read back with tbparse, which reads each event file on its own (no purge across
files): a step a resumed session wrote again would show twice. The runs are test_train's toy
runs (seconds on one CPU thread).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from ihsweep.config import complete, probe_key
from ihsweep.files import layout
from ihsweep.files.records import LR, SPEED, TRAIN_LOSS, VAL_LOSS, event_files, read_scalars
from ihsweep.probing.metrics import EMERGENCE_METRICS
from ihsweep.steps import probe as probe_command
from ihsweep.training.loop import train
from tbparse import SummaryReader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_train import (
    CPU,
    loss_rows,
    make_dataset,
    make_spec,
    run_to_end,
    subprocess_env,
    train_cmd,
    wait_for_step,
)

# tbparse 0.0.9 sorts in place, which pandas 3.1 deprecates: not this package's concern.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning")
PROBE = {"n_sequences": 20, "max_half_length": 50, "seed": 0, "min_layer": 0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir) -> Path:
    """An uninterrupted run of 60 updates, a train row every 2 and a checkpoint every 20."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    train(make_spec(steps=60, every=20, log_every=2), data_dir, run_dir, CPU)
    return run_dir


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] in the order written, every file of ``folder`` read by tbparse."""
    frame = SummaryReader(str(folder), extra_columns={"file_name"}).scalars
    frame = frame.sort_values("file_name", kind="stable")  # each file's events in their order
    return {
        tag: list(zip(rows["step"].tolist(), rows["value"].tolist(), strict=True))
        for tag, rows in frame.groupby("tag", sort=False)
    }


def train_events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    return scalars(Path(layout.train_events_dir(run_dir)))


def logged(run_dir: Path, split: str, column: int = 3) -> list[tuple[int, float]]:
    return [(int(r[0]), float(r[column])) for r in loss_rows(run_dir) if r[2] == split]


def assert_close(got: list[tuple[int, float]], want: list[tuple[int, float]], rel: float,
                 tolerance: float = 1e-6):  # fmt: skip
    """Equal steps, and values within the float32 of the events and the digits of loss.csv."""
    assert [step for step, _ in got] == [step for step, _ in want]
    for (step, value), (_, expected) in zip(got, want, strict=True):
        assert value == pytest.approx(expected, rel=rel, abs=tolerance), step


def test_training_events_are_the_loss_log_and_the_progress_lines(tmp_path, data_dir, capsys):
    run_dir = tmp_path / "run"
    spec = make_spec(steps=40, every=20, log_every=3)
    train(spec, data_dir, run_dir, replace(CPU, progress_seconds=0))  # a line every update
    events = train_events(run_dir)
    assert set(events) == {TRAIN_LOSS, VAL_LOSS, LR, SPEED}
    assert [step for step, _ in events[TRAIN_LOSS]] == [*range(3, 40, 3), 40]  # and the last
    assert_close(events[TRAIN_LOSS], logged(run_dir, "train"), rel=1e-6)
    assert_close(events[LR], logged(run_dir, "train", column=4), rel=2e-6)
    assert_close(events[VAL_LOSS], logged(run_dir, "val"), rel=1e-6)
    assert [step for step, _ in events[VAL_LOSS]] == [20, 40]
    lines = re.findall(r"step (\d+)/40 \|.*\| ([\d.]+)k tok/s", capsys.readouterr().out)
    want = [(int(step), float(speed) * 1e3) for step, speed in lines]
    assert len(want) == 40
    assert_close(events[SPEED], want, rel=0, tolerance=50.01)  # the lines print 0.1k tok/s
    assert len(event_files(layout.train_events_dir(run_dir))) == 1


def test_probe_events_are_the_model_table_and_a_rerun_rewrites_them(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    train(make_spec(steps=40, every=20), data_dir, run_dir, CPU)
    heads, table = tmp_path / "heads.parquet", tmp_path / "model.parquet"
    argv = ["--run-dir", str(run_dir), "--probe", json.dumps(PROBE), "--heads", str(heads),
            "--model-table", str(table), "--device", "cpu", "--threads", "1"]  # fmt: skip
    folder = Path(layout.probe_events_dir(run_dir, probe_key(complete("probe", PROBE))))
    for attempt in range(2):  # the second run rewrites the events: no step twice
        assert probe_command.main(argv) == 0
        model = pd.read_parquet(table)
        events = scalars(folder)
        assert set(events) == {f"probe/{metric}" for metric in EMERGENCE_METRICS}, attempt
        assert "probe/ps_content_max" in events, attempt
        for tag, values in events.items():
            want = list(zip(model["step"], model[tag.removeprefix("probe/")], strict=True))
            assert_close(values, want, rel=1e-6)
        assert [step for step, _ in events["probe/ar_acc"]] == [20, 40]
        assert len(event_files(folder)) == 1
    assert not [tag for tag in train_events(run_dir) if tag.startswith("probe/")]  # own run


def assert_same_curves(run_dir: Path, reference: Path) -> None:
    """Each step once per tag, and the uninterrupted run's steps and values (tokens/s aside:
    a timing), as tbparse, this package and TensorBoard's own reader see them."""
    got, want = train_events(run_dir), train_events(reference)
    for seen in (got, read_scalars(layout.train_events_dir(run_dir))):
        assert {tag: values for tag, values in seen.items() if tag != SPEED} == {
            tag: values for tag, values in want.items() if tag != SPEED
        }
    steps = [step for step, _ in got[SPEED]]
    assert steps == sorted(set(steps))
    board = EventAccumulator(layout.train_events_dir(run_dir))
    board.Reload()
    for tag in (TRAIN_LOSS, VAL_LOSS, LR):
        assert [(e.step, e.value) for e in board.Scalars(tag)] == want[tag]


def test_a_resumed_run_drops_what_its_killed_session_wrote_after_the_state(
    tmp_path, data_dir, reference
):
    """A session that trained past its last state (to 55, state at 45) and was killed, its
    event file cut mid-record: the resume at 45 rewrites that file without steps 46 to 55 and
    without the cut record, and ends with the uninterrupted run's curves."""
    spec = make_spec(steps=60, every=20, log_every=2)
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU, stop_after_step=45)
    saved = tmp_path / "state-45"
    shutil.copytree(run_dir / "state", saved)
    train(spec, data_dir, run_dir, CPU, stop_after_step=55)  # what the kill undoes
    shutil.rmtree(run_dir / "state")
    shutil.copytree(saved, run_dir / "state")
    newest = event_files(layout.train_events_dir(run_dir))[-1]
    newest.write_bytes(newest.read_bytes()[:-5])
    assert max(step for step, _ in train_events(run_dir)[TRAIN_LOSS]) == 54  # before the resume

    train(spec, data_dir, run_dir, CPU)
    assert_same_curves(run_dir, reference)
    assert (run_dir / "loss.csv").read_text() == (reference / "loss.csv").read_text()


def test_a_session_that_starts_afresh_drops_every_earlier_event(tmp_path, data_dir, reference):
    """Killed before its first state, a run starts again at step 0: nothing of the session
    before stays, or its steps would show twice."""
    spec = make_spec(steps=60, every=20, log_every=2)
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU, stop_after_step=15)
    shutil.rmtree(run_dir / "state")  # as if the kill came before any state was saved
    train(spec, data_dir, run_dir, CPU)
    assert_same_curves(run_dir, reference)


@pytest.mark.slow
def test_sigkill_then_rerun_shows_each_step_once_with_the_uninterrupted_values(tmp_path, data_dir):
    """The real thing: the command killed with SIGKILL past a checkpoint, then run again (300
    updates, a train row every update, a checkpoint every 30)."""
    spec = make_spec()
    reference, run_dir, log = tmp_path / "reference", tmp_path / "run", tmp_path / "first.log"
    train(spec, data_dir, reference, CPU)
    with open(log, "w") as out:
        proc = subprocess.Popen(train_cmd(spec, data_dir, run_dir), env=subprocess_env(),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_for_step(proc, run_dir, 100, log)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    written = max(step for step, _ in train_events(run_dir)[TRAIN_LOSS])

    out = run_to_end(spec, data_dir, run_dir)
    (resumed,) = map(int, re.findall(r"resuming at step (\d+)/300", out))
    assert written > resumed  # the killed session wrote steps the resume must drop
    assert_same_curves(run_dir, reference)
    assert (run_dir / "loss.csv").read_text() == (reference / "loss.csv").read_text()
