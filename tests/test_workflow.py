"""The whole DAG through the real ``snakemake`` command line, on a tiny study in a tmp folder.

One module-scoped fixture runs the study tests/studies/workflow.yaml once (about 2.5 minutes on two
busy cores: KJV, a 512-type BPE, a 2x2 grid of B x C in both model families plus one wider model,
attention-only d=32 models, 60k tokens per run), then runs Snakemake again and dry-runs config
changes (one analysis setting; only execution settings, in a configfile and as --set-threads and
--set-resources), a copy of the checkout with one module edited and one with two rules' commands
reworded, before any test looks. Paths are ``ihsweep.files.layout``'s. The tests inspect what it
left; only the probe-cache test changes the folder, and it runs last.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, job_stats, logs_of, mtimes, run_study, snakemake, study_text
from ihsweep.config import StudyPaths
from ihsweep.files import layout
from ihsweep.probing.metrics import HEAD_MAXIMA, HEAD_SCORES
from ihsweep.report.provenance import STUDY_JSON
from ihsweep.steps.prepare import prepare
from ihsweep.training.checkpoints import read_checkpoint
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.weights import load_checkpoint_weights

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")

pytestmark = pytest.mark.slow

CONFIG = study_text("workflow")
FIGURES = layout.figure_files(layout.NATURAL_FIGURES, NATURAL)
# The tables' documented columns (docs/files.md); the scores follow the registry.
HEAD_COLUMNS = [
    "run_id", "data", "model", "batch_size", "context_size", "seed", "step", "tokens",
    "layer", "head", *HEAD_SCORES,
]  # fmt: skip
MODEL_COLUMNS = [
    "run_id", "data", "model", "n_params", "batch_size", "context_size", "seed", "step",
    "tokens", "ar_acc", "ar_rank", *HEAD_MAXIMA, "ps_la_corr", "train_loss", "val_loss",
    "budget", "outcome", "outcome_detail", "predicted_tokens",
]  # fmt: skip
RUN_FIELDS = ["data", "model", "batch_size", "context_size", "seed"]
# How the study runs, not what it studies: none of it may plan a job.
EXECUTION = "execution: {device: cpu, threads: 2, progress_seconds: 1, compile: true}\n"
# A second study in the same folder: the 2x2 grid alone, under its own name.
GRID_STUDY = """\
study: grid
runs:
  - {data: kjv-copy, model: tiny, batch_size: [4, 8], context_size: [16, 32], seed: 0}
"""
NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.egg-info")
OVERRIDES = ("--set-threads", "train=2", "probe=2", "--set-resources", "train:device=cpu",
             "train:compile=auto")  # fmt: skip


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> SimpleNamespace:
    workdir = tmp_path_factory.mktemp("study")
    first = run_study(workdir, CONFIG)
    before = mtimes(workdir / layout.RESULTS)
    second = snakemake(workdir)
    after = mtimes(workdir / layout.RESULTS)

    # The same study, edited in its file (as a patch file it would be another study).
    (workdir / "config.yaml").write_text(CONFIG + "emergence: {min_rise: 0.2}\n")
    min_rise_file = snakemake(workdir, "-n")
    (workdir / "config.yaml").write_text(CONFIG)
    execution = workdir / "execution.yaml"
    execution.write_text(EXECUTION)
    execution_file = snakemake(workdir, "-n", *OVERRIDES, configfiles=(execution,))
    execution_flags = snakemake(workdir, "-n", *OVERRIDES)
    assert mtimes(workdir / layout.RESULTS) == after, "a dry run changed results/"

    # An update of the package: a copy of the checkout whose law fit gained a comment.
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    code_same = snakemake(workdir, "-n", checkout=checkout)
    with open(checkout / "workflow" / "ihsweep" / "analysis" / "lawfit.py", "a") as lawfit:
        lawfit.write("# an update\n")
    code_updated = snakemake(workdir, "-n", checkout=checkout)

    # A refactor of the rules: a copy whose train and probe commands' text changed, not what
    # they do; planned under the workflow profile's triggers, then with Snakemake's `code` one.
    refactored = copy_checkout(tmp_path_factory.mktemp("refactored"))
    refactor_commands(refactored)
    refactor = snakemake(workdir, "-n", "--quiet", "rules", checkout=refactored)
    refactor_code_trigger = snakemake(
        workdir, "-n", "--quiet", "rules", "--rerun-triggers", "code", checkout=refactored
    )

    grid = workdir / "grid.yaml"
    grid.write_text(GRID_STUDY)
    grid_study = snakemake(workdir, configfiles=(grid,))
    after_grid_study = mtimes(workdir / layout.RESULTS)
    first_study_again = snakemake(workdir, "-n")

    prepared = prepare(yaml.safe_load(CONFIG))
    return SimpleNamespace(
        dir=workdir,
        study=prepared,
        paths=StudyPaths(prepared),
        first=first,
        second=second,
        mtimes_before=before,
        mtimes_after=after,
        min_rise_file=min_rise_file,
        execution_file=execution_file,
        execution_flags=execution_flags,
        code_same=code_same,
        code_updated=code_updated,
        refactor=refactor,
        refactor_code_trigger=refactor_code_trigger,
        grid_study=grid_study,
        after_grid_study=after_grid_study,
        first_study_again=first_study_again,
    )


def copy_checkout(dest: Path) -> Path:
    """The Snakefile, workflow/ and profiles/ (the workflow profile) of the checkout, in dest."""
    shutil.copy(REPO / "Snakefile", dest)
    for folder in ("workflow", "profiles"):
        shutil.copytree(REPO / folder, dest / folder, ignore=NOT_SOURCE)
    return dest


# The commands a refactor edits: the same job, other text (`:` is the shell's no-op), which
# Snakemake's `code` trigger sees (it compares a rule's shell command text with the recorded).
REFACTORED = {"train.smk": "ihsweep.steps.train ", "probe.smk": "ihsweep.steps.probe "}


def refactor_commands(checkout: Path) -> None:
    for smk, module in REFACTORED.items():
        path = checkout / "workflow" / "rules" / smk
        text = path.read_text()
        assert text.count(f'"python -m {module}') == 1, (smk, module)
        path.write_text(text.replace(f'"python -m {module}', f'": a refactor; python -m {module}'))


def run_path(study, run, name: str) -> Path:
    """A file of a run's folder, in the study's folder."""
    return study.dir / study.paths.run_file(name, run)


def read_table(study, run, name: str) -> pd.DataFrame:
    return pd.read_parquet(study.dir / study.paths.probe_table(name, run))


# --------------------------------------------------------------------------------------------
# What the first run did and left


def test_first_run_ran_every_job_once(study):
    runs = study.study.runs
    assert len(runs) == 9
    assert job_stats(study.first.out) == {
        "tokenize": 1,
        "chunk": 2,
        "train": len(runs),
        "probe": len(runs),
        "run_figure": len(runs),
        "aggregate_natural": 1,
        "heldout_natural": 1,
        "all": 1,
    }


def test_every_expected_output_exists(study):
    root = study.dir
    expected = layout.natural_outputs(NATURAL) + layout.heldout_outputs(layout.heldout_dir(NATURAL))
    assert {f"{NATURAL}/emergence.csv", f"{NATURAL}/lawfit.json", *FIGURES} <= set(expected)
    for run in study.study.runs:
        paths = study.paths
        expected += [paths.run_file(layout.RUN_JSON, run), *paths.run_figures(run)]
        expected += [paths.probe_table(name, run) for name in layout.PROBE_TABLES]
    missing = [path for path in expected if not (root / path).is_file()]
    assert not missing, missing
    for path in FIGURES:
        magic = (root / path).read_bytes()[:8]
        assert magic.startswith(b"\x89PNG" if path.endswith(".png") else b"%PDF"), path
        assert (root / path).stat().st_size > 1000, path
    fit = json.loads(
        (root / layout.aggregate_file("lawfit.json", NATURAL)).read_text(),
        parse_constant=lambda name: pytest.fail(f"lawfit.json holds {name}"),
    )
    assert isinstance(fit, dict) and "ok" in fit


def test_runs_have_the_study_checkpoints(study):
    for run in study.study.runs:
        steps = study.study.checkpoint_steps(run)
        summary = json.loads(run_path(study, run, layout.RUN_JSON).read_text())
        assert summary["checkpoints"] == steps, run.id
        assert summary["steps"] == steps[-1] == study.study.total_steps(run)
        assert summary["tokens"] == steps[-1] * run.tokens_per_step
        saved = sorted(run_path(study, run, "ckpt").glob("step_*.json"))
        assert [int(p.stem.removeprefix("step_")) for p in saved] == steps, run.id


def test_model_tables(study):
    for run in study.study.runs:
        table = read_table(study, run, "model")
        assert list(table.columns) == MODEL_COLUMNS, run.id
        steps = study.study.checkpoint_steps(run)
        assert table["step"].tolist() == steps, run.id  # one row per checkpoint, in order
        assert (table["tokens"] == table["step"] * run.batch_size * run.context_size).all()
        assert (table["run_id"] == run.id).all()
        for field in RUN_FIELDS:
            assert (table[field] == getattr(run, field)).all(), (run.id, field)
        n_params = {
            json.loads(p.read_text())["n_params"]
            for p in run_path(study, run, "ckpt").glob("step_*.json")
        }
        assert table["n_params"].unique().tolist() == sorted(n_params)
        for column in ("ar_acc", "ps_max", "la_max"):
            assert table[column].between(0, 1).all(), (run.id, column)
        assert (table["ar_rank"] >= 0).all()
        assert table[["train_loss", "val_loss"]].map(math.isfinite).all().all(), run.id
        assert table["ps_la_corr"].dropna().between(-1, 1).all()
        assert (table["budget"] == study.study.total_steps(run) * run.tokens_per_step).all()
        assert (table["outcome"] == "completed").all() and (table["outcome_detail"] == "").all()
        assert table["predicted_tokens"].isna().all()  # no densify law in this study


def test_heads_tables_agree_with_model_tables(study):
    for run in study.study.runs:
        heads, model = read_table(study, run, "heads"), read_table(study, run, "model")
        assert list(heads.columns) == HEAD_COLUMNS, run.id
        n_layer = study.study.config["models"][run.model]["n_layer"]
        n_head = study.study.config["models"][run.model]["n_head"]
        assert len(heads) == len(model) * n_layer * n_head
        for (layer, head), rows in heads.groupby(["layer", "head"]):
            assert rows["step"].tolist() == model["step"].tolist(), (layer, head)
        assert sorted(heads["layer"].unique()) == list(range(n_layer))
        assert sorted(heads["head"].unique()) == list(range(n_head))
        assert heads[["ps", "la"]].stack().between(0, 1).all()
        # The model-level maxima are over the heads of layers probe.min_layer and up.
        counted = heads[heads["layer"] >= study.study.config["probe"]["min_layer"]]
        by_step = counted.groupby("step")
        assert by_step["ps"].max().tolist() == pytest.approx(model["ps_max"].tolist())
        assert by_step["la"].max().tolist() == pytest.approx(model["la_max"].tolist())
        assert (heads["tokens"] == heads["step"] * run.tokens_per_step).all()


def test_emergence_table_has_one_row_per_run(study):
    table = pd.read_csv(study.dir / layout.aggregate_file("emergence.csv", NATURAL))
    runs = {run.id: run for run in study.study.runs}
    assert sorted(table["run_id"]) == sorted(runs)
    for row in table.itertuples():
        run = runs[row.run_id]
        assert (row.batch_size, row.context_size, row.model) == (
            run.batch_size,
            run.context_size,
            run.model,
        )
    assert set(table["metric"]) == {"ps_max"} and set(table["method"]) == {"crossing"}


# --------------------------------------------------------------------------------------------
# Reruns


def test_second_invocation_has_nothing_to_do(study):
    assert study.second.rc == 0, study.second.out[-3000:]
    assert "Nothing to be done" in study.second.out
    assert job_stats(study.second.out) == {}
    assert not re.search(r"^(local)?rule \w+:", study.second.out, re.MULTILINE)
    assert study.mtimes_after == study.mtimes_before


def test_changing_min_rise_reruns_only_aggregates_and_figures(study):
    run = study.min_rise_file
    assert run.rc == 0, run.out[-3000:]
    n_runs = len(study.study.runs)
    assert job_stats(run.out) == {
        "aggregate_natural": 1, "heldout_natural": 1, "run_figure": n_runs, "all": 1
    }  # fmt: skip
    assert re.search(r"params have changed since last execution:\s+aggregate_natural", run.out)


def test_changing_only_execution_settings_reruns_nothing(study):
    """`execution` in a configfile and --set-threads / --set-resources: threads and resources,
    never params, so nothing is out of date and provenance keeps its hash."""
    for run in (study.execution_file, study.execution_flags):
        assert run.rc == 0, run.out[-3000:]
        assert job_stats(run.out) == {}, run.out[-3000:]
        assert "Nothing to be done" in run.out, run.out[-3000:]


def test_an_update_of_the_package_reruns_only_the_aggregates(study):
    """Code the rules only import is a parameter of the aggregates (its hash): a copy of the
    checkout plans nothing, and once a module of the copy changes, only the aggregates."""
    same, updated = study.code_same, study.code_updated
    assert same.rc == 0 and "Nothing to be done" in same.out, same.out[-3000:]
    assert updated.rc == 0, updated.out[-3000:]
    assert job_stats(updated.out) == {"aggregate_natural": 1, "heldout_natural": 1, "all": 1}
    assert re.search(r"params have changed since last execution:\s+aggregate_natural", updated.out)


def test_a_refactor_of_the_rules_commands_retrains_and_reprobes_nothing(study):
    """The workflow profile's rerun triggers leave out `code`: the train and probe commands'
    text changed in a copy of the checkout plans no job; Snakemake's `code` trigger, named on
    the command line, plans every run's training and probes again (what the profile avoids)."""
    refactor, forced = study.refactor, study.refactor_code_trigger
    assert refactor.rc == 0, refactor.out[-3000:]
    assert job_stats(refactor.out) == {}, refactor.out[-3000:]
    assert "Nothing to be done" in refactor.out, refactor.out[-3000:]
    assert forced.rc == 0, forced.out[-3000:]
    n_runs = len(study.study.runs)
    stats = job_stats(forced.out)
    assert stats["train"] == stats["probe"] == n_runs, forced.out[-3000:]


def test_a_second_study_shares_the_runs_and_keeps_its_own_aggregates(study):
    """Two studies in one results/ (config `study`): the second, on a subset of the first's
    runs, trains and draws nothing and aggregates into its own folder; the first study's
    aggregates stay as they were, so running it again has nothing to do."""
    run = study.grid_study
    assert run.rc == 0, run.out[-3000:]
    assert job_stats(run.out) == {"aggregate_natural": 1, "heldout_natural": 1, "all": 1}
    changed = {
        path
        for path, mtime in study.after_grid_study.items()
        if study.mtimes_after.get(path) != mtime
    }
    grid = layout.natural_dir("grid")
    own = {str(Path(layout.log("aggregate", "grid/natural")).relative_to(layout.RESULTS))}
    own.add(str(Path(layout.study_dir("grid"), STUDY_JSON).relative_to(layout.RESULTS)))
    own.add(str(Path(layout.log("heldout", "grid/natural")).relative_to(layout.RESULTS)))
    outputs = layout.natural_outputs(grid) + layout.heldout_outputs(layout.heldout_dir(grid))
    own |= {str(Path(p).relative_to(layout.RESULTS)) for p in outputs}
    assert changed == own
    assert len(pd.read_csv(study.dir / grid / "emergence.csv")) == 4
    assert len(pd.read_csv(study.dir / NATURAL / "emergence.csv")) == len(study.study.runs)
    again = study.first_study_again
    assert again.rc == 0 and "Nothing to be done" in again.out, again.out[-3000:]


def test_runs_record_their_progress(study):
    for run in study.study.runs:
        progress = json.loads(run_path(study, run, layout.PROGRESS_JSON).read_text())
        assert progress["state"] == "done", (run.id, progress)
        assert progress["step"] == progress["total_steps"] == study.study.total_steps(run), run.id
        assert progress["tokens"] == progress["step"] * run.tokens_per_step, run.id


@pytest.mark.parametrize("model, hf_class", [("tiny", "GPT2LMHeadModel"),
                                             ("rope", "LlamaForCausalLM")])  # fmt: skip
def test_export_target_gives_a_folder_transformers_loads_with_our_logits(study, model, hf_class):
    transformers = pytest.importorskip("transformers")
    run = next(r for r in study.study.runs if r.model == model)
    target = study.paths.export_dir(run)
    result = snakemake(study.dir, target)
    assert result.rc == 0, result.out[-3000:] + logs_of(study.dir)
    assert job_stats(result.out) == {"export": 1}
    hf = transformers.AutoModelForCausalLM.from_pretrained(study.dir / target).eval()
    assert type(hf).__name__ == hf_class
    meta = read_checkpoint(sorted(run_path(study, run, "ckpt").glob("*.json"))[-1])
    ours = GPT(GPTConfig(**meta["model_config"]))
    ours.load_state_dict(load_checkpoint_weights(meta))
    tokens = torch.randint(0, ours.cfg.vocab_size, (2, run.context_size))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours.eval()(tokens), rtol=0, atol=1e-5)
    assert "Nothing to be done" in snakemake(study.dir, target).out


def test_the_two_families_laws_are_side_by_side(study):
    # gpt2 (tiny, wide) and llama (rope) runs: the aggregate fits each family's law alone.
    table = pd.read_csv(study.dir / layout.aggregate_file("families.csv", NATURAL))
    assert list(table.columns) == ["family", "quantity", "estimate", "ci_low", "ci_high"]
    assert {"gpt2", "llama"} <= set(table["family"])
    fit = json.loads((study.dir / layout.aggregate_file("lawfit.json", NATURAL)).read_text())
    laws = fit["families"]["families"]
    assert laws["gpt2"]["models"] == ["tiny", "wide"] and laws["llama"]["models"] == ["rope"]
    runs = pd.read_csv(study.dir / NATURAL / "emergence.csv")
    assert laws["llama"]["n_runs"] == int(runs[runs["model"] == "rope"]["emerged"].sum())
    assert "Model families" in (study.dir / NATURAL / layout.FINDINGS).read_text()


def test_deleted_probe_tables_come_back_from_the_cache(study):
    """Runs last: it rewrites one run's probe tables (the same content, new mtimes)."""
    run = next(r for r in study.study.runs if r.model == "tiny" and r.batch_size == 8)
    probes = (study.dir / study.paths.probe_table("heads", run)).parent
    log = study.dir / study.paths.run_log("probe", run)
    n_ckpt = len(study.study.checkpoint_steps(run))
    assert len(re.findall(r"^probed step \d+", log.read_text(), re.MULTILINE)) == n_ckpt
    cache = {p.name: p.stat().st_mtime_ns for p in (probes / "cache").glob("*.parquet")}
    assert len(cache) == n_ckpt
    tables = {name: read_table(study, run, name) for name in ("heads", "model")}
    for name in tables:
        (probes / f"{name}.parquet").unlink()

    targets = [study.paths.probe_table(name, run) for name in tables]
    rerun = snakemake(study.dir, *targets)
    assert rerun.rc == 0, rerun.out[-3000:] + logs_of(study.dir)
    assert job_stats(rerun.out) == {"probe": 1}
    for name, before in tables.items():
        pd.testing.assert_frame_equal(read_table(study, run, name), before)
    assert "probed step" not in log.read_text()  # every checkpoint was a cache hit
    assert {p.name: p.stat().st_mtime_ns for p in (probes / "cache").glob("*.parquet")} == cache
