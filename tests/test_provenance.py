"""The config hash of provenance.json: the study definition, not where or how it runs."""

from __future__ import annotations

import copy

from ihsweep.provenance import config_sha256, study_definition

CONFIG = {
    "models": {"w64": {"n_layer": 2, "d_model": 64, "tokens_per_second": 200000}},
    "training": {"tokens": 3000000, "lr": 0.006, "device": "auto", "threads": 1,
                 "progress_seconds": 15, "log_every": 50},
    "resources": {"gpu": 1, "train_mem_mb": 16000},
}  # fmt: skip


def changed(**edits) -> dict:
    config = copy.deepcopy(CONFIG)
    for path, value in edits.items():
        section, key = path.split("__")
        config[section][key] = value
    return config


def test_execution_settings_do_not_change_the_hash():
    same = [
        changed(training__device="cuda", training__threads=8, training__progress_seconds=60),
        changed(resources__gpu=4, resources__train_mem_mb=64000),
        {**CONFIG, "models": {"w64": {**CONFIG["models"]["w64"], "tokens_per_second": 1e6}}},
    ]
    assert {config_sha256(c) for c in same} == {config_sha256(CONFIG)}
    assert study_definition(CONFIG) == {
        "models": {"w64": {"n_layer": 2, "d_model": 64}},
        "training": {"tokens": 3000000, "lr": 0.006, "log_every": 50},
    }
    assert CONFIG["resources"] == {"gpu": 1, "train_mem_mb": 16000}  # the input is not changed


def test_what_a_study_computes_changes_the_hash():
    hashes = {
        config_sha256(c)
        for c in (CONFIG, changed(training__lr=0.003), changed(training__log_every=10))
    }
    assert len(hashes) == 3
