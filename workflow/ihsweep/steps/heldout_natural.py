"""Rule ``heldout_natural``: how the law predicts runs it never saw
(docs/method.md#held-out-validation; ``ihsweep.analysis.heldout``)::

    python -m ihsweep.steps.heldout_natural --study default \
        --emergence-table results/studies/default/natural/emergence.csv \
        --lawfit '<lawfit JSON>' --out-dir results/studies/default/natural/heldout

Writes ``ihsweep.files.layout.heldout_outputs(out_dir)``: heldout.csv (one row per law and held-out
run, docs/files.md), heldout.json (per kind whether it was measured and why not, coverage and
RMSE per law), the summary as an HTML page and as the front page's findings.rst, the figure
heldout.png/.pdf and provenance.json. Deterministic for a fixed table and seed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ihsweep.analysis.heldout import held_out
from ihsweep.config import complete
from ihsweep.figures.heldout import plot_held_out
from ihsweep.files import layout
from ihsweep.files.io import DamagedFile, atomic_path, write_json
from ihsweep.report import heldout as report
from ihsweep.report.provenance import write_provenance
from ihsweep.report.tables import write_page
from ihsweep.steps import _args

NEEDED = ("run_id", "batch_size", "context_size", "seed", "emerged", "updates_pt")


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("heldout_natural", "Held-out validation of the law: coverage and RMSE.")
    p.add_argument("--emergence-table", required=True, type=Path, help="the emergence.csv")
    _args.add_spec(p, "--lawfit", "lawfit", required=False)
    p.add_argument("--study", required=True, help="the study's name, for the front page")
    p.add_argument("--out-dir", required=True, help="output folder: layout.heldout_dir(...)")
    p.add_argument("--config-sha256", help="hash of the study config, for provenance.json")
    args = p.parse_args(argv)
    spec, out = complete("lawfit", args.lawfit), args.out_dir
    emergence = read_emergence(args.emergence_table)
    table, summary = held_out(emergence, spec["bootstrap"], spec["seed"], spec["model"])

    def path(name: str) -> Path:
        return Path(layout.aggregate_file(name, out))

    with atomic_path(path("heldout.csv")) as tmp:
        table.to_csv(tmp, index=False)
    write_json(path("heldout.json"), summary)
    write_page(path("heldout.html"), report.page(summary))
    png = plot_held_out(table, summary, Path(out) / "figures" / "heldout")[0]
    with atomic_path(path(layout.FINDINGS)) as tmp:
        Path(tmp).write_text(report.findings(summary, args.study, png))
    written = [Path(f) for f in layout.heldout_outputs(out) if Path(f).name != layout.PROVENANCE]
    write_provenance(out, {"config_sha256": args.config_sha256}, emergence["run_id"],
                     [f.relative_to(out) for f in written])  # fmt: skip
    for row in summary["summary"]:
        cover = "no interval" if row["coverage"] is None else f"coverage {row['coverage']:.0%}"
        print(f"{row['kind']:>13} {row['law']:>10}: {row['n_runs']} runs, {cover}, "
              f"RMSE {row['rmse_log10']:.3f} log10 updates")  # fmt: skip
    for kind, verdict in summary["kinds"].items():
        if not verdict["ok"]:
            print(f"{kind}: not measured: {verdict['reason']}")
    return 0


def read_emergence(path: Path) -> pd.DataFrame:
    """An emergence table (emergence.csv) with the columns the split needs, else DamagedFile."""
    remedy = "rerun the study's aggregate_natural (snakemake --forcerun aggregate_natural)"
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as err:
        raise DamagedFile("emergence table", path, f"not a readable CSV ({err})", remedy) from err
    missing = [c for c in NEEDED if c not in table.columns]
    if missing:
        raise DamagedFile("emergence table", path, f"missing columns {', '.join(missing)}", remedy)
    return table


if __name__ == "__main__":
    raise SystemExit(main())
