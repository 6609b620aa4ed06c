"""``--config`` overrides read as the schema's types (``ihsweep.config.overrides``): nested
values, which Snakemake hands over as strings, become integers, numbers, booleans and null where
the schema wants them; a value that is none of its types is one line naming the key, the value,
the type and the ``--config`` form; a quoted number in a file is still refused. A real Snakemake
dry run and the cost table plan the overridden budget."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, snakemake, study_text
from ihsweep.config import (
    ConfigError,
    coerce_overrides,
    load_configfiles,
    parse_overrides,
    read_study,
)
from snakemake.utils import update_config

BASE = REPO / "tests" / "studies" / "base.yaml"


def overridden(*entries: str) -> dict:
    """base.yaml patched by ``--config`` entries as Snakemake patches it, then coerced."""
    config = load_configfiles([BASE])
    overrides = parse_overrides(entries)
    update_config(config, overrides)
    return coerce_overrides(config, overrides)


@pytest.mark.parametrize(
    ("entry", "section", "expected"),
    [
        ('training={"tokens": 80000}', "training", {"tokens": 80000}),
        ('training={"lr": 1e-3, "grad_clip": 0.5}', "training", {"lr": 0.001, "grad_clip": 0.5}),
        ('training={"stop_after_emergence": true}', "training", {"stop_after_emergence": True}),
        ('lawfit={"model": null, "bootstrap": 50}', "lawfit", {"model": None, "bootstrap": 50}),
        ('lawfit={"model": tiny}', "lawfit", {"model": "tiny"}),
        ('execution={"micro_batch": 4}', "execution", {"micro_batch": 4}),
        ('execution={"micro_batch": auto}', "execution", {"micro_batch": "auto"}),
        ('checkpoints={"tokens": [100000, 200000]}', "checkpoints", {"tokens": [100000, 200000]}),
        ('checkpoints={"start": "100000"}', "checkpoints", {"start": 100000}),
    ],
)
def test_a_nested_override_takes_the_type_the_schema_wants(entry, section, expected):
    config = overridden(entry)
    got = {key: config[section][key] for key in expected}
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


def test_an_overridden_study_reads_with_the_overridden_values():
    study = read_study(overridden('training={"tokens": 80000, "lr": 1e-3}', "study=other"))
    assert study.config["training"]["tokens"] == 80000
    assert study.config["training"]["lr"] == 0.001
    assert study.config["study"] == "other"
    assert study.config["datasets"]["kjv-copy"]["family"] == "natural"  # untouched


def test_a_runs_list_given_on_the_command_line_is_coerced_item_by_item():
    entry = 'runs=[{"data": kjv-copy, "model": tiny, "batch_size": [8, 16], "context_size": 32}]'
    run = read_study(overridden(entry)).config["runs"][0]
    assert run["batch_size"] == [8, 16] and run["context_size"] == 32


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            'training={"tokens": 80k}',
            "training.tokens: --config gave '80k', which is not an integer; give an integer "
            "without quotes, e.g. --config 'training={\"tokens\": 1000}'",
        ),
        (
            'training={"tokens": 1e5}',
            "training.tokens: --config gave '1e5', which is not an integer; give an integer "
            "without quotes, e.g. --config 'training={\"tokens\": 100000}'",
        ),
        (
            'training={"lr": fast}',
            "training.lr: --config gave 'fast', which is not a number; give a number without "
            "quotes, e.g. --config 'training={\"lr\": 0.00025}'",
        ),
    ],
)
def test_a_value_of_none_of_its_types_names_key_value_type_and_the_form(entry, message):
    with pytest.raises(ConfigError) as err:
        overridden(entry)
    assert str(err.value) == message


def test_a_quoted_number_in_a_config_file_is_still_refused(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(BASE.read_text().replace("tokens: 6000000", 'tokens: "6000000"'))
    config = load_configfiles([path])
    coerce_overrides(config, {})  # nothing came from the command line
    with pytest.raises(ConfigError, match=r"^training.tokens: expected an integer, got '6000000'"
                       r" \(string\); write 6000000 without quotes$"):  # fmt: skip
        read_study(config)


def planned_specs(output: str) -> list[dict]:
    """The training specs of the train jobs a ``snakemake -n -p`` prints."""
    lines = [line for line in output.splitlines() if "ihsweep.steps.train " in line]
    return [json.loads(re.search(r"--spec '(\{.*?\})'", line)[1]) for line in lines]


@pytest.mark.slow
def test_a_snakemake_dry_run_plans_the_nested_override(tmp_path):
    (tmp_path / "config.yaml").write_text(study_text("workflow"))
    plain = planned_specs(snakemake(tmp_path, "-n", "-p").out)
    result = snakemake(tmp_path, "-n", "-p", "--config", 'training={"tokens": 24576}')
    assert result.rc == 0, result.out[-3000:]
    specs = planned_specs(result.out)
    assert specs and len(specs) == len(plain)
    assert {spec["training"]["tokens"] for spec in specs} == {24576}
    assert {spec["training"]["tokens"] for spec in plain} != {24576}

    refused = snakemake(tmp_path, "-n", "--config", 'training={"tokens": 24k}')
    assert refused.rc != 0
    assert "config error: training.tokens: --config gave '24k', which is not an integer" in (
        refused.out
    )
    assert "Job stats" not in refused.out


def test_the_cost_table_takes_the_same_config_form(tmp_path):
    def cost(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "ihsweep.cost", "--configfile", str(BASE), *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)

    plain = cost()
    patched = cost("--config", 'training={"tokens": 1200000}')
    assert plain.returncode == patched.returncode == 0, plain.stderr + patched.stderr
    # kjv-copy/tiny/B8-C32-s0: 6,000,000 / 256 and 1,200,000 / 256 tokens an update
    assert re.search(r"kjv-copy/tiny/B8-C32-s0 +23437 ", plain.stdout), plain.stdout
    assert re.search(r"kjv-copy/tiny/B8-C32-s0 +4687 ", patched.stdout), patched.stdout
    refused = cost("--config", 'training={"tokens": lots}')
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith("config error: training.tokens: --config gave 'lots'")
    )
