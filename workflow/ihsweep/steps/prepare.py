"""Every check of a study config before any job exists: ``prepare``, which the Snakefile calls.

``ihsweep.config.read_study`` checks the config against its schema and by what the config
alone can tell; ``prepare`` adds the checks that need the layers below this one, each with the
code that will run the step, so that what passes here is what the step accepts:

- a hub corpus's local files and keys, a local corpus's folders and encoding
  (``ihsweep.data.corpus``);
- copy lengths that fit the context (``ihsweep.data.natural``), Markov cells whose
  repetition frequency the context can carry (``ihsweep.data.markov``);
- checkpoint suites (``ihsweep.probing.suite``), and a note when they come from the hub;
- the device profile, and every run's memory at its micro-batch (``ihsweep.cost.study``).

It stops at the first problem with a one-line ``ConfigError`` that names the key and the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ihsweep.config import SCHEMA, ConfigError, Run, Study, expand_runs, read_study
from ihsweep.config.study import configured_vocab_size
from ihsweep.cost import GB, MEMORY_MARGIN
from ihsweep.cost.study import StudyCost
from ihsweep.data.corpus import CorpusError, check_files, check_huggingface
from ihsweep.data.markov import MIN_CONTEXT, context_start_probability
from ihsweep.data.natural import copy_length_range
from ihsweep.probing.suite import SuiteError, check_suite, hub_note


def prepare(config: dict, schema: str | Path = SCHEMA) -> Study:
    """Validate ``config`` (filling in defaults, in place) and derive the study from it.

    Raises ConfigError with a one-line message at the first problem found.
    """
    study = read_study(config, schema)
    _check_suites(config)
    try:
        costed = StudyCost(study)
    except ValueError as err:
        raise ConfigError(f"execution.device_profile: {err}") from None
    for name, dataset in config["datasets"].items():
        _check_corpus(name, dataset)
    for index, run in expand_runs(config["runs"]):
        dataset = config["datasets"][run.data]
        _check_copy_fits(dataset, run, index)
        if dataset["family"] == "markov":
            _check_markov_fits(config, dataset, run, index)
        _check_memory(costed, index, run)
    return study


def _check_corpus(name: str, dataset: dict) -> None:
    corpus = dataset.get("corpus", {})
    check = {"huggingface": check_huggingface, "files": check_files}.get(corpus.get("source"))
    if check is None:
        return
    try:  # a local folder or data file that is not there, keys that do not apply, encoding
        check(corpus)
    except CorpusError as err:
        raise ConfigError(str(err.within(f"datasets.{name}.corpus"))) from None


def _check_suites(config: dict) -> None:
    """The suites, checked (``ihsweep.probing.suite.check_suite``); one line on stderr when
    probe jobs will download from the hub, saying how to use local copies instead."""
    suites = config.get("suites", {})
    for name, suite in suites.items():
        try:
            check_suite(name, suite, probe=config["probe"])
        except SuiteError as err:
            raise ConfigError(str(err)) from None
    if note := hub_note(suites):
        print(note, file=sys.stderr)


def _check_copy_fits(dataset: dict, run: Run, index: int) -> None:
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
    C, where = run.context_size, f"datasets.{dataset['grid']}"
    if C < MIN_CONTEXT:
        raise ConfigError(
            f"runs[{index}].context_size: C = {C} is too short for the Markov dataset "
            f"{run.data}; use C >= {MIN_CONTEXT}"
        )
    vocab = configured_vocab_size(dataset, config["datasets"])
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


def _check_memory(costed: StudyCost, index: int, run: Run) -> None:
    """A run must fit its device's memory at its micro-batch (``ihsweep.cost.peak_memory``)."""
    limit = costed.memory_limit
    where = (
        f"device profile {costed.profile['name']}"
        if costed.profile["memory_gb"] is not None
        else "execution.train_mem_mb"
    )
    micro_batch = costed.micro_batch(run)
    if micro_batch is None:
        need = costed.peak_memory(run, 1)["total"]
        raise ConfigError(
            f"runs[{index}]: run {run.id} does not fit in memory even one sequence at a time: "
            f"~{need / GB:.1f} GB estimated at micro-batch 1 against {limit / GB:.1f} "
            f"GB ({where}, {MEMORY_MARGIN:.0%} usable); use a smaller model or context, or "
            f"a device with more memory"
        )
    need = costed.peak_memory(run, micro_batch)["total"]
    if need > MEMORY_MARGIN * limit:
        fitting = costed.micro_batch(run, "auto")
        raise ConfigError(
            f"execution.micro_batch: run {run.id} (runs[{index}]) needs ~{need / GB:.1f} GB "
            f"at micro-batch {micro_batch}, more than {MEMORY_MARGIN:.0%} of "
            f"{limit / GB:.1f} GB ({where}); set micro_batch: auto"
            + (f" (it fits at {fitting})" if fitting else " (it does not fit even at 1)")
        )
