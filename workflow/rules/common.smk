# Validation, wildcard constraints and the helpers that the rules call. No rules here.
import json
import os
import sys

from ihsweep.config import ConfigError, Run, prepare

try:
    STUDY = prepare(
        config, schema=workflow.source_path("../schemas/config.schema.yaml")
    )
except ConfigError as err:
    sys.exit(f"config error: {err}")


wildcard_constraints:
    data=r"[A-Za-z0-9_.+-]+",
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


def train_spec_json(wildcards):
    return json.dumps(STUDY.train_spec(Run.from_wildcards(wildcards)), sort_keys=True)


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
        *expand(
            "results/natural/figures/{fig}.{ext}",
            fig=["run_curves", "emergence_vs_BC", "law_fit"],
            ext=["png", "pdf"],
        ),
    ]


def final_outputs():
    return natural_outputs()
