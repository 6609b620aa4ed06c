"""ihsweep.analysis.heldout and the heldout_natural step: every left-out cell is predicted by a
law refitted without it, the extrapolation split holds out the largest third by B * C, a split
that leaves too little says why, and cpu-full's real emergence table (tests/data/, from the
study's experiment-1 runs) goes through the step.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ihsweep.analysis.heldout import COLUMNS, LAWS, held_out
from ihsweep.analysis.lawfit import PUBLISHED
from ihsweep.files import layout
from ihsweep.steps import heldout_natural
from test_predict import table

CPU_FULL = Path(__file__).parent / "data" / "cpu-full-emergence.csv"


@pytest.fixture(scope="module")
def synthetic():
    runs = table(np.random.default_rng(5), seeds=2, batches=[8, 16, 64], contexts=[8, 16, 32])
    return runs, *held_out(runs, n_boot=100, seed=0)


def test_each_cell_is_predicted_by_a_law_fitted_without_it(synthetic):
    runs, rows, summary = synthetic
    assert summary["kinds"]["cell"] == {"ok": True, "reason": "", "n_splits": 9}
    cell = rows[rows["kind"] == "cell"]
    assert len(cell) == len(LAWS) * len(runs)  # every run held out once, by each law
    y = np.log10(runs.updates_pt)
    for (B, C), held in cell[cell.law == "study"].groupby(["batch_size", "context_size"]):
        rest = (runs.batch_size != B) | (runs.context_size != C)
        x = np.column_stack([np.ones(rest.sum()), -np.log10(runs.batch_size[rest]),
                             -np.log10(runs.context_size[rest])])  # fmt: skip
        coef = np.linalg.lstsq(x, y[rest], rcond=None)[0]
        expected = coef @ [1, -np.log10(B), -np.log10(C)]
        assert held.predicted_log10_updates.to_numpy() == pytest.approx(expected)
        assert (held.low_log10_updates < expected).all() and (
            expected < held.high_log10_updates
        ).all()
    calibrated = cell[cell.law == "calibrated"]
    slope = calibrated.predicted_log10_updates + PUBLISHED["a"] * np.log10(calibrated.batch_size)
    slope += PUBLISHED["b"] * np.log10(calibrated.context_size)
    assert slope.groupby([calibrated.batch_size, calibrated.context_size]).nunique().eq(1).all()
    published = cell[cell.law == "published"]
    assert published.inside.isna().all() and published.low_log10_updates.isna().all()
    judged = cell[cell.law != "published"]
    within = (judged.low_log10_updates <= judged.observed_log10_updates) & (
        judged.observed_log10_updates <= judged.high_log10_updates
    )
    assert (judged.inside.astype(bool) == within).all()
    assert list(rows.columns) == COLUMNS


def test_the_extrapolation_split_holds_out_the_largest_third(synthetic):
    runs, rows, summary = synthetic
    extra = rows[(rows.kind == "extrapolation") & (rows.law == "study")]
    cells = set(zip(extra.batch_size, extra.context_size, strict=True))
    # B * C 2048, 1024, then 512 twice: the tie goes by B, the larger held out; 3 of 9 cells.
    assert cells == {(64, 32), (64, 16), (64, 8)}
    assert len(extra) == 6
    row = next(r for r in summary["summary"] if (r["kind"], r["law"]) == ("extrapolation", "study"))
    error = extra.predicted_log10_updates - extra.observed_log10_updates
    assert row["rmse_log10"] == pytest.approx(np.sqrt(np.mean(error**2)))
    assert row["coverage"] == pytest.approx(extra.inside.mean())


@pytest.mark.parametrize(
    "seeds, why",
    [(1, "cell: B8-C8: the fit keeps 3 runs; it needs 4"),
     (2, "extrapolation: largest B*C: B16-C8, B16-C16: the fit keeps one value of B; it needs 2")],
)  # fmt: skip
def test_a_split_that_leaves_too_little_says_why(seeds, why):
    runs = table(np.random.default_rng(6), seeds=seeds, batches=[8, 16], contexts=[8, 16])
    rows, summary = held_out(runs, n_boot=50, seed=0)
    kind = why.split(":")[0]
    assert summary["kinds"][kind]["ok"] is False
    assert summary["kinds"][kind]["reason"] == why.split(": ", 1)[1]
    assert kind not in set(rows.kind)


def test_the_step_on_cpu_full(tmp_path, capsys):
    """cpu-full's emergence table (its 40 experiment-1 runs, 4 seeds per cell, trained on
    2026-12-07): every kind is measured, the files are what docs/files.md says, and the points,
    which no bootstrap draws, are docs/results.md's: RMSE 0.293 (own fit) and 0.970 (the
    published law) in log10 updates with each cell left out."""
    out = tmp_path / "heldout"
    argv = ["--emergence-table", str(CPU_FULL), "--study", "cpu-full", "--out-dir", str(out),
            "--lawfit", '{"bootstrap": 200, "model": "w64"}']  # fmt: skip
    assert heldout_natural.main(argv) == 0
    summary = json.loads((out / "heldout.json").read_text())
    assert all(kind["ok"] for kind in summary["kinds"].values()), summary["kinds"]
    rows = pd.read_csv(out / "heldout.csv")
    emergence = pd.read_csv(CPU_FULL)
    w64 = emergence[(emergence.model == "w64") & emergence.emerged]
    cells = w64.groupby(["batch_size", "context_size"]).ngroups
    assert summary["kinds"]["cell"]["n_splits"] == cells
    assert len(rows[rows.kind == "cell"]) == len(LAWS) * len(w64)
    for row in summary["summary"]:
        assert row["rmse_log10"] > 0
        assert (row["coverage"] is None) == (row["law"] == "published")
    rmse = {(r["kind"], r["law"]): r["rmse_log10"] for r in summary["summary"]}
    assert rmse["cell", "study"] == pytest.approx(0.2933, abs=5e-4)
    assert rmse["cell", "published"] == pytest.approx(0.9704, abs=5e-4)
    assert rmse["extrapolation", "published"] == pytest.approx(1.2023, abs=5e-4)
    assert all((out / Path(f).relative_to(out)).is_file() for f in layout.heldout_outputs(str(out)))
    assert "the study's own fit" in (out / "findings.rst").read_text()
    assert "cell      study" in capsys.readouterr().out


def test_a_damaged_emergence_table_is_named(tmp_path, capsys):
    bad = tmp_path / "emergence.csv"
    bad.write_text("run_id,batch_size\nx,8\n")
    argv = ["--emergence-table", str(bad), "--study", "s", "--out-dir", str(tmp_path / "h")]
    assert heldout_natural.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"damaged emergence table {bad}: missing columns context_size")
    assert not (tmp_path / "h").exists()
