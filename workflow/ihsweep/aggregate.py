"""Command-line entry point of the emergence analysis (SPEC section 3).

Reads the per-run model-level probe tables (Parquet, one row per checkpoint), finds each run's
emergence point (``ihsweep.emergence``), fits the law ``U_pt = T / (B^a C^b)`` with the
model-size test (``ihsweep.lawfit``) and draws the three figures (``ihsweep.figures``)::

    python -m ihsweep.aggregate --model-tables A.parquet B.parquet \\
        --metric ps_max --method breakpoint --min-rise 0.1 --bootstrap 1000 --seed 0 \\
        --emergence results/emergence.csv --fit results/law_fit.json --figures results/figures

Outputs: the emergence table (CSV, one row per run), the fit (JSON, indent 2, sorted keys, no
NaN), and run_curves, emergence_vs_BC, law_fit and model_size, each as PNG and PDF, in the figures
folder; optionally the fit as a table (CSV) and both tables as HTML pages for the report.
``provenance.json`` beside the emergence table records the config hash, the code version and
the run ids (``ihsweep.provenance``). Everything is deterministic for fixed inputs and seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ihsweep import figures, report_tables
from ihsweep.emergence import METHODS, METRICS, emergence_table
from ihsweep.io import atomic_path, write_json
from ihsweep.lawfit import fit_law
from ihsweep.provenance import write_provenance

FIGURES = ("run_curves", "emergence_vs_BC", "law_fit", "model_size")  # stems, PNG and PDF each


def fit_table(fit: dict) -> pd.DataFrame:
    """One row per fitted quantity: ``quantity, estimate, ci_low, ci_high`` (CI empty if none)."""
    rows = []
    for key in ("a", "b", "log10_T", "c", "r", "loo_rmse_log10", "n_runs"):
        ci = fit.get(f"{key}_ci") or [None, None]
        rows.append({"quantity": key, "estimate": fit.get(key), "ci_low": ci[0], "ci_high": ci[1]})
    return pd.DataFrame(rows, columns=["quantity", "estimate", "ci_low", "ci_high"])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ihsweep.aggregate",
        description="Emergence points per run, the emergence law fit, and figures.",
    )
    parser.add_argument(
        "--model-tables",
        nargs="+",
        required=True,
        type=Path,
        help="per-run model-level probe tables (Parquet), concatenated in the given order",
    )
    parser.add_argument(
        "--metric", choices=METRICS, default="ps_max", help="metric whose rise marks emergence"
    )
    parser.add_argument(
        "--method", choices=METHODS, default="breakpoint", help="change-point method"
    )
    parser.add_argument(
        "--min-rise",
        type=float,
        default=0.1,
        help="smallest rise of the metric that counts as a transition (metric units)",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap resamples for the law's CIs"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    parser.add_argument(
        "--emergence", required=True, type=Path, help="output: emergence table (CSV)"
    )
    parser.add_argument("--fit", required=True, type=Path, help="output: law fit (JSON)")
    parser.add_argument(
        "--fit-table", type=Path, help="output: the fit's parameters as a table (CSV)"
    )
    parser.add_argument(
        "--emergence-html", type=Path, help="output: the emergence table as an HTML page"
    )
    parser.add_argument("--fit-html", type=Path, help="output: the fit table as an HTML page")
    parser.add_argument(
        "--config-sha256", help="hash of the study config, recorded in provenance.json"
    )
    parser.add_argument(
        "--figures", required=True, type=Path, help="output folder for the figures (PNG, PDF)"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model_table = pd.concat(
        [pd.read_parquet(path) for path in args.model_tables], ignore_index=True
    )
    emergence = emergence_table(
        model_table, metric=args.metric, method=args.method, min_rise=args.min_rise
    )
    fit = fit_law(emergence, n_boot=args.bootstrap, seed=args.seed)

    with atomic_path(args.emergence) as tmp:
        emergence.to_csv(tmp, index=False)
    write_json(args.fit, fit)
    if args.fit_table:
        with atomic_path(args.fit_table) as tmp:
            fit_table(fit).to_csv(tmp, index=False)
    if args.emergence_html:
        report_tables.write_page(
            args.emergence_html, report_tables.natural_emergence(emergence, args.metric)
        )
    if args.fit_html:
        report_tables.write_page(args.fit_html, report_tables.law_fit(fit_table(fit)))

    args.figures.mkdir(parents=True, exist_ok=True)
    figures.plot_run_curves(model_table, emergence, args.figures / "run_curves")
    figures.plot_emergence_vs_BC(emergence, args.figures / "emergence_vs_BC")
    figures.plot_law_fit(emergence, fit, args.figures / "law_fit")
    figures.plot_model_size(emergence, fit, args.figures / "model_size")
    outputs = [args.emergence, args.fit, args.fit_table, args.emergence_html, args.fit_html]
    outputs += sorted(args.figures.iterdir())
    write_provenance(
        args.emergence.parent,
        args.config_sha256,
        emergence["run_id"],
        [p.relative_to(args.emergence.parent) for p in outputs if p is not None],
    )

    emerged = int(emergence["emerged"].sum())
    status = "law fitted" if fit["ok"] else f"law not fitted: {fit['reason']}"
    print(f"{emerged} of {len(emergence)} runs emerged ({args.metric}, {args.method}); {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
