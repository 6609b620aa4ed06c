"""The report's HTML tables: one row per table row, the numbers rounded as documented."""

from __future__ import annotations

import html as htmlmod
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from docutils.core import publish_parts
from ihsweep.analysis import frontier
from ihsweep.analysis.lawfit import QUANTITIES, fit_law, fit_table
from ihsweep.analysis.markov import SETTING_KEYS, setting_cells
from ihsweep.files import layout
from ihsweep.report import findings
from ihsweep.report.findings import law_findings
from ihsweep.report.rst import NB_HYPHEN
from ihsweep.report.tables import law_fit, markov_emergence, natural_emergence
from ihsweep.steps.prepare import prepare
from jinja2 import Environment

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")
MARKOV = layout.markov_dir("default")

REPO = Path(__file__).resolve().parents[1]


def cells(page: str) -> list[list[str]]:
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr.*?</tr>", body)]


def emergence_rows() -> pd.DataFrame:
    nan = math.nan
    return pd.DataFrame(
        {
            "run_id": ["d/m/B16-C8-s0", "d/m/B4-C8-s0"],
            "data": ["d", "d"],
            "model": ["m", "m"],
            "n_params": [168704, 168704],
            "batch_size": [16, 4],
            "context_size": [8, 8],
            "seed": [0, 0],
            "emerged": [False, True],
            "tokens_pt": [nan, 1_234_567.0],
            "tokens_lo": [nan, 1_000_000.0],
            "tokens_hi": [nan, 1_500_000.0],
            "updates_pt": [nan, 38580.2],
            "rise": [0.0243, 0.41],
            "reason": ["rise 0.0243 below min_rise 0.05 <no transition>", nan],
        }
    )


def test_natural_emergence_page_sorts_by_batch_size_and_rounds():
    page = natural_emergence(emergence_rows(), "ps_max")
    rows = cells(page)
    assert [r[0] for r in rows] == ["d/m/B4-C8-s0", "d/m/B16-C8-s0"]  # numeric order of B
    assert rows[0][1:9] == ["168,704", "4", "8", "0", "yes", "1.23M [1M, 1.5M]", "38,580", "0.41"]
    assert rows[1][5:8] == ["no", "none", "none"]
    assert "&lt;no transition&gt;" in rows[1][9]  # text is escaped
    assert page.count('<tr class="no">') == 1  # the run without a transition is greyed out
    assert "<th>rise of ps_max</th>" in page


def test_law_fit_page_has_a_row_per_quantity_with_its_interval():
    fit = {"a": 1.19887, "a_ci": [0.19216, 1.76716], "b": 0.5, "b_ci": [-0.1, 1.1]}
    fit |= {"log10_T": 5.4, "log10_T_ci": [4.4, 6.6], "c": None, "r": 0.864, "n_runs": 9}
    rows = cells(law_fit(fit_table(fit)))
    assert [r[0] for r in rows] == list(QUANTITIES)
    assert rows[0][2:] == ["1.2", "[0.192, 1.77]"]
    assert rows[3][2:] == ["", ""]  # not fitted: empty, not "nan"
    assert rows[5][2:] == ["", ""]  # r_cells of an older lawfit.json: empty too
    assert rows[-1][2:] == ["9", ""]


def test_markov_emergence_page_shows_requested_and_measured_statistics():
    runs = emergence_rows().assign(
        grid=["semi", "semi"],
        frequency=[0.9, 0.1],
        reliability=[0.5, 0.5],
        measured_frequency=[0.900133, 0.0998],
        measured_reliability=[0.50051, 0.4994],
    )
    rows = cells(markov_emergence(runs, "ps_max"))
    assert [r[:5] for r in rows] == [
        ["semi", "0.1", "0.5", "0.0998", "0.499"],
        ["semi", "0.9", "0.5", "0.9", "0.501"],
    ]


def ended_rows() -> pd.DataFrame:
    """Four runs as emergence_table writes them once runs record how they ended: completed with
    its prediction inside the interval, stopped early with it outside, diverged, and completed
    without a transition."""
    nan = math.nan
    rows = emergence_rows()
    rows = pd.concat([rows, rows], ignore_index=True)
    rows["run_id"] = ["d/m/B4-C8-s0", "d/m/B8-C8-s0", "d/m/B16-C8-s0", "d/m/B32-C8-s0"]
    rows["batch_size"] = [4, 8, 16, 32]
    rows["emerged"] = [True, True, False, False]
    rows["tokens_pt"] = [1_234_567.0, 600_000.0, nan, nan]
    rows["tokens_lo"] = [1_000_000.0, 500_000.0, nan, nan]
    rows["tokens_hi"] = [1_500_000.0, 700_000.0, nan, nan]
    rows["updates_pt"] = [38580.2, 9375.0, nan, nan]
    rows["reason"] = ["", "", "diverged: train loss nan at step 812 (lr 0.006)", "rise 0.01"]
    return rows.assign(
        outcome=["completed", "stopped_early", "diverged", "completed"],
        outcome_detail=["", "emergence confirmed", "train loss nan at step 812 (lr 0.006)", ""],
        tokens_trained=[4_000_000, 1_000_000, 0, 4_000_000],
        budget=[4_000_000] * 4,
        predicted_tokens=[1_100_000.0, 900_000.0, 2_000_000.0, nan],
        predicted_within=pd.array([True, False, pd.NA, pd.NA], dtype="boolean"),
    )


def test_natural_page_shows_outcomes_tokens_and_predictions():
    page = natural_emergence(ended_rows(), "ps_max")
    rows = {r[0]: r for r in cells(page)}
    completed, stopped = rows["d/m/B4-C8-s0"], rows["d/m/B8-C8-s0"]
    diverged, flat = rows["d/m/B16-C8-s0"], rows["d/m/B32-C8-s0"]
    assert completed[10:] == ["completed", "4M / 4M", "1.1M", "yes"]
    assert stopped[10:] == ["stopped early", "1M / 4M", "900k", "no"]
    assert diverged[5:8] == ["diverged", "diverged", "diverged"]  # not "no" / "none"
    assert diverged[10:] == ["diverged", "0 / 4M", "2M", ""]  # no emergence: no verdict
    assert "train loss nan at step 812" in diverged[9]
    assert flat[5] == "no" and flat[10:] == ["completed", "4M / 4M", "", ""]
    assert page.count('<tr class="diverged">') == 1 and page.count('<tr class="no">') == 1
    # 9M of 16M trained: 3M of the early stop's 4M saved (19%), the diverged run's 4M unspent.
    assert (
        "Tokens trained: 9M of a 16M budget in total (19% saved by early stops; 4M unspent by"
        " diverged runs). 1 of 4 runs stopped early once"
        " emergence was confirmed, 1 diverged. The law predicted 1 of 2 emerged runs within their"
        " interval"
    ) in page


def test_old_tables_without_outcomes_read_as_completed():
    page = natural_emergence(emergence_rows(), "ps_max")
    assert [r[10:] for r in cells(page)] == [["completed", "", "", ""]] * 2
    assert "0 of 2 runs stopped early once emergence was confirmed, 0 diverged." in page
    assert "Tokens trained" not in page and "The law predicted" not in page


def test_markov_page_lists_diverged_runs_as_diverged():
    runs = ended_rows().assign(
        grid="semi",
        frequency=[0.1, 0.3, 0.5, 0.9],
        reliability=0.5,
        measured_frequency=[0.1, 0.3, 0.5, 0.9],
        measured_reliability=0.5,
    )
    page = markov_emergence(runs, "ps_max")
    rows = cells(page)
    assert [r[9] for r in rows] == ["yes", "yes", "diverged", "no"]
    assert [r[12:14] for r in rows] == [
        ["completed", "4M / 4M"], ["stopped early", "1M / 4M"], ["diverged", "0 / 4M"],
        ["completed", "4M / 4M"],
    ]  # fmt: skip
    assert "Tokens trained: 9M of a 16M budget in total (19% saved by early stops; 4M" in page
    assert "1 diverged" in page and "The law predicted" not in page  # no law for Markov runs


def test_law_fit_page_says_what_the_fit_left_out():
    fit = {"a": 0.4, "n_runs": 5, "n_table_runs": 8, "n_not_emerged": 1, "n_diverged": 2}
    fit["diverged_run_ids"] = ["d/m/B16-C8-s0", "d/m/B64-C8-s0"]
    page = law_fit(fit_table(fit), fit)
    assert (
        "Fitted on 5 of 8 runs; left out: 1 without a transition within the budget, 2 diverged"
        " (d/m/B16-C8-s0, d/m/B64-C8-s0)."
    ) in page
    assert len(cells(page)) == len(QUANTITIES)  # the table itself is unchanged
    assert "left out" not in law_fit(fit_table(fit))  # without the fit: the table alone


# --- the front page's findings (ihsweep.report.findings) -----------------------------------
# Each test writes an aggregate folder's cached tables with known contents, runs the step the
# aggregate rules end with, and reads the reStructuredText as the front page shows it: rendered
# by docutils, any warning an error (an unescaped "|" or "*" breaks the page), report links
# resolved as Snakemake's report resolves them.


def rendered(rst: str) -> str:
    """The text a reader sees: rendered HTML without tags, one space between words."""
    targets = sorted(set(re.findall(r"`([^`<>]+)`_", rst)))
    links = "\n".join(f".. _{t}: javascript:app.showResultInfo('{t}')" for t in targets)
    html = publish_parts(rst + "\n\n" + links, writer="html", settings_overrides={"halt_level": 2})
    text = re.sub(r"<[^>]+>", " ", html["body"]).replace(NB_HYPHEN, "-")
    return re.sub(r"\s+([.,:;)])", r"\1", re.sub(r"\s+", " ", htmlmod.unescape(text))).strip()


def table_rows(rst: str) -> list[list[str]]:
    """The cells of the rendered list-table, row by row (header first)."""
    targets = set(re.findall(r"`([^`<>]+)`_", rst))
    html = publish_parts(rst + "\n\n" + "\n".join(f".. _{t}: #" for t in targets), writer="html")
    rows = re.findall(r"<tr>(.*?)</tr>", html["body"], re.S)
    return [
        [re.sub(r"\s+", " ", htmlmod.unescape(re.sub("<[^>]+>", "", c))).strip() for c in cells]
        for cells in (re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S) for row in rows)
    ]


def write_findings(folder: Path, aggregate: str) -> str:
    return findings.write_findings(folder, aggregate).read_text()


def natural_runs(n_seeds: int = 2) -> pd.DataFrame:
    """Eleven runs over B x C = {8, 16, 32} x {16, 32} (two seeds where n_seeds is 2): ten
    emerged, one without a transition; the law's outcome is given by the fit written beside."""
    rows = []
    for b in (8, 16, 32):
        for c in (16, 32):
            for seed in range(n_seeds if (b, c) != (32, 32) else 1):
                rows.append({"run_id": f"kjv/w64/B{b}-C{c}-s{seed}", "data": "kjv",
                             "model": "w64", "n_params": 52000, "batch_size": b,
                             "context_size": c, "seed": seed, "emerged": True,
                             "updates_pt": 1e4 / b**0.4 / c**0.6,
                             "outcome": "completed"})  # fmt: skip
    table = pd.DataFrame(rows)
    table.loc[table["run_id"] == "kjv/w64/B32-C32-s0", ["emerged", "updates_pt"]] = [
        False,
        math.nan,
    ]
    table.loc[table["run_id"] == "kjv/w64/B8-C16-s1", ["emerged", "outcome"]] = [False, "diverged"]
    return table


def known_fit(runs: pd.DataFrame, **changes) -> dict:
    """A fit_law result with known numbers, over the emerged, not diverged runs of ``runs``."""
    used = runs[runs["emerged"] & (runs["outcome"] != "diverged")]
    fit = {
        "ok": True, "reason": "", "a": 0.412, "a_ci": [0.301, 0.523], "b": 0.71,
        "b_ci": [0.66, 0.77], "log10_T": 4.1, "log10_T_ci": [3.9, 4.3], "r": 0.951,
        "c": 0.031, "c_ci": [-0.02, 0.08], "c_excludes_zero": False,
        "c_note": "2 distinct n_params; c = 0 means no model-size effect", "n_boot_used": 1000,
        "n_runs": len(used), "run_ids": sorted(used["run_id"]), "n_table_runs": len(runs),
        "n_not_emerged": 1, "n_diverged": 1, "diverged_run_ids": ["kjv/w64/B8-C16-s1"],
    }  # fmt: skip
    return fit | changes


def natural_folder(tmp_path: Path, runs: pd.DataFrame, fit: dict) -> Path:
    folder = tmp_path / "natural"
    folder.mkdir(parents=True)
    runs.to_csv(folder / "emergence.csv", index=False)
    (folder / "lawfit.json").write_text(json.dumps(fit))
    return folder


def test_front_page_states_the_fitted_law_beside_the_papers(tmp_path):
    runs = natural_runs()
    rst = write_findings(natural_folder(tmp_path, runs, known_fit(runs)), "natural")
    text = rendered(rst)
    assert text.startswith(
        "Experiment 1: when IHs emerge (natural data). The law U_pt = T / (B^a C^b), by least"
        " squares on log10 U_pt, with its 95% bootstrap intervals below. Fitted on 9 of 11 runs;"
        " left out: 1 without a transition within the budget, 1 diverged (kjv/w64/B8-C16-s1)."
        " Up to 2 seeds per (data, model, B, C) cell, each run one observation"
    )
    assert table_rows(rst) == [
        ["", "this study [95% bootstrap CI]", "the paper"],
        ["a (exponent of B)", "0.412 [0.301, 0.523]", "0.37 (inside the interval)"],
        ["b (exponent of C)", "0.71 [0.66, 0.77]", "0.62 (outside the interval)"],
        ["r (predicted vs observed)", "0.951", "0.98"],
        ["c (of log10 N_params)", "0.031 [-0.02, 0.08]", "0, no size effect (inside the interval)"],
    ]
    assert text.endswith("Details: lawfit.html, law_fit.png.")
    assert "`lawfit.html`_" in rst and "`law_fit.png`_" in rst  # links to the detailed pages


def test_front_page_says_how_much_of_the_scatter_is_seed_noise(tmp_path):
    runs = natural_runs()
    noise = {"n_cells": 12, "seed_sd_log10": 0.2204, "r_ceiling": 0.9141, "r_cells": 0.8356}
    fit = known_fit(runs, **noise, lack_of_fit_F=2.037, lack_of_fit_p=0.1248)
    text = rendered(write_findings(natural_folder(tmp_path, runs, fit), "natural"))
    assert (
        "Runs of one (B, C) cell differ by 0.22 decades (standard deviation), so no law of B and"
        " C could reach r above 0.914 on these runs; over the 12 cells' mean log updates the law"
        " gives r = 0.836. The law misses the cells' means by no more than the seeds scatter"
        " (lack-of-fit F = 2.04, p = 0.125). Details:"
    ) in text
    fit |= {"lack_of_fit_F": 9.5, "lack_of_fit_p": 0.0004}
    (tmp_path / "natural" / "lawfit.json").write_text(json.dumps(fit))
    text = rendered(write_findings(tmp_path / "natural", "natural"))
    assert "by more than the seeds scatter (lack-of-fit F = 9.5, p = 0.0004)." in text
    fit |= {"lack_of_fit_F": None, "lack_of_fit_p": None}  # 3 cells: no test, the rest stands
    (tmp_path / "natural" / "lawfit.json").write_text(json.dumps(fit))
    text = rendered(write_findings(tmp_path / "natural", "natural"))
    assert "the law gives r = 0.836. Details:" in text and "lack-of-fit" not in text


def test_front_page_model_size_effect_and_one_seed(tmp_path):
    runs = natural_runs(n_seeds=1)
    fit = known_fit(runs, c=0.25, c_ci=[0.1, 0.4], c_excludes_zero=True, n_diverged=0,
                    diverged_run_ids=[])  # fmt: skip
    rst = write_findings(natural_folder(tmp_path, runs, fit), "natural")
    assert "One seed per (data, model, B, C) cell." in rendered(rst)
    assert table_rows(rst)[4][1:] == [
        "0.25 [0.1, 0.4]",
        "0, no size effect (outside the interval: a size effect here)",
    ]
    fit = known_fit(runs, c=None, c_ci=None, c_note="1 distinct n_params among emerged runs")
    (tmp_path / "natural" / "lawfit.json").write_text(json.dumps(fit))
    rst = write_findings(tmp_path / "natural", "natural")
    assert table_rows(rst)[4][1] == "not tested: 1 distinct n_params among emerged runs"


def test_front_page_says_when_too_few_runs_emerged_to_fit_the_law(tmp_path):
    runs = natural_runs().head(4)
    runs["emerged"] = [True, True, False, False]
    runs["outcome"] = "completed"
    fit = fit_law(runs, n_boot=10, seed=0)  # the real fit: 2 emerged runs are too few
    text = rendered(write_findings(natural_folder(tmp_path, runs, fit), "natural"))
    assert text == (
        "Experiment 1: when IHs emerge (natural data). The law U_pt = T / (B^a C^b) was not"
        " fitted: only 2 emerged runs; the law needs at least 4. 2 of 4 runs emerged; 2 had no"
        " transition within the budget, 0 diverged. (The paper: a = 0.37, b = 0.62, r = 0.98.)"
        " Details: lawfit.html, law_fit.png."
    )
    assert "Not in this study: no run trains on natural data." in rendered(law_findings(None))


def markov_runs(bigram: dict, synthetic: dict | None = None, seeds: int = 1) -> pd.DataFrame:
    """A Markov run table as aggregate_markov writes it (the columns the findings read):
    ``bigram`` maps (f, r) to emerged for grid "semi"; ``synthetic`` maps (chain name, f, r)
    to emerged, the chain named like the default study's (zipf+D+C, unif-D, ...)."""
    rows = []

    def add(data, grid, kind, f, r, emerged, dependency=True, categorial=None,
            marginal="natural"):  # fmt: skip
        for seed in range(seeds):
            rows.append({"run_id": f"{data}/w64/B8-C32-s{seed}", "data": data, "model": "w64",
                         "batch_size": 8, "context_size": 32, "seed": seed, "emerged": emerged,
                         "tokens_pt": 1.5e6 if emerged else math.nan,
                         "updates_pt": 4883.0 if emerged else math.nan, "outcome": "completed",
                         "grid": grid, "chain_kind": kind, "frequency": f, "reliability": r,
                         "dependency": dependency, "categorial": categorial,
                         "marginal": marginal})  # fmt: skip

    for (f, r), emerged in bigram.items():
        add(f"semi-f{f}-r{r}", "semi", "bigram", f, r, emerged)
    marginals = {"zipf": "zipfian", "unif": "uniform", "gauss": "gaussian"}
    for (name, f, r), emerged in (synthetic or {}).items():
        marginal, d, c = re.fullmatch(r"(\w+)([+-])D([+-]C)?", name).groups()
        add(f"{name}-f{f}-r{r}", name, "synthetic", f, r, emerged, dependency=d == "+",
            categorial=c == "+C", marginal=marginals[marginal])  # fmt: skip
    return pd.DataFrame(rows)


def markov_folder(tmp_path: Path, runs: pd.DataFrame, verdicts: dict | None = None) -> Path:
    """emergence.csv, cells.csv and frontier.json as aggregate_markov writes them (its own
    functions); ``verdicts`` replaces a setting's sensitivity verdict by a known one."""
    folder = tmp_path / "markov"
    folder.mkdir(parents=True)
    cells = setting_cells(runs)
    fronts = {}
    for key, table in cells.groupby(SETTING_KEYS, sort=True):
        if len(table) > 1:
            name = layout.setting_name(*key)
            verdict = (verdicts or {}).get(name) or frontier.sensitivity(table)
            fronts[name] = frontier.pareto_frontier(table).summary() | {"sensitivity": verdict}
    runs.to_csv(folder / "emergence.csv", index=False)
    cells.to_csv(folder / "cells.csv", index=False)
    (folder / "frontier.json").write_text(json.dumps(fronts))
    return folder


GRID = [(f, r) for f in (0.1, 0.5, 0.9) for r in (0.1, 0.5, 0.9)]
# IHs form wherever r >= 0.5, except at the lowest f: reliability matters more. With three
# seeds a cell, because resampling nine runs leaves the verdict's interval across 0.5.
RELIABILITY_MATTERS = {(f, r): r >= 0.5 and (f, r) != (0.1, 0.5) for f, r in GRID}


def test_front_page_frontier_where_reliability_matters_more(tmp_path):
    folder = markov_folder(tmp_path, markov_runs(RELIABILITY_MATTERS, seeds=3))
    verdict = json.loads((folder / "frontier.json").read_text())["semi-w64-B8-C32"]["sensitivity"]
    assert verdict["verdict"] == "reliability"
    low, high = verdict["share_reliability_ci"]
    text = rendered(write_findings(folder, "markov"))
    assert (
        "semi-w64-B8-C32: IHs emerged in 5 of 9 (f, r) cells: (0.1, 0.9), (0.5, 0.5),"
        " (0.5, 0.9), (0.9, 0.5), (0.9, 0.9). Frontier (the minimal emerging cells): (0.1, 0.9),"
        " (0.5, 0.5). Every cell above it emerged, so one frontier separates the grid. More"
        " sensitive to reliability than to frequency, as in the paper: share of reliability"
        f" |b_r| / (|b_f| + |b_r|) = {verdict['share_reliability']:.2f} [{low:.2f}, {high:.2f}]"
        " in a logistic fit of each run's outcome on f and r (|b_r| / |b_f| ="
        f" {verdict['ratio_r_to_f']:.3g}; 27 runs, {verdict['n_boot_used']} of 1000 resamples"
        " usable; 0.5 = equal);"
        " outcomes perfectly separable, so only the direction of the ridge fit counts. Details:"
        " frontier-semi-w64-B8-C32.png."
    ) in text
    assert "The paper found that IHs form only above an effective Pareto frontier" in text
    assert text.endswith(
        "Experiment 3: which data properties make IHs form (synthetic Markov data). Not in this"
        " study: no run trains on a synthetic Markov chain."
    )


def test_front_page_shows_undecided_and_undetermined_verdicts_with_their_reason(tmp_path):
    bigram = {(f, r): f + r >= 1.0 for f, r in GRID}
    undecided = {"verdict": "undecided", "reason": "share of reliability 0.5 [0.3, 0.7]"}
    folder = markov_folder(tmp_path, markov_runs(bigram), {"semi-w64-B8-C32": undecided})
    text = rendered(write_findings(folder, "markov"))
    assert (
        "Whether IHs form does not decide between the axes (the interval includes 0.5; the"
        " paper: reliability): share of reliability 0.5 [0.3, 0.7]."
    ) in text
    # Nothing emerged: no frontier, and the real verdict is undetermined, with its reason.
    folder = markov_folder(tmp_path / "none", markov_runs(dict.fromkeys(GRID, False)))
    text = rendered(write_findings(folder, "markov"))
    assert (
        "IHs emerged in 0 of 9 (f, r) cells. No cell emerged, so there is no frontier."
        " Sensitivity undetermined (the paper: reliability matters more): no run emerged."
    ) in text


def test_front_page_frontier_that_is_not_monotone(tmp_path):
    bigram = {(f, r): r >= 0.5 and (f, r) != (0.5, 0.9) for f, r in GRID}
    text = rendered(write_findings(markov_folder(tmp_path, markov_runs(bigram)), "markov"))
    assert (
        "Frontier (the minimal emerging cells): (0.1, 0.5). Not monotone: (0.5, 0.9) lie above"
        " the frontier but did not emerge, so no single frontier separates the grid."
    ) in text


PROPERTIES = {
    ("zipf+D+C", 0.9, 0.9): True, ("zipf+D-C", 0.9, 0.9): True, ("unif+D+C", 0.9, 0.9): True,
    ("zipf-D", 0.9, 0.9): False, ("unif-D", 0.9, 0.9): False,
    ("zipf+D+C", 0.1, 0.3): True, ("zipf+D-C", 0.1, 0.3): False, ("unif+D+C", 0.1, 0.3): False,
}  # fmt: skip


def test_front_page_property_grid_agrees_with_the_paper(tmp_path):
    folder = markov_folder(tmp_path, markov_runs({}, PROPERTIES))
    text = rendered(write_findings(folder, "markov"))
    assert text.startswith(
        "Experiment 2: which (f, r) make IHs form (semi-natural Markov data). Not in this study:"
        " no run trains on a bigram Markov chain."
    )
    assert (
        "At (f, r) = (0.9, 0.9): IHs formed with +D+C uniform (1.5M tokens), +D+C Zipfian"
        " (1.5M tokens), +D-C Zipfian (1.5M tokens); not with -D uniform, -D Zipfian."
        " At (f, r) = (0.1, 0.3): IHs formed with +D+C Zipfian (1.5M tokens); not with +D+C"
        " uniform, +D-C Zipfian. Against the paper:"
        " +D is necessary: -D (i.i.d.) data never forms IHs: holds here: no -D chain formed IHs"
        " (2 tested, at (0.9, 0.9))."
        " high f and r are sufficient: holds here: all 3 +D chains formed IHs at the highest"
        " cell, (f, r) = (0.9, 0.9)."
        " near the frontier (f = 0.1, r = 0.3) only Zipfian, categorial data forms IHs: holds"
        " here: at (0.1, 0.3), of the 3 chains tested only Zipfian +D+C formed IHs (not +D+C"
        " uniform, +D-C Zipfian). Details: properties.png."
    ) in text


def test_front_page_property_grid_against_the_paper(tmp_path):
    changed = PROPERTIES | {("unif-D", 0.9, 0.9): True, ("zipf+D-C", 0.9, 0.9): False,
                            ("unif+D+C", 0.1, 0.3): True}  # fmt: skip
    text = rendered(write_findings(markov_folder(tmp_path, markov_runs({}, changed)), "markov"))
    assert "never forms IHs: does not hold here: -D uniform at (0.9, 0.9) formed IHs." in text
    assert (
        "sufficient: does not hold here: 2 of 3 +D chains formed IHs at the highest cell,"
        " (f, r) = (0.9, 0.9) (not +D-C Zipfian)."
    ) in text
    assert "forms IHs: does not hold here: at (0.1, 0.3), +D+C uniform formed IHs too." in text
    # With the chains at the highest cell only, the study has no edge: not judged.
    high = {k: v for k, v in PROPERTIES.items() if k[1:] == (0.9, 0.9)}
    text = rendered(
        write_findings(markov_folder(tmp_path / "high", markov_runs({}, high)), "markov")
    )
    assert (
        "forms IHs: not tested here (no synthetic chain at (0.1, 0.3); the chains were tested"
        " only at (0.9, 0.9), so the study has no edge of its own to judge it at)."
    ) in text


PLUS_D = ("zipf+D+C", "zipf+D-C", "unif+D+C", "unif+D-C")


def chains_at(cells: dict) -> dict:
    """Experiment-3 outcomes: {(f, r): the +D chains that form IHs there}, for every +D chain."""
    return {(c, f, r): c in formed for (f, r), formed in cells.items() for c in PLUS_D}


def property_text(folder: Path, cells: dict, seeds: int = 1) -> str:
    runs = markov_runs({}, chains_at(cells), seeds=seeds)
    return rendered(write_findings(markov_folder(folder, runs), "markov"))


def test_near_frontier_claim_is_judged_at_the_studys_own_edge(tmp_path):
    """Without the paper's cell, the claim is judged at the lowest cells where any chain formed
    IHs, and the text says what was tested below them."""
    high = {"zipf+D+C", "zipf+D-C", "unif+D-C"}
    diagonal = {(0.9, 0.9): high, (0.7, 0.7): {"zipf+D+C"}, (0.6, 0.6): set()}
    assert (
        "forms IHs: holds here: at this study's lowest cell where any chain formed IHs, (0.7,"
        " 0.7) (below it, no chain formed IHs at (0.6, 0.6); the paper's cell (0.1, 0.3) is"
        " below what this scale reaches), of the 4 chains tested only Zipfian +D+C formed IHs"
        " (not +D+C uniform, +D-C uniform, +D-C Zipfian)."
    ) in property_text(tmp_path / "holds", diagonal, seeds=2)
    # One cell higher, Zipfian and uniform chains without categories form IHs too.
    assert (
        "forms IHs: does not hold here: at this study's lowest cell where any chain formed IHs,"
        " (0.8, 0.8) (no cell below it tested; the paper's cell (0.1, 0.3) is below what this"
        " scale reaches), +D-C uniform, +D-C Zipfian formed IHs too."
    ) in property_text(tmp_path / "higher", {(0.9, 0.9): high, (0.8, 0.8): high}, seeds=2)
    # Two edge cells that neither lies below the other: both are judged; (0.5, 0.5) lies below.
    corners = {(0.9, 0.5): {"zipf+D+C"}, (0.5, 0.9): {"zipf+D+C"}, (0.5, 0.5): set()}
    text = property_text(tmp_path / "corners", corners)
    assert (
        "holds here: at this study's lowest cell where any chain formed IHs, (0.5, 0.9), (0.9,"
        " 0.5) (below it, no chain formed IHs at (0.5, 0.5);"
    ) in text
    assert (
        "of the 4 chains tested only Zipfian +D+C formed IHs (not +D+C uniform, +D-C uniform,"
        " +D-C Zipfian)."
    ) in text
    # No chain formed IHs anywhere: no edge, not judged.
    assert (
        "forms IHs: not tested here (no synthetic chain at (0.1, 0.3); no chain formed IHs at"
        " any cell, so the study has no edge of its own to judge it at)."
    ) in property_text(tmp_path / "none", dict.fromkeys(diagonal, set()))


def front_page(workdir: Path, results: list[str], monkeypatch) -> str:
    """workflow/report/workflow.rst rendered the way ``snakemake --report`` renders it (Jinja
    with its settings, the link targets it appends, docutils from the study folder), for a
    report whose results are the files ``results``; any docutils warning is an error."""
    files = [SimpleNamespace(target=Path(p).name, path=Path(p)) for p in results]
    links = "".join(f"\n.. _{f.target}: javascript:app.showResultInfo('{f.path}')" for f in files)
    template = (REPO / "workflow" / "report" / "workflow.rst").read_text() + "\n" + links
    config = prepare(yaml.safe_load((REPO / "tests" / "studies" / "report.yaml").read_text()))
    monkeypatch.chdir(workdir)  # the report's results, and the files it includes, are relative
    text = (
        Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string(template)
        .render(snakemake=SimpleNamespace(config=config.config), categories={}, files=files)
    )
    html = publish_parts(text, writer="html", settings_overrides={"halt_level": 2})["body"]
    text = re.sub(r"<style>.*?</style>|<[^>]+>", " ", html, flags=re.S)
    text = re.sub(r"\s+", " ", htmlmod.unescape(text).replace(NB_HYPHEN, "-"))
    text = re.sub(r"\(\s+", "(", text)  # "( x )": where a tag became a space
    return re.sub(r"\s+([.,:;)])", r"\1", text).strip()


NATURAL_RESULTS = [f"{NATURAL}/lawfit.html", f"{NATURAL}/figures/law_fit.png"]
MARKOV_RESULTS = [f"{MARKOV}/figures/{s}.png" for s in ("frontier-semi-w64-B8-C32",
                                                                 "generator")]  # fmt: skip


def test_front_page_opens_with_the_findings_and_says_what_is_not_in_the_study(
    tmp_path, monkeypatch
):
    runs = natural_runs()
    natural = natural_folder(tmp_path / layout.study_dir("default"), runs, known_fit(runs))
    write_findings(natural, "natural")
    page = front_page(tmp_path, NATURAL_RESULTS, monkeypatch)
    assert page.startswith(
        "Findings of this study, each computed from its aggregate tables, beside the paper's."
        " Experiment 1: when IHs emerge (natural data). The law U_pt = T / (B^a C^b), by least"
        " squares"
    )
    assert "a (exponent of B) 0.412 [0.301, 0.523] 0.37 (inside the interval)" in page
    assert (
        "Experiments 2 and 3: which data statistics make IHs form (Markov data). Not in this"
        " report: the study has no Markov-data runs, or they are not aggregated yet."
        " ihsweep measures when induction heads"
    ) in page  # the findings come first, then what the study is
    assert "This study (default). 2 run entries" in page

    runs = markov_runs(RELIABILITY_MATTERS, seeds=3)
    folder = markov_folder(tmp_path / layout.study_dir("default"), runs)
    write_findings(folder, "markov")
    page = front_page(tmp_path, MARKOV_RESULTS, monkeypatch)
    assert page.startswith(
        "Findings of this study, each computed from its aggregate tables, beside the paper's."
        " Experiment 1: when IHs emerge (natural data). Not in this report: the study has no"
        " natural-data runs, or they are not aggregated yet. Experiment 2: which (f, r) make"
        " IHs form (semi-natural Markov data)."
    )
    assert "More sensitive to reliability than to frequency, as in the paper" in page
    assert (
        "Experiment 3: which data properties make IHs form (synthetic Markov data). Not in" in page
    )

    (natural / layout.FINDINGS).unlink()  # results aggregated before findings were written
    page = front_page(tmp_path, NATURAL_RESULTS + MARKOV_RESULTS, monkeypatch)
    assert (
        "Experiment 1 (natural data). Its findings are not written yet: run the workflow (it"
        " rewrites the aggregate, nothing else), then build the report again."
    ) in page


def test_timing_verdict_in_words():
    from ihsweep.report.findings import _timing

    reason = "share of reliability ... = 0.80 [0.70, 0.90]"
    said = _timing({"verdict": "reliability", "reason": reason})
    assert said == (
        "Emergence is delayed more by less reliability than by less frequency, as in the paper:"
        f" {reason}."
    )
    assert "unlike the paper (reliability)" in _timing({"verdict": "frequency", "reason": "x"})
    assert "does not decide" in _timing({"verdict": "undecided", "reason": "x"})


# --- the study as it ran: budgets, learning rates and environments from the runs' run.json ---

ENV_CPU = {
    "python": "3.11.7",
    "packages": {"torch": "2.13.0", "numpy": "2.1.3"},
    "torch_build": "cpu",
    "cuda": None,
    "device": "cpu",
    "platform": "Linux-6.1-x86_64",
}
ENV_GPU = {**ENV_CPU, "torch_build": "cu124", "cuda": "12.4", "device": "NVIDIA H100 80GB HBM3",
           "packages": {"torch": "2.13.0", "numpy": "2.2.0"}}  # fmt: skip


def run_record(tmp_path: Path, run_id: str, tokens: int, lr: float, environment=None) -> Path:
    """A run.json as the training job writes it: budget, spec (with its lr), environment."""
    b, c = 8, 16
    spec = {"run_id": run_id, "batch_size": b, "context_size": c, "total_steps": tokens // (b * c),
            "training": {"tokens": tokens, "lr": lr}}  # fmt: skip
    record = {"run_id": run_id, "budget": tokens, "spec": spec}
    if environment is not None:
        record["environment"] = environment
    path = tmp_path / "runs" / run_id.replace("/", "_") / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def test_front_page_states_each_runs_budget_and_lr_and_where_they_trained(tmp_path):
    from ihsweep.report.trained import read_records

    runs = natural_runs()
    folder = natural_folder(tmp_path, runs, known_fit(runs))
    ids = list(runs["run_id"])
    same = read_records([run_record(tmp_path / "same", i, 8_000_000, 0.002, ENV_CPU) for i in ids])
    rst = findings.write_findings(folder, "natural", same).read_text()
    assert rendered(rst).startswith(
        "Experiment 1: when IHs emerge (natural data). Trained 8,000,000 tokens per run at"
        " lr 0.002 (11 runs). The law U_pt"
    )
    environments = rst[rst.index("**Where the natural-data runs trained**") :]
    assert table_rows(environments) == [
        ["Python", "torch", "torch build", "CUDA", "device", "platform", "runs"],
        ["3.11.7", "2.13.0", "cpu", "none", "cpu", "Linux-6.1-x86_64", "11"],
    ]

    # Runs that differ: ranges; three environments, the runs without one "not recorded".
    mixed = [run_record(tmp_path / "mixed", i, (1 + k % 2) * 4_000_000, 0.006 - 0.002 * (k % 3),
                        [ENV_CPU, ENV_GPU, ENV_GPU, None][k % 4])
             for k, i in enumerate(ids)]  # fmt: skip
    rst = findings.write_findings(folder, "natural", read_records(mixed)).read_text()
    assert (
        "Trained 4,000,000 to 8,000,000 tokens per run at lr 0.002 to 0.006 (11 runs)."
        in rendered(rst)
    )
    rows = table_rows(rst[rst.index("**Where the natural-data runs trained**") :])
    assert rows[0][-2:] == ["numpy", "runs"]  # the one package that differs gets a column
    assert [(row[2], row[4], row[-2], row[-1]) for row in rows[1:]] == [
        ("cu124", "NVIDIA H100 80GB HBM3", "2.2.0", "6"), ("cpu", "cpu", "2.1.3", "3"),
        ("", "", "", "2"),
    ]  # fmt: skip
    assert rows[3][0] == "not recorded"


def test_markov_findings_state_each_experiments_own_runs(tmp_path):
    from ihsweep.report.trained import read_records

    runs = markov_runs(RELIABILITY_MATTERS, {("zipf+D+C", 0.9, 0.9): True})
    folder = markov_folder(tmp_path, runs)
    records = [
        run_record(tmp_path, row.run_id, 2_000_000 if row.chain_kind == "bigram" else 1_000_000,
                   0.003 if row.chain_kind == "bigram" else 0.001)
        for row in runs.itertuples()
    ]  # fmt: skip
    text = rendered(findings.write_findings(folder, "markov", read_records(records)).read_text())
    n_bigram = int((runs["chain_kind"] == "bigram").sum())
    n_synthetic = len(runs) - n_bigram
    assert (
        "(semi-natural Markov data). Trained 2,000,000 tokens per run at lr 0.003"
        f" ({n_bigram} runs)."
    ) in text
    assert (
        "(synthetic Markov data). Trained 1,000,000 tokens per run at lr 0.001"
        f" ({n_synthetic} run{'s' if n_synthetic != 1 else ''})."
    ) in text
    assert "Where the Markov-data runs trained (from each run's run.json): Python" in text
    assert "not recorded" in text  # these records carry no environment


def test_a_damaged_run_record_is_named_with_its_fix(tmp_path):
    from ihsweep.files.io import DamagedFile
    from ihsweep.report.trained import read_records

    path = run_record(tmp_path, "kjv/w64/B8-C16-s0", 8_000_000, 0.002)
    path.write_text("{")
    with pytest.raises(DamagedFile, match=r"run\.json.*snakemake"):
        read_records([path])


def test_front_page_shows_the_law_fit_and_one_run_inline_as_data_uris(tmp_path):
    import base64

    from ihsweep.figures.style import new_figure, save_figure

    runs = natural_runs()
    folder = natural_folder(tmp_path, runs, known_fit(runs))
    figures = {}
    for stem in (folder / "figures" / "law_fit", tmp_path / "run" / "figures" / "k" / "run"):
        fig = new_figure(3, 2)
        fig.subplots().plot([0, 1], [0, 1])
        figures[stem.name] = save_figure(fig, stem)[0]
    (figures["run"].parent / layout.PROVENANCE).write_text(json.dumps({"runs": ["kjv/w64/B8"]}))
    rst = findings.write_findings(folder, "natural", run_figure=figures["run"]).read_text()
    assert max(map(len, rst.splitlines())) < 1000  # docutils refuses lines over 10,000
    html = publish_parts(rst + "\n\n.. _law_fit.png: #\n.. _lawfit.html: #", writer="html")
    sources = re.findall(r'<img alt="([^"]+)" src="([^"]+)"', html["body"])
    assert sources == [
        (alt, "data:image/png;base64," + base64.b64encode(figures[name].read_bytes()).decode())
        for alt, name in [("The law fit", "law_fit"), ("The figure of run kjv/w64/B8", "run")]
    ]
    assert "One run, kjv/w64/B8: the middle of the runs" in rendered(rst)
