"""The execution settings are declared once, in the schema's ``execution`` section
(``ihsweep.config.execution``): one entry added there, in a copy of the checkout, reaches the
train rule's resources, the train step's command line and the ``Execution`` that the trainer
builds its job from, with no other edit. The fast tests check the pieces: the typed object,
the rules' resources and flags, a flag's text read as the schema's type."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, snakemake, study_text
from ihsweep.config import ConfigError, Execution, complete, execution_of
from ihsweep.config.execution import rule_flags, rule_resources, rule_settings, setting_value
from test_config import flag, shell_commands
from test_train import TIMEOUT, make_dataset, make_spec
from test_workflow import copy_checkout

SCHEMA = Path("workflow/schemas/config.schema.yaml")
# The setting a copy of the checkout gains: an integer that only the train rule takes.
ADDED = """      added_setting:
        x-rules: [train]
        description: A setting that tests/test_execution_settings.py adds to a copy.
        type: integer
        minimum: 0
        default: 7
"""


def test_execution_has_a_typed_field_per_schema_setting_with_its_default():
    fields = {field.name: field for field in dataclasses.fields(Execution)}
    assert list(fields) == list(complete("execution"))
    assert all(fields[key].default == value for key, value in complete("execution").items())
    assert fields["threads"].type is int and fields["micro_batch"].type == int | str
    assert fields["compile"].type == bool | str and fields["gpu_model"].type == str | None
    execution = execution_of({"device": "cpu"})
    assert execution.device == "cpu" and execution.threads == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        execution.threads = 2
    with pytest.raises(ConfigError, match="execution.threads"):
        execution_of({"threads": 0})


def test_each_rule_takes_the_settings_that_name_it_as_resources_and_flags():
    train = [s.key for s in rule_settings("train")]
    assert train == [
        "device", "threads", "progress_seconds", "gpu", "gpu_model", "train_mem_mb",
        "micro_batch", "compile", "vocab_padding", "fused_loss", "capturable_update",
        "device_profile",
    ]  # fmt: skip
    probe = [s.key for s in rule_settings("probe")]
    assert probe == [s.key for s in rule_settings("probe_suite")]
    assert probe == ["device", "threads", "gpu", "gpu_model", "probe_mem_mb"]
    resources = rule_resources(complete("execution", {"compile": True}), "train")
    assert "threads" not in resources and resources["mem_mb"] == 16000  # x-resource
    assert resources["compile"] == "true" and resources["gpu_model"] == ""
    flags = rule_flags("train")
    assert "--threads={threads}" in flags and "--train-mem-mb={resources.mem_mb:q}" in flags
    # a resource the rule computes per job (execution.gpu: auto) replaces the setting's value
    per_job = rule_resources(complete("execution"), "train", gpu=len)
    assert resources["gpu"] == "auto" and per_job["gpu"] is len


@pytest.mark.parametrize(
    "key, text, value",
    [
        ("threads", "3", 3),
        ("compile", "true", True),
        ("compile", "auto", "auto"),
        ("micro_batch", "4", 4),
        ("gpu", "0", 0),
        ("gpu", "auto", "auto"),
        ("gpu_model", "", None),
        ("gpu_model", "a100", "a100"),
        ("device_profile", "h100.json", "h100.json"),
        ("device", "cuda:1", "cuda:1"),
        ("compile", "maybe", "maybe"),  # refused later, naming the key (execution_of)
    ],
)
def test_a_flag_reads_as_the_schema_types_its_setting(key, text, value):
    assert setting_value(key, text) == value
    assert type(setting_value(key, text)) is type(value)


@pytest.mark.slow
def test_one_schema_entry_reaches_the_rule_the_step_and_the_trainer(tmp_path):
    (tmp_path / "checkout").mkdir()
    checkout = copy_checkout(tmp_path / "checkout")
    schema = checkout / SCHEMA
    text = schema.read_text()
    anchor = "      device:\n        x-rules:"  # the first setting of `execution`
    assert text.count(anchor) == 1 and "added_setting" not in text
    schema.write_text(text.replace(anchor, ADDED + anchor))
    differ = filecmp.dircmp(REPO / "workflow", checkout / "workflow")
    assert changed_files(differ) == [str(SCHEMA.relative_to("workflow"))]  # nothing else

    # The rule: a resource (--set-resources overrides it), handed to the step as a flag.
    workdir = tmp_path / "study"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(study_text("workflow"))
    dry = snakemake(workdir, "-n", "-p", checkout=checkout)
    assert dry.rc == 0, dry.out[-3000:]
    assert {flag(c, "--added-setting") for c in shell_commands(dry.out, "train")} == {"7"}
    assert all("--added-setting" not in c for c in shell_commands(dry.out, "probe"))
    override = ("-n", "-p", "--set-resources", "train:added_setting=9")
    dry = snakemake(workdir, *override, checkout=checkout)
    assert {flag(c, "--added-setting") for c in shell_commands(dry.out, "train")} == {"9"}

    # The step: its flag, read as an integer into the Execution the trainer's job is built from.
    data_dir = make_dataset(tmp_path / "data")
    spec = make_spec(steps=4, every=2)
    argv = ["--spec", json.dumps(spec), "--data-dir", str(data_dir), "--run-dir",
            str(tmp_path / "run"), "--device", "cpu", "--added-setting=9"]  # fmt: skip
    shown = run_step_showing_the_job_execution(checkout, argv)
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert "execution.added_setting" in run_step(checkout, ["--help"]).stdout
    built = json.loads(shown.stdout.splitlines()[0])
    assert built == {"type": "Execution", "added_setting": 9, "device": "cpu"}
    assert (tmp_path / "run" / "run.json").exists()  # and it trained


def changed_files(differ: filecmp.dircmp, prefix: str = "") -> list[str]:
    """The files of ``differ``'s two trees that differ or exist in one only."""
    changed = [prefix + name for name in differ.diff_files + differ.left_only + differ.right_only]
    for name, sub in differ.subdirs.items():
        changed += changed_files(sub, f"{prefix}{name}/")
    # bytecode, and the metadata `pip install -e .` writes beside the package: neither is tracked
    return [name for name in changed if "__pycache__" not in name and ".egg-info" not in name]


# Runs the copy's train step with Job.build wrapped to print the execution it is given (its
# type, the added setting, the device) before building the job as it does.
SHOW_JOB_EXECUTION = """
import json, sys
from ihsweep.steps import train as step
from ihsweep.training.loop import Job

build = Job.build

def showing(spec, data_dir, execution):
    shown = {"type": type(execution).__name__, "device": execution.device}
    print(json.dumps({**shown, "added_setting": execution.added_setting}), flush=True)
    return build(spec, data_dir, execution)

Job.build = showing
sys.exit(step.main(sys.argv[1:]))
"""


def run_step_showing_the_job_execution(checkout: Path, argv: list[str]):
    return run_step(checkout, argv, ["-c", SHOW_JOB_EXECUTION])


def run_step(checkout: Path, argv: list[str], how: list[str] | None = None):
    env = {**os.environ, "PYTHONPATH": str(checkout / "workflow")}  # the copy's package only
    return subprocess.run(
        [sys.executable, *(how or ["-m", "ihsweep.steps.train"]), *argv],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=checkout,
    )  # fmt: skip
