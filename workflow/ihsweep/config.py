"""Study configuration: validation, the grid of runs, and the per-run training spec.

``prepare()`` is called once by the Snakefile (workflow/rules/common.smk) before any job exists.
It checks the config and stops at the first problem with a one-line ``ConfigError`` that names
the key and what would be accepted:

1. the JSON schema (workflow/schemas/config.schema.yaml, the only home of every default), in one
   jsonschema pass that also fills the defaults in, in place (so the Snakefile's ``config``
   carries them too); the message is ours rather than a dump of the schema;
2. semantic checks a schema cannot express (names that must exist, sizes that must fit).

Steps run by hand complete a partial section the same way (``complete``).

``execution`` is the one section that says where and how a study runs rather than what it
studies (``study_definition`` is the config without it: what provenance hashes).

The checkpoint schedule is given in tokens, the same for every run (SPEC section 2), and turned
into update counts per run here, so that every consumer agrees on which steps are saved.
``checkpoints.densify`` adds, to each natural-data run, log-spaced token counts around the
emergence point the law U_pt = T / (B^a C^b) predicts for it (the law is read once, here), and
records that prediction in the run's training spec (``Study.prediction``).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import glob
import itertools
import json
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

from ihsweep import cost, layout
from ihsweep.analysis.lawfit import predict_updates
from ihsweep.data.corpus import CorpusError, check_huggingface
from ihsweep.probing.suite import SuiteError, check_suite

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
GPT2_VOCAB_SIZE = 50257
BYTES_PER_TOKEN = 4.0  # of English text under GPT-2's tokenizer (4.16 on the KJV): chunk sizing
MODEL_KEYS = ("n_layer", "n_head", "d_model", "mlp", "n_ctx")
RUN_FIELDS = ("data", "model", "batch_size", "context_size", "seed")
EXECUTION = "execution"  # the section of execution settings; everything else is the study
# Keys that moved to `execution`: a study file written for an older ihsweep gets told where.
MOVED_KEYS = {
    "training.device": "execution.device",
    "training.threads": "execution.threads",
    "training.progress_seconds": "execution.progress_seconds",
    "resources": "execution (gpu, gpu_model, train_mem_mb, probe_mem_mb, overhead_minutes, "
    "safety, probe_minutes)",
    "tokens_per_second": "execution.device_profile (the cost model's device constants)",
}
# Keys that a later ihsweep replaced by something else.
REPLACED_KEYS = {
    "execution.tokens_per_second": "replaced by the cost model (ihsweep.cost): set "
    "execution.device_profile to a built-in GPU profile or to the profile file that "
    "bench/gpu_plan.py writes on your GPU",
}


class ConfigError(ValueError):
    """A problem in the study config, described in one line that names the key."""


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


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list) else [value]


def expand_runs(entries: list[dict]) -> Iterator[tuple[int, Run]]:
    """Yield (index of the runs entry, run) for every cell of every cartesian product."""
    for index, entry in enumerate(entries):
        for values in itertools.product(*(_as_list(entry[name]) for name in RUN_FIELDS)):
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


LAW_KEYS = ("a", "b", "log10_T")
LAW_FIX = "run the pilot study first, or give checkpoints.densify.law: {a, b, log10_T}"


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
            cell for data in _as_list(entry["data"]) for cell in grids.get(data, [data])
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
        for f in _as_list(dataset["frequency"])
        for r in _as_list(dataset["reliability"])
    ]


# --------------------------------------------------------------------------------------------
# The prepared study


@dataclass
class Study:
    """The validated config (defaults filled in) and everything derived from it."""

    config: dict
    runs: list[Run]
    profile: dict = field(default_factory=dict)  # the cost model's device (ihsweep.cost)
    checkpoint_tokens: list[int] = field(default_factory=list)  # at the `training` budget
    # checkpoints.densify with its law read (None = off): law, source, window_decades, per_decade
    densify: dict | None = None
    grids: dict[str, list[str]] = field(default_factory=dict)  # Markov entry -> its datasets
    overrides: dict[Run, dict] = field(default_factory=dict)  # a runs entry's `training` keys
    suites: dict[str, dict] = field(default_factory=dict)  # checkpoint suites, by name

    @property
    def name(self) -> str:
        """The config's ``study``: the name of the folder of its aggregates (``ihsweep.layout``)."""
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
        updates = predict_updates(law, run.batch_size, run.context_size)
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
        return {k: self.config["models"][run.model][k] for k in MODEL_KEYS}

    @property
    def memory_limit(self) -> float:
        """Bytes a training job may use on the study's device profile (``ihsweep.cost``)."""
        return cost.memory_limit(self.profile, self.config[EXECUTION])

    def micro_batch(self, run: Run, setting: int | str | None = None) -> int | None:
        """The micro-batch a run trains at on the study's device profile: ``setting`` (by
        default ``execution.micro_batch``) resolved by ``cost.choose_micro_batch``; None when
        even one sequence does not fit."""
        return cost.choose_micro_batch(
            self.config[EXECUTION]["micro_batch"] if setting is None else setting,
            self.model_of(run),
            self.vocab_size_of(run.data),
            run.batch_size,
            run.context_size,
            cost.profile_device_type(self.profile),
            self.memory_limit,
        )

    def peak_memory(self, run: Run, micro_batch: int) -> dict[str, float]:
        return cost.peak_memory(
            self.model_of(run),
            self.vocab_size_of(run.data),
            micro_batch,
            run.context_size,
            cost.profile_device_type(self.profile),
        )

    def train_seconds(self, run: Run, tokens: int | None = None) -> float:
        """Estimated seconds of training ``tokens`` (by default the full budget) on the study's
        device profile (``ihsweep.cost``)."""
        micro_batch = self.micro_batch(run) or 1
        passes = len(cost.micro_batch_sizes(run.batch_size, micro_batch))
        fpt = cost.flops_per_token(
            self.model_of(run), self.vocab_size_of(run.data), run.context_size
        )
        updates = self.total_steps(run) if tokens is None else tokens // run.tokens_per_step
        return cost.train_seconds(updates, passes, updates * run.tokens_per_step, fpt, self.profile)

    def train_minutes(self, run: Run, attempt: int = 1) -> int:
        """Runtime a cluster training job asks for (``ihsweep.cost.job_minutes``): the full
        budget's, since a run may form no induction heads and train to its end."""
        return cost.job_minutes(self.train_seconds(run), self.config[EXECUTION], attempt)

    def early_stop_tokens(self, run: Run) -> int:
        """Tokens the run is expected to train (``cost.early_stop_tokens``): with early stop on
        and a law that predicts its transition, the first checkpoint ``margin_decades`` past the
        prediction; otherwise its budget."""
        tokens = [step * run.tokens_per_step for step in self.checkpoint_steps(run)]
        rule, prediction = self.early_stop(run), self.prediction(run)
        if rule is None or prediction is None:
            return tokens[-1]
        return cost.early_stop_tokens(
            prediction["tokens"], rule["margin_decades"], tokens, run.tokens_per_step
        )

    def cost(self, run: Run) -> dict:
        """The run's row of ``python -m ihsweep.cost``."""
        micro_batch = self.micro_batch(run) or 1
        n_params = cost.parameter_count(self.model_of(run), self.vocab_size_of(run.data))
        n_checkpoints = len(self.checkpoint_steps(run))
        updates = self.total_steps(run)
        seconds = self.train_seconds(run)
        stop_tokens = self.early_stop_tokens(run)
        return {
            "run_id": run.id,
            "updates": updates,
            "tokens": updates * run.tokens_per_step,
            "early_stop_tokens": stop_tokens,
            "micro_batch": micro_batch,
            "peak_gb": self.peak_memory(run, micro_batch)["total"] / cost.GB,
            "limit_gb": self.memory_limit / cost.GB,
            "device_hours": seconds / 3600,
            "early_stop_device_hours": self.train_seconds(run, stop_tokens) / 3600,
            "walltime_min": cost.job_minutes(seconds, self.config[EXECUTION], attempt=1),
            "checkpoints": n_checkpoints,
            # fp32 weights per checkpoint, and two resume states (weights and AdamW's moments)
            "checkpoint_gb": (n_checkpoints * 4 + 24) * n_params / cost.GB,
        }

    def tokenize_minutes(self, data: str, attempt: int = 1) -> int:
        corpus = self.config["datasets"][data]["corpus"]
        return cost.tokenize_minutes(corpus, self.config[EXECUTION], attempt)

    def chunk_minutes(self, data: str, context: int, attempt: int = 1) -> int:
        dataset = self.config["datasets"][data]
        if dataset["family"] == "markov":
            tokens = (dataset["n_train_sequences"] + dataset["n_val_sequences"]) * context
        else:
            size = cost.corpus_bytes(dataset["corpus"])
            tokens = None if size is None else size / BYTES_PER_TOKEN
        return cost.chunk_minutes(tokens, self.config[EXECUTION], attempt)

    def probe_minutes(self, attempt: int = 1) -> int:
        return attempt * math.ceil(self.config[EXECUTION]["probe_minutes"])

    def dataset_spec(self, name: str) -> dict:
        """The dataset entry, defaults filled in (a copy: callers may change it)."""
        return copy.deepcopy(self.config["datasets"][name])

    def vocab_size_of(self, data: str) -> int:
        """Vocabulary size the dataset's tokenizer is configured for (an upper bound for bpe)."""
        return _vocab_size(self.config["datasets"][data], self.config["datasets"])

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


def prepare(config: dict, schema: str | Path = SCHEMA) -> Study:
    """Validate ``config`` (filling in defaults, in place) and derive the study from it.

    Raises ConfigError with a one-line message at the first problem found.
    """
    problem = first_schema_problem(config, load_schema(schema))
    if problem:
        raise ConfigError(problem)

    suites = _check_suites(config)
    try:
        profile = cost.device_profile(config[EXECUTION])
    except ValueError as err:
        raise ConfigError(f"execution.device_profile: {err}") from None
    if "runs" not in config:  # a study of checkpoint suites only: nothing to train
        config.update(models={}, datasets={}, runs=[])
        _check_law_model(config)
        return Study(config=config, runs=[], profile=profile, suites=suites)

    grids = expand_markov_grids(config)
    indexed = _check_semantics(config)
    densify = _read_densify(config["checkpoints"])
    tokens = schedule_tokens(config["checkpoints"], config["training"]["tokens"])
    overrides = {
        run: config["runs"][index]["training"]
        for index, run in indexed
        if config["runs"][index].get("training")
    }
    study = Study(
        config=config,
        runs=[run for _, run in indexed],
        profile=profile,
        checkpoint_tokens=tokens,
        grids=grids,
        overrides=overrides,
        densify=densify,
        suites=suites,
    )
    for index, run in indexed:
        _check_memory(study, index, run)
        _check_prediction(study, index, run)
    return study


def load_configfiles(paths: list[Path]) -> dict:
    """Several YAML files merged in order, as ``snakemake --configfile a b`` merges them."""
    from snakemake.utils import update_config

    config: dict = {}
    for path in paths:
        update_config(config, yaml.safe_load(Path(path).read_text()))
    return config


def add_configfile(parser: argparse.ArgumentParser) -> None:
    """The ``--configfile`` flag of the command-line tools (status, cost), as Snakemake's."""
    parser.add_argument("--configfile", nargs="+", default=[Path("config.yaml")], type=Path)


def study_of_files(paths: list[Path]) -> Study:
    """The prepared study of a tool's ``--configfile`` files; a bad config exits with its
    one-line message, as the Snakefile does."""
    try:
        return prepare(load_configfiles(paths))
    except ConfigError as err:
        sys.exit(f"config error: {err}")


def study_definition(config: dict) -> dict:
    """The config without its execution settings: what a study computes, wherever it runs."""
    return {key: value for key, value in config.items() if key != EXECUTION}


@functools.cache
def _schema_text(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_schema(path: str | Path = SCHEMA) -> dict:
    return copy.deepcopy(_schema_text(Path(path).resolve()))


def complete(where: str, instance: dict | None = None, schema: str | Path = SCHEMA) -> dict:
    """A checked copy of one section with the schema's defaults filled in, by the same pass as
    ``prepare``: ``where`` is a top-level key (``probe``, ``emergence``, ``execution``, ...) or
    a definition (``dataset``, ``chain``). For steps run by hand with a partial spec."""
    root = load_schema(schema)
    if where in root["properties"]:
        section = root["properties"][where]
    elif where in root["$defs"]:
        section = {"$ref": f"#/$defs/{where}"}
    else:
        raise KeyError(f"{where!r} is neither a top-level key nor a definition of the schema")
    # Checked under its own name, so that every message names the key as `where.key`.
    wrapped = {where: copy.deepcopy(instance) if instance is not None else {}}
    schema_of_one = {"$defs": root["$defs"], "type": "object", "properties": {where: section}}
    problem = first_schema_problem(wrapped, schema_of_one)
    if problem:
        raise ConfigError(problem)
    return wrapped[where]


# --------------------------------------------------------------------------------------------
# Schema check and defaults in one pass; errors as one line


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    # jsonschema accepts 6.0 as an integer; the training code would then see floats.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _properties_with_defaults(validator, properties, instance, schema):
    """``properties`` that first fills in each absent key's default (a fresh copy, so no two
    entries share one object), then validates: nested defaults fill in as validation descends.
    Defaults in an ``if`` would be filled whatever the condition: the schema puts none there."""
    if validator.is_type(instance, "object"):
        for key, subschema in properties.items():
            if "default" in subschema and key not in instance:
                instance[key] = copy.deepcopy(subschema["default"])
    yield from Draft202012Validator.VALIDATORS["properties"](
        validator, properties, instance, schema
    )


_Validator = validators.extend(
    Draft202012Validator,
    validators={"properties": _properties_with_defaults},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)


def first_schema_problem(config: dict, schema: dict) -> str | None:
    """Fill the schema's defaults into ``config`` (in place) and return the schema error that
    comes first in the config, as one line; None if there is none."""
    errors = list(_Validator(schema).iter_errors(config))
    if not errors:
        return None
    error = min(errors, key=lambda e: _position(config, e))
    return _describe(error)


def _position(config: Any, error: ValidationError) -> tuple[int, ...]:
    """Where the error sits in the config's own order, so the top-most problem is told first."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        path.append(_unknown_keys(error)[0])
    position = []
    node = config
    for key in path:
        if isinstance(node, Mapping):
            position.append(list(node).index(key))
        else:
            position.append(key)
        node = node[key]
    return tuple(position)


def _key_path(path: Any) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping of keys to values",
    "null": "null",
}

_PY_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "list",
    dict: "mapping",
    type(None): "null",
}


def _type_name(value: Any) -> str:
    for py_type, name in _PY_TYPE_NAMES.items():
        if type(value) is py_type:
            return name
    return "mapping" if isinstance(value, Mapping) else type(value).__name__


def _unknown_keys(error: ValidationError) -> list[str]:
    known = error.schema.get("properties", {})
    return [key for key in error.instance if key not in known]


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _describe(error: ValidationError) -> str:
    """One line: the key path, what is wrong, and what would be accepted."""
    where = _key_path(error.absolute_path) or "config"
    kind, value, expected = error.validator, error.instance, error.validator_value
    if kind == "additionalProperties":
        return _describe_unknown_key(error)
    if kind == "required":
        missing = [key for key in expected if key not in value]
        return f"{where}: missing required key '{missing[0]}'"
    if kind == "type":
        return (
            f"{where}: expected {_expected_types(expected)}, got {_short(value)} "
            f"({_type_name(value)}){_number_hint(value, expected)}"
        )
    if kind in ("enum", "const"):
        allowed = ", ".join(str(a) for a in (expected if kind == "enum" else [expected]))
        return f"{where}: {_short(value)} is not allowed; choose one of: {allowed}"
    if kind in _BOUNDS:
        return f"{where}: must be {_BOUNDS[kind]} {expected}, got {_short(value)}"
    if kind == "minItems":
        return _describe_too_short(where, error)
    if kind == "maxItems":
        return f"{where}: takes at most {expected} items, got {len(value)}"
    if kind == "uniqueItems":
        return f"{where}: {_short(value)} repeats a value; list each value once"
    if kind == "minProperties":
        return f"{where}: must define at least {expected} entry"
    if kind == "minLength":
        return f"{where}: must not be empty"
    if kind == "pattern":
        return _describe_pattern(where, error)
    if kind == "anyOf":  # e.g. a number or `auto`: the key's description says which in words
        description = " ".join(error.schema.get("description", "").split())
        return f"{where}: {_short(value)} is not allowed. {description}"
    return f"{where}: {' '.join(error.message.split())}"


def _describe_too_short(where: str, error: ValidationError) -> str:
    needed, value = error.validator_value, error.instance
    if needed > 1:
        return f"{where}: needs at least {needed} items, got {len(value)}"
    if error.schema.get("type") != "array":  # a scalar would do as well (runs fields)
        return f"{where}: empty list; give a single value or a non-empty list"
    return f"{where}: empty list; give at least one item"


def _describe_unknown_key(error: ValidationError) -> str:
    where = _key_path(error.absolute_path)
    key = _unknown_keys(error)[0]
    properties = error.schema.get("properties", {})
    allowed = list(properties)
    level = f"in {where}" if where else "at the top level"
    # Inside a variant (tokenizer kind, corpus source, ...) the allowed keys depend on it.
    variant = [f"{k}: {s['const']}" for k, s in properties.items() if "const" in s]
    if variant:
        level += f" with {variant[0]}"
    path = _key_path([*error.absolute_path, key])
    if path in REPLACED_KEYS:
        return f"{path}: {REPLACED_KEYS[path]}"
    moved = MOVED_KEYS.get(path) or MOVED_KEYS.get(str(key))
    if moved:
        return f"{path}: moved to {moved}; where a study runs is not part of what it studies"
    line = f"{path}: unknown key {level}; allowed keys: "
    line += ", ".join(allowed)
    guess = difflib.get_close_matches(str(key), allowed, n=1)
    if guess:
        line += f" (did you mean '{guess[0]}'?)"
    if where == "checkpoints":
        # Easy to hit when merging several --configfile files, key by key.
        line += "; checkpoints take either {start, linear_from, every} or {tokens: [...]}, not both"
    return line


def _describe_pattern(where: str, error: ValidationError) -> str:
    # The pattern itself is unreadable for most users; the key's description says it in words.
    description = " ".join(error.schema.get("description", "").split())
    if "propertyNames" in error.relative_schema_path:
        return f"{where}: name {_short(error.instance)} is not allowed. {description}"
    return f"{where}: {_short(error.instance)} is not allowed. {description}"


def _expected_types(expected: str | list[str]) -> str:
    names = [_TYPE_NAMES.get(t, t) for t in _as_list(expected)]
    return " or ".join(names)


def _number_hint(value: Any, expected: str | list[str]) -> str:
    """How to write a number that was given as text or as the wrong kind of number."""
    if isinstance(value, bool) or not isinstance(value, str | float):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if "integer" in _as_list(expected) and number.is_integer():
        return f"; write {int(number)}"
    if isinstance(value, str) and "number" in _as_list(expected):
        return f"; YAML took it as text, write {_yaml_float(number)} (no quotes)"
    return ""


def _yaml_float(number: float) -> str:
    """``number`` as PyYAML (YAML 1.1) reads a float: with a dot, and a sign on the exponent."""
    text = repr(number)
    if "e" not in text:
        return text
    mantissa, exponent = f"{number:e}".split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"


# --------------------------------------------------------------------------------------------
# Semantic checks (the config is schema-valid and has its defaults here)


def _entry_training(config: dict, index: int) -> dict:
    """The training recipe of runs entry ``index``: `training` with the entry's overrides."""
    return {**config["training"], **config["runs"][index].get("training", {})}


def _check_semantics(config: dict) -> list[tuple[int, Run]]:
    """Check the config; return every run with the index of its runs entry."""
    _check_models(config["models"])
    _check_law_model(config)
    for name, dataset in config["datasets"].items():
        _check_dataset(name, dataset)
        _check_chain_source(config["datasets"], dataset.get("grid", name), dataset)
    budgets = [_entry_training(config, i)["tokens"] for i in range(len(config["runs"]))]
    _check_checkpoints(config["checkpoints"], max([config["training"]["tokens"], *budgets]))
    runs = _check_run_names(config)
    for index, run in runs:
        _check_run(config, index, run)
    return runs


def _check_law_model(config: dict) -> None:
    law_model = config["lawfit"]["model"]
    names = [*config["models"], *config.get("suites", {})]  # a suite is a model of its own
    if law_model is not None and law_model not in names:
        raise ConfigError(
            f"lawfit.model: {law_model!r} is not a model or suite; use one of "
            f"{', '.join(sorted(names))} or null (every run)"
        )


def _check_suites(config: dict) -> dict:
    """The suites, checked (``ihsweep.probing.suite.check_suite``)."""
    suites = config.get("suites", {})
    for name, suite in suites.items():
        try:
            check_suite(name, suite)
        except SuiteError as err:
            raise ConfigError(str(err)) from None
    return suites


def _check_models(models: dict) -> None:
    for name, model in models.items():
        d_model, n_head = model["d_model"], model["n_head"]
        if d_model % n_head:
            below = d_model - d_model % n_head
            raise ConfigError(
                f"models.{name}.d_model: {d_model} is not divisible by n_head = {n_head}; "
                f"use a multiple of {n_head} (e.g. {below or n_head} or {below + n_head}) "
                f"or change n_head"
            )


def _check_dataset(name: str, dataset: dict) -> None:
    corpus = dataset.get("corpus", {})
    if corpus.get("source") == "files":
        for i, pattern in enumerate(corpus["paths"]):
            if not glob.glob(pattern, recursive=True):
                raise ConfigError(
                    f"datasets.{name}.corpus.paths[{i}]: {pattern!r} matches no file "
                    f"(paths are relative to {Path.cwd()}); fix the path or create the file"
                )
    elif corpus.get("source") == "huggingface":
        try:  # a local folder or data file that is not there, keys that do not apply
            check_huggingface(corpus)
        except CorpusError as err:
            raise ConfigError(str(err.within(f"datasets.{name}.corpus"))) from None
    repetition = dataset.get("repetition")
    if repetition:
        lo, hi = repetition["copy_length"]
        if lo > hi:
            raise ConfigError(
                f"datasets.{name}.repetition.copy_length: lo = {lo} is above hi = {hi}; "
                f"give [lo, hi] with lo <= hi"
            )


def _check_chain_source(datasets: dict, name: str, dataset: dict) -> None:
    chain = dataset.get("chain", {})
    if chain.get("kind") != "bigram":
        return
    source = chain["source"]
    natural = sorted(k for k, d in datasets.items() if d["family"] == "natural")
    if datasets.get(source, {}).get("family") != "natural":
        what = "is not a natural dataset" if source in datasets else "is not a dataset"
        raise ConfigError(
            f"datasets.{name}.chain.source: {source!r} {what}; a bigram chain counts the tokens "
            f"of a natural dataset: " + (", ".join(natural) or "define one under datasets")
        )


def _check_checkpoints(checkpoints: dict, budget: int) -> None:
    if "tokens" in checkpoints:
        for i, t in enumerate(checkpoints["tokens"]):
            if t > budget:
                raise ConfigError(
                    f"checkpoints.tokens[{i}]: {t} is beyond the budget training.tokens = "
                    f"{budget}; drop it or raise training.tokens"
                )
        return
    start, linear_from = checkpoints["start"], checkpoints["linear_from"]
    if start > budget:
        raise ConfigError(
            f"checkpoints.start: {start} is beyond the budget training.tokens = {budget}; "
            f"lower start or raise training.tokens"
        )
    if start > linear_from:
        raise ConfigError(
            f"checkpoints.start: {start} is above linear_from = {linear_from}; "
            f"make start <= linear_from"
        )


def _read_densify(checkpoints: dict) -> dict | None:
    """``checkpoints.densify`` with its law read (from the config or a lawfit.json); None = off."""
    densify = checkpoints.get("densify")
    if densify is None:
        return None
    given = [key for key in ("law", "lawfit") if key in densify]
    if len(given) == 2:
        raise ConfigError(
            "checkpoints.densify: gives both law and lawfit; give one of them (law: {a, b, "
            "log10_T}, or lawfit: the path of a pilot study's lawfit.json)"
        )
    if not given:
        raise ConfigError(
            "checkpoints.densify: no law to predict from; give lawfit: <path of a pilot study's "
            "lawfit.json> or law: {a, b, log10_T}"
        )
    if "law" in densify:
        law, source = densify["law"], "config"
        for key in LAW_KEYS:
            if not math.isfinite(law[key]):
                raise ConfigError(
                    f"checkpoints.densify.law.{key}: {law[key]!r} is not a finite number; "
                    f"give a number"
                )
    else:
        source = densify["lawfit"]
        law = _read_lawfit(source)
    return {
        "law": {key: float(law[key]) for key in LAW_KEYS},
        "source": source,
        "window_decades": densify["window_decades"],
        "per_decade": densify["per_decade"],
    }


def _read_lawfit(path: str) -> dict:
    """The fitted law of a lawfit.json (``ihsweep.analysis.lawfit.fit_law``'s output)."""
    where = f"checkpoints.densify.lawfit: {path!r}"
    file = Path(path)
    if not file.is_file():
        what = "is not a file" if file.exists() else "does not exist"
        raise ConfigError(
            f"{where} {what} (paths are relative to {Path.cwd()}); fix the path, or {LAW_FIX}"
        )
    try:
        fit = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where} cannot be read ({err}); fix the file, or {LAW_FIX}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{where} is not valid JSON ({err}); rerun the pilot's law fit, or {LAW_FIX}"
        ) from None
    if not isinstance(fit, dict):
        raise ConfigError(
            f"{where} holds {_type_name(fit)}, not a law fit (an object with a, b, log10_T); "
            f"{LAW_FIX}"
        )
    if fit.get("ok", True) is not True:
        reason = fit.get("reason") or "no reason given"
        raise ConfigError(
            f"{where} holds no fitted law (ok: {fit.get('ok')!r}: {reason}); run the pilot "
            f"until its law fits, or give checkpoints.densify.law: {{a, b, log10_T}}"
        )
    for key in LAW_KEYS:
        value = fit.get(key)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or not math.isfinite(value):
            got = "it is missing" if key not in fit else f"got {_short(value)}"
            raise ConfigError(
                f"{where} has no numeric {key} ({got}); rerun the pilot's law fit, or {LAW_FIX}"
            )
    return fit


def _check_prediction(study: Study, index: int, run: Run) -> None:
    with np.errstate(over="ignore"):
        prediction = study.prediction(run)
    if prediction is not None and not math.isfinite(prediction["updates"]):
        key = "law" if study.densify["source"] == "config" else "lawfit"
        raise ConfigError(
            f"checkpoints.densify.{key}: the law {study.densify['law']} predicts more updates "
            f"than a float holds for run {run.id} (runs[{index}]); check a, b and log10_T"
        ) from None


def _check_run_names(config: dict) -> list[tuple[int, Run]]:
    """Expand the grid, rejecting unknown names and runs listed twice."""
    known = {"data": config["datasets"], "model": config["models"]}
    what = {"data": "dataset", "model": "model"}
    for index, entry in enumerate(config["runs"]):
        for key in ("data", "model"):
            for name in _as_list(entry[key]):
                if name not in known[key]:
                    raise ConfigError(
                        f"runs[{index}].{key}: unknown {what[key]} {name!r}; known "
                        f"{what[key]}s: " + ", ".join(sorted(known[key]))
                    )
    seen: dict[Run, int] = {}
    runs = []
    for index, run in expand_runs(config["runs"]):
        if run in seen:
            where = "earlier in the same entry" if seen[run] == index else f"in runs[{seen[run]}]"
            raise ConfigError(f"runs[{index}]: run {run.id} is already {where}; list each run once")
        seen[run] = index
        runs.append((index, run))
    return runs


def _check_run(config: dict, index: int, run: Run) -> None:
    model = config["models"][run.model]
    dataset = config["datasets"][run.data]
    budget = _entry_training(config, index)["tokens"]
    C = run.context_size
    if C > model["n_ctx"]:
        raise ConfigError(
            f"runs[{index}].context_size: C = {C} exceeds models.{run.model}.n_ctx = "
            f"{model['n_ctx']}; use C <= {model['n_ctx']} or raise n_ctx"
        )
    if budget < run.tokens_per_step:
        raise ConfigError(
            f"training.tokens: {budget} is less than one update of run {run.id} "
            f"(B*C = {run.tokens_per_step}, runs[{index}]); raise training.tokens to at least "
            f"{run.tokens_per_step}"
        )
    _check_copy_fits(dataset, run, index)
    if dataset["family"] == "markov":
        _check_markov_fits(config, dataset, run, index)
    _check_probe_fits(config, dataset, run, index)


def _check_copy_fits(dataset: dict, run: Run, index: int) -> None:
    from ihsweep.data.natural import copy_length_range

    repetition = dataset.get("repetition")
    if not repetition or not repetition["copy_fraction"]:
        return
    try:  # the chunk step's own rounding: what passes here is what it accepts
        copy_length_range(repetition["copy_length"], run.context_size)
    except ValueError as err:
        raise ConfigError(
            f"datasets.{run.data}.repetition.copy_length: {err} (runs[{index}])"
        ) from None


def _check_markov_fits(config: dict, dataset: dict, run: Run, index: int) -> None:
    from ihsweep.data.markov import MIN_CONTEXT, context_start_probability

    C, where = run.context_size, f"datasets.{dataset['grid']}"
    if C < MIN_CONTEXT:
        raise ConfigError(
            f"runs[{index}].context_size: C = {C} is too short for the Markov dataset "
            f"{run.data}; use C >= {MIN_CONTEXT}"
        )
    vocab = _vocab_size(dataset, config["datasets"])
    if vocab < C:
        key = "vocab_size" if dataset["chain"]["kind"] == "synthetic" else "vocab_cap"
        raise ConfigError(
            f"{where}.chain.{key}: V = {vocab} < C = {C} (runs[{index}]): a never-seen type must "
            f"always remain; raise it to at least {C} or use a shorter context"
        )
    try:
        context_start_probability(
            dataset["frequency"], dataset["reliability"], C, dataset["calibration"]
        )
    except ValueError as err:
        raise ConfigError(f"{where}.frequency: {err} (runs[{index}])") from None


def _check_probe_fits(config: dict, dataset: dict, run: Run, index: int) -> None:
    min_layer = config["probe"]["min_layer"]
    n_layer = config["models"][run.model]["n_layer"]
    if min_layer >= n_layer:
        raise ConfigError(
            f"probe.min_layer: {min_layer} leaves no heads in models.{run.model} "
            f"({n_layer} layer{'s' if n_layer > 1 else ''}, runs[{index}]); use probe.min_layer: "
            f"{n_layer - 1} or give the model more layers"
        )
    C = run.context_size
    cap = config["probe"]["max_half_length"]
    s = min(cap, C // 2)
    if s < 2:
        raise ConfigError(
            f"runs[{index}].context_size: C = {C} leaves the probe half length "
            f"s = min({cap}, C // 2) = {s} < 2; use C >= 4"
        )
    vocab = _vocab_size(dataset, config["datasets"])
    if s > vocab:
        raise ConfigError(
            f"probe.max_half_length: s = min({cap}, C // 2) = {s} for C = {C} (runs[{index}]) "
            f"exceeds the {vocab}-token vocabulary of datasets.{run.data}; lower "
            f"probe.max_half_length to at most {vocab} or enlarge the vocabulary"
        )


def _check_memory(study: Study, index: int, run: Run) -> None:
    """A run must fit its device's memory at its micro-batch (``ihsweep.cost.peak_memory``)."""
    limit = study.memory_limit
    where = (
        f"device profile {study.profile['name']}"
        if study.profile["memory_gb"] is not None
        else "execution.train_mem_mb"
    )
    micro_batch = study.micro_batch(run)
    if micro_batch is None:
        need = study.peak_memory(run, 1)["total"]
        raise ConfigError(
            f"runs[{index}]: run {run.id} does not fit in memory even one sequence at a time: "
            f"~{need / cost.GB:.1f} GB estimated at micro-batch 1 against {limit / cost.GB:.1f} "
            f"GB ({where}, {cost.MEMORY_MARGIN:.0%} usable); use a smaller model or context, or "
            f"a device with more memory"
        )
    need = study.peak_memory(run, micro_batch)["total"]
    if need > cost.MEMORY_MARGIN * limit:
        fitting = study.micro_batch(run, "auto")
        raise ConfigError(
            f"execution.micro_batch: run {run.id} (runs[{index}]) needs ~{need / cost.GB:.1f} GB "
            f"at micro-batch {micro_batch}, more than {cost.MEMORY_MARGIN:.0%} of "
            f"{limit / cost.GB:.1f} GB ({where}); set micro_batch: auto"
            + (f" (it fits at {fitting})" if fitting else " (it does not fit even at 1)")
        )


def _vocab_size(dataset: dict, datasets: dict) -> int:
    """The configured vocabulary size (an upper bound for bpe and bigram chains)."""
    chain = dataset.get("chain")
    if chain is not None:
        if chain["kind"] == "synthetic":
            return chain["vocab_size"]
        return min(chain["vocab_cap"], _vocab_size(datasets[chain["source"]], datasets))
    tokenizer = dataset.get("tokenizer", {"kind": "gpt2"})
    if tokenizer["kind"] == "bpe":
        return tokenizer["vocab_size"]
    return GPT2_VOCAB_SIZE
