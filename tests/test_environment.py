"""What a run trained on (ihsweep.training.environment): run.json's ``environment`` object.

A tiny run trained through the real command line records this interpreter, the installed
versions of ihsweep's dependencies, the torch build and the device; the object leaves the run's
key alone, and a run stopped and resumed records the same one as the uninterrupted run.
"""

from __future__ import annotations

import json
import platform
import tomllib
from importlib import metadata

import numpy as np
import pytest
import torch
from conftest import REPO
from ihsweep.files.layout import RUN_JSON
from ihsweep.files.records import read_run
from ihsweep.training import environment as env_module
from ihsweep.training.environment import environment, package_versions, torch_build
from ihsweep.training.loop import Outcome, train
from ihsweep.training.resume import spec_hash
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_train import CPU, make_dataset, make_spec, run_to_end

KEYS = {"python", "packages", "torch_build", "cuda", "cudnn", "device", "platform"}


def pyproject_dependencies() -> set[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        lines = tomllib.load(f)["project"]["dependencies"]
    return {canonicalize_name(Requirement(line).name) for line in lines}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


def test_a_trained_runs_record_says_what_it_ran_on(tmp_path, data_dir):
    spec = make_spec(steps=20, every=10)
    run_dir = tmp_path / "run"
    run_to_end(spec, data_dir, run_dir)
    record = json.loads((run_dir / RUN_JSON).read_text())
    env = record["environment"]
    assert set(env) == KEYS
    assert env["python"] == platform.python_version()
    assert env["platform"] == platform.platform()
    assert env["device"] == "cpu"
    assert env["packages"]["torch"] == torch.__version__
    assert env["packages"]["numpy"] == np.__version__
    assert env["packages"]["ihsweep"] == metadata.version("ihsweep")
    assert set(env["packages"]) == pyproject_dependencies() | {"ihsweep"}
    assert env["cuda"] == torch.version.cuda
    if torch.version.cuda is None:  # this machine's CPU wheel
        assert (env["torch_build"], env["cudnn"]) == ("cpu", None)
    # The environment is no part of the run's key.
    assert "environment" not in spec
    assert record["spec_hash"] == spec_hash(spec)


def test_a_resumed_run_records_the_environment_of_an_uninterrupted_one(tmp_path, data_dir):
    spec = make_spec(steps=20, every=10)
    train(spec, data_dir, tmp_path / "whole", CPU)
    whole = read_run(tmp_path / "whole")
    assert train(spec, data_dir, tmp_path / "parts", CPU, stop_after_step=13) is Outcome.INTERRUPTED
    train(spec, data_dir, tmp_path / "parts", CPU)
    resumed = read_run(tmp_path / "parts")
    assert resumed["environment"] == whole["environment"]
    assert json.loads((tmp_path / "parts" / RUN_JSON).read_text()) == json.loads(
        json.dumps(resumed)
    )


@pytest.mark.parametrize(
    ("cuda", "hip", "version", "build"),
    [
        ("12.4", None, "2.13.0+cu124", "cu124"),
        ("12.8", None, "2.13.0", "cu128"),  # PyPI's Linux wheel has no local tag
        (None, "6.1.40091-a8dbc0c19", "2.13.0+rocm6.1", "rocm6.1"),
        (None, None, "2.13.0+cpu", "cpu"),
        (None, None, "2.13.0", "cpu"),  # macOS wheels: no tag, no CUDA
    ],
)
def test_torch_build_names_cuda_rocm_or_cpu(monkeypatch, cuda, hip, version, build):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch, "__version__", version)
    assert torch_build() == build


def test_cpu_environment_has_no_cuda_or_cudnn():
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch")
    env = environment(torch.device("cpu"))
    assert (env["cuda"], env["cudnn"], env["device"], env["torch_build"]) == (
        None,
        None,
        "cpu",
        "cpu",
    )


def test_a_checkout_without_installed_metadata_reads_pyproject(monkeypatch):
    """Jobs in a conda env import ihsweep from the checkout (PYTHONPATH) uninstalled."""

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(env_module.metadata, "requires", not_installed)
    versions = package_versions()
    assert set(versions) == pyproject_dependencies() | {"ihsweep"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert versions["ihsweep"] == project["version"]
    assert versions["numpy"] == np.__version__
