"""Every path under ``results/``: the one place that says where each file of a study lives.

The rules (workflow/rules/*.smk), the steps (``ihsweep.steps``), ``ihsweep.status`` and the tests
build paths with these functions. Called with no arguments, a function returns the path as a
Snakemake pattern over the rules' wildcards (``{data}``, ``{model}``, ``{batch}``, ``{ctx}``,
``{seed}``, ``{grid}``, ``{suite}`` and the keys ``{dkey}``, ``{ckey}``, ``{rkey}``, ``{skey}``,
``{pkey}``, ``{fkey}``); called with values, the concrete path::

    results/data/<data>-<dkey>/tokens.bin, tokenizer.json, tokens.json   natural: tokenize
    results/chains/<grid>-<ckey>/chain.npy, stationary.npy, chain.json    Markov: chain
    results/data/<data>-<dkey>/C<C>/train.bin, val.bin, chunks.json       both: chunk
    results/runs/<data>/<model>/B<B>-C<C>-s<seed>-<rkey>/                 train (run.json)
        ckpt/ state/ loss.csv progress.json
        tensorboard/train/, tensorboard/probe-<pkey>/                     event files (derived)
        probes/<pkey>/heads.parquet, model.parquet, cache/                probe
        figures/<fkey>/run.png, run.pdf, provenance.json                  run_figure
        hf/                                                               export (GPT-2 folder)
    results/suites/<suite>-<skey>/probes/<pkey>/heads.parquet, ...         probe_suite
        fingerprints.parquet, duplicates.csv, duplicates.html          (fingerprints)
        cache/<revision>.parquet                                         (each revision)
    results/studies/<study>/natural/, markov/                             a study's aggregates
    results/studies/<study>/natural/heldout/                               heldout_natural
    results/logs/<rule>/<job>.log

A key is ``settings_key`` of everything that decides a folder's files (``ihsweep.config.keys``
says what goes into each): two studies that give one name other settings get two folders, and
equal settings under one name share one folder, computed once. Names stay readable; a run's
readable id (``run_name``) is what tables, ``status`` and the report show.

A run folder's own files (checkpoints, resume state) are the training package's format
(``ihsweep.training.checkpoints``); the names the rest of the pipeline reads are here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The metadata file an export writes beside its model (ihsweep.training.hf_export), and
# that a suite of exports is read by (ihsweep.probing.suite).
EXPORT_SPEC = "ihsweep_spec.json"

RESULTS = "results"

# Files of a run folder that other steps and ``status`` read.
RUN_JSON = "run.json"  # the completion record: the train rule's declared output
PROGRESS_JSON = "progress.json"  # written while training (state, step, tokens, speed)
LOSS_CSV = "loss.csv"
# TensorBoard event files: train/ (the training job), probe-<pkey>/ (the probe step)
TENSORBOARD = "tensorboard"
PROBE_TABLES = ("heads", "model")
RUN_FIGURE = "run"  # figures/run.png and run.pdf
# Beside a suite's probe tables: its revisions' fingerprints and duplicate groups (a report page)
FINGERPRINTS = "fingerprints.parquet"
DUPLICATES = "duplicates.csv"
DUPLICATES_PAGE = "duplicates.html"
SUITE_FILES = (FINGERPRINTS, DUPLICATES, DUPLICATES_PAGE)

# Each data step writes its record last; a step that reads the data depends on the record alone.
TOKENS_JSON, CHAIN_JSON, CHUNKS_JSON = "tokens.json", "chain.json", "chunks.json"
TOKENIZE_FILES = ("tokens.bin", "tokenizer.json", TOKENS_JSON)
CHAIN_FILES = ("chain.npy", "stationary.npy", CHAIN_JSON)
CHUNK_FILES = ("train.bin", "val.bin", CHUNKS_JSON)

NATURAL_FIGURES = ("run_curves", "emergence_vs_BC", "law_fit", "model_size")
# findings.rst: the report front page's summary of the aggregate (ihsweep.report.findings)
FINDINGS = "findings.rst"
NATURAL_TABLES = (
    "emergence.csv", "lawfit.json", "lawfit.csv", "families.csv", "emergence.html", "lawfit.html",
    FINDINGS,
)  # fmt: skip
MARKOV_TABLES = (
    "emergence.csv", "cells.csv", "generator.csv", "emergence.html", "frontier.json", FINDINGS,
)  # fmt: skip
# The held-out validation of the law (heldout_natural), a folder of the natural aggregate's.
HELDOUT_TABLES = ("heldout.csv", "heldout.json", "heldout.html", FINDINGS)
HELDOUT_FIGURES = ("heldout",)
FIGURE_FORMATS = ("png", "pdf")
PROVENANCE = "provenance.json"


KEY_LENGTH = 8  # hex digits: readable, and a clash among a study's folders is ~1 in 4e9


def settings_key(settings: Any) -> str:
    """The key of a folder: a short hash of the settings that decide its files (JSON)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def keyed(name: str, key: str) -> str:
    """``<name>-<key>``: a folder's readable name and the key of its settings."""
    return f"{name}-{key}"


def unkeyed(folder: str) -> str:
    """The readable name of a keyed folder name (``keyed``'s inverse)."""
    name, _, key = folder.rpartition("-")
    if len(key) != KEY_LENGTH or not name:
        raise ValueError(f"{folder!r} is no keyed folder name (<name>-<{KEY_LENGTH} hex digits>)")
    return name


def dataset_dir(data: str = "{data}", key: str = "{dkey}") -> str:
    """A natural dataset's tokens (and the parent of every dataset's chunk folders)."""
    return f"{RESULTS}/data/{keyed(data, key)}"


def chunk_dir(data: str = "{data}", key: str = "{dkey}", context: Any = "{ctx}") -> str:
    return f"{dataset_dir(data, key)}/C{context}"


def chain_dir(grid: str = "{grid}", key: str = "{ckey}") -> str:
    return f"{RESULTS}/chains/{keyed(grid, key)}"


def dataset_file(name: str, data: str = "{data}", key: str = "{dkey}") -> str:
    """One of ``TOKENIZE_FILES`` of a natural dataset."""
    return f"{dataset_dir(data, key)}/{name}"


def chunk_file(name: str, data: str = "{data}", key: str = "{dkey}", context: Any = "{ctx}") -> str:
    """One of ``CHUNK_FILES`` of a dataset's chunks at one context size."""
    return f"{chunk_dir(data, key, context)}/{name}"


def chain_file(name: str, grid: str = "{grid}", key: str = "{ckey}") -> str:
    """One of ``CHAIN_FILES`` of a Markov chain."""
    return f"{chain_dir(grid, key)}/{name}"


def run_dir(run: Any = None, key: str = "{rkey}") -> str:
    """The folder of a run (an ``ihsweep.config.Run``), or its pattern when ``run`` is None."""
    return f"{RESULTS}/runs/{keyed(run_name(run), key)}"


def run_name(run: Any = None) -> str:
    """``<data>/<model>/B<B>-C<C>-s<seed>``: a run's readable id in tables, status and report."""
    if run is None:
        return "{data}/{model}/B{batch}-C{ctx}-s{seed}"
    return f"{run.data}/{run.model}/B{run.batch_size}-C{run.context_size}-s{run.seed}"


def run_file(name: str, run: Any = None, key: str = "{rkey}") -> str:
    return f"{run_dir(run, key)}/{name}"


def probe_dir(folder: str | Path, probe_key: str = "{pkey}") -> str:
    """The probe tables (and their cache) of a run or suite folder, for one probe setting."""
    return f"{folder}/probes/{probe_key}"


def probe_table(name: str, folder: str | Path, probe_key: str = "{pkey}") -> str:
    """``heads`` or ``model``: the probe tables (Parquet) of a run or suite folder."""
    return f"{probe_dir(folder, probe_key)}/{name}.parquet"


def suite_file(name: str, folder: str | Path, probe_key: str = "{pkey}") -> str:
    """One of ``SUITE_FILES`` of a suite folder, beside its probe tables."""
    return f"{probe_dir(folder, probe_key)}/{name}"


def probe_cache(folder: str | Path, name: str, probe_key: str = "{pkey}") -> str:
    """The cached probe result ``name`` (a suite's revision) of a run or suite folder."""
    return f"{probe_dir(folder, probe_key)}/cache/{name}.parquet"


def train_events_dir(folder: str | Path) -> str:
    """The training job's TensorBoard event files of a run folder."""
    return f"{folder}/{TENSORBOARD}/train"


def probe_events_dir(folder: str | Path, probe_key: str = "{pkey}") -> str:
    """The probe step's TensorBoard event files of a run folder, for one probe setting."""
    return f"{folder}/{TENSORBOARD}/probe-{probe_key}"


def export_dir(run: Any = None, key: str = "{rkey}") -> str:
    """A run's newest checkpoint as a Hugging Face GPT-2 folder (``ihsweep.training.hf_export``)."""
    return f"{run_dir(run, key)}/hf"


def suite_dir(suite: str = "{suite}", key: str = "{skey}") -> str:
    """A checkpoint suite's folder (``ihsweep.probing.suite``)."""
    return f"{RESULTS}/suites/{keyed(suite, key)}"


def run_figures(folder: str | Path, figure_key: str = "{fkey}") -> list[str]:
    """A run folder's figure files and their provenance record, for one figure setting."""
    figures = f"{folder}/figures/{figure_key}"
    return [*(f"{figures}/{RUN_FIGURE}.{ext}" for ext in FIGURE_FORMATS), f"{figures}/{PROVENANCE}"]


def log(rule: str, *job: str) -> str:
    """A job's log: ``logs/<rule>/<job parts joined by />.log``."""
    return f"{RESULTS}/logs/{rule}/{'/'.join(job)}.log"


def run_log(rule: str, run: Any = None, key: str = "{rkey}", *subkeys: str) -> str:
    """A run job's log, named by its folder (and the probe or figure key of what it made)."""
    return log(rule, keyed(run_name(run), key), *subkeys)


def study_dir(study: str) -> str:
    """A study's own folder (config ``study``). Runs, datasets and chains are shared by every
    study that has them; the aggregates over a study's runs are the study's own."""
    return f"{RESULTS}/studies/{study}"


def natural_dir(study: str) -> str:
    """The natural-data aggregate of a study: experiment 1 (and the checkpoint suites)."""
    return f"{study_dir(study)}/natural"


def markov_dir(study: str) -> str:
    """The Markov-data aggregate of a study: experiments 2 and 3."""
    return f"{study_dir(study)}/markov"


def heldout_dir(natural: str) -> str:
    """The held-out validation of the law fitted in a natural aggregate folder."""
    return f"{natural}/heldout"


def heldout_outputs(folder: str) -> list[str]:
    """Everything the held-out validation writes (``folder``: ``heldout_dir``)."""
    tables = [aggregate_file(name, folder) for name in (*HELDOUT_TABLES, PROVENANCE)]
    return tables + figure_files(HELDOUT_FIGURES, folder)


def aggregate_file(name: str, folder: str) -> str:
    """A table or record of an aggregate folder (``natural_dir``, ``markov_dir``, or another)."""
    return f"{folder}/{name}"


def figure_file(stem: str, folder: str, ext: str = "png") -> str:
    return f"{folder}/figures/{stem}.{ext}"


def figure_files(stems: Iterable[str], folder: str) -> list[str]:
    return [figure_file(stem, folder, ext) for stem in stems for ext in FIGURE_FORMATS]


def natural_outputs(folder: str) -> list[str]:
    """Everything the natural-data aggregate writes."""
    tables = [aggregate_file(name, folder) for name in (*NATURAL_TABLES, PROVENANCE)]
    return tables + figure_files(NATURAL_FIGURES, folder)


def setting_name(grid: str, model: str, batch_size: int, context_size: int) -> str:
    """``semi-w64-B16-C32``: one (f, r) sweep of a Markov entry, as it appears in file names."""
    return f"{grid}-{model}-B{batch_size}-C{context_size}"


def markov_figures(runs: Iterable[dict]) -> list[str]:
    """The Markov aggregate's figure stems, for runs given as mappings with ``data, grid,
    chain_kind, model, batch_size, context_size``: a frontier per setting over a bigram chain
    with more than one cell, the property grid when any chain is synthetic, the generator.

    The DAG (from the config) and the aggregate step (from its run table) both ask this."""
    cells: dict[tuple, set] = {}
    kinds = {}
    for run in runs:
        key = (run["grid"], run["model"], int(run["batch_size"]), int(run["context_size"]))
        cells.setdefault(key, set()).add(run["data"])
        kinds[run["grid"]] = run["chain_kind"]
    stems = [
        f"frontier-{setting_name(*key)}"
        for key in sorted(cells)
        if kinds[key[0]] == "bigram" and len(cells[key]) > 1
    ]
    if "synthetic" in kinds.values():
        stems.append("properties")
    return [*stems, "generator"]


def markov_outputs(figures: list[str], folder: str) -> list[str]:
    """Everything the Markov aggregate writes, given its figure stems (``markov_figures``)."""
    tables = [aggregate_file(name, folder) for name in (*MARKOV_TABLES, PROVENANCE)]
    return tables + figure_files(figures, folder)
