# Validation, wildcard constraints and the input functions that the rules call. No rules here.
# Paths come from ihsweep.files.layout, the one home of the results/ layout.
import dataclasses
import json
import os
import sys

# `report` alone is a keyword of a Snakefile: the function goes by another name here.
from snakemake.io import report as report_output

from ihsweep import cost

from ihsweep.files import layout
from ihsweep.config import EXECUTION, ConfigError, Run, StudyPaths
from ihsweep.config.execution import rule_flags, rule_resources
from ihsweep.cost.study import StudyCost
from ihsweep.report.provenance import (
    StudyClaim,
    claim_clash,
    code_sha256,
    config_sha256,
    run_sha256,
    write_claim,
)
from ihsweep.steps.prepare import prepare

try:
    STUDY = prepare(config)
except ConfigError as err:
    sys.exit(f"config error: {err}")
COST = StudyCost(STUDY)  # each job's runtime on a cluster
PATHS = StudyPaths(STUDY)  # every folder keyed by the settings that decide its files
CONFIG_SHA256 = config_sha256(config)  # recorded in every aggregate's provenance.json
# The study's folder is named, not keyed: another study under its name is refused here.
CLAIM = StudyClaim.of(STUDY.name, workflow.configfiles, CONFIG_SHA256)
if clash := claim_clash(CLAIM):
    sys.exit(f"config error: {clash}")
# A parameter of the aggregates only, so that an update of the package redoes them (seconds)
# and nothing else: runs, probes and run figures stay cached.
CODE_SHA256 = code_sha256()
# The study's own aggregate folders (config `study`): studies that share results/ share runs,
# datasets and chains, but each aggregates its own runs in its own folder.
NATURAL_DIR = layout.natural_dir(STUDY.name)
MARKOV_DIR = layout.markov_dir(STUDY.name)
# The rules turn these into threads and resources, never params: changing one plans no job.
# A rule takes the settings whose schema entry names it (x-rules) as resources
# (rule_resources) and hands them to its step as flags filled in from them (rule_flags).
EXECUTION_SETTINGS = config[EXECUTION]


onstart:
    write_claim(CLAIM)  # a real run, before its first job (not a dry run)


wildcard_constraints:
    data=r"[A-Za-z0-9_.+-]+",
    grid=r"[A-Za-z0-9_+-]+",
    model=r"[A-Za-z0-9_.+-]+",
    batch=r"\d+",
    ctx=r"\d+",
    seed=r"\d+",
    suite=r"[A-Za-z0-9_+-]+",
    # the keys of ihsweep.config.keys: a hash of the settings behind a folder
    dkey=r"[0-9a-f]{8}",
    ckey=r"[0-9a-f]{8}",
    rkey=r"[0-9a-f]{8}",
    skey=r"[0-9a-f]{8}",
    pkey=r"[0-9a-f]{8}",
    fkey=r"[0-9a-f]{8}",


def section_json(name):
    """A whole config section as one JSON parameter: a step receives it complete."""
    return json.dumps(config[name], sort_keys=True)


def model_families():
    """Each model's family as one JSON parameter: the natural aggregate compares their laws."""
    return json.dumps(
        {name: m["family"] for name, m in config["models"].items()}, sort_keys=True
    )


def input_dir(wildcards, input):
    """The folder of a rule's first input (ihsweep.files.layout's), for steps that read a folder."""
    return os.path.dirname(input[0])


def output_dir(wildcards, output):
    """The folder of a rule's first output, for steps that write a folder."""
    return os.path.dirname(output[0])


def provenance_dir(wildcards, output):
    """The folder an aggregate writes: where its provenance.json goes."""
    return os.path.dirname(output.provenance)


def output_stem(wildcards, output):
    """A figure's path without its suffix: the step writes .png and .pdf."""
    return os.path.splitext(output.png)[0]


class NotOfThisStudy(ValueError):
    """A path whose key is not this study's settings for that name (a typed or stale path)."""


def check_key(kind, name, key, expected, where):
    if key != expected:
        raise NotOfThisStudy(
            f"{kind} {name} with key {key} is not this study's: its settings give key "
            f"{expected} ({where}); python -m ihsweep.where {name} prints the path"
        )


def checked_dataset(wildcards):
    """The dataset of a data folder's wildcards, after checking the folder's key."""
    data = wildcards.data
    check_key(
        "data", data, wildcards.dkey, PATHS.dataset_key(data), PATHS.dataset_dir(data)
    )
    return data


def checked_run(wildcards):
    """The run of a run folder's wildcards, after checking the folder's key."""
    run = Run.from_wildcards(wildcards)
    check_key("run", run.id, wildcards.rkey, PATHS.run_key(run), PATHS.run_dir(run))
    return run


def dataset_spec_json(wildcards):
    """A dataset's entry as the schema defines it (the step checks it again): without the
    `grid` a Markov cell belongs to, which its input (the chain) says."""
    spec = STUDY.dataset_spec(checked_dataset(wildcards))
    spec.pop("grid", None)
    return json.dumps(spec, sort_keys=True)


def chunk_source(wildcards):
    """What a dataset's chunks are cut or drawn from: natural tokens or a Markov chain."""
    data = checked_dataset(wildcards)
    if STUDY.config["datasets"][data]["family"] == "markov":
        return PATHS.chain_file(layout.CHAIN_JSON, STUDY.grid_of(data))
    return PATHS.dataset_file(layout.TOKENS_JSON, data)


def chain_spec_json(wildcards):
    grid = wildcards.grid
    check_key(
        "chain", grid, wildcards.ckey, PATHS.chain_key(grid), PATHS.chain_dir(grid)
    )
    return json.dumps(STUDY.chain_spec(grid), sort_keys=True)


def chain_source(wildcards):
    """A bigram chain counts the tokens of its natural source; a synthetic one reads nothing."""
    chain = STUDY.chain_spec(wildcards.grid)
    if chain["kind"] == "bigram":
        return PATHS.dataset_file(layout.TOKENS_JSON, chain["source"])
    return []


def chain_source_flag(wildcards, input):
    """The natural tokens folder a bigram chain counts (chain_source's), if it has one."""
    return f"--source-dir {os.path.dirname(input[0])}" if input else ""


def run_chunks(wildcards):
    """The chunks a run trains on."""
    run = checked_run(wildcards)
    return PATHS.chunk_file(layout.CHUNKS_JSON, run.data, run.context_size)


def train_spec_json(wildcards):
    return json.dumps(STUDY.train_spec(checked_run(wildcards)), sort_keys=True)


def probe_json(wildcards):
    """The `probe` section, for a probe folder whose key is this study's."""
    key = wildcards.pkey
    check_key("probe setting", "probe", key, PATHS.probe_key, "config `probe`")
    return section_json("probe")


def run_probe_tables(wildcards):
    """The probe tables a run figure is drawn from (this study's probe setting)."""
    run = checked_run(wildcards)
    check_key(
        "figure setting",
        run.id,
        wildcards.fkey,
        PATHS.figure_key,
        "`probe`, `emergence`",
    )
    return {name: PATHS.probe_table(name, run) for name in layout.PROBE_TABLES}


def run_figure_sha256(wildcards):
    """A run figure's hash: not the study's, so a study that adds runs redraws no other."""
    run = Run.from_wildcards(wildcards)
    return run_sha256(STUDY.train_spec(run), config["emergence"])


def train_runtime(wildcards, attempt):
    """Minutes for a training job on a cluster; a retry asks for more (config `execution`)."""
    return COST.train_minutes(Run.from_wildcards(wildcards), attempt)


def profile_resource(name):
    """A default resource of the profile (slurm/config.yaml's default-resources), or None."""
    resource = (workflow.resource_settings.default_resources or {}).get(name)
    if resource is None:
        return None
    # A profile's value is an expression of the job; a partition's name depends on none.
    job = dict(
        wildcards={}, input=(), attempt=1, threads=1, rulename="", async_run=None
    )
    return resource.evaluate(**job).value


# Where a cluster job goes: a job that asks for a GPU to the profile's gpu_partition, any other
# (data preparation, training and probes the GPU would not speed up) to its slurm_partition.
GPU_PARTITION = profile_resource("gpu_partition")
CPU_PARTITION = profile_resource("slurm_partition")


def gpu_resources(gpus):
    """A rule's GPUs, ``gpus(wildcards)``, and the partition that follows from them."""
    if GPU_PARTITION is None:
        return {"gpu": gpus}

    def partition(wildcards):
        return GPU_PARTITION if gpus(wildcards) else CPU_PARTITION

    return {"gpu": gpus, "slurm_partition": partition}


def run_gpus(wildcards):
    """GPUs of a run's training and probe jobs (config `execution.gpu`, ihsweep.cost)."""
    return COST.gpus(Run.from_wildcards(wildcards))


def suite_gpus(wildcards):
    """GPUs of a checkpoint suite's probe job: the cost model has no suite's model, so auto
    asks for one."""
    gpus = EXECUTION_SETTINGS["gpu"]
    return 1 if gpus == "auto" else gpus


def tokenize_runtime(wildcards, attempt):
    return COST.tokenize_minutes(wildcards.data, attempt)


def chunk_runtime(wildcards, attempt):
    return COST.chunk_minutes(wildcards.data, int(wildcards.ctx), attempt)


def probe_runtime(wildcards, attempt):
    return COST.probe_minutes(attempt)


def suite_spec_json(wildcards):
    suite = wildcards.suite
    check_key(
        "suite", suite, wildcards.skey, PATHS.suite_key(suite), PATHS.suite_dir(suite)
    )
    spec = dict(STUDY.suites[suite])
    spec.pop(
        "keep_duplicates"
    )  # the fit's setting (suite_duplicates): no probe job rerun
    return json.dumps(spec, sort_keys=True)


def natural_model_tables():
    """The natural-data runs' probe tables and the checkpoint suites': one emergence analysis."""
    runs = [PATHS.probe_table("model", run) for run in STUDY.runs_of_family("natural")]
    return runs + [PATHS.suite_table("model", suite) for suite in STUDY.suites]


def suite_duplicates():
    """The checkpoint suites' duplicate groups (ihsweep.probing.fingerprints), for the fit."""
    return [PATHS.suite_file(layout.DUPLICATES, suite) for suite in STUDY.suites]


def kept_duplicates():
    """The suites whose duplicate revisions stay in the emergence fit (keep_duplicates)."""
    return json.dumps(
        sorted(s for s, spec in STUDY.suites.items() if spec["keep_duplicates"])
    )


def markov_model_tables():
    return [PATHS.probe_table("model", run) for run in STUDY.runs_of_family("markov")]


def front_page_run_figure(family):
    """The run figure the front page shows, from the findings of ``family``'s aggregate: the
    middle of the natural-data runs sorted by (data, model, B, C, seed), or of the Markov
    runs in a study without natural data; [] for the other aggregate."""
    shown = "natural" if STUDY.runs_of_family("natural") else "markov"
    runs = sorted(STUDY.runs_of_family(family), key=dataclasses.astuple)
    if family != shown or not runs:
        return []
    return [PATHS.run_figures(runs[(len(runs) - 1) // 2])[0]]


def run_records(family):
    """The run.json of each run on ``family`` data: the findings say how they were trained."""
    runs = STUDY.runs_of_family(family)
    return [PATHS.run_file(layout.RUN_JSON, run) for run in runs]


def markov_chunk_metas():
    runs = STUDY.runs_of_family("markov")
    return sorted(
        {PATHS.chunk_file(layout.CHUNKS_JSON, r.data, r.context_size) for r in runs}
    )


def markov_datasets_json(wildcards):
    """The Markov datasets (cells) that runs train on, as the aggregate step reads them."""
    names = sorted({run.data for run in STUDY.runs_of_family("markov")})
    return json.dumps(
        {name: STUDY.dataset_spec(name) for name in names}, sort_keys=True
    )


def markov_figures():
    runs = [
        {
            "data": run.data,
            "grid": STUDY.grid_of(run.data),
            "chain_kind": STUDY.config["datasets"][run.data]["chain"]["kind"],
            "model": run.model,
            "batch_size": run.batch_size,
            "context_size": run.context_size,
        }
        for run in STUDY.runs_of_family("markov")
    ]
    return layout.markov_figures(runs)


def final_outputs():
    outputs = [f for run in STUDY.runs for f in PATHS.run_figures(run)]
    if STUDY.runs_of_family("natural") or STUDY.suites:
        outputs += layout.natural_outputs(NATURAL_DIR)
    if STUDY.runs_of_family("natural"):  # a checkpoint suite alone has no (B, C) grid
        outputs += layout.heldout_outputs(layout.heldout_dir(NATURAL_DIR))
    if STUDY.runs_of_family("markov"):
        outputs += layout.markov_outputs(markov_figures(), MARKOV_DIR)
    return outputs


# Report entries (`snakemake --report`): what the aggregate rules declare as outputs.
def report_table(path, caption, category, label):
    """The report shows HTML in a frame but a CSV only as a download: tables go as pages."""
    return report_output(
        path,
        caption=caption,
        category=category,
        subcategory="Tables",
        labels={"table": label},
    )


def report_figures(stems, folder, category, caption_of, label_of):
    return [
        report_output(
            layout.figure_file(stem, folder),
            caption=f"../report/{caption_of(stem)}.rst",
            category=category,
            subcategory="Figures",
            labels={"figure": label_of(stem)},
        )
        for stem in stems
    ]
