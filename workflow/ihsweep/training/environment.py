"""What a run trained on: the ``environment`` object of its ``run.json``.

::

    {"python": "3.11.7", "packages": {"numpy": "2.4.6", ..., "ihsweep": "0.1.0"},
     "torch_build": "cpu" | "cu124" | "rocm6.1", "cuda": null | "12.4", "cudnn": null | 90100,
     "device": "cpu" | "NVIDIA H100 80GB HBM3", "platform": "Linux-6.1.0-...-x86_64-with-glibc2.36"}

``packages`` holds the installed version of each of ihsweep's own dependencies (pyproject's
``[project].dependencies``; null for one that is not installed) and of ihsweep itself. Two runs
on one machine record equal objects, so a resumed run's ``run.json`` still equals an
uninterrupted one's; the object is no part of a run's key (``spec_hash``): the same spec trained
elsewhere is the same run, and this says where its numbers came from.
"""

from __future__ import annotations

import platform
import tomllib
from importlib import metadata
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# A checkout's pyproject.toml: the jobs of a conda env import ihsweep from the checkout
# (PYTHONPATH), without installing it, so there is no installed metadata to read.
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def environment(device: torch.device) -> dict:
    """The ``environment`` object of a run trained on ``device`` by this process."""
    cuda = torch.version.cuda
    return {
        "python": platform.python_version(),
        "packages": package_versions(),
        "torch_build": torch_build(),
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "platform": platform.platform(),
    }


def torch_build() -> str:
    """``cu124`` for a CUDA 12.4 build, ``rocm6.1`` for ROCm, else the version's local tag
    (``2.13.0+cpu``), else ``cpu``: a build with neither CUDA nor ROCm runs on the CPU."""
    if torch.version.cuda:
        return "cu" + torch.version.cuda.replace(".", "")
    if torch.version.hip:
        return "rocm" + ".".join(torch.version.hip.split(".")[:2])
    return torch.__version__.partition("+")[2] or "cpu"


def package_versions() -> dict[str, str | None]:
    """{name: installed version} of ihsweep's dependencies, then ihsweep's own version."""
    version, requirements = declared_dependencies()
    versions = {}
    for line in requirements:
        name = canonicalize_name(Requirement(line).name)
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {**dict(sorted(versions.items())), "ihsweep": version}


def declared_dependencies() -> tuple[str, list[str]]:
    """ihsweep's version and ``[project].dependencies``, installed or from the checkout."""
    try:
        requires = metadata.requires("ihsweep") or []
        return metadata.version("ihsweep"), [line for line in requires if is_core(line)]
    except metadata.PackageNotFoundError:
        with open(PYPROJECT, "rb") as f:
            project = tomllib.load(f)["project"]
        return project["version"], list(project["dependencies"])


def is_core(line: str) -> bool:
    """Not an extra's requirement: those carry an ``extra == "..."`` marker, false without one."""
    marker = Requirement(line).marker
    return marker is None or marker.evaluate({"extra": ""})
