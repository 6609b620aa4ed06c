"""The report's key tables as small self-contained HTML pages.

Snakemake's report shows an HTML result in a frame but offers a CSV only as a download, so the
tables a reader looks at first (emergence per run, the law fit, emergence per Markov run) are
also written as HTML, with readable headers and rounded numbers. The CSV files stay the data
(every digit, documented columns); these pages are derived from them and hold nothing else.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ihsweep.analysis.frontier import format_tokens
from ihsweep.io import atomic_path

# What each quantity of ``ihsweep.analysis.lawfit.fit_table`` means, for the report's reader.
FIT_MEANING = {
    "a": "exponent of the batch size B",
    "b": "exponent of the context size C",
    "log10_T": "log10 of the constant T (updates at B = C = 1)",
    "c": "exponent of the parameter count (0: no model-size effect)",
    "r": "correlation of log predicted and log observed updates",
    "loo_rmse_log10": "leave-one-out prediction error (decades)",
    "n_runs": "runs in the fit (those that emerged)",
}

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #1e293b; }
h1 { font-size: 17px; margin: 0 0 4px; }
p { margin: 0 0 12px; max-width: 60em; color: #475569; }
table { border-collapse: collapse; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e2e8f0; white-space: nowrap; }
th { text-align: left; background: #f1f5f9; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.note { white-space: normal; min-width: 24em; color: #64748b; }
tr.no td { color: #94a3b8; }
"""


def _number(digits: int) -> Callable[[float], str]:
    return lambda x: "" if pd.isna(x) else f"{x:.{digits}g}"


def _tokens_ci(row) -> str:
    if not row["emerged"]:
        return "none"
    lo, hi = row["tokens_lo"], row["tokens_hi"]
    ci = "" if pd.isna(lo) else f" [{format_tokens(lo, 3)}, {format_tokens(hi, 3)}]"
    return format_tokens(row["tokens_pt"], 3) + ci


def _updates(row) -> str:
    return f"{row['updates_pt']:,.0f}" if row["emerged"] else "none"


def _yes_no(x) -> str:
    return "yes" if x else "no"


def _not_emerged(row) -> bool:
    return not row["emerged"]


def render(title: str, note: str, columns: dict, table: pd.DataFrame, dim=None) -> str:
    """An HTML page with one table. ``columns`` maps a header to ``(cell function, css class)``;
    ``dim`` (a function of a row) greys out rows, e.g. runs without a transition."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns)
    rows = []
    for _, row in table.iterrows():
        cells = "".join(
            f'<td class="{css}">{html.escape(str(cell(row)))}</td>'
            for cell, css in columns.values()
        )
        grey = ' class="no"' if dim is not None and dim(row) else ""
        rows.append(f"<tr{grey}>{cells}</tr>")
    body = "\n".join(rows)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(note)}</p>\n"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
        "</body></html>\n"
    )


def natural_emergence(emergence: pd.DataFrame, metric: str) -> str:
    columns = {
        "run": (lambda r: r["run_id"], "text"),
        "parameters": (lambda r: f"{r['n_params']:,}", "num"),
        "B": (lambda r: r["batch_size"], "num"),
        "C": (lambda r: r["context_size"], "num"),
        "seed": (lambda r: r["seed"], "num"),
        "emerged": (lambda r: _yes_no(r["emerged"]), "text"),
        "tokens [95% CI]": (_tokens_ci, "num"),
        "updates": (_updates, "num"),
        f"rise of {metric}": (lambda r: _number(2)(r["rise"]), "num"),
        "note": (lambda r: "" if pd.isna(r["reason"]) else r["reason"], "note"),
    }
    note = (
        f"Emergence point of each run: where {metric} rises (and stays up) to the end of the "
        "budget, in tokens with its 95% interval and in optimiser updates. Data: emergence.csv."
    )
    table = emergence.sort_values(["data", "model", "batch_size", "context_size", "seed"])
    return render("Emergence per run", note, columns, table, _not_emerged)


def law_fit(table: pd.DataFrame) -> str:
    def ci(row) -> str:
        if pd.isna(row["ci_low"]):
            return ""
        return f"[{row['ci_low']:.3g}, {row['ci_high']:.3g}]"

    columns = {
        "quantity": (lambda r: r["quantity"], "text"),
        "meaning": (lambda r: FIT_MEANING.get(r["quantity"], ""), "note"),
        "estimate": (lambda r: _number(3)(r["estimate"]), "num"),
        "95% CI": (ci, "num"),
    }
    note = (
        "The fitted law U_pt = T / (B^a C^b) over the runs that emerged, with bootstrap "
        "intervals; c comes from the extended fit with the parameter count. Data: lawfit.csv."
    )
    return render("Law fit", note, columns, table)


def markov_emergence(runs: pd.DataFrame, metric: str) -> str:
    columns = {
        "grid": (lambda r: r["grid"], "text"),
        "f": (lambda r: f"{r['frequency']:g}", "num"),
        "r": (lambda r: f"{r['reliability']:g}", "num"),
        "measured f": (lambda r: _number(3)(r["measured_frequency"]), "num"),
        "measured r": (lambda r: _number(3)(r["measured_reliability"]), "num"),
        "model": (lambda r: r["model"], "text"),
        "B": (lambda r: r["batch_size"], "num"),
        "C": (lambda r: r["context_size"], "num"),
        "seed": (lambda r: r["seed"], "num"),
        "emerged": (lambda r: _yes_no(r["emerged"]), "text"),
        "tokens [95% CI]": (_tokens_ci, "num"),
        f"rise of {metric}": (lambda r: _number(2)(r["rise"]), "num"),
    }
    note = (
        "Emergence per Markov run with the requested repetition frequency f and reliability r "
        "and the values measured on the generated training data. Data: emergence.csv."
    )
    keys = ["grid", "frequency", "reliability", "model", "batch_size", "context_size", "seed"]
    table = runs.sort_values(keys)
    return render("Emergence per Markov run", note, columns, table, _not_emerged)


def write_page(path: str | Path, page: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(page)
