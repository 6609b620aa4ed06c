"""Rule ``aggregate_markov``: the Markov-data analysis (experiments 2 and 3,
docs/method.md#data-families).

    python -m ihsweep.steps.aggregate_markov --model-tables A.parquet ... \
        --chunk-metas results/data/<cell>-<key>/C32/chunks.json ... \
        --datasets '<{cell name: dataset entry} JSON>' --emergence '<emergence JSON>' \
        --out-dir results/studies/default/markov

Reads the chunk sidecars of the runs' datasets (``--chunk-metas``, each in its
``layout.chunk_dir``) for the generator's measured statistics and writes
``ihsweep.files.layout.markov_outputs``:

- ``emergence.csv`` (``ihsweep.analysis.markov.run_table``) and ``emergence.html``;
- ``cells.csv`` (``setting_cells``) and ``generator.csv`` (``generator_table``);
- ``frontier.json``: per setting with more than one cell, keyed ``layout.setting_name``, the
  frontier (``Frontier.summary``) and the sensitivity verdict (``frontier.sensitivity``);
- the figures of ``layout.markov_figures`` (PNG and PDF): ``frontier-<setting>`` (experiment 2),
  ``properties`` (experiment 3: cells pool the runs of every model, B and C with the same
  properties and (f, r)) and ``generator`` (measured vs requested f and r);
- ``provenance.json``: config hash, code version, run ids (``ihsweep.report.provenance``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from ihsweep.analysis import frontier
from ihsweep.analysis.emergence import emergence_table
from ihsweep.analysis.markov import SETTING_KEYS, generator_table, run_table, setting_cells
from ihsweep.config import complete
from ihsweep.data.chunks import read_chunks_json
from ihsweep.figures import markov as figures
from ihsweep.files import layout
from ihsweep.files.io import atomic_path, json_arg, read_probe_table, write_json
from ihsweep.report import findings, trained
from ihsweep.report.provenance import write_provenance
from ihsweep.report.tables import markov_emergence, write_page
from ihsweep.steps import _args


def chunk_metas(paths: list[Path]) -> dict[tuple[str, int], dict]:
    """{(dataset, C): chunks.json} of ``layout.chunk_dir`` files, named by their folders."""
    metas = {}
    for path in paths:
        meta = read_chunks_json(path, required=("context",))
        metas[(layout.unkeyed(path.parent.parent.name), int(meta["context"]))] = meta
    return metas


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("aggregate_markov", "Emergence per Markov run, the (f, r) frontier, figures.")
    p.add_argument("--model-tables", nargs="+", required=True, type=Path, help="probe tables")
    _args.add_findings_inputs(p)
    p.add_argument("--chunk-metas", nargs="+", required=True, type=Path, help="chunks.json files")
    p.add_argument("--datasets", required=True, type=json_arg, help="{cell name: entry} (JSON)")
    _args.add_spec(p, "--emergence", "emergence", required=False)
    p.add_argument("--out-dir", required=True, help="output folder: layout.markov_dir(<study>)")
    p.add_argument("--config-sha256", help="hash of the study config, for provenance.json")
    args = p.parse_args(argv)
    records = trained.read_records(args.run_records)  # checked before anything is written
    spec, datasets, out = complete("emergence", args.emergence), args.datasets, args.out_dir

    def path(name: str) -> Path:
        return Path(layout.aggregate_file(name, out))

    # A table probed before its metric existed (ps_content_max) is named with the fix.
    checked = [read_probe_table(table, (spec["metric"],)) for table in args.model_tables]
    model_table = pd.concat(checked, ignore_index=True)
    unknown = sorted(set(model_table["data"]) - set(datasets))
    if unknown:
        print(f"runs on datasets missing from --datasets: {unknown}", file=sys.stderr)
        return 1
    metas = chunk_metas(args.chunk_metas)
    runs_at = model_table[["data", "context_size"]].drop_duplicates().itertuples(index=False)
    missing = sorted(f"{data}/C{C}" for data, C in runs_at if (data, int(C)) not in metas)
    if missing:
        print(f"runs on chunks missing from --chunk-metas: {missing}", file=sys.stderr)
        return 1
    generator = generator_table(datasets, metas)
    runs = run_table(emergence_table(model_table, spec), datasets, generator)
    cells = setting_cells(runs)
    stems = layout.markov_figures(runs.to_dict("records"))

    for name, table in (("emergence", runs), ("cells", cells), ("generator", generator)):
        with atomic_path(path(f"{name}.csv")) as tmp:
            table.to_csv(tmp, index=False)
    write_page(path("emergence.html"), markov_emergence(runs, spec["metric"]))

    figure_stem = Path(out) / "figures"
    fronts = {}
    for key, table in cells.groupby(SETTING_KEYS, sort=True):
        if len(table) < 2:
            continue
        name = layout.setting_name(*key)
        front = frontier.pareto_frontier(table)
        verdict = frontier.sensitivity(table)
        in_setting = (runs[SETTING_KEYS] == pd.Series(key, index=SETTING_KEYS)).all(axis=1)
        timing = frontier.timing_sensitivity(runs[in_setting])
        fronts[name] = front.summary() | {"sensitivity": verdict, "timing": timing}
        if f"frontier-{name}" in stems:
            figures.plot_frontier(table, front, figure_stem / f"frontier-{name}", verdict)
    write_json(path("frontier.json"), fronts)
    if "properties" in stems:
        synthetic = runs[runs["chain_kind"] == "synthetic"]
        figures.plot_property_grid(frontier.property_table(synthetic), figure_stem / "properties")
    figures.plot_generator_stats(generator, figure_stem / "generator")

    findings.write_findings(out, "markov", records, *args.run_figure[:1])  # from the tables above
    written = [Path(f) for f in layout.markov_outputs(stems, out)]
    written = [f.relative_to(out) for f in written if f.name != layout.PROVENANCE]
    write_provenance(out, {"config_sha256": args.config_sha256}, runs["run_id"], written)

    emerged = int(runs["emerged"].sum())
    print(f"{emerged} of {len(runs)} Markov runs emerged ({spec['metric']}, {spec['method']})")
    for name, front in fronts.items():
        print(f"  {name}: frontier {front['frontier']}, {front['sensitivity']['verdict']},"
              f" timing {front['timing']['verdict']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
