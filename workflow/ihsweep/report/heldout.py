"""The held-out validation on the report: a table page (heldout.html) and the front page's
summary (findings.rst of the heldout folder), from ``ihsweep.analysis.heldout``'s summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ihsweep.analysis.heldout import KINDS, LAWS, SUMMARY
from ihsweep.report import rst
from ihsweep.report.tables import render

PREDICT = "python -m ihsweep.predict -B 1024 -C 2048 --law study:{study}"


def page(summary: dict) -> str:
    """The summary as an HTML table: per law and kind, runs, coverage and RMSE; a kind that
    was not measured is one row saying why."""
    columns = {
        "law": (lambda r: LAWS.get(r["law"], r["law"]), "text"),
        "held out": (lambda r: KINDS[r["kind"]], "text"),
        "runs": (lambda r: r["n_runs"], "num"),
        "inside 95% interval": (_coverage, "num"),
        "RMSE (log10 updates)": (lambda r: _signed(r["rmse_log10"], ""), "num"),
        "bias (log10)": (lambda r: _signed(r["bias_log10"], "+"), "num"),
    }
    note = (
        "Each held-out run predicted by a law fitted without its (B, C) cell (or, for the "
        "extrapolation split, without the largest third of the cells by B * C): coverage of "
        "the 95% prediction intervals for a new run and the RMSE of the points. "
        "Data: heldout.csv, heldout.json."
    )
    skipped = [{"kind": kind, "law": "not measured", "n_runs": 0, "reason": verdict["reason"]}
               for kind, verdict in summary["kinds"].items() if not verdict["ok"]]  # fmt: skip
    rows = pd.DataFrame(summary["summary"] + skipped, columns=[*SUMMARY, "reason"])
    return render("How the law predicts runs it never saw", note, columns, rows)


def _signed(value, sign: str) -> str:
    return "" if pd.isna(value) else f"{value:{sign}.3f}"


def findings(summary: dict, study: str, png: Path) -> str:
    """The front page's paragraph: the table as RST, the figure inline, how to predict."""
    head = (
        "**The law on runs it never saw.** Each (B, C) cell of experiment 1 left out in turn "
        "(all its seeds), the law refitted on the rest and the cell predicted; and the largest "
        "third of the cells by B * C predicted from the rest. "
    )
    if not summary["ok"]:
        return head + rst.text(_skipped(summary)) + "\n\n" + _how_to_predict(study) + "\n"
    rows = [["law", "held out", "runs", "inside 95% interval", "RMSE (log10 updates)"]]
    rows += [[LAWS[r["law"]], KINDS[r["kind"]], str(r["n_runs"]), _coverage(r),
              f"{r['rmse_log10']:.3f}"] for r in summary["summary"]]  # fmt: skip
    parts = [
        head + rst.text(_skipped(summary)),
        rst.list_table(rows),
        rst.inline_figure(png, "Held-out runs: predicted against observed", "heldout.png"),
        _how_to_predict(study),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def _how_to_predict(study: str) -> str:
    return (
        "**To predict a new configuration** (updates and tokens to emergence, with a 95% "
        "interval for a new run): "
        + rst.literal(PREDICT.format(study=study))
        + " (docs/predict.md); "
        + rst.literal("--law published")
        + " uses the paper's law."
    )


def _coverage(row) -> str:
    if isinstance(row.get("reason"), str):
        return row["reason"]
    if row["coverage"] is None or pd.isna(row["coverage"]):
        return "no interval"
    return f"{row['n_inside']} of {row['n_runs']} ({row['coverage']:.0%})"


def _skipped(summary: dict) -> str:
    lines = [f"Not measured ({KINDS[k]}): {v['reason']}." for k, v in summary["kinds"].items()
             if not v["ok"]]  # fmt: skip
    return " ".join(lines)
