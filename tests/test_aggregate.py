"""ihsweep.steps.aggregate_natural end to end: probe tables in; tables, figures out, repeatably."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ihsweep import layout
from ihsweep.provenance import config_sha256
from ihsweep.steps.aggregate_natural import main
from scipy.special import expit

TOKENS = [62_500 * 2**i for i in range(5)] + list(range(1_250_000, 6_000_001, 250_000))
FIGURES = ["run_curves", "emergence_vs_BC", "law_fit", "model_size"]
TABLES = ["emergence.csv", "lawfit.json", "lawfit.csv", "emergence.html", "lawfit.html"]
EMERGENCE = {"metric": "ps_max", "method": "sigmoid", "min_rise": 0.1}
LAWFIT = {"bootstrap": 100, "seed": 0}
CONFIG_HASH = config_sha256({"emergence": EMERGENCE, "lawfit": LAWFIT})


def synthetic_model_table(seed=0):
    """Six runs whose ps_max rises at U = 10^4.6 / (B^0.37 C^0.62) updates; one never rises."""
    rng = np.random.default_rng(seed)
    x = np.log10(TOKENS)
    rows = []
    for b in (8, 16, 32):
        for ctx in (32, 64):
            log_tokens = 4.6 - 0.37 * math.log10(b) - 0.62 * math.log10(ctx) + math.log10(b * ctx)
            flat = (b, ctx) == (32, 64)
            ps = 0.05 + (0 if flat else 0.8) * expit(15 * (x - log_tokens))
            ps += rng.normal(0, 0.01, len(x))
            for t, v in zip(TOKENS, ps, strict=True):
                rows.append(
                    {
                        "run_id": f"toy_B{b}_C{ctx}_s0",
                        "data": "synthetic",
                        "model": "tiny",
                        "n_params": 1000,
                        "batch_size": b,
                        "context_size": ctx,
                        "seed": 0,
                        "step": t // (b * ctx),
                        "tokens": t,
                        "ar_acc": float(v) * 0.9,
                        "ar_rank": 1.0,
                        "ps_max": float(v),
                        "la_max": float(v),
                        "ps_la_corr": 0.0,
                        "val_loss": 5.0,
                        "train_loss": 5.0,
                    }
                )
    return pd.DataFrame(rows)


def write_tables(folder):
    """One Parquet file per run, as the probe rule writes them."""
    tables = []
    for i, (_, run) in enumerate(synthetic_model_table().groupby("run_id")):
        tables.append(folder / f"run{i}.parquet")
        run.to_parquet(tables[-1], index=False)
    return tables


def run_cli(tables, out, *specs):
    argv = ["--model-tables", *map(str, tables), *specs, "--out-dir", str(out)]
    assert main([*argv, "--config-sha256", CONFIG_HASH]) == 0


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aggregate")
    tables = write_tables(tmp)
    specs = ["--emergence", json.dumps(EMERGENCE), "--lawfit", json.dumps(LAWFIT)]
    run_cli(tables, tmp / "first", *specs)
    run_cli(tables, tmp / "second", *specs)
    return tmp / "first", tmp / "second"


def test_writes_table_fit_and_figures(outputs):
    first, _ = outputs
    emergence = pd.read_csv(first / "emergence.csv")
    assert len(emergence) == 6 and emergence["emerged"].sum() == 5
    assert list(emergence["run_id"]) == sorted(emergence["run_id"])
    assert (emergence["method"] == "sigmoid").all() and (emergence["metric"] == "ps_max").all()
    text = (first / "lawfit.json").read_text()
    fit = json.loads(text)
    assert list(fit) == sorted(fit)  # sorted keys
    assert fit["ok"] and fit["n_runs"] == 5 and fit["n_boot"] == 100
    assert text.startswith('{\n  "')  # indent 2
    fit_rows = pd.read_csv(first / "lawfit.csv").set_index("quantity")
    assert fit_rows.loc["a", "estimate"] == pytest.approx(fit["a"])
    assert list(fit_rows.loc["a", ["ci_low", "ci_high"]]) == pytest.approx(fit["a_ci"])
    assert fit_rows.loc["n_runs", "estimate"] == 5
    for name in ("emergence.html", "lawfit.html"):
        assert "<table" in (first / name).read_text()
    for name in FIGURES:
        for ext in ("png", "pdf"):
            assert (first / "figures" / f"{name}.{ext}").stat().st_size > 1000


def test_writes_exactly_the_layouts_outputs(outputs):
    first, _ = outputs
    written = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    expected = sorted(str(Path(p).relative_to(first)) for p in layout.natural_outputs(str(first)))
    assert written == expected
    assert set(TABLES) <= set(written)


def test_provenance_names_config_runs_and_outputs(outputs):
    first, _ = outputs
    record = json.loads((first / layout.PROVENANCE).read_text())
    assert record["config_sha256"] == CONFIG_HASH
    assert record["runs"] == sorted(pd.read_csv(first / "emergence.csv")["run_id"])
    expected = [str(Path(p).relative_to(first)) for p in layout.natural_outputs(str(first))]
    assert record["outputs"] == sorted(p for p in expected if p != layout.PROVENANCE)
    assert record["code_version"]


def test_rerun_gives_byte_identical_outputs(outputs):
    first, second = outputs
    for name in TABLES + [f"figures/{f}.{ext}" for f in FIGURES for ext in ("png", "pdf")]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_absent_and_partial_specs_take_the_schema_defaults(tmp_path):
    tables = write_tables(tmp_path)
    run_cli(tables, tmp_path / "defaults")  # neither --emergence nor --lawfit
    emergence = pd.read_csv(tmp_path / "defaults" / "emergence.csv")
    assert (emergence["method"] == "breakpoint").all() and (emergence["metric"] == "ps_max").all()
    fit = json.loads((tmp_path / "defaults" / "lawfit.json").read_text())
    assert fit["n_boot"] == 1000 and fit["seed"] == 0
    run_cli(tables, tmp_path / "partial", "--emergence", '{"metric": "la_max"}')
    emergence = pd.read_csv(tmp_path / "partial" / "emergence.csv")
    assert (emergence["method"] == "breakpoint").all() and (emergence["metric"] == "la_max").all()


def test_missing_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--emergence", json.dumps(EMERGENCE)])
    assert "--model-tables" in capsys.readouterr().err


def test_a_bad_spec_is_refused(tmp_path):
    tables = write_tables(tmp_path)
    with pytest.raises(ValueError, match="method"):
        run_cli(tables, tmp_path / "bad", "--emergence", '{"method": "threshold"}')
    assert not (tmp_path / "bad" / "emergence.csv").exists()
