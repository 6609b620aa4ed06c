"""The Markov-data analysis (experiments 2 and 3, docs/method.md#data-families): each run's
emergence point, found exactly as for natural data (``ihsweep.analysis.emergence``), joined to
its dataset's requested (f, r), its chain's properties and the generator's measured statistics.

- ``run_table``: one row per run, the emergence columns of ``emergence.TABLE_COLUMNS`` plus
  ``RUN_EXTRA`` (below);
- ``setting_cells``: one row per (f, r) cell of each setting, i.e. of each (grid, model, B, C):
  ``SETTING_KEYS`` then the ``frontier.cell_outcomes`` columns (seeds pool within a cell);
- ``generator_table``: one row per (dataset, C): requested and measured statistics of the
  training split (``GENERATOR_COLUMNS``).

The command that writes them, the frontier and the figures is ``python -m
ihsweep.steps.aggregate_markov``. Deterministic for fixed inputs.
"""

from __future__ import annotations

import pandas as pd

from ihsweep.analysis import frontier

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
    dependency = bool(chain["dependency"])
    return {
        "dependency": dependency,
        # -D rows are all the marginal: there are no blocks to be categorial about.
        "categorial": bool(chain["categorial"]) and dependency,
        "marginal": chain["marginal"],
    }


def generator_table(datasets: dict, chunk_metas: dict[tuple[str, int], dict]) -> pd.DataFrame:
    """Requested vs measured statistics of every (dataset, C), from its ``chunks.json``
    (``chunk_metas[(data, C)]``)."""
    rows = []
    for data, C in sorted(chunk_metas):
        spec, train = datasets[data], chunk_metas[(data, C)]["measured"]["train"]
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


def setting_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Cell outcomes per setting: ``SETTING_KEYS``, then ``frontier.cell_outcomes``'s columns."""
    parts = [
        frontier.cell_outcomes(group).assign(**dict(zip(SETTING_KEYS, key, strict=True)))
        for key, group in runs.groupby(SETTING_KEYS, sort=True)
    ]
    cells = pd.concat(parts, ignore_index=True)
    return cells[[*SETTING_KEYS, *cells.columns.drop(SETTING_KEYS)]]
