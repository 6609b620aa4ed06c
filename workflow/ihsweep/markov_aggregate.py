"""Command-line entry point of the Markov-data analysis (experiments 2 and 3, SPEC section 4).

Reads the Markov runs' model-level probe tables, finds each run's emergence point exactly as
for natural data (``ihsweep.emergence``), joins each run to its dataset's requested (f, r), its
chain's properties and the generator's measured statistics, and writes::

    python -m ihsweep.markov_aggregate --model-tables A.parquet ... --datasets JSON \\
        --data-root results/data --metric ps_max --method sigmoid --min-rise 0.05 \\
        --out results/markov

- ``emergence.csv``: one row per run, the emergence columns of ``emergence.TABLE_COLUMNS``
  plus ``RUN_EXTRA`` (below); ``emergence.html``: the same runs as a page for the report;
- ``cells.csv``: one row per (f, r) cell of each setting, i.e. of each (grid, model, B, C):
  ``SETTING_KEYS`` then the ``frontier.cell_outcomes`` columns (seeds pool within a cell);
- ``frontier.json``: per setting with more than one cell, keyed ``setting_name``, the frontier
  (``Frontier.summary``) and the sensitivity verdict (``frontier.sensitivity``);
- ``generator.csv``: one row per (dataset, C): requested and measured statistics of the
  training split (``GENERATOR_COLUMNS``);
- ``figures/frontier-<setting>``: experiment 2, one per setting over a bigram chain with more
  than one cell; ``figures/properties``: experiment 3, when any chain is synthetic (cells pool
  the runs of every model, B and C with the same properties and (f, r));
  ``figures/generator``: measured vs requested f and r. Each as PNG and PDF.

- ``provenance.json``: config hash, code version, run ids (``ihsweep.provenance``).

``--datasets`` maps each Markov dataset (cell) name to its config entry (``grid``, f, r,
``chain``); the Snakefile passes the validated config's entries. Deterministic for fixed
inputs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from ihsweep import frontier, markov_figures
from ihsweep.data.chunks import CHUNKS_JSON
from ihsweep.emergence import METHODS, METRICS, emergence_table
from ihsweep.io import atomic_path, json_arg, write_json
from ihsweep.provenance import write_provenance
from ihsweep.report_tables import markov_emergence, write_page

RUN_EXTRA = {
    "grid": "the config entry the dataset is a cell of (it also names the chain)",
    "chain_kind": "bigram (experiment 2) or synthetic (experiment 3)",
    "frequency": "requested f",
    "reliability": "requested r",
    "dependency": "+D (True) or -D (False); True for a bigram chain",
    "categorial": "+C (True) or -C (False); empty for a bigram chain",
    "marginal": "target marginal of a synthetic chain; 'natural' for a bigram chain",
    "measured_frequency": "f measured on the run's training sequences",
    "measured_reliability": "r measured on the run's training sequences",
}
SETTING_KEYS = ["grid", "model", "batch_size", "context_size"]
GENERATOR_COLUMNS = [
    "data",
    "grid",
    "generator",
    "context_size",
    "frequency",
    "reliability",
    "measured_frequency",
    "measured_reliability",
    "first_half_repeats",
    "entropy_rate_bits",
]


def chain_properties(chain: dict) -> dict:
    """The experiment-3 coordinates of a chain spec (bigram chains: +D, natural marginal)."""
    if chain["kind"] == "bigram":
        return {"dependency": True, "categorial": None, "marginal": "natural"}
    dependency = bool(chain.get("dependency", True))
    return {
        "dependency": dependency,
        # -D rows are all the marginal: there are no blocks to be categorial about.
        "categorial": bool(chain.get("categorial", True)) and dependency,
        "marginal": chain.get("marginal", "zipfian"),
    }


def generator_table(datasets: dict, contexts: dict[str, list[int]], data_root: Path):
    """Requested vs measured statistics of every (dataset, C), read from its chunks.json."""
    rows = []
    for data in sorted(contexts):
        spec = datasets[data]
        for C in sorted(contexts[data]):
            meta = json.loads((data_root / data / f"C{C}" / CHUNKS_JSON).read_text())
            train = meta["measured"]["train"]
            rows.append(
                {
                    "data": data,
                    "grid": spec["grid"],
                    "generator": spec["chain"]["kind"],
                    "context_size": C,
                    "frequency": float(spec["frequency"]),
                    "reliability": float(spec["reliability"]),
                    "measured_frequency": train["f"],
                    "measured_reliability": train["r"],
                    "first_half_repeats": train["first_half_repeats"],
                    "entropy_rate_bits": train["entropy_rate_bits"],
                }
            )
    return pd.DataFrame(rows, columns=GENERATOR_COLUMNS)


def run_table(emergence: pd.DataFrame, datasets: dict, generator: pd.DataFrame) -> pd.DataFrame:
    """The emergence table with each run's cell, chain properties and measured f, r."""
    extra = pd.DataFrame(
        [
            {
                "data": data,
                "grid": spec["grid"],
                "chain_kind": spec["chain"]["kind"],
                "frequency": float(spec["frequency"]),
                "reliability": float(spec["reliability"]),
                **chain_properties(spec["chain"]),
            }
            for data, spec in datasets.items()
        ]
    )
    measured = generator[["data", "context_size", "measured_frequency", "measured_reliability"]]
    table = emergence.merge(extra, on="data", how="left").merge(
        measured, on=["data", "context_size"], how="left"
    )
    return table[[*emergence.columns, *RUN_EXTRA]]


def setting_name(grid: str, model: str, batch_size: int, context_size: int) -> str:
    """``semi-w64-B16-C32``: the name of one (f, r) sweep, used in file names."""
    return f"{grid}-{model}-B{batch_size}-C{context_size}"


def setting_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Cell outcomes per setting: ``SETTING_KEYS``, then ``frontier.cell_outcomes``'s columns."""
    parts = [
        frontier.cell_outcomes(group).assign(**dict(zip(SETTING_KEYS, key, strict=True)))
        for key, group in runs.groupby(SETTING_KEYS, sort=True)
    ]
    cells = pd.concat(parts, ignore_index=True)
    return cells[[*SETTING_KEYS, *cells.columns.drop(SETTING_KEYS)]]


def main(argv=None) -> int:
    args = parse_args(argv)
    datasets = args.datasets
    model_table = pd.concat([pd.read_parquet(p) for p in args.model_tables], ignore_index=True)
    unknown = sorted(set(model_table["data"]) - set(datasets))
    if unknown:
        raise SystemExit(f"runs on datasets missing from --datasets: {unknown}")
    contexts = model_table.groupby("data")["context_size"].unique().to_dict()
    generator = generator_table(datasets, contexts, args.data_root)
    emergence = emergence_table(
        model_table, metric=args.metric, method=args.method, min_rise=args.min_rise
    )
    runs = run_table(emergence, datasets, generator)
    cells = setting_cells(runs)

    out, figures = args.out, args.out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    for name, table in (("emergence", runs), ("cells", cells), ("generator", generator)):
        with atomic_path(out / f"{name}.csv") as tmp:
            table.to_csv(tmp, index=False)
    write_page(out / "emergence.html", markov_emergence(runs, args.metric))

    fronts = {}
    for key, table in cells.groupby(SETTING_KEYS, sort=True):
        if len(table) < 2:
            continue
        name = setting_name(*key)
        front = frontier.pareto_frontier(table)
        verdict = frontier.sensitivity(table)
        fronts[name] = front.summary() | {"sensitivity": verdict}
        if runs.loc[runs["grid"] == key[0], "chain_kind"].eq("bigram").all():
            markov_figures.plot_frontier(table, front, figures / f"frontier-{name}", verdict)
    write_json(out / "frontier.json", fronts)

    synthetic = runs[runs["chain_kind"] == "synthetic"]
    if len(synthetic):
        properties = frontier.property_table(synthetic)
        markov_figures.plot_property_grid(properties, figures / "properties")
    markov_figures.plot_generator_stats(generator, figures / "generator")
    outputs = [p.relative_to(out) for p in [*out.glob("*.*"), *sorted(figures.iterdir())]]
    write_provenance(out, args.config_sha256, runs["run_id"], outputs)

    emerged = int(runs["emerged"].sum())
    print(f"{emerged} of {len(runs)} Markov runs emerged ({args.metric}, {args.method})")
    for name, front in fronts.items():
        print(f"  {name}: frontier {front['frontier']}, {front['sensitivity']['verdict']}")
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ihsweep.markov_aggregate",
        description="Emergence per Markov run, the (f, r) frontier, the property grid, figures.",
    )
    parser.add_argument("--model-tables", nargs="+", required=True, type=Path)
    parser.add_argument(
        "--datasets", required=True, type=json_arg, help="{cell name: config entry} (JSON)"
    )
    parser.add_argument(
        "--data-root", required=True, type=Path, help="folder of <data>/C<C>/chunks.json"
    )
    parser.add_argument("--metric", choices=METRICS, default="ps_max")
    parser.add_argument("--method", choices=METHODS, default="sigmoid")
    parser.add_argument("--min-rise", type=float, default=0.05)
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--config-sha256", help="hash of the study config, for provenance.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
