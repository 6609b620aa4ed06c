# Validation, wildcard constraints and the helpers that the rules call. No rules here.
import json
import os
import shlex
import sys

from ihsweep.aggregate import FIGURES as NATURAL_FIGURES
from ihsweep.config import ConfigError, Run, prepare
from ihsweep.provenance import config_sha256

try:
    STUDY = prepare(
        config, schema=workflow.source_path("../schemas/config.schema.yaml")
    )
except ConfigError as err:
    sys.exit(f"config error: {err}")
CONFIG_SHA256 = config_sha256(config)  # recorded in every provenance.json


wildcard_constraints:
    data=r"[A-Za-z0-9_.+-]+",
    grid=r"[A-Za-z0-9_+-]+",
    model=r"[A-Za-z0-9_.+-]+",
    batch=r"\d+",
    ctx=r"\d+",
    seed=r"\d+",


def input_dir(wildcards, input):
    """The folder of a rule's first input (passed to steps that read a whole folder)."""
    return os.path.dirname(input[0])


def output_dir(wildcards, output):
    """The folder of a rule's first output."""
    return os.path.dirname(output[0])


def dataset_spec_json(wildcards):
    return json.dumps(STUDY.dataset_spec(wildcards.data), sort_keys=True)


def family_of(wildcards):
    return STUDY.config["datasets"][wildcards.data]["family"]


def chunk_source(wildcards):
    """What a dataset's chunks are cut or drawn from: natural tokens or a Markov chain."""
    if family_of(wildcards) == "markov":
        return f"results/chains/{STUDY.grid_of(wildcards.data)}/chain.json"
    return f"results/data/{wildcards.data}/tokens.json"


def chunk_command(wildcards):
    """The family's chunk step, up to the flag that takes chunk_source's folder."""
    if family_of(wildcards) == "markov":
        return "ihsweep.data.markov_chunks --chain-dir"
    return "ihsweep.data.natural chunk --tokens-dir"


def chain_spec(wildcards):
    return STUDY.chain_spec(wildcards.grid)


def chain_source(wildcards):
    """A bigram chain counts the tokens of its natural source; a synthetic one reads nothing."""
    chain = chain_spec(wildcards)
    if chain["kind"] == "bigram":
        return f"results/data/{chain['source']}/tokens.json"
    return []


def chain_args(wildcards, input, output):
    """The arguments of `python -m ihsweep.data.chains` for this dataset's chain."""
    chain = chain_spec(wildcards)
    out_dir = shlex.quote(os.path.dirname(output[0]))
    if chain["kind"] == "bigram":
        drop = " --drop-eot" if chain["drop_eot"] else ""
        tokens_dir = shlex.quote(os.path.dirname(input[0]))
        cap = chain["vocab_cap"]
        return f"bigram --tokens-dir {tokens_dir} --cap {cap}{drop} --out-dir {out_dir}"
    spec = shlex.quote(json.dumps(chain, sort_keys=True))
    return f"synthetic --spec {spec} --out-dir {out_dir}"


def train_spec_json(wildcards):
    return json.dumps(STUDY.train_spec(Run.from_wildcards(wildcards)), sort_keys=True)


def train_runtime(wildcards, attempt):
    """Minutes for a training job on a cluster; a retry asks for more (config `resources`)."""
    return STUDY.train_minutes(Run.from_wildcards(wildcards), attempt)


def probe_runtime(wildcards, attempt):
    return STUDY.probe_minutes(attempt)


def probe_json(wildcards):
    return json.dumps(config["probe"], sort_keys=True)


def natural_runs():
    return STUDY.runs_of_family("natural")


def natural_model_tables():
    return [f"{run.dir}/probes/model.parquet" for run in natural_runs()]


def natural_outputs():
    if not natural_runs():
        return []
    return [
        "results/natural/emergence.csv",
        "results/natural/lawfit.json",
        "results/natural/lawfit.csv",
        "results/natural/emergence.html",
        "results/natural/lawfit.html",
        "results/natural/provenance.json",
        *expand(
            "results/natural/figures/{fig}.{ext}",
            fig=NATURAL_FIGURES,
            ext=["png", "pdf"],
        ),
    ]


def markov_runs():
    return STUDY.runs_of_family("markov")


def markov_model_tables():
    return [f"{run.dir}/probes/model.parquet" for run in markov_runs()]


def markov_chunk_metas():
    return sorted(
        {
            f"results/data/{run.data}/C{run.context_size}/chunks.json"
            for run in markov_runs()
        }
    )


def markov_datasets_json(wildcards):
    """The Markov datasets (cells) that runs train on, as the aggregate step reads them."""
    names = sorted({run.data for run in markov_runs()})
    return json.dumps(
        {name: STUDY.dataset_spec(name) for name in names}, sort_keys=True
    )


def markov_figures():
    """Figure stems: a frontier per bigram (f, r) sweep, the property grid, the generator."""
    from ihsweep.markov_aggregate import setting_name

    cells = {}  # (grid, model, B, C) -> the cells that runs train on
    for run in markov_runs():
        key = (STUDY.grid_of(run.data), run.model, run.batch_size, run.context_size)
        cells.setdefault(key, set()).add(run.data)
    kinds = {grid: STUDY.chain_spec(grid)["kind"] for grid, *_ in cells}
    stems = [
        f"frontier-{setting_name(*key)}"
        for key in sorted(cells)
        if kinds[key[0]] == "bigram" and len(cells[key]) > 1
    ]
    if "synthetic" in kinds.values():
        stems.append("properties")
    return [*stems, "generator"]


def markov_outputs():
    if not markov_runs():
        return []
    return [
        *expand(
            "results/markov/{table}.csv", table=["emergence", "cells", "generator"]
        ),
        "results/markov/emergence.html",
        "results/markov/frontier.json",
        "results/markov/provenance.json",
        *expand(
            "results/markov/figures/{fig}.{ext}",
            fig=markov_figures(),
            ext=["png", "pdf"],
        ),
    ]


def run_figures():
    return [
        f"{run.dir}/figures/{name}"
        for run in STUDY.runs
        for name in ("run.png", "run.pdf", "provenance.json")
    ]


def final_outputs():
    return natural_outputs() + markov_outputs() + run_figures()
