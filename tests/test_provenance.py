"""The config hash of provenance.json: the study definition, not where or how it runs.

Where and how a study runs lives in its ``execution`` section (``ihsweep.config``), so the hash
is that of the config without it (``ihsweep.config.study_definition``): changing anything under
``execution`` keeps the hash, changing anything else changes it.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml
from conftest import SCHEMA, study_text
from ihsweep.config import study_definition
from ihsweep.report.provenance import PACKAGE_DIR, code_sha256, config_sha256, run_sha256
from ihsweep.steps.prepare import prepare

CONFIG = {
    "models": {"w64": {"n_layer": 2, "d_model": 64}},
    "training": {"tokens": 3000000, "lr": 0.006, "log_every": 50},
    "emergence": {"metric": "ps_max", "method": "sigmoid", "min_rise": 0.05},
    "execution": {"device": "auto", "threads": 1, "progress_seconds": 15, "gpu": 1,
                  "train_mem_mb": 16000, "micro_batch": "auto"},
}  # fmt: skip
EXECUTION_EDITS = {
    "device": "cuda:1",
    "threads": 8,
    "progress_seconds": 60,
    "gpu": 4,
    "gpu_model": "a100",
    "train_mem_mb": 64000,
    "probe_mem_mb": 32000,
    "micro_batch": 2,
    "compile": True,
    "device_profile": "h100",
    "overhead_minutes": 3,
    "safety": 2.0,
    "probe_minutes": 90,
}
STUDY_EDITS = [
    ("training", "lr", 0.003),
    ("training", "log_every", 10),
    ("training", "tokens", 4000000),
    ("models", "w64", {"n_layer": 2, "d_model": 32}),
    ("emergence", "method", "breakpoint"),
    ("emergence", "min_rise", 0.1),
]


def changed(section: str, key: str, value) -> dict:
    config = copy.deepcopy(CONFIG)
    config.setdefault(section, {})[key] = value
    return config


def test_study_definition_is_the_config_without_execution():
    before = copy.deepcopy(CONFIG)
    study = study_definition(CONFIG)
    assert study == {k: v for k, v in before.items() if k != "execution"}
    assert "execution" not in study and set(study) == {"models", "training", "emergence"}
    assert CONFIG == before  # the input is not changed


def test_execution_settings_do_not_change_the_hash():
    same = [changed("execution", key, value) for key, value in EXECUTION_EDITS.items()]
    same.append({**CONFIG, "execution": EXECUTION_EDITS})  # all of them at once
    same.append({k: v for k, v in CONFIG.items() if k != "execution"})  # none at all
    assert {config_sha256(c) for c in same} == {config_sha256(CONFIG)}


def test_what_a_study_computes_changes_the_hash():
    hashes = [config_sha256(CONFIG)] + [config_sha256(changed(*edit)) for edit in STUDY_EDITS]
    assert len(set(hashes)) == len(STUDY_EDITS) + 1


def prepared(**sections) -> dict:
    """A tiny test study as ``prepare`` leaves it, validated with every default filled in;
    ``sections`` replace (or add) top-level sections."""
    return prepare({**yaml.safe_load(study_text("base")), **sections}, SCHEMA).config


def test_prepared_study_keeps_its_hash_wherever_it_runs():
    # prepare fills `execution` with the schema's defaults; other values must hash the same.
    base = prepared()
    assert base["execution"]["device"] == "auto"
    elsewhere = prepared(execution=copy.deepcopy(EXECUTION_EDITS))
    assert elsewhere["execution"]["threads"] == 8 and elsewhere["execution"]["gpu"] == 4
    assert config_sha256(elsewhere) == config_sha256(base)


@pytest.mark.parametrize(
    "sections",
    [
        {"emergence": {"method": "sigmoid"}},
        {"lawfit": {"seed": 1}},
        {"probe": {"seed": 1}},
        {"checkpoints": {"start": 31250, "linear_from": 1000000, "every": 250000}},
    ],
)
def test_prepared_study_change_changes_the_hash(sections):
    base = prepared()
    other = prepared(**copy.deepcopy(sections))
    assert study_definition(other) != study_definition(base)
    assert config_sha256(other) != config_sha256(base)


def test_a_runs_figure_hash_is_its_spec_and_the_emergence_settings():
    study = prepare(yaml.safe_load(study_text("base")), SCHEMA)
    first, second = study.runs[:2]
    emergence = study.config["emergence"]
    spec = study.train_spec(first)
    assert run_sha256(spec, emergence) == run_sha256(copy.deepcopy(spec), dict(emergence))
    assert run_sha256(spec, emergence) != run_sha256(study.train_spec(second), emergence)
    assert run_sha256(spec, emergence) != run_sha256(spec, {**emergence, "min_rise": 0.2})
    assert run_sha256({**spec, "seed": 1}, emergence) != run_sha256(spec, emergence)


def test_the_code_hash_is_the_packages_python_source(tmp_path):
    """Any edit, added or renamed module changes it; bytecode and other files do not."""
    package = tmp_path / "ihsweep"
    shutil.copytree(PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    base = code_sha256(package)
    assert base == code_sha256(PACKAGE_DIR)  # the paths inside the package, not where it lies
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (package / "notes.txt").write_text("not code")
    assert code_sha256(package) == base

    lawfit = package / "analysis" / "lawfit.py"
    source = lawfit.read_text()
    lawfit.write_text(source + "# a comment\n")
    edited = code_sha256(package)
    lawfit.write_text(source)
    assert code_sha256(package) == base
    lawfit.rename(package / "analysis" / "lawfit2.py")
    renamed = code_sha256(package)
    (package / "analysis" / "lawfit2.py").rename(lawfit)
    (package / "analysis" / "extra.py").write_text("")
    added = code_sha256(package)
    assert len({base, edited, renamed, added}) == 4
