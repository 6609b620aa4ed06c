"""ihsweep.aggregate end to end: Parquet tables in; CSV, JSON and figures out, reproducibly."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from ihsweep.aggregate import main
from scipy.special import expit

TOKENS = [62_500 * 2**i for i in range(5)] + list(range(1_250_000, 6_000_001, 250_000))
FIGURES = ["run_curves", "emergence_vs_BC", "law_fit", "model_size"]


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


def run_cli(tmp_path, tables, out):
    argv = ["--model-tables", *map(str, tables)]
    argv += ["--metric", "ps_max", "--method", "sigmoid", "--min-rise", "0.1"]
    argv += ["--bootstrap", "100", "--seed", "0"]
    argv += ["--emergence", str(out / "emergence.csv"), "--fit", str(out / "fit.json")]
    argv += ["--figures", str(out / "figures")]
    assert main(argv) == 0


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aggregate")
    table = synthetic_model_table()
    tables = []
    for i, (_, run) in enumerate(table.groupby("run_id")):  # one Parquet file per run
        tables.append(tmp / f"run{i}.parquet")
        run.to_parquet(tables[-1], index=False)
    run_cli(tmp, tables, tmp / "first")
    run_cli(tmp, tables, tmp / "second")
    return tmp / "first", tmp / "second"


def test_writes_table_fit_and_figures(outputs):
    first, _ = outputs
    emergence = pd.read_csv(first / "emergence.csv")
    assert len(emergence) == 6 and emergence["emerged"].sum() == 5
    assert list(emergence["run_id"]) == sorted(emergence["run_id"])
    text = (first / "fit.json").read_text()
    fit = json.loads(text)
    assert list(fit) == sorted(fit)  # sorted keys
    assert fit["ok"] and fit["n_runs"] == 5 and fit["n_boot"] == 100
    assert text.startswith('{\n  "')  # indent 2
    for name in FIGURES:
        for ext in ("png", "pdf"):
            assert (first / "figures" / f"{name}.{ext}").stat().st_size > 1000


def test_rerun_gives_byte_identical_outputs(outputs):
    first, second = outputs
    for name in ["emergence.csv", "fit.json"] + [
        f"figures/{f}.{ext}" for f in FIGURES for ext in ("png", "pdf")
    ]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_missing_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--metric", "ps_max"])
    assert "--model-tables" in capsys.readouterr().err
