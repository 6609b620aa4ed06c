"""Rule ``aggregate_natural``: the emergence analysis of natural data
(docs/method.md#the-emergence-rule and #the-law-and-its-fit).

Reads the per-run model-level probe tables (without the checkpoint suites' duplicate revisions,
``ihsweep.analysis.duplicates``), finds each run's emergence point
(``ihsweep.analysis.emergence``), fits the law ``U_pt = T / (B^a C^b)`` with the model-size test
(``ihsweep.analysis.lawfit``), each model family's law beside the others' where the runs span
several (``ihsweep.analysis.families``), and draws the figures (``ihsweep.figures.natural``)::

    python -m ihsweep.steps.aggregate_natural --model-tables A.parquet B.parquet \
        --emergence '<emergence JSON>' --lawfit '<lawfit JSON>' \
        --out-dir results/studies/default/natural

It writes ``ihsweep.files.layout.natural_outputs(out_dir)``: the emergence table (CSV, one row per
run), the fit (JSON, indent 2, sorted keys, no NaN; with ``families`` where the runs span
several families) and the same as a table (CSV), the families' laws (CSV, empty for one family),
both tables
as HTML pages for the report, the figures ``layout.NATURAL_FIGURES`` as PNG and PDF, and
``provenance.json`` (``ihsweep.report.provenance``). Deterministic for fixed inputs and seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ihsweep.analysis.duplicates import fitted_revisions, mark_undetermined, read_duplicates
from ihsweep.analysis.emergence import emergence_table
from ihsweep.analysis.families import compare_families, families_table
from ihsweep.analysis.lawfit import fit_law, fit_table, fixed_exponents
from ihsweep.config import complete
from ihsweep.figures import natural as figures
from ihsweep.files import layout
from ihsweep.files.io import atomic_path, read_probe_table, write_json
from ihsweep.report import findings, tables, trained
from ihsweep.report.provenance import write_provenance
from ihsweep.steps import _args


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("aggregate_natural", "Emergence per run, the law fit, and figures.")
    p.add_argument("--model-tables", nargs="+", required=True, type=Path, help="probe tables")
    _args.add_findings_inputs(p)
    p.add_argument(
        "--suite-duplicates", nargs="*", default=[], type=Path,
        help="the checkpoint suites' duplicate groups (duplicates.csv of probe_suite)",
    )  # fmt: skip
    p.add_argument(
        "--keep-duplicates", type=json.loads, default=[],
        help="JSON list of the suites whose duplicate revisions stay in the fit",
    )  # fmt: skip
    p.add_argument(
        "--families", type=json.loads, default={},
        help="JSON object: each model's family (models.<name>.family); several: compare laws",
    )  # fmt: skip
    _args.add_spec(p, "--emergence", "emergence", required=False)
    _args.add_spec(p, "--lawfit", "lawfit", required=False)
    p.add_argument("--out-dir", required=True, help="output folder: layout.natural_dir(<study>)")
    p.add_argument("--config-sha256", help="hash of the study config, for provenance.json")
    args = p.parse_args(argv)
    records = trained.read_records(args.run_records)  # checked before anything is written
    duplicates = read_duplicates(args.suite_duplicates)
    spec, fit_spec = complete("emergence", args.emergence), complete("lawfit", args.lawfit)
    out = args.out_dir

    def path(name: str) -> Path:
        return Path(layout.aggregate_file(name, out))

    # A table probed before its metric existed (ps_content_max) is named with the fix.
    checked = [read_probe_table(table, (spec["metric"],)) for table in args.model_tables]
    model_table = pd.concat(checked, ignore_index=True)
    # A suite's duplicate revisions are left out before anything is dated (docs/checkpoints.md).
    model_table = fitted_revisions(model_table, duplicates, args.keep_duplicates)
    emergence = mark_undetermined(emergence_table(model_table, spec), duplicates)
    exponents = fixed_exponents(fit_spec["exponents"])
    fit = fit_law(emergence, fit_spec["bootstrap"], fit_spec["seed"], fit_spec["model"], exponents)
    by_family = compare_families(emergence, args.families, fit_spec["bootstrap"], fit_spec["seed"])
    if by_family is not None:
        fit["families"] = by_family

    with atomic_path(path("emergence.csv")) as tmp:
        emergence.to_csv(tmp, index=False)
    write_json(path("lawfit.json"), fit)
    fit_rows = fit_table(fit)
    with atomic_path(path("lawfit.csv")) as tmp:
        fit_rows.to_csv(tmp, index=False)
    with atomic_path(path("families.csv")) as tmp:
        families_table(by_family).to_csv(tmp, index=False)
    page = tables.natural_emergence(emergence, spec["metric"])
    tables.write_page(path("emergence.html"), page)
    tables.write_page(path("lawfit.html"), tables.law_fit(fit_rows, fit))

    stem = Path(out) / "figures"
    figures.plot_run_curves(model_table, emergence, stem / "run_curves")
    figures.plot_emergence_vs_BC(emergence, stem / "emergence_vs_BC")
    figures.plot_law_fit(emergence, fit, stem / "law_fit")
    figures.plot_model_size(emergence, fit, stem / "model_size")
    findings.write_findings(out, "natural", records, *args.run_figure[:1])  # from the tables above
    written = [Path(f) for f in layout.natural_outputs(out) if Path(f).name != layout.PROVENANCE]
    write_provenance(out, {"config_sha256": args.config_sha256}, emergence["run_id"],
                     [f.relative_to(out) for f in written])  # fmt: skip

    emerged = int(emergence["emerged"].sum())
    status = "law fitted" if fit["ok"] else f"law not fitted: {fit['reason']}"
    print(
        f"{emerged} of {len(emergence)} runs emerged ({spec['metric']}, {spec['method']}); {status}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
