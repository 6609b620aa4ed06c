"""Config validation: bad configs fail through the real command line with one clear line.

Each bad case is an override merged into the study tests/studies/base.yaml (mappings merge key by
key, lists replace: what several ``--configfile`` files do), so a case states only what it
breaks. The expected fragments are the key path and the allowed values or the fix.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import REPO, SCHEMA, job_stats, snakemake, study_text
from ihsweep import cost
from ihsweep.config import (
    MOVED_KEYS,
    ConfigError,
    Run,
    checkpoint_steps,
    complete,
    load_schema,
    study_definition,
)
from ihsweep.cost.study import StudyCost
from ihsweep.data.natural import copy_length_range, draw_copies
from ihsweep.files import layout
from ihsweep.report.provenance import config_sha256
from ihsweep.steps.prepare import prepare
from snakemake.utils import update_config

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL_DIR = layout.natural_dir("default")
MARKOV_DIR = layout.markov_dir("default")

BASE = study_text("base")
RUNS_TINY = "runs: [{data: kjv-copy, model: tiny, batch_size: 8, context_size: %s}]"

# (case id, override YAML, fragments the one-line message must contain)
CLI_CASES = [
    ("wrong-type", "training: {lr: fast}", ["training.lr", "expected a number", "'fast'"]),
    (
        "unknown-top-level-key",
        "trainig: {lr: 0.1}",
        ["trainig", "unknown key at the top level", "training, checkpoints", "did you mean"],
    ),
    (
        "unknown-nested-key",
        "models: {tiny: {n_heads: 4}}",
        [
            "models.tiny.n_heads",
            "allowed keys: family, n_layer, n_head, d_model, mlp, n_ctx, rope_base",
        ],
    ),
    (
        "unknown-model",
        "runs: [{data: kjv-copy, model: huge, batch_size: 8, context_size: 32}]",
        ["runs[0].model", "'huge'", "known models: medium, small, tiny"],
    ),
    (
        "unknown-dataset",
        "runs: [{data: wiki, model: tiny, batch_size: 8, context_size: 32}]",
        ["runs[0].data", "'wiki'", "known datasets: kjv-copy"],
    ),
    (
        "context-beyond-n_ctx",
        RUNS_TINY % 256,
        ["runs[0].context_size", "C = 256", "models.tiny.n_ctx = 128", "C <= 128"],
    ),
    (
        "schedule-beyond-budget",
        "checkpoints: {start: 7000000, linear_from: 8000000}",
        ["checkpoints.start", "7000000", "training.tokens = 6000000"],
    ),
    (
        "missing-corpus-file",
        "datasets: {kjv-copy: {corpus: {source: files, paths: [corpus/nope-*.txt]}}}",
        ["datasets.kjv-copy.corpus.paths[0]", "'corpus/nope-*.txt' matches no file"],
    ),
    (
        "bad-enum",
        "emergence: {method: bisect}",
        ["emergence.method", "'bisect'", "breakpoint, sigmoid"],
    ),
    (
        "negative-batch-size",
        "runs: [{data: kjv-copy, model: tiny, batch_size: [8, -16], context_size: 32}]",
        ["runs[0].batch_size[1]", "must be >= 1", "-16"],
    ),
    (
        "fraction-above-one",
        "datasets: {kjv-copy: {repetition: {copy_fraction: 1.5}}}",
        ["datasets.kjv-copy.repetition.copy_fraction", "must be <= 1", "1.5"],
    ),
    (
        "d_model-not-divisible",
        "models: {tiny: {d_model: 66}}",
        ["models.tiny.d_model", "not divisible by n_head = 4", "64 or 68"],
    ),
    (
        "unknown-model-family",
        "models: {tiny: {family: mistral}}",
        ["models.tiny.family", "gpt2", "llama"],
    ),
    (
        "odd-head-dimension-under-rope",
        "models: {tiny: {family: llama, d_model: 60, n_head: 4}}",
        ["models.tiny", "RoPE", "d_model / n_head = 15 is odd"],
    ),
    (
        "family-key-where-it-does-not-apply",
        "models: {tiny: {rope_base: 500}}",
        ["models.tiny.rope_base", "family llama only", "models.tiny.family: llama"],
    ),
    (
        "budget-below-one-update",
        "training: {tokens: 1000}\ncheckpoints: {start: 100, linear_from: 200, every: 100}",
        ["training.tokens", "B*C = 1024", "at least 1024"],
    ),
    (
        "copy-too-long",
        "datasets: {kjv-copy: {repetition: {copy_length: [0.25, 0.6]}}}",
        ["datasets.kjv-copy.repetition.copy_length", "C = 32", "hi <= 0.5"],
    ),
    (
        "empty-list-in-runs",
        "runs: [{data: kjv-copy, model: [], batch_size: 8, context_size: 32}]",
        ["runs[0].model", "empty list", "non-empty list"],
    ),
    (
        "duplicate-runs",
        "runs: [{data: kjv-copy, model: tiny, batch_size: 8, context_size: 32},"
        " {data: kjv-copy, model: [small, tiny], batch_size: 8, context_size: 32}]",
        ["runs[1]", "kjv-copy/tiny/B8-C32-s0", "already in runs[0]"],
    ),
    (
        "bad-device",
        "execution: {device: gpu}",
        ["execution.device", "'gpu'", "auto", "cuda:N"],
    ),
    (
        "moved-training-device",
        "training: {device: cpu}",
        ["training.device", "moved to execution.device"],
    ),
]

# Checked through prepare() only: the CLI path is the same for every message.
MARKOV = """
datasets:
  syn:
    family: markov
    chain: {kind: synthetic, vocab_size: 64}
    frequency: %s
    reliability: 0.9
runs: [{data: syn, model: tiny, batch_size: 8, context_size: %s}]
"""
BIGRAM = """
datasets:
  semi:
    family: markov
    chain: {kind: bigram, source: %s, vocab_cap: 64}
    frequency: 0.5
    reliability: 0.5
runs: [{data: semi, model: tiny, batch_size: 8, context_size: 32}]
"""

DIRECT_CASES = [
    (
        "probe-min-layer-beyond-the-model",
        "probe: {min_layer: 2}",
        ["probe.min_layer: 2 leaves no heads in models.tiny (2 layers", "probe.min_layer: 1"],
    ),
    (
        "lawfit-unknown-model",
        "lawfit: {model: w99}",
        ["lawfit.model: 'w99' is not a model", "tiny"],
    ),
    (
        "markov-unreachable-frequency",
        MARKOV % (0.9, 16),
        ["datasets.syn.frequency: requested f=0.9", "unreachable", "runs[0]"],
    ),
    (
        "markov-vocab-below-context",
        MARKOV % (0.5, 65),  # C = 65: the probe's 2s = 64 still fits the vocabulary
        ["datasets.syn.chain.vocab_size", "V = 64 < C = 65", "at least 65"],
    ),
    ("markov-context-too-short", MARKOV % (0.1, 4), ["runs[0].context_size", "C >= 5"]),
    (
        "bigram-source-not-natural",
        BIGRAM % "semi",
        ["datasets.semi.chain.source", "'semi' is not a natural dataset", "kjv-copy"],
    ),
    (
        "bigram-source-unknown",
        BIGRAM % "wiki",
        ["datasets.semi.chain.source", "'wiki' is not a dataset", "kjv-copy"],
    ),
    (
        "markov-chain-variant-key",
        "datasets: {syn: {family: markov, chain: {kind: bigram, source: kjv-copy, vocab_cap: 64,"
        " marginal: zipfian}, frequency: 0.5, reliability: 0.5}}",
        ["datasets.syn.chain.marginal", "with kind: bigram"],
    ),
    (
        "markov-cells-and-frequency",
        "datasets: {syn: {family: markov, chain: {kind: synthetic, vocab_size: 64},"
        " frequency: 0.5, cells: [[0.9, 0.9]]}}",
        ["datasets.syn.cells", "together with frequency", "not both"],
    ),
    (
        "markov-reliability-missing",
        "datasets: {syn: {family: markov, chain: {kind: synthetic, vocab_size: 64},"
        " frequency: [0.1, 0.5]}}",
        ["datasets.syn: reliability is missing", "cells: [[f, r], ...]"],
    ),
    (
        "markov-grid-unreachable-cell",
        MARKOV.replace("frequency: %s", "frequency: [0.1, %s]") % (0.9, 16),
        ["datasets.syn.frequency: requested f=0.9", "unreachable"],
    ),
    (
        "markov-grid-duplicate-value",
        MARKOV % ("[0.1, 0.1]", 32),
        ["datasets.syn.frequency", "repeats a value"],
    ),
    (
        "copy-length-lo-above-hi",
        "datasets: {kjv-copy: {repetition: {copy_length: [0.5, 0.25]}}}",
        ["datasets.kjv-copy.repetition.copy_length", "lo <= hi"],
    ),
    (
        "probe-too-short",
        RUNS_TINY % 2,
        ["runs[0].context_size", "s = min(50, C // 2) = 1", "C >= 4"],
    ),
    (
        "probe-beyond-vocab",
        """
        models: {tiny: {n_ctx: 1024}}
        datasets: {kjv-copy: {tokenizer: {kind: bpe, vocab_size: 300}}}
        probe: {max_half_length: 400}
        runs: [{data: kjv-copy, model: tiny, batch_size: 1, context_size: 1024}]
        """,
        ["probe.max_half_length", "= 800 distinct", "300-token vocabulary", "at most 150"],
    ),
    ("missing-required", "models: {huge: {n_layer: 2}}", ["models.huge", "'n_head'"]),
    (
        "float-for-integer",
        "training: {tokens: 6.0e+6}",
        ["training.tokens", "an integer", "6000000"],
    ),
    ("yaml-1.1-exponent", "training: {lr: 1e-3}", ["training.lr", "write 0.001"]),
    (
        "variant-key",
        "datasets: {kjv-copy: {tokenizer: {kind: gpt2}}}",
        ["tokenizer.vocab_size", "with kind: gpt2", "allowed keys: kind"],
    ),
    (
        "bad-name",
        "models: {'my model': {n_layer: 1, n_head: 1, d_model: 8}}",
        ["models", "'my model'"],
    ),
    (
        "start-above-linear_from",
        "checkpoints: {start: 400000, linear_from: 200000}",
        ["checkpoints.start", "start <= linear_from"],
    ),
    ("unknown-family", "datasets: {kjv-copy: {family: mystery}}", ["family", "natural, markov"]),
    ("val-fraction", "datasets: {kjv-copy: {val_fraction: 1.0}}", ["val_fraction", "< 1"]),
    # Keys that moved to `execution` say where they went (ihsweep.config.MOVED_KEYS).
    (
        "moved-training-threads",
        "training: {threads: 2}",
        ["training.threads", "moved to execution.threads"],
    ),
    (
        "moved-training-progress_seconds",
        "training: {progress_seconds: 1}",
        ["training.progress_seconds", "moved to execution.progress_seconds"],
    ),
    (
        "moved-resources",
        "resources: {gpu: 0, train_mem_mb: 1000}",
        ["resources", "moved to execution", "train_mem_mb"],
    ),
    (
        "moved-tokens_per_second",
        "models: {tiny: {tokens_per_second: 300000}}",
        ["models.tiny.tokens_per_second", "moved to execution.device_profile"],
    ),
    (
        "bad-execution-key",
        "execution: {cores: 4}",
        ["execution.cores", "unknown key in execution", "threads"],
    ),
    (
        "replaced-tokens_per_second",
        "execution: {tokens_per_second: 300000}",
        ["execution.tokens_per_second", "replaced by the cost model", "device_profile"],
    ),
    (
        "bad-micro_batch",
        "execution: {micro_batch: half}",
        [
            "execution.micro_batch",
            "'half' is not allowed",
            "A number of sequences (at least 1) or auto",
        ],
    ),
    (
        "bad-device_profile",
        "execution: {device_profile: tpu-v9}",
        ["execution.device_profile", "'tpu-v9' is neither a built-in profile", "h100"],
    ),
]


def default_config() -> dict:
    with open(REPO / "config.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def merged(override: str) -> dict:
    """The base study with ``override`` merged in the way several ``--configfile`` files merge."""
    config = yaml.safe_load(BASE)
    update_config(config, yaml.safe_load(textwrap.dedent(override)))
    return config


def snapshot(directory: Path) -> set[str]:
    return (
        {str(p.relative_to(directory)) for p in directory.rglob("*")}
        if directory.exists()
        else set()
    )


def snakemake_dry_run(*args: str, workdir: Path = REPO) -> subprocess.CompletedProcess:
    snakefile = ["-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *snakefile, *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Run every CLI case at once: each is ~2 s of Snakemake start-up, mostly imports."""
    directory = tmp_path_factory.mktemp("bad-configs")
    # A scratch working directory of its own, so that a study running in this checkout (whose
    # results/ grows meanwhile) cannot pass for a job that a bad config started.
    workdir = tmp_path_factory.mktemp("bad-configs-workdir")
    configfiles = {}
    for case, override, _ in CLI_CASES:
        configfiles[case] = directory / f"{case}.yaml"
        configfiles[case].write_text(yaml.safe_dump(merged(override)), encoding="utf-8")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            case: pool.submit(snakemake_dry_run, "--configfile", str(path), workdir=workdir)
            for case, path in configfiles.items()
        }
        results = {case: future.result() for case, future in futures.items()}
    # No job may run for an invalid config: nothing appears under results/.
    assert snapshot(workdir / "results") == set()
    return results


@pytest.mark.parametrize(
    "case, fragments", [(c[0], c[2]) for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_bad_config_fails_on_the_command_line(cli_results, case, fragments):
    proc = cli_results[case]
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("config error: ")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Job stats" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "override, fragments",
    [c[1:] for c in CLI_CASES + DIRECT_CASES],
    ids=[c[0] for c in CLI_CASES + DIRECT_CASES],
)
def test_bad_config_is_one_line_naming_the_key(override, fragments, monkeypatch):
    monkeypatch.chdir(REPO)  # corpus paths are relative to the working directory
    with pytest.raises(ConfigError) as raised:
        prepare(merged(override))
    message = str(raised.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_default_config_passes_on_the_command_line():
    proc = snakemake_dry_run()
    assert proc.returncode == 0, proc.stderr


def test_default_config_validates_and_gets_defaults(monkeypatch):
    monkeypatch.chdir(REPO)
    config = default_config()
    study = prepare(config)
    assert study.config is config  # filled in place, so the Snakefile's config has them
    assert study.runs
    for name, dataset in config["datasets"].items():
        filled = {"natural": {"val_fraction", "tokenizer"}, "markov": {"calibration", "grid"}}
        assert filled[dataset["family"]] | {"seed"} <= set(study.dataset_spec(name))
    assert {run.data for run in study.runs} == set(config["datasets"])  # every cell is run
    assert {"probe", "emergence", "lawfit"} <= set(config)


def cpu_study_specs(*studies: str) -> dict[str, dict]:
    """Each run's training spec in config.yaml patched by ``workflow/studies/<study>.yaml`` files,
    merged as ``--configfile config.yaml <files>`` merges them."""
    config = default_config()
    for name in studies:
        update_config(config, yaml.safe_load((REPO / f"workflow/studies/{name}.yaml").read_text()))
    study = prepare(config)
    return {run.id: study.train_spec(run) for run in study.runs}


def test_cpu_full_extends_the_default_with_the_same_runs(monkeypatch):
    # What lets `make cpu-full` after `make demo` train only the runs it adds: every run of the
    # default study is planned again with the same spec.
    monkeypatch.chdir(REPO)
    default = cpu_study_specs()
    full = cpu_study_specs("cpu-full")
    assert {run: full[run] for run in default} == default
    law_grid = {run for run in full if run.startswith("kjv-copy/w64/")}
    assert law_grid == {
        f"kjv-copy/w64/B{b}-C{c}-s{s}" for b in (8, 16, 64) for c in (8, 16, 32) for s in range(4)
    }


def test_defaults_are_filled_in(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    study = prepare(config)
    assert config["probe"] == {
        "n_sequences": 100,
        "max_half_length": 50,
        "seed": 1234,
        "min_layer": 1,
    }
    assert config["emergence"] == {"metric": "ps_max", "method": "crossing", "min_rise": 0.1}
    assert config["lawfit"] == {"bootstrap": 1000, "seed": 0, "model": None, "exponents": None}
    assert config["training"]["lr"] == 0.001  # given values stay
    assert config["training"]["warmup_fraction"] == 0.01
    assert config["execution"] == {
        "device": "auto",
        "threads": 1,
        "progress_seconds": 15,
        "gpu": "auto",
        "gpu_model": None,
        "train_mem_mb": 16000,
        "probe_mem_mb": 8000,
        "micro_batch": "auto",
        "compile": "auto",
        "vocab_padding": "auto",
        "fused_loss": "auto",
        "capturable_update": "auto",
        "device_profile": "auto",
        "overhead_minutes": 10,
        "safety": 1.5,
        "probe_minutes": 30,
    }
    assert not {"device", "threads", "progress_seconds"} & set(config["training"])
    dataset = study.dataset_spec("kjv-copy")
    assert dataset["val_fraction"] == 0.05 and dataset["seed"] == 0
    assert dataset["repetition"]["repeated_bigram_fraction"] is None
    assert config["runs"][1]["seed"] == 0
    assert len(study.runs) == 3 * 3 + 2
    assert study.runs[0] == Run("kjv-copy", "tiny", 8, 32, 0)
    assert study.runs_of_family("natural") == study.runs
    assert study.runs_of_family("markov") == []
    assert study.contexts_of("kjv-copy") == [32, 64, 128]
    assert study.vocab_size_of("kjv-copy") == 2048


def test_markov_defaults_and_vocabulary(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(MARKOV % (0.5, 32))
    config["datasets"]["semi"] = yaml.safe_load(BIGRAM % "kjv-copy")["datasets"]["semi"]
    study = prepare(config)
    syn = study.dataset_spec("syn")
    assert syn["calibration"] == "exact" and syn["seed"] == 0
    assert syn["chain"]["dependency"] is True and syn["chain"]["marginal"] == "zipfian"
    assert study.dataset_spec("semi")["chain"]["drop_eot"] is False
    assert study.vocab_size_of("syn") == 64 and study.vocab_size_of("semi") == 64
    assert [run.data for run in study.runs_of_family("markov")] == ["syn"]


def test_markov_grid_expands_to_one_dataset_per_cell(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(
        """
        datasets:
          semi: {family: markov, chain: {kind: bigram, source: kjv-copy, vocab_cap: 64},
                 frequency: [0.1, 0.9], reliability: [0.5, 1]}
          pairs: {family: markov, chain: {kind: synthetic, vocab_size: 64},
                  cells: [[0.9, 0.9], [0.1, 0.3]]}
          one: {family: markov, chain: {kind: synthetic, vocab_size: 64},
                frequency: 0.5, reliability: 0.5}
        runs:
          - {data: [semi, one], model: tiny, batch_size: 8, context_size: 32}
          - {data: pairs-f0.1-r0.3, model: tiny, batch_size: 8, context_size: 32}
        """
    )
    study = prepare(config)
    semi = ["semi-f0.1-r0.5", "semi-f0.1-r1", "semi-f0.9-r0.5", "semi-f0.9-r1"]
    assert study.grids == {
        "semi": semi,
        "pairs": ["pairs-f0.9-r0.9", "pairs-f0.1-r0.3"],
        "one": ["one"],  # scalars: one cell, the entry's own name
    }
    assert [run.data for run in study.runs] == [*semi, "one", "pairs-f0.1-r0.3"]
    cell = study.dataset_spec("semi-f0.9-r0.5")
    assert (cell["frequency"], cell["reliability"], cell["grid"]) == (0.9, 0.5, "semi")
    assert "cells" not in study.dataset_spec("pairs-f0.1-r0.3")
    assert {study.grid_of(name) for name in semi} == {"semi"}
    assert study.chain_spec("semi") == cell["chain"]
    assert "semi" not in study.config["datasets"]


def test_a_runs_entry_can_override_budget_and_learning_rate(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(
        """
        training: {tokens: 1000}
        checkpoints: {start: 100, linear_from: 400, every: 300}
        runs:
          - {data: kjv-copy, model: tiny, batch_size: 1, context_size: 32}
          - {data: kjv-copy, model: tiny, batch_size: 2, context_size: 32,
             training: {tokens: 2000, lr: 0.01}}
        """
    )
    study = prepare(config)
    plain, longer = study.runs
    assert study.train_spec(plain)["training"]["tokens"] == 1000
    assert study.train_spec(plain)["training"]["lr"] == 0.001
    spec = study.train_spec(longer)
    assert (spec["training"]["tokens"], spec["training"]["lr"]) == (2000, 0.01)
    assert spec["total_steps"] == 2000 // 64
    # The schedule continues to the entry's own budget: 100, 200, 400, 700, ..., 1900.
    assert spec["checkpoint_tokens"][-1] == 31 * 64
    assert len(spec["checkpoint_tokens"]) > len(study.train_spec(plain)["checkpoint_tokens"])
    assert spec["training"]["warmup_fraction"] == study.config["training"]["warmup_fraction"]


def test_minimal_dataset_gets_gpt2_tokenizer_and_no_repetition(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    minimal = {"family": "natural", "corpus": {"source": "kjv"}}
    config["datasets"] = {"text": dict(minimal), "other": dict(minimal)}
    config["runs"] = [{"data": "text", "model": "tiny", "batch_size": 8, "context_size": 32}]
    study = prepare(config)
    dataset = study.dataset_spec("text")
    assert dataset["tokenizer"] == {"kind": "gpt2"}
    other = study.config["datasets"]["other"]
    assert other["repetition"] == dataset["repetition"]
    assert other["repetition"] is not study.config["datasets"]["text"]["repetition"]
    assert dataset["repetition"]["copy_fraction"] == 0.0
    assert study.vocab_size_of("text") == 50257


def test_checkpoint_schedule_per_decade_is_log_spaced(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(
        """
        training: {tokens: 2000}
        checkpoints: {start: 100, linear_from: 1000, every: 500, per_decade: 10}
        runs: [{data: kjv-copy, model: tiny, batch_size: 4, context_size: 16, seed: 0}]
        """
    )
    # 100 * 10^(k/10) rounded, below linear_from; then 1000, 1500, 2000.
    expected = [100, 126, 158, 200, 251, 316, 398, 501, 631, 794, 1000, 1500, 2000]
    assert prepare(config).checkpoint_tokens == expected


def test_checkpoint_schedule_and_steps_hand_checked(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(
        """
        training: {tokens: 1000}
        checkpoints: {start: 100, linear_from: 400, every: 300}
        runs: [{data: kjv-copy, model: tiny, batch_size: 4, context_size: 16, seed: [0, 1]}]
        """
    )
    study = prepare(config)
    # Doubling 100, 200 (400 is not below linear_from), then 400, 700, 1000 (lands on budget).
    assert study.checkpoint_tokens == [100, 200, 400, 700, 1000]
    run = study.runs[0]
    spec = study.train_spec(run)
    # B*C = 64: 1000 // 64 = 15 updates; 100/64 = 1.56 -> 2, 200/64 = 3.1 -> 3,
    # 400/64 = 6.25 -> 6, 700/64 = 10.9 -> 11, 1000/64 = 15.6 -> 16, clamped to 15.
    assert spec["total_steps"] == 15
    assert spec["checkpoint_steps"] == [2, 3, 6, 11, 15]
    assert spec["checkpoint_tokens"] == [128, 192, 384, 704, 960]
    assert spec["run_id"] == "kjv-copy/tiny/B4-C16-s0"
    assert spec["model_config"] == {
        "n_layer": 2,
        "n_head": 4,
        "d_model": 64,
        "mlp": False,
        "n_ctx": 128,
    }
    assert spec["training"] == config["training"]  # how a run executes is not in its recipe
    assert not {"device", "threads", "progress_seconds"} & set(spec["training"])
    assert json.loads(json.dumps(spec)) == spec


def test_explicit_checkpoints_are_sorted(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    config["checkpoints"] = {"tokens": [500000, 62500, 250000]}
    assert prepare(config).checkpoint_tokens == [62500, 250000, 500000]


def test_explicit_checkpoint_beyond_budget(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    config["checkpoints"] = {"tokens": [100000, 7000000]}
    message = r"^checkpoints.tokens\[1\]: 7000000 is beyond the budget training.tokens = 6000000"
    with pytest.raises(ConfigError, match=message):
        prepare(config)


def test_mixed_checkpoint_forms_are_explained(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match="either {start, linear_from, every} or {tokens"):
        prepare(merged("checkpoints: {tokens: [100000]}"))


def test_step_conversion_edges():
    # Rounds halves up, never below step 1, always ends on the last step, no duplicates.
    assert checkpoint_steps([10, 96, 100, 6400], 64, 50) == [1, 2, 50]
    assert checkpoint_steps([], 64, 7) == [7]


def test_run_id_and_dir_round_trip_through_wildcards():
    run = Run(data="kjv-copy", model="tiny", batch_size=16, context_size=64, seed=3)
    assert run.id == "kjv-copy/tiny/B16-C64-s3"
    assert layout.run_dir(run, "0123abcd") == "results/runs/kjv-copy/tiny/B16-C64-s3-0123abcd"
    pattern = layout.run_dir().format(
        data="kjv-copy", model="tiny", batch=16, ctx=64, seed=3, rkey="0123abcd"
    )
    assert pattern == layout.run_dir(run, "0123abcd")
    wildcards = {"data": "kjv-copy", "model": "tiny", "batch": "16", "ctx": "64", "seed": "3"}
    assert Run.from_wildcards(wildcards) == run
    assert Run.from_wildcards(SimpleNamespace(**wildcards)) == run


def test_missing_required_key():
    config = merged("{}")
    del config["training"]["tokens"]
    with pytest.raises(ConfigError, match=r"^training: missing required key 'tokens'$"):
        prepare(config)


def test_every_schema_key_is_described():
    with open(SCHEMA, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, sub in node.get("properties", {}).items():
                if "description" not in sub and "$ref" not in sub:
                    missing.append(f"{path}.{key}")
            for key, sub in node.items():
                if key != "if":  # conditions select a variant; they define no keys
                    walk(sub, f"{path}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}[{i}]")

    walk(schema, "schema")
    assert missing == []


def test_every_moved_key_is_a_case():
    """Each key that moved to `execution` has a case above that checks where it says it went."""
    fragments = [f for case in CLI_CASES + DIRECT_CASES for f in case[2]]
    for key in MOVED_KEYS:
        assert any(f == key or f.endswith(f".{key}") for f in fragments), key
    assert any("moved to execution" in f for c in CLI_CASES for f in c[2])  # and on the CLI


# --------------------------------------------------------------------------------------------
# copy_length: validation uses the chunk step's own rounding (ihsweep.data.natural)


def accepted_by_chunk_step(copy_length: list[float], context: int) -> bool:
    try:
        copy_length_range(copy_length, context)
    except ValueError:
        return False
    return True


def with_copy_length(hi: float, context: int) -> dict:
    config = merged(RUNS_TINY % context)
    config["datasets"]["kjv-copy"]["repetition"]["copy_length"] = [0.25, hi]
    return config


COPY_HIS = [0.3, 0.45, 0.48, 0.49, 0.5, 0.51, 0.515, 0.52, 0.53, 0.55, 0.6]


@pytest.mark.parametrize("context", [8, 16, 17, 32, 33, 63, 64, 100, 128])
def test_copy_length_passes_validation_exactly_when_the_chunk_step_accepts_it(context):
    for hi in COPY_HIS:
        config = with_copy_length(hi, context)
        if accepted_by_chunk_step([0.25, hi], context):
            prepare(config)
            continue
        with pytest.raises(ConfigError) as raised:
            prepare(config)
        message = str(raised.value)
        assert message.startswith("datasets.kjv-copy.repetition.copy_length: "), message
        assert f"C = {context}" in message and "runs[0]" in message, message


def test_copy_length_the_old_rule_refused_now_passes():
    """At C = 32, hi = 0.51 gives round(16.32) = 16 tokens: a copy and its source fill 32
    positions, which the chunk step accepts; the old check, 2 * ceil(hi * C) = 34 > 32, refused
    it. The grid above holds such a disagreement, so it tells the two rules apart."""
    assert accepted_by_chunk_step([0.25, 0.51], 32)
    study = prepare(with_copy_length(0.51, 32))
    assert study.runs == [Run("kjv-copy", "tiny", 8, 32, 0)]
    old_rule = [
        (hi, C)
        for C in (8, 16, 17, 32, 33, 63, 64, 100, 128)
        for hi in COPY_HIS
        if accepted_by_chunk_step([0.25, hi], C) != (2 * math.ceil(hi * C) <= C)
    ]
    assert (0.51, 32) in old_rule

    # What the chunk step draws with it: every copy and its source fit in the context.
    rows = draw_copies(500, 32, 1.0, [0.25, 0.51], np.random.default_rng(0))
    length, a, b = rows.T
    assert length.max() == 16 and (b >= a + length).all() and (b + length <= 32).all()


def test_copy_length_one_token_too_long_is_refused_with_the_steps_numbers():
    with pytest.raises(ConfigError) as raised:
        prepare(with_copy_length(0.52, 32))
    assert str(raised.value) == (
        "datasets.kjv-copy.repetition.copy_length: hi = 0.52 is too long for C = 32: a copy of "
        "round(hi*C) = 17 tokens and its source need 34 > 32 positions; make hi <= 0.5 (runs[0])"
    )


# --------------------------------------------------------------------------------------------
# One home per default: the schema's emergence defaults reach every aggregate command


def schema_defaults(section: str) -> dict:
    properties = load_schema()["properties"][section]["properties"]
    return {key: sub["default"] for key, sub in properties.items()}


def test_emergence_defaults_are_the_schemas():
    defaults = schema_defaults("emergence")
    assert defaults == {"metric": "ps_max", "method": "crossing", "min_rise": 0.1}
    assert complete("emergence", {}) == complete("emergence") == defaults
    assert complete("emergence", {"min_rise": 0.2}) == {**defaults, "min_rise": 0.2}
    assert prepare(merged("{}")).config["emergence"] == defaults
    assert complete("lawfit", {}) == schema_defaults("lawfit")


class SpecSeen(Exception):
    """Raised once a step has completed its emergence spec: nothing after it needs to run."""


# Each command that finds emergence points, with its other required arguments.
AGGREGATE_COMMANDS = {
    "run_figure": ["--probes", "probes", "--out", "figures/run"],
    "aggregate_natural": ["--model-tables", "model.parquet", "--out-dir", "natural"],
    "aggregate_markov": [
        "--model-tables",
        "model.parquet",
        "--chunk-metas",
        "chunks.json",
        "--datasets",
        "{}",
        "--out-dir",
        "m",
    ],  # fmt: skip
}


@pytest.mark.parametrize("step", sorted(AGGREGATE_COMMANDS))
@pytest.mark.parametrize(
    "given, expected",
    [(None, {}), ('{"min_rise": 0.2}', {"min_rise": 0.2}), ("{}", {})],
    ids=["absent", "partial", "empty"],
)
def test_every_aggregate_command_completes_emergence_from_the_schema(
    step, given, expected, monkeypatch
):
    module = importlib.import_module(f"ihsweep.steps.{step}")
    seen = {}

    def recording(where, instance=None, *args):
        spec = complete(where, instance, *args)
        seen[where] = spec
        if where == "emergence":
            raise SpecSeen
        return spec

    monkeypatch.setattr(module, "complete", recording)
    argv = AGGREGATE_COMMANDS[step] + ([] if given is None else ["--emergence", given])
    with pytest.raises(SpecSeen):
        module.main(argv)
    assert seen["emergence"] == {**schema_defaults("emergence"), **expected}


def shell_commands(output: str, step: str) -> list[list[str]]:
    """The arguments of every ``python -m ihsweep.steps.<step>`` command a dry run printed."""
    prefix = f"python -m ihsweep.steps.{step} "
    lines = [line for line in output.splitlines() if prefix in line]
    return [shlex.split(line.split(prefix, 1)[1].split(" > ")[0]) for line in lines]


def flag(args: list[str], name: str) -> str:
    """The value of ``name`` (given as ``name value`` or ``name=value``)."""
    if name in args:
        return args[args.index(name) + 1]
    return next(arg.split("=", 1)[1] for arg in args if arg.startswith(name + "="))


def test_the_rules_pass_whole_sections_to_the_aggregate_commands(tmp_path):
    """A partial `emergence` in the study reaches every command complete, as prepare filled it."""
    (tmp_path / "config.yaml").write_text(study_text("report"))
    override = tmp_path / "override.yaml"
    override.write_text("emergence: {min_rise: 0.2}\nlawfit: {bootstrap: 7}\n")
    dry = snakemake(tmp_path, "-n", "-p", configfiles=(override,))
    assert dry.rc == 0, dry.out[-3000:]
    emergence = {**schema_defaults("emergence"), "min_rise": 0.2}
    lawfit = {**schema_defaults("lawfit"), "bootstrap": 7}
    counts = job_stats(dry.out)
    commands = {step: shell_commands(dry.out, step) for step in AGGREGATE_COMMANDS}
    assert {step: len(c) for step, c in commands.items()} == {
        step: counts[step] for step in AGGREGATE_COMMANDS
    }
    assert counts["run_figure"] == 4
    for step, runs in commands.items():
        for args in runs:
            assert json.loads(flag(args, "--emergence")) == emergence, (step, args)
    (natural,) = commands["aggregate_natural"]
    assert json.loads(flag(natural, "--lawfit")) == lawfit
    assert flag(natural, "--out-dir") == NATURAL_DIR
    assert flag(commands["aggregate_markov"][0], "--out-dir") == MARKOV_DIR


# --------------------------------------------------------------------------------------------
# The execution section: where a study runs, outside what it studies


def test_execution_is_outside_the_study_definition():
    plain = prepare(merged("{}")).config
    moved = prepare(
        merged("execution: {device: cpu, threads: 4, progress_seconds: 0, gpu: 0, safety: 3}")
    ).config
    assert plain["execution"] != moved["execution"]
    assert "execution" not in study_definition(moved)
    assert study_definition(plain) == study_definition(moved)
    assert config_sha256(plain) == config_sha256(moved)
    changed = prepare(merged("emergence: {min_rise: 0.2}")).config
    assert config_sha256(changed) != config_sha256(plain)


def test_cluster_runtime_follows_the_cost_model(tmp_path):
    # A profile file as bench/device_profile.py writes it: 1 TFLOP/s peak at 50% and 2 ms a pass.
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({"profile": {
        "peak_tflops": 1.0, "mfu": 0.5, "step_overhead_ms": 2.0, "memory_gb": 10}}))  # fmt: skip
    study = prepare(merged(f"execution: {{device_profile: {profile}, overhead_minutes: 10}}"))
    run = next(r for r in study.runs if r.model == "tiny")
    updates, tokens = study.total_steps(run), study.total_steps(run) * run.tokens_per_step
    fpt = cost.flops_per_token(study.model_of(run), 2048, run.context_size)
    seconds = updates * 2e-3 + tokens * fpt / 0.5e12  # one pass per update: B fits
    costed = StudyCost(study)
    assert costed.micro_batch(run) == run.batch_size
    assert costed.train_seconds(run) == pytest.approx(seconds)
    assert costed.train_minutes(run) == math.ceil(10 + 1.5 * seconds / 60)
    assert costed.train_minutes(run, attempt=2) == 2 * costed.train_minutes(run)
    assert costed.probe_minutes() == 30 and costed.probe_minutes(3) == 90


def test_execution_settings_reach_the_jobs_as_threads_and_resources(tmp_path):
    """`execution` becomes each job's threads and resources, and --set-threads and
    --set-resources override them per rule, as the schema says (threads at most --cores 2)."""
    (tmp_path / "config.yaml").write_text(study_text("workflow"))
    override = tmp_path / "execution.yaml"
    override.write_text("execution: {device: cpu, threads: 2, progress_seconds: 1}\n")
    args = ("-n", "-p", "--set-threads", "probe=1", "--set-resources", "train:device=cuda:1")
    dry = snakemake(tmp_path, *args, configfiles=(override,))
    assert dry.rc == 0, dry.out[-3000:]
    train, probe = shell_commands(dry.out, "train"), shell_commands(dry.out, "probe")
    assert len(train) == len(probe) == 9  # the runs of tests/studies/workflow.yaml
    for command in train:
        assert flag(command, "--device") == "cuda:1" and flag(command, "--threads") == "2"
        assert flag(command, "--progress-seconds") == "1"
    for command in probe:
        assert flag(command, "--device") == "cpu" and flag(command, "--threads") == "1"


# The JSON flags of each step and the schema section its `complete` checks them against.
STEP_SPECS = {
    "tokenize": {"--spec": "dataset"},
    "chunk": {"--spec": "dataset"},
    "chain": {"--spec": "chain"},
    "probe": {"--probe": "probe"},
    "run_figure": {"--emergence": "emergence"},
    "aggregate_markov": {"--emergence": "emergence"},
}


def test_every_step_accepts_the_spec_its_rule_passes(tmp_path):
    """What a rule passes is complete already and what the step's own check accepts: the
    step's ``complete`` neither refuses it nor adds to it (natural, synthetic and bigram data)."""
    (tmp_path / "config.yaml").write_text(study_text("markov"))
    dry = snakemake(tmp_path, "-n", "-p")
    assert dry.rc == 0, dry.out[-3000:]
    counts = job_stats(dry.out)
    for step, flags in STEP_SPECS.items():
        commands = shell_commands(dry.out, step)
        assert commands and len(commands) == counts[step], step
        for args in commands:
            for name, section in flags.items():
                spec = json.loads(flag(args, name))
                assert complete(section, spec) == spec, (step, spec)
    chunks = [json.loads(flag(args, "--spec")) for args in shell_commands(dry.out, "chunk")]
    assert {spec["family"] for spec in chunks} == {"markov"}
    assert {spec["chain"]["kind"] for spec in chunks} == {"synthetic", "bigram"}


def test_complete_names_keys_inside_their_section():
    """A step's partial spec is checked under its section's name, like the whole config."""
    cases = [
        ("probe", {"n_sequences": 0}, "probe.n_sequences: must be >= 1, got 0"),
        ("execution", {"devcie": "cpu"}, "execution.devcie: unknown key in execution"),
        ("training", {"tokens": 5, "device": "cpu"}, "training.device: moved to execution"),
        ("chain", {"kind": "synthetic"}, "chain: missing required key 'vocab_size'"),
    ]
    for where, partial, fragment in cases:
        with pytest.raises(ConfigError) as err:
            complete(where, partial)
        assert str(err.value).startswith(fragment), (where, str(err.value))
    assert complete("chain", {"kind": "bigram", "source": "a", "vocab_cap": 9})["drop_eot"] is False
