"""The study model: runs, the checkpoint schedule, the law's predictions and the training spec.

A ``Study`` is a validated config (defaults filled in) and everything derived from it: the
grid of runs (``Run``), each run's recipe, checkpoint steps and training spec. The checkpoint
schedule is given in tokens, the same for every run (docs/method.md#the-checkpoint-schedule),
and turned into update counts per run here, so that every consumer agrees on which steps are
saved.
``checkpoints.densify`` adds, to each natural-data run, log-spaced token counts around the
emergence point the law U_pt = T / (B^a C^b) predicts for it (``law_updates``), and records
that prediction in the run's training spec (``Study.prediction``).

``execution`` is the one section that says where and how a study runs rather than what it
studies (``study_definition`` is the config without it: what provenance hashes). What a study
costs on a device is ``ihsweep.cost.study``'s.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ihsweep.config.schema import ConfigError, as_list, load_schema
from ihsweep.files import layout

GPT2_VOCAB_SIZE = 50257
MODEL_KEYS = ("n_layer", "n_head", "d_model", "mlp", "n_ctx")
LLAMA_KEYS = ("family", "rope_base")
RUN_FIELDS = ("data", "model", "batch_size", "context_size", "seed")
EXECUTION = "execution"  # the section of execution settings; everything else is the study
LAW_KEYS = ("a", "b", "log10_T")


# --------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class Run:
    """One training run: one cell of the grid."""

    data: str
    model: str
    batch_size: int
    context_size: int
    seed: int

    @property
    def id(self) -> str:
        return layout.run_name(self)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_size

    @classmethod
    def from_wildcards(cls, wildcards: Any) -> Run:
        """Rebuild a run from Snakemake wildcards ``data, model, batch, ctx, seed`` (strings)."""

        def get(name: str) -> str:
            if isinstance(wildcards, Mapping):
                return wildcards[name]
            return getattr(wildcards, name)

        return cls(
            data=get("data"),
            model=get("model"),
            batch_size=int(get("batch")),
            context_size=int(get("ctx")),
            seed=int(get("seed")),
        )


def expand_runs(entries: list[dict]) -> Iterator[tuple[int, Run]]:
    """Yield (index of the runs entry, run) for every cell of every cartesian product."""
    for index, entry in enumerate(entries):
        for values in itertools.product(*(as_list(entry[name]) for name in RUN_FIELDS)):
            yield index, Run(*values)


# --------------------------------------------------------------------------------------------
# Checkpoint schedule


def schedule_tokens(checkpoints: dict, budget: int) -> list[int]:
    """Checkpoint token counts of the config's schedule, sorted, none beyond the budget."""
    if "tokens" in checkpoints:
        return sorted(t for t in checkpoints["tokens"] if t <= budget)
    start, linear_from, every = (checkpoints[k] for k in ("start", "linear_from", "every"))
    per_decade = checkpoints.get("per_decade")
    tokens = []
    k, t = 0, start
    while t < linear_from and t <= budget:
        tokens.append(t)
        k += 1
        # Integer doubling by default (exact); log-spaced from start with per_decade.
        t = start * 2**k if per_decade is None else round(start * 10 ** (k / per_decade))
    tokens = sorted(set(tokens))
    t = linear_from
    while t <= budget:
        tokens.append(t)
        t += every
    return tokens


def checkpoint_steps(tokens: list[int], tokens_per_step: int, total_steps: int) -> list[int]:
    """Convert token counts to update counts for one run.

    Each count rounds to the nearest step (halves up, in integer arithmetic so that no float
    error moves a checkpoint), clamped to [1, total_steps]; the last step is always included so
    that every run ends with a checkpoint of its final model.
    """
    steps = {
        min(max((2 * t + tokens_per_step) // (2 * tokens_per_step), 1), total_steps) for t in tokens
    }
    steps.add(total_steps)
    return sorted(steps)


def densify_tokens(
    predicted: float, window_decades: float, per_decade: int, budget: int
) -> list[int]:
    """Token counts around a predicted emergence point: ``predicted * 10^(k / per_decade)`` for
    every integer k with ``|k / per_decade| <= window_decades``, rounded to whole tokens and
    kept within (0, budget]; sorted, unique."""
    reach = math.floor(window_decades * per_decade + 1e-9)  # 0.29 * 100 is 28.999...
    values = (predicted * 10.0 ** (k / per_decade) for k in range(-reach, reach + 1))
    tokens = {round(x) for x in values if math.isfinite(x) and x < budget + 0.5}
    return sorted(t for t in tokens if t >= 1)


# --------------------------------------------------------------------------------------------
# Markov grids: one config entry, one dataset per (f, r) cell, one shared chain


def cell_name(entry: str, frequency: float, reliability: float) -> str:
    """The dataset name of one (f, r) cell of a Markov entry: ``semi-f0.1-r0.9``."""
    return f"{entry}-f{frequency:g}-r{reliability:g}"


def expand_markov_grids(config: dict) -> dict[str, list[str]]:
    """Replace every Markov entry by its (f, r) cells, in place; return {entry: [cell names]}.

    An entry with scalar ``frequency`` and ``reliability`` is one cell and keeps its name; lists
    sweep their cartesian product, ``cells`` lists the pairs. Each cell is a dataset of its own
    (scalar f and r, ``grid`` = the entry's name, which also names the shared chain), and a run
    entry whose ``data`` names the entry trains on every cell.
    """
    datasets, grids = {}, {}
    for name, dataset in config["datasets"].items():
        if dataset["family"] != "markov":
            datasets[name] = dataset
            continue
        pairs = _grid_cells(name, dataset)
        sweeps = "cells" in dataset or any(
            isinstance(dataset[k], list) for k in ("frequency", "reliability")
        )
        cells = {}
        for f, r in pairs:
            cell = {k: v for k, v in dataset.items() if k != "cells"}
            cell.update(frequency=f, reliability=r, grid=name)
            cells[cell_name(name, f, r) if sweeps else name] = cell
        for cell in cells:
            if cell in config["datasets"] and cell != name:
                raise ConfigError(
                    f"datasets.{name}: its cell {cell!r} has the name of another dataset; "
                    f"rename one of them"
                )
        datasets.update(cells)
        grids[name] = list(cells)
    config["datasets"] = datasets
    for entry in config["runs"]:
        entry["data"] = [
            cell for data in as_list(entry["data"]) for cell in grids.get(data, [data])
        ]
    return grids


def _grid_cells(name: str, dataset: dict) -> list[tuple[float, float]]:
    given = [k for k in ("frequency", "reliability") if k in dataset]
    if "cells" in dataset:
        if given:
            raise ConfigError(
                f"datasets.{name}.cells: given together with {' and '.join(given)}; give "
                f"cells, or frequency and reliability, not both"
            )
        return [(float(f), float(r)) for f, r in dataset["cells"]]
    if len(given) < 2:
        missing = ({"frequency", "reliability"} - set(given)).pop()
        raise ConfigError(
            f"datasets.{name}: {missing} is missing; give frequency and reliability (a list "
            f"sweeps), or cells: [[f, r], ...]"
        )
    return [
        (float(f), float(r))
        for f in as_list(dataset["frequency"])
        for r in as_list(dataset["reliability"])
    ]


# --------------------------------------------------------------------------------------------
# The prepared study


def law_updates(law: dict, B, C):
    """The emergence point the law ``{a, b, log10_T}`` predicts, in updates: T / (B^a C^b).

    B and C may be scalars (a float comes back) or arrays (broadcast, an array comes back)."""
    B, C = np.asarray(B, dtype=float), np.asarray(C, dtype=float)
    pred = 10.0 ** (law["log10_T"] - law["a"] * np.log10(B) - law["b"] * np.log10(C))
    return float(pred) if np.ndim(pred) == 0 else pred


def study_definition(config: dict) -> dict:
    """The config without its execution settings: what a study computes, wherever it runs."""
    return {key: value for key, value in config.items() if key != EXECUTION}


# --------------------------------------------------------------------------------------------
# The study


@dataclass
class Study:
    """The validated config (defaults filled in) and everything derived from it."""

    config: dict
    runs: list[Run]
    checkpoint_tokens: list[int] = field(default_factory=list)  # at the `training` budget
    # checkpoints.densify with its law read (None = off): law, source, window_decades, per_decade
    densify: dict | None = None
    grids: dict[str, list[str]] = field(default_factory=dict)  # Markov entry -> its datasets
    overrides: dict[Run, dict] = field(default_factory=dict)  # a runs entry's `training` keys
    suites: dict[str, dict] = field(default_factory=dict)  # checkpoint suites, by name

    @property
    def name(self) -> str:
        """The config's ``study``: the name of the folder of its aggregates
        (``ihsweep.files.layout``)."""
        return self.config["study"]

    def training(self, run: Run) -> dict:
        """The training recipe of one run: `training`, with its runs entry's overrides."""
        return {**self.config["training"], **self.overrides.get(run, {})}

    def total_steps(self, run: Run) -> int:
        return self.training(run)["tokens"] // run.tokens_per_step

    def checkpoint_steps(self, run: Run) -> list[int]:
        tokens = self.requested_tokens(run)
        return checkpoint_steps(tokens, run.tokens_per_step, self.total_steps(run))

    def requested_tokens(self, run: Run) -> list[int]:
        """The token counts a run's checkpoints are asked for, before conversion to steps: the
        fixed schedule up to the run's budget (``checkpoint_tokens`` at the `training` budget)
        and the densified ones around its predicted emergence point; sorted, unique."""
        fixed = schedule_tokens(self.config["checkpoints"], self.training(run)["tokens"])
        return sorted({*fixed, *self.densified_tokens(run)})

    def densified_tokens(self, run: Run) -> list[int]:
        """The token counts ``checkpoints.densify`` adds to a run's schedule ([] when off)."""
        prediction = self.prediction(run)
        if prediction is None:
            return []
        return densify_tokens(
            prediction["tokens"],
            prediction["window_decades"],
            prediction["per_decade"],
            self.training(run)["tokens"],
        )

    def prediction(self, run: Run) -> dict | None:
        """The law's emergence point for ``run`` (``checkpoints.densify``): tokens and updates,
        the law, its source (config or the lawfit path) and the window; None when densify is
        off or the run is not on natural data (the law does not predict Markov runs)."""
        if self.densify is None or self.config["datasets"][run.data]["family"] != "natural":
            return None
        law = self.densify["law"]
        updates = law_updates(law, run.batch_size, run.context_size)
        return {
            "tokens": float(updates * run.tokens_per_step),
            "updates": float(updates),
            "law": dict(law),
            "source": self.densify["source"],
            "window_decades": self.densify["window_decades"],
            "per_decade": self.densify["per_decade"],
        }

    def train_spec(self, run: Run) -> dict:
        """Everything a training job needs, JSON-serialisable."""
        steps = self.checkpoint_steps(run)
        return {
            "run_id": run.id,
            "data": run.data,
            "model": run.model,
            "batch_size": run.batch_size,
            "context_size": run.context_size,
            "seed": run.seed,
            "model_config": self.model_of(run),
            "training": copy.deepcopy(self.training(run)),
            "checkpoint_steps": steps,
            # The tokens actually seen at each saved step, not the requested counts.
            "checkpoint_tokens": [step * run.tokens_per_step for step in steps],
            "total_steps": self.total_steps(run),
            **self._early_stop(run),
            **self._prediction(run),
        }

    def early_stop(self, run: Run) -> dict | None:
        """The rule that may end ``run`` before its budget (``training.stop_after_emergence``):
        its margin, and the probe and emergence settings the training job applies to its own
        checkpoints; None when the run trains to its budget."""
        setting = self.training(run)["stop_after_emergence"]
        if setting is False:
            return None
        if setting is True:  # the object with every key at its schema default
            keys = load_schema()["properties"]["training"]["properties"]["stop_after_emergence"]
            setting = {key: sub["default"] for key, sub in keys["properties"].items()}
        return {**setting, "probe": self.config["probe"], "emergence": self.config["emergence"]}

    def _early_stop(self, run: Run) -> dict:
        # Absent when off: then no probe or emergence setting reaches the training job.
        rule = self.early_stop(run)
        return {} if rule is None else {"early_stop": copy.deepcopy(rule)}

    def _prediction(self, run: Run) -> dict:
        # Absent when densify is off, so that existing studies' specs stay byte-identical.
        prediction = self.prediction(run)
        return {} if prediction is None else {"prediction": prediction}

    def model_of(self, run: Run) -> dict:
        model = self.config["models"][run.model]
        # A gpt2 model's dict leaves its family out, as before families existed: today's run
        # keys stay as they were.
        keys = MODEL_KEYS if model["family"] == "gpt2" else (*MODEL_KEYS, *LLAMA_KEYS)
        return {k: model[k] for k in keys}

    def dataset_spec(self, name: str) -> dict:
        """The dataset entry, defaults filled in (a copy: callers may change it)."""
        return copy.deepcopy(self.config["datasets"][name])

    def vocab_size_of(self, data: str) -> int:
        """Vocabulary size the dataset's tokenizer is configured for (an upper bound for bpe)."""
        return configured_vocab_size(self.config["datasets"][data], self.config["datasets"])

    def runs_of_family(self, family: str) -> list[Run]:
        datasets = self.config["datasets"]
        return [run for run in self.runs if datasets[run.data]["family"] == family]

    def grid_of(self, data: str) -> str:
        """The Markov entry a dataset is a cell of; it names the chain the cells share."""
        return self.config["datasets"][data]["grid"]

    def chain_spec(self, grid: str) -> dict:
        return copy.deepcopy(self.config["datasets"][self.grids[grid][0]]["chain"])

    def contexts_of(self, data: str) -> list[int]:
        return sorted({run.context_size for run in self.runs if run.data == data})


def configured_vocab_size(dataset: dict, datasets: dict) -> int:
    """The configured vocabulary size (an upper bound for bpe and bigram chains)."""
    chain = dataset.get("chain")
    if chain is not None:
        if chain["kind"] == "synthetic":
            return chain["vocab_size"]
        return min(chain["vocab_cap"], configured_vocab_size(datasets[chain["source"]], datasets))
    tokenizer = dataset.get("tokenizer", {"kind": "gpt2"})
    if tokenizer["kind"] == "bpe":
        return tokenizer["vocab_size"]
    return GPT2_VOCAB_SIZE
