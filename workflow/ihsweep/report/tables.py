"""The report's key tables as small self-contained HTML pages.

Snakemake's report shows an HTML result in a frame but offers a CSV only as a download, so the
tables a reader looks at first (emergence per run, the law fit, emergence per Markov run) are
also written as HTML, with readable headers and rounded numbers. The CSV files stay the data
(every digit, documented columns); these pages are derived from them and hold nothing else.

Both emergence pages say how each run's training ended (``outcome``: completed, stopped early
once its emergence was confirmed, or diverged) and the tokens it trained against its budget,
and open with a totals line: tokens trained against the budget over all runs with the saving,
and how many runs stopped early or diverged. A diverged run reads "diverged" (its row in red),
not "not emerged": it says nothing about when induction heads form, and the law fit leaves it
out. The natural page adds each run's predicted emergence point (recorded with the run, from
``checkpoints.densify``) and whether it lies inside the observed 95% interval, with the count
("the law predicted N of M emerged runs within their interval"). Tables written before runs
recorded their outcome (no ``outcome``, ``tokens_trained``, ``budget`` or prediction columns)
show every run as completed and leave those cells empty.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined

from ihsweep.analysis.frontier import format_tokens
from ihsweep.files.io import atomic_path

# What each quantity of ``ihsweep.analysis.lawfit.fit_table`` means, for the report's reader.
FIT_MEANING = {
    "a": "exponent of the batch size B",
    "b": "exponent of the context size C",
    "log10_T": "log10 of the constant T (updates at B = C = 1)",
    "c": "exponent of the parameter count (0: no model-size effect)",
    "r": "correlation of log predicted and log observed updates",
    "r_cells": "r between the law and the (B, C) cells' mean log updates",
    "r_ceiling": "highest r any law of B and C could reach, given the seeds' spread",
    "seed_sd_log10": "spread of log updates between runs of one (B, C) cell (decades)",
    "lack_of_fit_p": "p of the law missing the cells' means by more than seed noise",
    "loo_rmse_log10": "leave-one-out prediction error (decades)",
    "n_runs": "runs in the fit (those that emerged)",
}

# The pages' HTML lives in templates/ (package data), every value escaped by Jinja.
TEMPLATES = Environment(
    loader=PackageLoader("ihsweep.report", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

OUTCOME_LABELS = {
    "completed": "completed",
    "stopped_early": "stopped early",
    "diverged": "diverged",
}


def _number(digits: int) -> Callable[[float], str]:
    return lambda x: "" if pd.isna(x) else f"{x:.{digits}g}"


def _point_ci(row) -> str:
    if not row["emerged"]:
        return "none"
    lo, hi = row["tokens_lo"], row["tokens_hi"]
    ci = "" if pd.isna(lo) else f" [{format_tokens(lo, 3)}, {format_tokens(hi, 3)}]"
    return format_tokens(row["tokens_pt"], 3) + ci


def _updates(row) -> str:
    return f"{row['updates_pt']:,.0f}" if row["emerged"] else "none"


def _yes_no(x) -> str:
    return "yes" if x else "no"


def _outcome(row) -> str:
    """The run's outcome ("completed" in tables written before runs recorded one)."""
    value = row.get("outcome")
    return "completed" if value is None or pd.isna(value) else str(value)


def _diverged(row) -> bool:
    return _outcome(row) == "diverged"


def _row_class(row) -> str:
    """Diverged runs in red, runs without a transition greyed out, the others plain."""
    return "diverged" if _diverged(row) else "no" if not row["emerged"] else ""


def _emerged(row) -> str:
    if str(row["reason"]).startswith("undetermined:"):  # a suite's duplicate revisions
        return "undetermined"
    return "diverged" if _diverged(row) else _yes_no(row["emerged"])


def _tokens_ci(row) -> str:
    if _diverged(row):
        return "diverged"
    return _point_ci(row)


def _updates_cell(row) -> str:
    return "diverged" if _diverged(row) else _updates(row)


def _trained(row) -> str:
    """Tokens trained / budget, e.g. "1.5M / 4M" (only what is known)."""
    trained, budget = row.get("tokens_trained"), row.get("budget")
    have = [not (x is None or pd.isna(x)) for x in (trained, budget)]
    if all(have):
        return f"{format_tokens(trained, 3)} / {format_tokens(budget, 3)}"
    return format_tokens(trained, 3) if have[0] else ""


def _predicted(row) -> str:
    value = row.get("predicted_tokens")
    return "" if value is None or pd.isna(value) else format_tokens(value, 3)


def _within(row) -> str:
    value = row.get("predicted_within")
    return "" if value is None or pd.isna(value) else _yes_no(bool(value))


def _column(table: pd.DataFrame, name: str, default=math.nan) -> pd.Series:
    return table[name] if name in table else pd.Series(default, index=table.index)


def totals(table: pd.DataFrame) -> str:
    """Tokens trained against the budget in total (the saving of early stops; the budget
    diverged runs left unspent is no saving), runs stopped early and
    diverged: the first line of the emergence pages ("" for an empty table)."""
    if not len(table):
        return ""
    outcome = _column(table, "outcome", "completed").fillna("completed")
    counts = (
        f"{int((outcome == 'stopped_early').sum())} of {len(table)} runs stopped early once"
        f" emergence was confirmed, {int((outcome == 'diverged').sum())} diverged."
    )
    trained = pd.to_numeric(_column(table, "tokens_trained"), errors="coerce")
    budget = pd.to_numeric(_column(table, "budget"), errors="coerce")
    if trained.isna().any() or budget.isna().any() or not budget.sum() > 0:
        return counts
    unspent = budget - trained
    saved = 100 * unspent[outcome == "stopped_early"].sum() / budget.sum()
    lost = unspent[outcome == "diverged"].sum()  # a diverged run's budget is not saved
    lost_text = f"; {format_tokens(lost, 3)} unspent by diverged runs" if lost > 0 else ""
    return (
        f"Tokens trained: {format_tokens(trained.sum(), 3)} of a"
        f" {format_tokens(budget.sum(), 3)} budget in total ({saved:.0f}% saved by early"
        f" stops{lost_text}). " + counts
    )


def prediction_count(table: pd.DataFrame) -> str:
    """The sentence "the law predicted N of M emerged runs within their interval", over the
    emerged runs with a prediction ("" when there are none)."""
    judged = _column(table, "predicted_within", pd.NA).dropna()
    if not len(judged):
        return ""
    inside = int(judged.astype(bool).sum())
    return (
        f"The law predicted {inside} of {len(judged)} emerged runs within their interval"
        " (the point recorded with the run against its observed 95% interval)."
    )


def render(
    title: str, note: str, columns: dict, table: pd.DataFrame, dim=None, summary: str = ""
) -> str:
    """An HTML page with one table (templates/table.html.j2). ``columns`` maps a header to
    ``(cell function, css class)``; ``dim`` (a function of a row) greys out rows, e.g. runs
    without a transition: True for the grey ``no`` class, or a string naming the row's class
    ("" for none). ``summary``, when given, is a paragraph above the table (totals)."""
    rows = []
    for _, row in table.iterrows():
        cells = [{"text": str(cell(row)), "css": css} for cell, css in columns.values()]
        css = dim(row) if dim is not None else ""
        grey = not isinstance(css, str) and bool(css)  # True, or numpy's True
        rows.append({"cells": cells, "css": "no" if grey else css or ""})
    return TEMPLATES.get_template("table.html.j2").render(
        title=title, note=note, summary=summary, headers=list(columns), rows=rows
    )


def natural_emergence(emergence: pd.DataFrame, metric: str) -> str:
    columns = {
        "run": (lambda r: r["run_id"], "text"),
        "parameters": (lambda r: f"{r['n_params']:,}", "num"),
        "B": (lambda r: r["batch_size"], "num"),
        "C": (lambda r: r["context_size"], "num"),
        "seed": (lambda r: r["seed"], "num"),
        "emerged": (_emerged, "text"),
        "tokens [95% CI]": (_tokens_ci, "num"),
        "updates": (_updates_cell, "num"),
        f"rise of {metric}": (lambda r: _number(2)(r["rise"]), "num"),
        "note": (lambda r: "" if pd.isna(r["reason"]) else r["reason"], "note"),
        "outcome": (lambda r: OUTCOME_LABELS.get(_outcome(r), _outcome(r)), "text"),
        "tokens trained / budget": (_trained, "num"),
        "predicted tokens": (_predicted, "num"),
        "prediction within CI": (_within, "text"),
    }
    note = (
        f"Emergence point of each run: where {metric} rises (and stays up) to the end of the "
        "budget, in tokens with its 95% interval and in optimiser updates; how its training "
        "ended and the tokens it trained; the emergence point the law predicted for it and "
        "whether that lies inside the observed interval. Diverged runs are left out of the law "
        "fit, as are runs without a transition. Data: emergence.csv."
    )
    summary = " ".join(s for s in (totals(emergence), prediction_count(emergence)) if s)
    table = emergence.sort_values(["data", "model", "batch_size", "context_size", "seed"])
    return render("Emergence per run", note, columns, table, _row_class, summary)


def law_fit(table: pd.DataFrame, fit: dict | None = None) -> str:
    """The law fit page from ``lawfit.fit_table``; with the ``fit_law`` result ``fit``, its note
    also says which runs the fit left out and why (no transition within the budget, diverged)."""

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
    return render("Law fit", note, columns, table, summary=left_out(fit) if fit else "")


def left_out(fit: dict) -> str:
    """What the law fit left out and why, from a ``fit_law`` result ("" for an older one)."""
    if "n_diverged" not in fit:
        return ""
    ids = fit.get("diverged_run_ids") or []
    diverged = f" ({', '.join(ids)})" if ids else ""
    others = ""
    if fit.get("model"):
        others = (
            f" {fit.get('n_other_models', 0)} emerged runs of other models (a, b and T are"
            f" fitted on model {fit['model']}'s; every model's enter the size term c),"
        )
    return (
        f"Fitted on {fit.get('n_runs', 0)} of {fit.get('n_table_runs', '?')} runs; left out:"
        f"{others} {fit.get('n_not_emerged', 0)} without a transition within the budget,"
        f" {fit['n_diverged']} diverged{diverged}."
    )


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
        "emerged": (_emerged, "text"),
        "tokens [95% CI]": (_tokens_ci, "num"),
        f"rise of {metric}": (lambda r: _number(2)(r["rise"]), "num"),
        "outcome": (lambda r: OUTCOME_LABELS.get(_outcome(r), _outcome(r)), "text"),
        "tokens trained / budget": (_trained, "num"),
        "note": (lambda r: "" if pd.isna(r.get("reason")) else r["reason"], "note"),
    }
    note = (
        "Emergence per Markov run with the requested repetition frequency f and reliability r "
        "and the values measured on the generated training data; how its training ended and "
        "the tokens it trained. A diverged run says nothing about whether induction heads form "
        "at its (f, r). Data: emergence.csv."
    )
    keys = ["grid", "frequency", "reliability", "model", "batch_size", "context_size", "seed"]
    table = runs.sort_values(keys)
    return render("Emergence per Markov run", note, columns, table, _row_class, totals(runs))


def write_page(path: str | Path, page: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(page)


def suite_duplicates(suite: str, duplicates: pd.DataFrame) -> str:
    """A checkpoint suite's page: its duplicate revision groups
    (``ihsweep.probing.fingerprints.duplicate_groups``), or that there are none."""
    columns = {
        "revisions": (lambda r: r["revisions"].replace(" ", ", "), "text"),
        "steps they claim": (lambda r: r["steps"].replace(" ", ", "), "num"),
        "kind": (lambda r: r["kind"], "text"),
        "shared tensors": (lambda r: r["tensors"].replace(" ", ", "), "note"),
    }
    note = (
        "Revisions of the suite that hold identical weights, or share a trained parameter "
        "tensor (a hash of each, as loaded for probing), so that some of them do not hold the "
        "weights of the step they claim. They are left out of the emergence fit unless "
        f"suites.{suite}.keep_duplicates is true; a step-0 revision sharing weights with a "
        "trained one, or a group spanning the transition, leaves the emergence point "
        "undetermined (docs/checkpoints.md). Data: duplicates.csv, fingerprints.parquet."
    )
    summary = (
        f"{len(duplicates)} group(s) of duplicate revisions."
        if len(duplicates)
        else "No two revisions share a trained parameter tensor."
    )
    return render(f"Duplicate revisions of {suite}", note, columns, duplicates, summary=summary)
