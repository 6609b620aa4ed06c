"""Markov datasets through the real ``snakemake`` command line, on a tiny study in a tmp folder.

One module-scoped fixture runs the study tests/studies/markov.yaml, with a synthetic chain
(V = 64, +D, a few optimiser steps) and a two-cell (f, r) grid over one bigram chain of a 300-type
BPE of the KJV (capped at 64 types), tiny attention-only runs on each, and the Markov aggregate;
the tests then read what it left, at the paths of ``ihsweep.files.layout``. A dry run checks that an
unreachable frequency is refused before any job exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import job_stats, run_study, snakemake, study_text
from ihsweep.config import StudyPaths
from ihsweep.files import layout
from ihsweep.steps.prepare import prepare

# The aggregates of the test studies, which keep the schema's default name (`study`).
MARKOV = layout.markov_dir("default")

pytestmark = pytest.mark.slow

CONFIG = study_text("markov")
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> SimpleNamespace:
    workdir = tmp_path_factory.mktemp("markov")
    first = run_study(workdir, CONFIG)
    prepared = prepare(yaml.safe_load(CONFIG))
    return SimpleNamespace(dir=workdir, study=prepared, paths=StudyPaths(prepared), first=first)


def chunks_meta(study, data: str, ctx: int) -> dict:
    return json.loads((study.dir / study.paths.chunk_dir(data, ctx) / "chunks.json").read_text())


def test_jobs(study):
    assert job_stats(study.first.out) == {
        "tokenize": 1,
        "chain": 2,  # the grid's two cells share one chain
        "chunk": 4,
        "train": 4,
        "probe": 4,
        "run_figure": 4,
        "aggregate_markov": 1,
        "all": 1,
    }


CELLS = [("syn", 16), ("syn", 32), ("semi-f0.3-r0.5", 32), ("semi-f0.5-r0.5", 32)]


@pytest.mark.parametrize(("data", "ctx"), CELLS)
def test_chunks_measure_the_request(study, data, ctx):
    meta = chunks_meta(study, data, ctx)
    spec = study.study.config["datasets"][data]
    assert meta["format"] == "ihsweep.markov.chunks/1"
    assert meta["context"] == ctx and meta["vocab_size"] == 64
    assert (meta["n_train"], meta["n_val"]) == (1000, 200)
    assert meta["requested"]["calibration"] == "exact"
    assert meta["split_seeds"]["train"] != meta["split_seeds"]["val"]
    for split in ("train", "val"):
        m = meta["measured"][split]
        assert abs(m["f"] - spec["frequency"]) < TOLERANCE, (split, m)
        assert abs(m["r"] - spec["reliability"]) < TOLERANCE, (split, m)
        assert m["first_half_repeats"] == 0
        assert m["entropy_rate_bits"] > 0
        chunks = study.dir / study.paths.chunk_dir(data, ctx) / meta["files"][split]["chunks"]
        size = chunks.stat()
        assert size.st_size == meta[f"n_{split}"] * ctx * 2  # uint16


def test_chains(study):
    syn = json.loads((study.dir / study.paths.chain_dir("syn") / "chain.json").read_text())
    semi = json.loads((study.dir / study.paths.chain_dir("semi") / "chain.json").read_text())
    assert (syn["kind"], syn["vocab_size"]) == ("synthetic", 64)
    assert (semi["kind"], semi["vocab_size"]) == ("bigram", 64)
    assert semi["spec"]["vocab_cap"] == 64
    chains = (study.dir / study.paths.chain_dir("syn")).parent
    assert sorted(p.name for p in chains.iterdir()) == sorted(
        study.paths.chain_folder(grid) for grid in ("semi", "syn")
    )
    for grid in ("syn", "semi"):
        folder = study.dir / study.paths.chain_dir(grid)
        assert all((folder / f).is_file() for f in layout.CHAIN_FILES)


def test_runs_have_probe_tables(study):
    runs = study.study.runs
    assert len(runs) == 4
    for run in runs:
        table = pd.read_parquet(study.dir / study.paths.probe_table("model", run))
        assert len(table) == 3 and set(table["data"]) == {run.data}
        assert (study.dir / study.paths.probe_table("heads", run)).is_file()
        assert all((study.dir / f).is_file() for f in study.paths.run_figures(run)), run.id


def test_unreachable_frequency_is_a_config_error(tmp_path: Path):
    config = yaml.safe_load(CONFIG)
    config["datasets"]["syn"]["frequency"] = 0.9  # at C = 16 at most 7/8 can be contexts
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    assert result.rc != 0
    lines = [line for line in result.out.splitlines() if line.startswith("config error:")]
    assert len(lines) == 1, result.out
    assert lines[0].startswith("config error: datasets.syn.frequency: ")
    assert "unreachable" in lines[0] and "runs[0]" in lines[0]


def test_markov_aggregate(study):
    out = study.dir / MARKOV
    runs = pd.read_csv(out / "emergence.csv")
    assert sorted(runs["data"]) == sorted(run.data for run in study.study.runs)
    semi = runs[runs["grid"] == "semi"].sort_values("frequency")
    assert semi["frequency"].tolist() == [0.3, 0.5] and set(semi["chain_kind"]) == {"bigram"}
    assert (semi["measured_frequency"] - semi["frequency"]).abs().max() < TOLERANCE
    generator = pd.read_csv(out / "generator.csv")
    assert len(generator) == 4 and (generator["first_half_repeats"] == 0).all()
    assert set(json.loads((out / "frontier.json").read_text())) == {"semi-tiny-B8-C32"}
    figures = {p.name for p in (out / "figures").iterdir()}
    assert figures == {f"{s}.{e}" for s in ("frontier-semi-tiny-B8-C32", "properties", "generator")
                       for e in ("png", "pdf")}  # fmt: skip
    # The DAG asked for what the aggregate wrote: layout.markov_outputs of the same stems.
    stems = ["frontier-semi-tiny-B8-C32", "properties", "generator"]
    expected = layout.markov_outputs(stems, MARKOV)
    assert all((study.dir / f).is_file() for f in expected), expected
    assert {Path(f).name for f in expected if "/figures/" in f} == figures
