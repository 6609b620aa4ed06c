"""Config validation: bad configs fail through the real command line with one clear line.

Each bad case is an override merged into BASE (mappings merge key by key, lists replace: what
several ``--configfile`` files do), so a case states only what it breaks. BASE mirrors the
default config.yaml but lives here, so that tuning the default study does not break these tests.
The expected fragments are the key path and the allowed values or the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ihsweep.config import ConfigError, Run, checkpoint_steps, prepare
from snakemake.utils import update_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
BASE = """
models:
  tiny: {n_layer: 2, n_head: 4, d_model: 64, mlp: false, n_ctx: 128}
  small: {n_layer: 2, n_head: 4, d_model: 96, mlp: false, n_ctx: 128}
  medium: {n_layer: 2, n_head: 4, d_model: 128, mlp: false, n_ctx: 128}
datasets:
  kjv-copy:
    family: natural
    corpus: {source: kjv}
    tokenizer: {kind: bpe, vocab_size: 2048}
    repetition: {copy_fraction: 1.0, copy_length: [0.25, 0.5]}
runs:
  - {data: kjv-copy, model: tiny, batch_size: [8, 16, 32], context_size: [32, 64, 128], seed: 0}
  - {data: kjv-copy, model: [small, medium], batch_size: 16, context_size: 64}
training: {tokens: 6000000, lr: 0.001}
checkpoints: {start: 62500, linear_from: 1000000, every: 250000}
"""
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
        ["models.tiny.n_heads", "allowed keys: n_layer, n_head, d_model, mlp, n_ctx"],
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
        "training: {device: gpu}",
        ["training.device", "'gpu'", "auto", "cuda:N"],
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
        "markov-unreachable-frequency",
        MARKOV % (0.9, 16),
        ["datasets.syn.frequency: requested f=0.9", "unreachable", "runs[0]"],
    ),
    (
        "markov-vocab-below-context",
        MARKOV % (0.5, 128),
        ["datasets.syn.chain.vocab_size", "V = 64 < C = 128", "at least 128"],
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
        ["probe.max_half_length", "= 400", "300-token vocabulary", "at most 300"],
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
]


def default_config() -> dict:
    with open(REPO / "config.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def merged(override: str) -> dict:
    """BASE with ``override`` merged in the way several ``--configfile`` files merge."""
    config = yaml.safe_load(BASE)
    update_config(config, yaml.safe_load(textwrap.dedent(override)))
    return config


def snapshot(directory: Path) -> set[str]:
    return (
        {str(p.relative_to(directory)) for p in directory.rglob("*")}
        if directory.exists()
        else set()
    )


def snakemake_dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Run every CLI case at once: each is ~2 s of Snakemake start-up, mostly imports."""
    directory = tmp_path_factory.mktemp("bad-configs")
    configfiles = {}
    for case, override, _ in CLI_CASES:
        configfiles[case] = directory / f"{case}.yaml"
        configfiles[case].write_text(yaml.safe_dump(merged(override)), encoding="utf-8")
    before = snapshot(REPO / "results")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            case: pool.submit(snakemake_dry_run, "--configfile", str(path))
            for case, path in configfiles.items()
        }
        results = {case: future.result() for case, future in futures.items()}
    # No job may run for an invalid config: nothing appears under results/.
    assert snapshot(REPO / "results") == before
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
        prepare(merged(override), SCHEMA)
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
    study = prepare(config, SCHEMA)
    assert study.config is config  # filled in place, so the Snakefile's config has them
    assert study.runs
    for name, dataset in config["datasets"].items():
        filled = {"natural": {"val_fraction", "tokenizer"}, "markov": {"calibration", "grid"}}
        assert filled[dataset["family"]] | {"seed"} <= set(study.dataset_spec(name))
    assert {run.data for run in study.runs} == set(config["datasets"])  # every cell is run
    assert {"probe", "emergence", "lawfit"} <= set(config)


def test_defaults_are_filled_in(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    study = prepare(config, SCHEMA)
    assert config["probe"] == {"n_sequences": 100, "max_half_length": 50, "seed": 1234}
    assert config["emergence"] == {"metric": "ps_max", "method": "breakpoint", "min_rise": 0.1}
    assert config["lawfit"] == {"bootstrap": 1000, "seed": 0}
    assert config["training"]["lr"] == 0.001  # given values stay
    assert config["training"]["warmup_fraction"] == 0.01
    assert config["training"]["device"] == "auto"
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
    study = prepare(config, SCHEMA)
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
    study = prepare(config, SCHEMA)
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
    study = prepare(config, SCHEMA)
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
    study = prepare(config, SCHEMA)
    dataset = study.dataset_spec("text")
    assert dataset["tokenizer"] == {"kind": "gpt2"}
    other = study.config["datasets"]["other"]
    assert other["repetition"] == dataset["repetition"]
    assert other["repetition"] is not study.config["datasets"]["text"]["repetition"]
    assert dataset["repetition"]["copy_fraction"] == 0.0
    assert study.vocab_size_of("text") == 50257


def test_checkpoint_schedule_and_steps_hand_checked(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged(
        """
        training: {tokens: 1000}
        checkpoints: {start: 100, linear_from: 400, every: 300}
        runs: [{data: kjv-copy, model: tiny, batch_size: 4, context_size: 16, seed: [0, 1]}]
        """
    )
    study = prepare(config, SCHEMA)
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
    execution = {"device", "threads", "progress_seconds"}  # how a run executes or logs: not in it
    assert spec["training"] == {k: v for k, v in config["training"].items() if k not in execution}
    assert json.loads(json.dumps(spec)) == spec


def test_explicit_checkpoints_are_sorted(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    config["checkpoints"] = {"tokens": [500000, 62500, 250000]}
    assert prepare(config, SCHEMA).checkpoint_tokens == [62500, 250000, 500000]


def test_explicit_checkpoint_beyond_budget(monkeypatch):
    monkeypatch.chdir(REPO)
    config = merged("{}")
    config["checkpoints"] = {"tokens": [100000, 7000000]}
    message = r"^checkpoints.tokens\[1\]: 7000000 is beyond the budget training.tokens = 6000000"
    with pytest.raises(ConfigError, match=message):
        prepare(config, SCHEMA)


def test_mixed_checkpoint_forms_are_explained(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match="either {start, linear_from, every} or {tokens"):
        prepare(merged("checkpoints: {tokens: [100000]}"), SCHEMA)


def test_step_conversion_edges():
    # Rounds halves up, never below step 1, always ends on the last step, no duplicates.
    assert checkpoint_steps([10, 96, 100, 6400], 64, 50) == [1, 2, 50]
    assert checkpoint_steps([], 64, 7) == [7]


def test_run_id_and_dir_round_trip_through_wildcards():
    run = Run(data="kjv-copy", model="tiny", batch_size=16, context_size=64, seed=3)
    assert run.id == "kjv-copy/tiny/B16-C64-s3"
    assert run.dir == "results/runs/kjv-copy/tiny/B16-C64-s3"
    wildcards = {"data": "kjv-copy", "model": "tiny", "batch": "16", "ctx": "64", "seed": "3"}
    assert Run.from_wildcards(wildcards) == run
    assert Run.from_wildcards(SimpleNamespace(**wildcards)) == run


def test_missing_required_key():
    config = merged("{}")
    del config["training"]["tokens"]
    with pytest.raises(ConfigError, match=r"^training: missing required key 'tokens'$"):
        prepare(config, SCHEMA)


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
