"""The checks a schema cannot express, on the config alone, and reading a study from files.

``read_study`` runs the schema (``ihsweep.config.schema``), then these checks (names that must
exist, sizes that must fit, the law ``checkpoints.densify`` reads), and builds the ``Study``.
Checks that need the data, probing or cost layers live above them, in ``ihsweep.steps.prepare``.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import math
import sys
from pathlib import Path

import numpy as np

from ihsweep.config.files import read_config_file
from ihsweep.config.overrides import coerce_overrides, parse_overrides
from ihsweep.config.schema import (
    SCHEMA,
    ConfigError,
    as_list,
    first_schema_problem,
    load_schema,
    short_repr,
    type_name,
)
from ihsweep.config.study import (
    LAW_KEYS,
    Run,
    Study,
    configured_vocab_size,
    expand_markov_grids,
    expand_runs,
    schedule_tokens,
)

LAW_FIX = "run the pilot study first, or give checkpoints.densify.law: {a, b, log10_T}"


def read_study(config: dict, schema: str | Path = SCHEMA) -> Study:
    """Validate ``config`` against the schema (filling in defaults, in place) and by the checks
    that need nothing but the config, and derive the study from it. Raises ConfigError with a
    one-line message at the first problem found. ``ihsweep.steps.prepare.prepare`` adds the checks
    that need the data, probing and cost layers; a tool that only reads a study's results
    (status, cost) needs no more than this."""
    problem = first_schema_problem(config, load_schema(schema))
    if problem:
        raise ConfigError(problem)
    suites = config.get("suites", {})
    if "runs" not in config:  # a study of checkpoint suites only: nothing to train
        config.update(models={}, datasets={}, runs=[])
        _check_law_model(config)
        return Study(config=config, runs=[], suites=suites)

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
        checkpoint_tokens=tokens,
        grids=grids,
        overrides=overrides,
        densify=densify,
        suites=suites,
    )
    for index, run in indexed:
        _check_prediction(study, index, run)
    return study


def load_configfiles(paths: list[Path]) -> dict:
    """Several YAML files merged in order, as ``snakemake --configfile a b`` merges them, each
    read strictly (``read_config_file``: ``ConfigError`` naming the file and line)."""
    from snakemake.utils import update_config

    config: dict = {}
    for path in paths:
        update_config(config, read_config_file(path))
    return config


def add_configfile(parser: argparse.ArgumentParser) -> None:
    """The ``--configfile`` and ``--config`` flags of the command-line tools (status, cost,
    where, stopping), as Snakemake's."""
    parser.add_argument("--configfile", nargs="+", default=[Path("config.yaml")], type=Path)
    parser.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="""override config keys as snakemake --config does: 'training={"tokens": 80000}'""",
    )


def study_of_files(paths: list[Path], overrides: list[str] = ()) -> Study:
    """The study (``read_study``) of a reading tool's ``--configfile`` files patched by its
    ``--config`` entries; ``ConfigError`` with its one-line message, as the Snakefile gives it."""
    config = load_configfiles(paths)
    if overrides:
        from snakemake.utils import update_config

        parsed = parse_overrides(overrides)
        update_config(config, parsed)
        coerce_overrides(config, parsed)
    return read_study(config)


def reports_config_errors(main):
    """A reading tool's ``main``: a bad config is one line on stderr, ``config error: ...``, and
    exit status 1, as the Snakefile ends on it; the package itself never exits the process."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except ConfigError as err:
            print(f"config error: {err}", file=sys.stderr)
            return 1

    return wrapped


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
    _check_budgets_reach_a_checkpoint(config, budgets)
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
        _check_family(name, model)


def _check_family(name: str, model: dict) -> None:
    if model["family"] != "llama":
        if "rope_base" in model:
            raise ConfigError(
                f"models.{name}.rope_base applies to family llama only (rotary positions); "
                f"remove it or set models.{name}.family: llama"
            )
        return
    d_head = model["d_model"] // model["n_head"]
    if d_head % 2:
        raise ConfigError(
            f"models.{name}: RoPE rotates pairs of dimensions, but the head dimension "
            f"d_model / n_head = {d_head} is odd; use an even d_model / n_head"
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


def _check_budgets_reach_a_checkpoint(config: dict, budgets: list[int]) -> None:
    """Every run's budget reaches the schedule's first checkpoint: a run that ends before it
    has its last step alone to probe, and no emergence point can come of it."""
    first = schedule_tokens(config["checkpoints"], max([config["training"]["tokens"], *budgets]))
    if not first:
        return
    for index, budget in enumerate(budgets):
        if budget < first[0]:
            own = "tokens" in config["runs"][index].get("training", {})
            key = f"runs[{index}].training.tokens" if own else "training.tokens"
            raise ConfigError(
                f"{key}: {budget} tokens end before the first checkpoint at {first[0]} tokens"
                f" (checkpoints); raise the budget or start the checkpoints earlier"
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
            f"{where} holds {type_name(fit)}, not a law fit (an object with a, b, log10_T); "
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
            got = "it is missing" if key not in fit else f"got {short_repr(value)}"
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
            for name in as_list(entry[key]):
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
    _check_probe_fits(config, dataset, run, index)


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
    vocab = configured_vocab_size(dataset, config["datasets"])
    if 2 * s > vocab:  # the control batch's rows hold 2s distinct ids
        raise ConfigError(
            f"probe.max_half_length: the probe's 2s = 2 min({cap}, C // 2) = {2 * s} distinct "
            f"tokens for C = {C} (runs[{index}]) exceed the {vocab}-token vocabulary of "
            f"datasets.{run.data}; lower probe.max_half_length to at most {vocab // 2} or "
            f"enlarge the vocabulary"
        )
