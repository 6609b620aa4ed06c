"""The report's HTML tables: one row per table row, the numbers rounded as documented."""

from __future__ import annotations

import math
import re

import pandas as pd
from ihsweep.analysis.lawfit import fit_table
from ihsweep.report.tables import law_fit, markov_emergence, natural_emergence


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
    assert [r[0] for r in rows] == ["a", "b", "log10_T", "c", "r", "loo_rmse_log10", "n_runs"]
    assert rows[0][2:] == ["1.2", "[0.192, 1.77]"]
    assert rows[3][2:] == ["", ""]  # not fitted: empty, not "nan"
    assert rows[6][2:] == ["9", ""]


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
    # 9M of 16M trained: 44% saved.
    assert (
        "Tokens trained: 9M of a 16M budget in total (44% saved). 1 of 4 runs stopped early once"
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
    assert "Tokens trained: 9M of a 16M budget in total (44% saved)" in page
    assert "1 diverged" in page and "The law predicted" not in page  # no law for Markov runs


def test_law_fit_page_says_what_the_fit_left_out():
    fit = {"a": 0.4, "n_runs": 5, "n_table_runs": 8, "n_not_emerged": 1, "n_diverged": 2}
    fit["diverged_run_ids"] = ["d/m/B16-C8-s0", "d/m/B64-C8-s0"]
    page = law_fit(fit_table(fit), fit)
    assert (
        "Fitted on 5 of 8 runs; left out: 1 without a transition within the budget, 2 diverged"
        " (d/m/B16-C8-s0, d/m/B64-C8-s0)."
    ) in page
    assert len(cells(page)) == 7  # the table itself is unchanged
    assert "left out" not in law_fit(fit_table(fit))  # without the fit: the table alone
