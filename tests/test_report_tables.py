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
