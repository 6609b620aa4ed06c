"""ihsweep.analysis.markov through its command (ihsweep.steps.aggregate_markov), end to end on
hand-made probe tables with a known frontier.

A 3 x 3 bigram grid where a run emerges exactly when f + 2 r >= 1.5 (reliability counts double),
plus a synthetic +D and a -D chain at one (f, r): the frontier, the cell table, the property
rows and the generator table must come out as constructed.
"""

import json

import numpy as np
import pandas as pd
import pytest
from ihsweep.analysis.markov import generator_table
from ihsweep.config import complete
from ihsweep.files import layout
from ihsweep.steps.aggregate_markov import main
from scipy.special import expit

TOKENS = [31_250 * 2**i for i in range(5)] + list(range(750_000, 4_000_001, 250_000))
GRID = [0.1, 0.5, 0.9]
BIGRAM = complete("chain", {"kind": "bigram", "source": "kjv", "vocab_cap": 64})


def emerges(f: float, r: float) -> bool:
    return f + 2 * r >= 1.5


def probe_rows(data: str, rise: bool, midpoint: float = 6.0) -> list[dict]:
    x = np.log10(TOKENS)
    ps = 0.04 + (0.6 if rise else 0.0) * expit(12 * (x - midpoint))
    return [
        {
            "run_id": f"{data}/tiny/B8-C32-s0",
            "data": data,
            "model": "tiny",
            "n_params": 1000,
            "batch_size": 8,
            "context_size": 32,
            "seed": 0,
            "step": t // 256,
            "tokens": t,
            "ps_max": float(v),
            "la_max": float(v),
            "ar_acc": float(v),
        }
        for t, v in zip(TOKENS, ps, strict=True)
    ]


def chunks_meta(f: float, r: float) -> dict:
    measured = {"f": f + 0.001, "r": r - 0.002, "first_half_repeats": 0, "entropy_rate_bits": 3.0}
    return {"context": 32, "measured": {"train": measured}}


def write_chunks(root, data: str, f: float, r: float) -> str:
    """The run's chunk sidecar in its keyed folder (layout.chunk_dir) below ``root``."""
    folder = root / layout.chunk_dir(data, layout.settings_key(data), 32)
    folder.mkdir(parents=True)
    (folder / "chunks.json").write_text(json.dumps(chunks_meta(f, r)))
    return str(folder / "chunks.json")


def markov_entry(chain: dict, f: float, r: float, grid: str) -> dict:
    """A complete Markov dataset entry as ``prepare`` leaves it: schema defaults, and ``grid``."""
    entry = {"family": "markov", "chain": chain, "frequency": f, "reliability": r}
    return {**complete("dataset", entry), "grid": grid}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("markov_aggregate")
    datasets, rows, metas = {}, [], []
    for f in GRID:
        for r in GRID:
            name = f"semi-f{f:g}-r{r:g}"
            datasets[name] = markov_entry(BIGRAM, f, r, "semi")
            rows += probe_rows(name, emerges(f, r))
            metas.append(write_chunks(tmp, name, f, r))
    for name, dependency in (("plus", True), ("minus", False)):
        chain = {"kind": "synthetic", "vocab_size": 64, "dependency": dependency}
        datasets[name] = markov_entry(complete("chain", chain), 0.9, 0.9, name)
        rows += probe_rows(name, dependency, midpoint=5.5)
        metas.append(write_chunks(tmp, name, 0.9, 0.9))
    assert datasets["plus"]["chain"]["marginal"] == "zipfian"  # the schema's default marginal
    table = tmp / "model.parquet"
    pd.DataFrame(rows).to_parquet(table)
    argv = ["--model-tables", str(table), "--datasets", json.dumps(datasets)]
    argv += ["--chunk-metas", *metas, "--out-dir", str(tmp / "out")]
    argv += ["--emergence", json.dumps({"metric": "ps_max", "method": "sigmoid", "min_rise": 0.05})]
    assert main(argv) == 0
    return tmp / "out"


def test_frontier_is_the_constructed_boundary(outputs):
    fronts = json.loads((outputs / "frontier.json").read_text())
    assert set(fronts) == {"semi-tiny-B8-C32"}  # one-cell grids have no frontier
    fronts["semi"] = fronts.pop("semi-tiny-B8-C32")
    # Emerging cells: f + 2r >= 1.5. Minimal ones: (0.1, 0.9) and (0.5, 0.5).
    assert fronts["semi"]["frontier"] == [[0.1, 0.9], [0.5, 0.5]]
    assert fronts["semi"]["monotone"] is True
    # The fit leans to r, which is worth two units of f here; nine single-seed runs are too few
    # for its interval to exclude equal shares, so no axis is named.
    verdict = fronts["semi"]["sensitivity"]
    low, high = verdict["share_reliability_ci"]
    assert 0.5 < verdict["share_reliability"] and low < 0.5 < high
    assert verdict["verdict"] == "undecided" and verdict["n_boot_used"] > 900


def test_cells_and_runs(outputs):
    cells = pd.read_csv(outputs / "cells.csv")
    semi = cells[cells["grid"] == "semi"]
    assert len(semi) == 9
    for row in semi.itertuples():
        assert row.emerged == emerges(row.frequency, row.reliability)
        if row.emerged:
            assert row.tokens_pt == pytest.approx(1e6, rel=0.05)
    runs = pd.read_csv(outputs / "emergence.csv")
    assert len(runs) == 11
    plus = runs.set_index("data").loc["plus"]
    assert plus.emerged and plus.dependency and plus.categorial and plus.marginal == "zipfian"
    minus = runs.set_index("data").loc["minus"]
    assert not minus.emerged and not minus.dependency and not minus.categorial
    assert runs["measured_frequency"].sub(runs["frequency"]).round(6).eq(0.001).all()
    semi_run = runs[runs["grid"] == "semi"].iloc[0]
    assert semi_run.chain_kind == "bigram" and semi_run.marginal == "natural"


def test_generator_table_and_figures(outputs):
    generator = pd.read_csv(outputs / "generator.csv")
    assert len(generator) == 11 and (generator["first_half_repeats"] == 0).all()
    assert set(generator["generator"]) == {"bigram", "synthetic"}
    figures = sorted(p.name for p in (outputs / "figures").iterdir())
    assert figures == [
        f"{stem}.{ext}" for stem in ("frontier-semi-tiny-B8-C32", "generator", "properties")
        for ext in ("pdf", "png")
    ]  # fmt: skip


def test_generator_table_reads_one_sidecar_per_dataset_and_context():
    datasets = {
        "semi-f0.1-r0.9": markov_entry(BIGRAM, 0.1, 0.9, "semi"),
        "semi-f0.5-r0.5": markov_entry(BIGRAM, 0.5, 0.5, "semi"),
    }
    metas = {
        ("semi-f0.5-r0.5", 64): chunks_meta(0.5, 0.5),
        ("semi-f0.1-r0.9", 32): chunks_meta(0.1, 0.9),
        ("semi-f0.1-r0.9", 16): chunks_meta(0.1, 0.9),
    }
    table = generator_table(datasets, metas)
    assert list(zip(table["data"], table["context_size"], strict=True)) == sorted(metas)
    row = table.iloc[0]
    assert (row.grid, row.generator, row.frequency, row.reliability) == ("semi", "bigram", 0.1, 0.9)
    assert row.measured_frequency == pytest.approx(0.101)
    assert row.measured_reliability == pytest.approx(0.898)
    assert (table["entropy_rate_bits"] == 3.0).all() and (table["first_half_repeats"] == 0).all()


# --- diverged runs: a cell table that counts them, and a run diverged before any checkpoint ---


def captured_text(monkeypatch):
    """Replace the Markov figures' save_figure: keep each figure's texts (a list of strings per
    figure) instead of files."""
    from ihsweep.figures import markov

    texts = []

    def capture(fig, out_stem):
        parts = [fig._suptitle.get_text() if fig._suptitle else ""]
        parts += [t.get_text() for ax in fig.axes for t in ax.texts]
        parts += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        texts.append(parts)
        return []

    monkeypatch.setattr(markov, "save_figure", capture)
    return texts


def diverged_cells():
    """A 2 x 2 (f, r) grid: (0.9, 0.9) emerged; (0.1, 0.9) diverged in both its seeds;
    (0.9, 0.1) did not emerge, one of its two seeds diverged; (0.1, 0.1) did not emerge."""
    from ihsweep.analysis.frontier import cell_outcomes

    rows = []
    for f, r, emerged, diverged in [
        (0.9, 0.9, [True, True], [0, 0]), (0.1, 0.9, [False, False], [1, 1]),
        (0.9, 0.1, [False, False], [1, 0]), (0.1, 0.1, [False, False], [0, 0]),
    ]:  # fmt: skip
        for seed in (0, 1):
            up = emerged[seed]
            rows.append({"frequency": f, "reliability": r, "emerged": up,
                         "tokens_pt": 1e6 if up else np.nan, "updates_pt": 4e3 if up else np.nan,
                         "outcome": "diverged" if diverged[seed] else "completed"})  # fmt: skip
    return cell_outcomes(pd.DataFrame(rows))


def test_frontier_figure_marks_cells_whose_runs_diverged(monkeypatch):
    from ihsweep.figures.markov import plot_frontier, plot_property_grid

    texts = captured_text(monkeypatch)
    cells = diverged_cells()
    plot_frontier(cells, None, "unused")
    title, *labels = texts[0]
    assert "1 of 4 (f, r) cells emerged (3 runs diverged)" in title
    assert labels.count("diverged") == 1  # the cell whose every run diverged, not "none"
    assert "none\n1 diverged" in labels  # a split cell names its diverged run
    assert "every run diverged (says nothing about emergence)" in labels  # in the legend
    plot_frontier(cells.drop(columns="n_diverged"), None, "unused")  # as cell_outcomes gives
    assert not any("diverged" in t for t in texts[1])
    grid = cells.assign(dependency=True, categorial=True, marginal="zipfian", label="")
    plot_property_grid(grid, "unused")
    assert "(3 runs diverged)" in texts[2][0] and "none\n1 diverged" in texts[2]


def test_a_run_diverged_before_its_first_checkpoint_is_listed_as_diverged(tmp_path):
    """Four bigram cells, one of whose runs diverged at once: its model table is a single row at
    0 tokens with NaN metrics. The step must list it as diverged and draw every figure."""
    datasets, rows, metas = {}, [], []
    for f in (0.1, 0.9):
        for r in (0.1, 0.9):
            name = f"semi-f{f:g}-r{r:g}"
            datasets[name] = markov_entry(BIGRAM, f, r, "semi")
            rows += probe_rows(name, emerges(f, r))
            metas.append(write_chunks(tmp_path, name, f, r))
    table = pd.DataFrame(rows).assign(outcome="completed", outcome_detail="", budget=TOKENS[-1],
                                      predicted_tokens=np.nan)  # fmt: skip
    lone = table["data"] == "semi-f0.1-r0.9"
    first = table[lone].iloc[:1].assign(step=0, tokens=0, ps_max=np.nan, la_max=np.nan,
                                        ar_acc=np.nan, outcome="diverged",
                                        outcome_detail="train loss nan at step 1")  # fmt: skip
    pd.concat([table[~lone], first]).to_parquet(tmp_path / "model.parquet")
    argv = ["--model-tables", str(tmp_path / "model.parquet"), "--datasets", json.dumps(datasets)]
    argv += ["--chunk-metas", *metas]
    argv += ["--out-dir", str(tmp_path / "out"), "--emergence", json.dumps({"min_rise": 0.05})]
    assert main(argv) == 0
    runs = pd.read_csv(tmp_path / "out/emergence.csv").set_index("data")
    assert runs.loc["semi-f0.1-r0.9", "outcome"] == "diverged"
    assert not runs.loc["semi-f0.1-r0.9", "emerged"]
    page = (tmp_path / "out/emergence.html").read_text()
    assert page.count('<tr class="diverged">') == 1 and "1 diverged" in page
    assert (tmp_path / "out/figures/frontier-semi-tiny-B8-C32.png").stat().st_size > 1000
