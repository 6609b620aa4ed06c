"""Rule ``run_figure``: one run's figure, its probe curves with the emergence point and PS per
head over time (``ihsweep.figures.run``), and ``provenance.json`` beside it.

    python -m ihsweep.steps.run_figure --probes results/runs/<run folder>/probes/<key> \
        --emergence '<emergence JSON>' --out results/runs/<run folder>/figures/<key>/run
"""

from __future__ import annotations

from pathlib import Path

from ihsweep.analysis.emergence import run_point
from ihsweep.config import complete
from ihsweep.figures.run import plot_run
from ihsweep.files.io import read_probe_table
from ihsweep.files.layout import PROBE_TABLES
from ihsweep.report.provenance import write_provenance
from ihsweep.steps import _args


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("run_figure", "One run's probe curves and per-head heat map.")
    p.add_argument("--probes", required=True, type=Path, help="a run's probes/ folder")
    _args.add_spec(p, "--emergence", "emergence", required=False)
    p.add_argument("--out", required=True, type=Path, help="output stem (no suffix)")
    p.add_argument(
        "--run-sha256", help="the run's hash (ihsweep.report.provenance), for provenance.json"
    )
    args = p.parse_args(argv)
    spec = complete("emergence", args.emergence)
    heads, model = (read_probe_table(args.probes / f"{name}.parquet") for name in PROBE_TABLES)
    paths = plot_run(model, heads, run_point(model, spec), spec["metric"], args.out)
    run_ids = model["run_id"].unique()
    written = [p.name for p in paths]
    write_provenance(args.out.parent, {"run_sha256": args.run_sha256}, run_ids, written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
