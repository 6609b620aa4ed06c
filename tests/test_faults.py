"""The fault matrix (bench/faults.py): its quick subset passes in every class, and its parts can
fail: the injector kills the process at the point named and reports a point never reached, and
the comparison with the uninterrupted run names a file that differs by one byte."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from _fault_kills import differences  # noqa: E402
from faults import CLASSES  # noqa: E402

KILL_AT = str(REPO / "bench" / "_kill_at.py")


@pytest.mark.slow
def test_quick_fault_matrix_passes_in_every_class(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, "bench/faults.py", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert sorted(record) == sorted(CLASSES)
    for name, result in record.items():
        cases = result["cases"]
        assert len(cases) >= 2, name
        assert all(case["passed"] for case in cases), cases
        assert f"{name}: {len(cases)}/{len(cases)} passed" in proc.stdout


def kill_at(point: str, tmp_path) -> subprocess.CompletedProcess:
    source = tmp_path / "in.json"
    source.write_text('{"a": [1, 2, 3]}')
    return subprocess.run(
        [sys.executable, KILL_AT, point, "-m", "json.tool", str(source)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_injector_kills_at_the_point_and_reports_one_never_reached(tmp_path):
    killed = kill_at("json:dump#1", tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == ""  # nothing after the point ran
    missed = kill_at("json:dump#2", tmp_path)
    assert missed.returncode == 3, missed.stderr
    assert '"a"' in missed.stdout  # the module ran to its end


def fake_run(folder, loss: str) -> None:
    """A run folder as the comparison reads it: checkpoints, loss.csv, tables, run.json."""
    (folder / "ckpt").mkdir(parents=True)
    (folder / "ckpt" / "step_000030.safetensors").write_bytes(b"weights")
    (folder / "tables").mkdir()
    for table in ("heads", "model"):
        (folder / "tables" / f"{table}.parquet").write_bytes(table.encode())
    (folder / "loss.csv").write_text(loss)
    record = {"steps": 30, "seconds_this_session": 1.0, "tokens_per_second_this_session": 9.0}
    (folder / "run.json").write_text(json.dumps(record))


def test_comparison_names_a_file_that_differs_by_one_byte(tmp_path):
    fake_run(tmp_path / "reference", "step,loss\n30,1.5\n")
    fake_run(tmp_path / "equal", "step,loss\n30,1.5\n")
    fake_run(tmp_path / "resumed", "step,loss\n30,1.6\n")
    assert differences(tmp_path / "equal", tmp_path / "reference") == []
    assert differences(tmp_path / "resumed", tmp_path / "reference") == ["loss.csv"]
    (tmp_path / "equal" / ".lease.json.tmp").write_text("")
    assert differences(tmp_path / "equal", tmp_path / "reference") == [
        "left behind: ['.lease.json.tmp']"
    ]
