"""bench/device_profile.py runs on the CPU; bench/trainer_vs_minimal.py's trainer and minimal
loop must end with the same weights (the benchmark compares two equal computations).
bench/step_startup.py times the steps' imports against a git ref, and sees no step load scipy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = str(REPO / "bench" / "device_profile.py")
COMPARE = str(REPO / "bench" / "trainer_vs_minimal.py")


def bench(*args: str, script: str = SCRIPT) -> str:
    proc = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_profile_mode_on_the_cpu(tmp_path):
    out = bench("--device", "cpu", "--cells", "4x16,8x16", "--model", "1,2,16,0", "--vocab",
                "64", "--steps", "2", "--quick", "--out", str(tmp_path / "cpu.json"))  # fmt: skip
    assert "B    4 C    16" in out and "profile:" in out
    record = json.loads((tmp_path / "cpu.json").read_text())
    assert [cell["batch_size"] for cell in record["cells"]] == [4, 8]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_compare_times_two_runs_that_end_with_the_same_weights(tmp_path, family):
    out = bench("--cells", "w32:4x16:64", "--rounds", "2", "--seconds", "0.1", "--family", family,
                "--out", str(tmp_path / "compare.json"), script=COMPARE)  # fmt: skip
    assert "round 2: trainer" in out, out
    (cell,) = json.loads((tmp_path / "compare.json").read_text())["cells"]
    name = "w32:4x16:64" + ("" if family == "gpt2" else ":llama")
    assert cell["cell"] == name and len(cell["ratios"]) == 2
    assert cell["same_weights"], out
    assert cell["trainer_tokens_per_second"] > 0 and cell["minimal_tokens_per_second"] > 0


@pytest.mark.slow
def test_profile_mode_times_the_compiled_loss_beside_eager(tmp_path):
    out = bench("--device", "cpu", "--cells", "4x16", "--model", "1,2,16,0", "--vocab", "64",
                "--steps", "2", "--quick", "--compile",
                "--out", str(tmp_path / "cpu.json"))  # fmt: skip
    assert "x eager" in out, out
    record = json.loads((tmp_path / "cpu.json").read_text())
    (eager,), (compiled,) = record["cells"], record["compiled_cells"]
    assert not eager["compiled"] and compiled["compiled"]
    assert compiled["tokens_per_second"] > 0 and compiled["warmup_seconds"] > 0


def test_step_startup_times_both_trees_and_no_step_loads_scipy():
    """scipy.stats and scipy.optimize cost ~0.8 s of every job's start-up; only the fitted
    emergence rules, the law fit's lack-of-fit test and the frontier's fits use them, so no step
    may load scipy on import."""
    out = bench("--baseline", "HEAD", "--repeats", "1", "--steps", "train", "run_figure",
                script=str(REPO / "bench" / "step_startup.py"))  # fmt: skip
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"train", "run_figure"}, out
    assert "torch" in rows["train"] and "matplotlib" in rows["run_figure"], out
    loaded_here = [row.split("x  ", 1)[1].split(" (baseline")[0] for row in rows.values()]
    assert not any("scipy" in loaded for loaded in loaded_here), out
