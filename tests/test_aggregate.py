"""ihsweep.steps.aggregate_natural end to end: probe tables in; tables, figures out, repeatably."""

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ihsweep.files import layout
from ihsweep.report.provenance import code_sha256, config_sha256
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
    assert record["code_sha256"] == code_sha256()


def test_rerun_gives_byte_identical_outputs(outputs):
    first, second = outputs
    for name in TABLES + [f"figures/{f}.{ext}" for f in FIGURES for ext in ("png", "pdf")]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_absent_and_partial_specs_take_the_schema_defaults(tmp_path):
    tables = write_tables(tmp_path)
    run_cli(tables, tmp_path / "defaults")  # neither --emergence nor --lawfit
    emergence = pd.read_csv(tmp_path / "defaults" / "emergence.csv")
    assert (emergence["method"] == "crossing").all() and (emergence["metric"] == "ps_max").all()
    fit = json.loads((tmp_path / "defaults" / "lawfit.json").read_text())
    assert fit["n_boot"] == 1000 and fit["seed"] == 0
    run_cli(tables, tmp_path / "partial", "--emergence", '{"metric": "la_max"}')
    emergence = pd.read_csv(tmp_path / "partial" / "emergence.csv")
    assert (emergence["method"] == "crossing").all() and (emergence["metric"] == "la_max").all()


def test_missing_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--emergence", json.dumps(EMERGENCE)])
    assert "--model-tables" in capsys.readouterr().err


def test_a_bad_spec_is_refused(tmp_path):
    tables = write_tables(tmp_path)
    with pytest.raises(ValueError, match="method"):
        run_cli(tables, tmp_path / "bad", "--emergence", '{"method": "threshold"}')
    assert not (tmp_path / "bad" / "emergence.csv").exists()


def test_a_table_probed_before_its_metric_existed_is_named_with_the_fix(tmp_path, capsys):
    # Tables probed before content PS (these lack ps_content_max) serve ps_max as before; a
    # study that dates content PS gets one line naming the first such table and its fix.
    tables = write_tables(tmp_path)
    specs = ["--emergence", json.dumps({**EMERGENCE, "metric": "ps_content_max"})]
    argv = ["--model-tables", *map(str, tables), *specs, "--out-dir", str(tmp_path / "out")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"damaged probe table {tables[0]}: missing columns ps_content_max; remove it and run "
        f"`snakemake {tables[0]}`, then `snakemake`: the probe step rewrites it"
    )
    assert not (tmp_path / "out").exists()


# --- runs that ended early: stopped once emergence was confirmed, or diverged -------------

STOPPED, DIVERGED, DIVERGED_AT_START = "toy_B8_C32_s0", "toy_B16_C64_s0", "toy_B32_C64_s0"
DETAIL = "train loss nan at step 2500 (lr 0.006)"  # 2500 x 16 x 64 = 2.56M tokens
EARLY_DETAIL = "train loss inf at step 3 (lr 0.006)"  # 3 x 32 x 64 = 6144 tokens


def ended_model_table(with_outcomes=True):
    """The synthetic runs as probe tables record their endings: B8 C32 stopped early at 3M
    tokens (it emerged near 0.55M), B16 C64 diverged at 2.56M (after its checkpoint at 2.5M),
    and the flat B32 C64 run diverged before its first checkpoint: a single row at 0 tokens
    with NaN metrics. ``with_outcomes=False``: the same rows without the run-record columns."""
    table = synthetic_model_table()
    table = table[~((table["run_id"] == STOPPED) & (table["tokens"] > 3_000_000))]
    table = table[~((table["run_id"] == DIVERGED) & (table["tokens"] > 2_500_000))]
    start = table[table["run_id"] == DIVERGED_AT_START].iloc[:1].copy()
    start[["step", "tokens"]] = 0
    metrics = ["ar_acc", "ar_rank", "ps_max", "la_max", "ps_la_corr", "val_loss", "train_loss"]
    start[metrics] = math.nan
    table = pd.concat([table[table["run_id"] != DIVERGED_AT_START], start], ignore_index=True)
    if not with_outcomes:
        return table
    outcome = table["run_id"].map({STOPPED: "stopped_early", DIVERGED: "diverged"})
    outcome[table["run_id"] == DIVERGED_AT_START] = "diverged"
    detail = outcome.map({"stopped_early": "emergence confirmed", "diverged": DETAIL})
    detail[table["run_id"] == DIVERGED_AT_START] = EARLY_DETAIL
    return table.assign(
        budget=6_000_000,
        outcome=outcome.fillna("completed"),
        outcome_detail=detail.fillna(""),
        predicted_tokens=math.nan,
    )


class Captured:
    """Stands in for save_figure: keeps each figure's text instead of writing files."""

    def __init__(self):
        self.texts = []

    def __call__(self, fig, out_stem):
        parts = [fig._suptitle.get_text() if fig._suptitle else ""]
        for ax in fig.axes:
            parts += [ax.get_title(), *(t.get_text() for t in ax.texts)]
            legend = ax.get_legend()
            parts += [t.get_text() for t in legend.get_texts()] if legend else []
        parts += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        self.texts.append("\n".join(parts))
        return []


@pytest.fixture
def captured(monkeypatch):
    from ihsweep.figures import natural, style

    capture = Captured()
    monkeypatch.setattr(natural, "save_figure", capture)
    monkeypatch.setattr(style, "save_figure", capture)
    return capture


def ended_emergence(table):
    from ihsweep.analysis.emergence import emergence_table

    return emergence_table(table, EMERGENCE)


def test_aggregate_lists_diverged_runs_and_fits_without_them(tmp_path):
    tables = []
    for i, (_, run) in enumerate(ended_model_table().groupby("run_id")):
        tables.append(tmp_path / f"run{i}.parquet")
        run.to_parquet(tables[-1], index=False)
    specs = ["--emergence", json.dumps(EMERGENCE), "--lawfit", json.dumps(LAWFIT)]
    run_cli(tables, tmp_path / "out", *specs)
    emergence = pd.read_csv(tmp_path / "out/emergence.csv").set_index("run_id")
    assert not emergence.loc[[DIVERGED, DIVERGED_AT_START], "emerged"].any()
    assert emergence.loc[STOPPED, "emerged"]
    fit = json.loads((tmp_path / "out/lawfit.json").read_text())
    assert fit["ok"] and fit["n_runs"] == 4 and fit["n_diverged"] == 2
    assert fit["diverged_run_ids"] == [DIVERGED, DIVERGED_AT_START]
    page = (tmp_path / "out/emergence.html").read_text()
    assert page.count('<tr class="diverged">') == 2 and "stopped early" in page
    for name in FIGURES:
        assert (tmp_path / "out/figures" / f"{name}.png").stat().st_size > 1000


def test_run_curves_say_where_runs_stopped_or_diverged(captured):
    from ihsweep.figures.natural import plot_run_curves

    table = ended_model_table()
    plot_run_curves(table, ended_emergence(table), "unused")
    text = captured.texts[0]
    assert "tiny  B=8  C=32\nstopped early at 3M" in text
    assert "tiny  B=16  C=64\ndiverged at 2.6M" in text  # the step, not the last checkpoint
    assert "tiny  B=32  C=64\ndiverged at 6.1k" in text  # before its first checkpoint
    for detail in (DETAIL, EARLY_DETAIL):  # in the panel, instead of "no transition"
        assert "diverged\n" + textwrap.fill(detail, 34) in text
    assert "no transition" not in text  # the flat run diverged: no run lacks a transition
    assert text.splitlines()[-2:] == ["stopped early", "diverged"]  # in the legend


def test_law_fit_and_summaries_count_the_diverged_runs(captured):
    from ihsweep.analysis.lawfit import fit_law
    from ihsweep.figures.natural import plot_emergence_vs_BC, plot_law_fit

    emergence = ended_emergence(ended_model_table())
    fit = fit_law(emergence, n_boot=50, seed=0)
    plot_law_fit(emergence, fit, "unused")
    plot_emergence_vs_BC(emergence, "unused")
    assert "left out: 0 not emerged, 2 diverged" in captured.texts[0]
    assert "4 of 6 runs emerged (2 diverged)" in captured.texts[0]
    assert "4 of 6 runs emerged (2 diverged)" in captured.texts[1]
    # A fit written before it counted diverged runs: counted on the table instead.
    old = {k: v for k, v in fit.items() if k not in ("n_diverged", "n_not_emerged")}
    plot_law_fit(emergence, old, "unused")
    assert "left out: 0 not emerged, 2 diverged" in captured.texts[2]
    three = emergence.head(3)  # B16 C32, B16 C64 (diverged), B32 C32: too few to fit
    plot_law_fit(three, fit_law(three, n_boot=10, seed=0), "unused")
    assert "law not fitted" in captured.texts[3]
    assert "left out: 0 not emerged, 1 diverged" in captured.texts[3]


def test_run_figure_of_runs_that_ended_early(captured, tmp_path):
    from ihsweep.analysis.emergence import run_point
    from ihsweep.figures.run import plot_run

    table = ended_model_table()
    table.loc[table["run_id"] == STOPPED, "predicted_tokens"] = 500_000.0
    for run_id in (STOPPED, DIVERGED, DIVERGED_AT_START):
        model = table[table["run_id"] == run_id]
        heads = pd.DataFrame(
            {"tokens": model["tokens"], "layer": 0, "head": 0, "ps": model["ps_max"]}
        )
        if run_id == DIVERGED_AT_START:
            heads = heads.iloc[0:0]  # nothing probed
        plot_run(model, heads, run_point(model, EMERGENCE), "ps_max", tmp_path / "run")
    stopped, diverged, at_start = captured.texts
    assert "emerged at" in stopped and "stopped early at 3M tokens (budget 6M)" in stopped
    assert "law's prediction" in stopped
    assert f"{DIVERGED}: diverged at 2.6M tokens: {DETAIL}" in diverged
    assert "emerged at" not in diverged  # a diverged run has no emergence point
    assert f"{DIVERGED_AT_START}: diverged at 6.1k tokens: {EARLY_DETAIL}" in at_start
    assert "no checkpoint before it diverged" in at_start and "no checkpoint probed" in at_start


def test_old_tables_and_a_lone_nan_row_do_not_crash(captured, tmp_path):
    from ihsweep.analysis.emergence import run_point
    from ihsweep.figures.natural import plot_law_fit, plot_model_size, plot_run_curves
    from ihsweep.figures.run import plot_run

    table = ended_model_table(with_outcomes=False)  # no outcome, budget or prediction columns
    emergence = ended_emergence(table)
    plot_run_curves(table, emergence, "unused")
    plot_law_fit(emergence, {"ok": False, "reason": "test"}, "unused")
    plot_model_size(emergence, {}, "unused")
    lone = table[table["run_id"] == DIVERGED_AT_START]
    plot_run(lone, lone.assign(layer=0, head=0, ps=math.nan), run_point(lone, EMERGENCE),
             "ps_max", tmp_path / "run")  # fmt: skip
    assert "no transition within the budget" in captured.texts[-1]
    assert "diverged" not in captured.texts[0]  # nothing says so in an old table
