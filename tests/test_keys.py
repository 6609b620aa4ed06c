"""Folders keyed by the settings that made them (``ihsweep.config.keys``).

Unit tests: which settings move which folders (and that execution settings move none), the
default study and cpu-full sharing their common folders, ``python -m ihsweep.where``, and the
study-name claim. Through the real ``snakemake`` (slow): four tiny studies in one results/
that give the names ``kjv``, ``semi`` and ``tiny`` other settings (a tokenizer, a chain's
vocabulary cap, a width) all finish with the tables each makes alone, and none plans anything
afterwards; another study under a taken name is refused before any job; one configuration is
retrained by the documented command; and a results/ made by the last commit that keyed folders
by names alone is upgraded by ``python -m ihsweep.upgrade`` with no training or probing.
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, job_stats, mtimes, run_study, snakemake
from ihsweep.config import Run, StudyPaths, load_configfiles
from ihsweep.files import layout
from ihsweep.report.provenance import STUDY_JSON, StudyClaim, claim_clash, write_claim
from ihsweep.steps.prepare import prepare
from ihsweep.upgrade import agrees

# The last commit whose results/ folders are named by names alone (the upgrade's source).
NAMED_LAYOUT_COMMIT = "b150055"

BASE = """\
study: a
models:
  tiny: {n_layer: 2, n_head: 4, d_model: 32, mlp: false, n_ctx: 64}
datasets:
  kjv:
    family: natural
    corpus: {source: kjv}
    tokenizer: {kind: bpe, vocab_size: 300}
  semi:
    family: markov
    chain: {kind: bigram, source: kjv, vocab_cap: 64}
    frequency: 0.5
    reliability: 0.9
    n_train_sequences: 1000
    n_val_sequences: 200
runs:
  - {data: [kjv, semi], model: tiny, batch_size: 8, context_size: 16, seed: 0}
training: {tokens: 20000, lr: 0.003}
checkpoints: {tokens: [5000, 10000, 20000]}
lawfit: {bootstrap: 20}
"""
NATURAL_RUN = Run("kjv", "tiny", 8, 16, 0)
MARKOV_RUN = Run("semi", "tiny", 8, 16, 0)


def variant(study: str, *changes: tuple[tuple[str, ...], object]) -> dict:
    """BASE under another study name, with values set at key paths."""
    config = yaml.safe_load(BASE)
    config["study"] = study
    for path, value in changes:
        node = config
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return config


# One name each, given other settings: a tokenizer, a width, a chain's vocabulary cap.
VARIANTS = {
    "tok": variant("tok", (("datasets", "kjv", "tokenizer", "vocab_size"), 280)),
    "width": variant("width", (("models", "tiny", "d_model"), 48)),
    "cap": variant("cap", (("datasets", "semi", "chain", "vocab_cap"), 48)),
}


def paths_of(config: dict) -> StudyPaths:
    return StudyPaths(prepare(copy.deepcopy(config)))


def folders(paths: StudyPaths) -> dict[str, str]:
    """Every keyed folder of the test study."""
    return {
        "kjv": paths.dataset_dir("kjv"),
        "semi chain": paths.chain_dir("semi"),
        "semi": paths.dataset_dir("semi"),
        "natural run": paths.run_dir(NATURAL_RUN),
        "markov run": paths.run_dir(MARKOV_RUN),
        "probes": paths.probe_table("model", NATURAL_RUN),
        "figures": paths.run_figures(NATURAL_RUN)[0],
    }


def moved_by(config: dict) -> set[str]:
    """The folders whose keys differ from BASE's."""
    base, other = folders(paths_of(yaml.safe_load(BASE))), folders(paths_of(config))
    return {name for name in base if base[name] != other[name]}


EVERY = {"kjv", "semi chain", "semi", "natural run", "markov run", "probes", "figures"}
RUNS = {"natural run", "markov run", "probes", "figures"}  # probes and figures are in runs


@pytest.mark.parametrize(
    ("changes", "moved"),
    [
        ([(("datasets", "kjv", "tokenizer", "vocab_size"), 280)], EVERY),
        ([(("datasets", "semi", "chain", "vocab_cap"), 48)], {"semi chain", "semi", "markov run"}),
        ([(("datasets", "semi", "frequency"), 0.6)], {"semi", "markov run"}),
        ([(("models", "tiny", "d_model"), 48)], RUNS),
        ([(("training", "tokens"), 40000)], RUNS),
        ([(("training", "stop_after_emergence"), True)], RUNS),
        ([(("probe", "seed"), 7)], {"probes", "figures"}),
        ([(("emergence", "min_rise"), 0.2)], {"figures"}),
        ([(("lawfit", "bootstrap"), 30)], set()),
        ([(("execution",), {"device": "cpu", "threads": 2, "micro_batch": 4, "compile": True})],
         set()),
    ],
    ids=["tokenizer", "chain-cap", "cell-f", "width", "budget", "early-stop", "probe",
         "emergence", "lawfit", "execution"],
)  # fmt: skip
def test_each_setting_moves_exactly_the_folders_it_changes(changes, moved):
    assert moved_by(variant("a", *changes)) == moved


def test_an_early_stopping_run_is_keyed_by_its_probe_and_emergence_settings():
    # The rule that decides where it ends probes its checkpoints: those settings move the run.
    stop = (("training", "stop_after_emergence"), True)
    for setting in [(("probe", "seed"), 7), (("emergence", "min_rise"), 0.2)]:
        before = folders(paths_of(variant("a", stop)))
        after = folders(paths_of(variant("a", stop, setting)))
        assert before["natural run"] != after["natural run"], setting


def test_the_default_study_and_cpu_full_share_every_common_folder():
    default = StudyPaths(prepare(load_configfiles([REPO / "config.yaml"])))
    full = StudyPaths(
        prepare(load_configfiles([REPO / "config.yaml", REPO / "workflow/studies/cpu-full.yaml"]))
    )
    assert set(default.study.runs) < set(full.study.runs)
    for run in default.study.runs:
        assert default.run_dir(run) == full.run_dir(run), run.id
        assert default.probe_table("model", run) == full.probe_table("model", run)
        assert default.run_figures(run) == full.run_figures(run)
    for grid in default.study.grids:
        assert default.chain_dir(grid) == full.chain_dir(grid)
    # cpu-full trains only the runs the default study has not.
    own = {full.run_dir(run) for run in full.study.runs} - {
        default.run_dir(run) for run in default.study.runs
    }
    assert len(own) == len(full.study.runs) - len(default.study.runs)


def test_a_suites_key_is_as_before_and_keep_duplicates_moves_it_not():
    # keep_duplicates decides the emergence fit, not the suite's files: no suite is re-probed.
    entry = {"model": "EleutherAI/pythia-70m-deduped", "revisions": ["step0", "step1000"],
             "batch_size": 1024, "context_size": 2048}  # fmt: skip
    for keep in (False, True):
        study = prepare({"suites": {"p": entry | {"keep_duplicates": keep}}})
        assert StudyPaths(study).suite_dir("p") == "results/suites/p-7cb94034"  # as at cfb1bda


def test_keyed_names_round_trip():
    key = layout.settings_key({"a": 1})
    assert len(key) == layout.KEY_LENGTH and layout.settings_key({"a": 1}) == key
    assert layout.unkeyed(layout.keyed("zipf+D-C-f0.9-r0.9", key)) == "zipf+D-C-f0.9-r0.9"
    with pytest.raises(ValueError, match="no keyed folder name"):
        layout.unkeyed("kjv-copy")


def test_agrees_compares_what_a_record_holds():
    assert agrees({"a": 1, "b": None, "c": {"d": 2}}, {"a": 1, "b": 5, "c": {"d": 2, "e": 3}})
    assert not agrees({"a": 1, "c": {"d": 2}}, {"a": 1, "c": {"d": 3}})
    assert agrees({"a": 1, "missing": 2}, {"a": 1})


def where(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ihsweep.where", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )  # fmt: skip


def test_where_prints_folders_by_readable_names(tmp_path):
    (tmp_path / "config.yaml").write_text(BASE)
    paths = paths_of(yaml.safe_load(BASE))
    found = where(tmp_path, "kjv/tiny/B8-C16-s0", "kjv", "semi")
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [
        paths.run_dir(NATURAL_RUN),
        paths.dataset_dir("kjv"),
        paths.dataset_dir("semi"),  # a one-cell Markov entry: a dataset and its chain
        paths.chain_dir("semi"),
    ]
    pattern = where(tmp_path, "*/tiny/B8-*", "--file", "run.json")
    assert pattern.stdout.split() == [
        paths.run_file("run.json", NATURAL_RUN),
        paths.run_file("run.json", MARKOV_RUN),
    ]
    missing = where(tmp_path, "kjv/tiny/B9-C16-s0")
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith("kjv/tiny/B9-C16-s0: no run, dataset, chain, suite or suite")


def test_a_study_name_is_held_by_its_files(tmp_path):
    mine = StudyClaim("s", ("config.yaml",), "1" * 64)
    assert claim_clash(mine, tmp_path) is None  # nothing recorded yet
    write_claim(mine, tmp_path)
    assert (tmp_path / layout.study_dir("s") / STUDY_JSON).is_file()
    assert claim_clash(StudyClaim("s", ("config.yaml",), "2" * 64), tmp_path) is None  # edited
    assert claim_clash(StudyClaim("s", ("copy.yaml",), "1" * 64), tmp_path) is None  # a copy
    clash = claim_clash(StudyClaim("s", ("config.yaml", "mine.yaml"), "2" * 64), tmp_path)
    assert clash is not None and "\n" not in clash
    assert "config.yaml (definition sha256 111111111111)" in clash
    assert "config.yaml mine.yaml (definition sha256 222222222222)" in clash


# --------------------------------------------------------------------------------------------
# Through Snakemake


def tables(workdir: Path, config: dict) -> dict[str, bytes]:
    """A study's tables, by path: its aggregates' (not provenance.json, which names the code,
    nor study.json) and its runs' probe tables."""
    paths = paths_of(config)
    files = _aggregate_tables(workdir, config["study"], (".csv", ".json", ".html", ".rst"))
    for run in paths.study.runs:
        for name in layout.PROBE_TABLES:
            path = paths.probe_table(name, run)
            files[path] = (workdir / path).read_bytes()
    return files


def run_config(workdir: Path, config: dict, *args: str) -> SimpleNamespace:
    return run_study(workdir, yaml.safe_dump(config, sort_keys=False), *args)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> SimpleNamespace:
    """Study a alone, then the three variants in the same results/; then a again."""
    workdir = tmp_path_factory.mktemp("shared")
    base = yaml.safe_load(BASE)
    first = run_config(workdir, base)
    alone_a = tables(workdir, base)
    variants = {name: run_config(workdir, config) for name, config in VARIANTS.items()}
    (workdir / "config.yaml").write_text(BASE)
    again = {"a": snakemake(workdir, "-n")}
    for name, config in VARIANTS.items():
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
        again[name] = snakemake(workdir, "-n")
    (workdir / "config.yaml").write_text(BASE)
    return SimpleNamespace(dir=workdir, first=first, alone_a=alone_a, variants=variants,
                           again=again)  # fmt: skip


@pytest.mark.slow
def test_studies_that_reuse_names_keep_their_own_folders(shared):
    jobs = {name: job_stats(run.out) for name, run in shared.variants.items()}
    # What each variant shares with a is not made again.
    assert jobs["width"]["train"] == 2 and "tokenize" not in jobs["width"]
    assert "chain" not in jobs["width"] and "chunk" not in jobs["width"]
    assert jobs["cap"]["train"] == 1 and jobs["cap"]["chain"] == 1
    assert "tokenize" not in jobs["cap"]
    assert jobs["tok"]["tokenize"] == jobs["tok"]["chain"] == 1 and jobs["tok"]["train"] == 2
    for name, run in shared.again.items():
        assert run.rc == 0 and "Nothing to be done" in run.out, (name, run.out[-3000:])
    assert tables(shared.dir, yaml.safe_load(BASE)) == shared.alone_a


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_study_makes_the_tables_it_makes_alone(shared, name, tmp_path):
    config = VARIANTS[name]
    run_config(tmp_path, config)
    alone = tables(tmp_path, config)
    # natural, held-out and Markov aggregate files; 2 runs' probe tables
    aggregates = (*layout.NATURAL_TABLES, *layout.HELDOUT_TABLES, *layout.MARKOV_TABLES)
    assert len(alone) == len(aggregates) + 2 * 2
    assert tables(shared.dir, config) == alone


@pytest.mark.slow
def test_another_study_under_a_taken_name_is_refused_before_any_job(shared):
    other = shared.dir / "other.yaml"
    other.write_text(yaml.safe_dump(variant("a", (("training", "lr"), 0.002))))
    before = mtimes(shared.dir / layout.RESULTS)
    refused = snakemake(shared.dir, "-n", configfiles=(other,))
    assert refused.rc != 0
    lines = [line for line in refused.out.splitlines() if line.startswith("config error:")]
    assert len(lines) == 1, refused.out[-3000:]
    assert lines[0].startswith("config error: study 'a': results/studies/a/ holds the study of")
    assert "other.yaml" in lines[0] and "--config study=<name>" in lines[0]
    assert mtimes(shared.dir / layout.RESULTS) == before


@pytest.mark.slow
def test_the_documented_command_retrains_one_configuration_alone(shared):
    """README: rm -r $(python -m ihsweep.where <run id>) && snakemake."""
    base = yaml.safe_load(BASE)
    folder = where(shared.dir, "kjv/tiny/B8-C16-s0").stdout.strip()
    assert folder == paths_of(base).run_dir(NATURAL_RUN)
    before = tables(shared.dir, base)
    subprocess.run(["rm", "-r", folder], cwd=shared.dir, check=True)
    rerun = snakemake(shared.dir)
    assert rerun.rc == 0, rerun.out[-3000:]
    assert job_stats(rerun.out) == {
        "train": 1, "probe": 1, "run_figure": 1, "aggregate_natural": 1, "heldout_natural": 1,
        "all": 1,
    }  # fmt: skip
    assert tables(shared.dir, base) == before  # the same bits again


def checkout_of(commit: str, dest: Path) -> Path:
    """The Snakefile, package, profiles and envs of ``commit`` (git archive), in ``dest``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "Snakefile", "workflow",
         "profiles", "envs"],
        capture_output=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(dest, filter="data")
    return dest


@pytest.mark.slow
def test_a_results_folder_named_by_names_is_upgraded_without_training(tmp_path_factory):
    old = checkout_of(NAMED_LAYOUT_COMMIT, tmp_path_factory.mktemp("named-layout"))
    workdir = tmp_path_factory.mktemp("upgrade")
    (workdir / "config.yaml").write_text(BASE)
    built = snakemake(workdir, checkout=old)
    assert built.rc == 0, built.out[-3000:]
    assert (workdir / "results/runs/kjv/tiny/B8-C16-s0/run.json").is_file()  # named by names
    base = yaml.safe_load(BASE)
    named = _aggregate_tables(workdir, "a", (".csv", ".json"))

    # Upgraded first for another study that shares the data but not the width: the datasets
    # and the chain move; the runs, made with another spec, stay where they are.
    (workdir / "width.yaml").write_text(yaml.safe_dump(VARIANTS["width"]))
    other = upgrade(workdir, "--configfile", "width.yaml")
    assert other.startswith("moved into keyed folders: 2 datasets, 4 logs, 1 chain\n"), other
    assert "left 2 folders made with other settings in place:" in other, other
    assert "results/runs/kjv/tiny/B8-C16-s0: run.json records another training spec" in other
    mine = upgrade(workdir)
    assert mine.startswith("moved into keyed folders:") and "2 runs" in mine, mine
    assert "4 probe tables" in mine and "6 run figure files" in mine, mine
    assert "left" not in mine, mine
    planned = snakemake(workdir, "-n")
    assert planned.rc == 0, planned.out[-3000:]
    assert job_stats(planned.out) == {
        "aggregate_natural": 1, "heldout_natural": 1, "aggregate_markov": 1, "all": 1
    }  # fmt: skip

    rerun = snakemake(workdir)
    assert rerun.rc == 0, rerun.out[-3000:]
    assert _as_written_then(_aggregate_tables(workdir, "a", (".csv", ".json")), named) == named
    assert (workdir / paths_of(base).run_file("run.json", NATURAL_RUN)).is_file()


def _as_written_then(tables: dict[str, bytes], then: dict[str, bytes]) -> dict[str, bytes]:
    """Tables written now as the code of ``then`` wrote them: the files it wrote (the held-out
    folder came later) and, of lawfit.json, the fields it had (the prediction's came later)."""
    now = {path: tables[path] for path in then if path in tables}
    for path in [p for p in then if p.endswith("lawfit.json") and p in now]:
        old = json.loads(then[path])
        kept = {key: value for key, value in json.loads(now[path]).items() if key in old}
        now[path] = then[path] if kept == old else json.dumps(kept).encode()
    return now


def upgrade(workdir: Path, *args: str) -> str:
    """``python -m ihsweep.upgrade`` in ``workdir``: what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "ihsweep.upgrade", *args], cwd=workdir, capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _aggregate_tables(workdir: Path, study: str, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    """A study's aggregate files with these suffixes, but provenance.json and study.json."""
    folder = workdir / layout.study_dir(study)
    return {
        str(p.relative_to(workdir)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.suffix in suffixes and p.name not in (layout.PROVENANCE, STUDY_JSON)
    }
