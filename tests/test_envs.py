"""The conda envs of the rules (envs/*.yaml) agree with pyproject.toml.

pyproject.toml's [project].dependencies is the one list of what the code needs. envs/train.yaml
(training, data and probe jobs) lists all of it with the same specifiers, except that torch may be
pinned to one version inside pyproject's range (the CPU wheel); envs/analysis.yaml (the aggregate
and figure jobs) lists a subset, without torch, and that subset must be enough to import the step
command (``ihsweep.steps.<rule>``) of every rule that runs in it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "envs"
ENV_NAMES = sorted(p.stem for p in ENVS.glob("*.yaml"))
# A package an env may pin to one version within pyproject's range instead of copying it.
MAY_PIN = {"torch"}


def pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def project_requirements() -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in pyproject()["project"]["dependencies"]]
    by_name = {canonicalize_name(r.name): r for r in reqs}
    assert len(by_name) == len(reqs), "pyproject lists a package twice"
    return by_name


def env_doc(name: str) -> dict:
    return yaml.safe_load((ENVS / f"{name}.yaml").read_text())


def env_requirements(name: str) -> dict[str, Requirement]:
    """The pip: list of an env file, by canonical package name."""
    deps = env_doc(name)["dependencies"]
    pips = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, f"envs/{name}.yaml should have one pip: list"
    reqs = [Requirement(line) for line in pips[0]]
    by_name = {canonicalize_name(r.name): r for r in reqs}
    assert len(by_name) == len(reqs), f"envs/{name}.yaml lists a package twice"
    return by_name


def pinned_version(spec: SpecifierSet) -> Version | None:
    """The version of an exact pin (==X), else None."""
    items = list(spec)
    if len(items) == 1 and items[0].operator == "==" and "*" not in items[0].version:
        return Version(items[0].version)
    return None


def test_the_rules_envs_exist():
    assert {"train", "analysis"} <= set(ENV_NAMES)


@pytest.mark.parametrize("env", ENV_NAMES)
def test_env_python_satisfies_requires_python(env):
    wanted = SpecifierSet(pyproject()["project"]["requires-python"])
    pythons = [
        d for d in env_doc(env)["dependencies"] if isinstance(d, str) and d.startswith("python")
    ]
    assert len(pythons) == 1, pythons
    version = pythons[0].split("=", 1)[1].lstrip("=")
    assert wanted.contains(version), f"envs/{env}.yaml: {pythons[0]} vs requires-python {wanted}"


def test_train_env_lists_every_project_dependency_with_its_specifier():
    project, env = project_requirements(), env_requirements("train")
    missing = sorted(set(project) - set(env))
    assert not missing, f"envs/train.yaml lacks {missing}"
    for name, req in project.items():
        got = env[name]
        assert got.extras == req.extras, name
        assert got.marker == req.marker, name
        if got.specifier == req.specifier:
            continue
        pin = pinned_version(got.specifier)
        assert name in MAY_PIN and pin is not None, (
            f"envs/train.yaml: {got} differs from pyproject's {req}"
        )
        assert req.specifier.contains(pin, prereleases=True), (
            f"envs/train.yaml pins {got}, outside pyproject's {req}"
        )


def test_analysis_env_is_a_subset_without_torch():
    project, env = project_requirements(), env_requirements("analysis")
    assert "torch" not in env
    for name, got in env.items():
        assert name in project, f"envs/analysis.yaml lists {name}, which pyproject lacks"
        assert got.specifier == project[name].specifier, (
            f"envs/analysis.yaml: {got} differs from pyproject's {project[name]}"
        )


@pytest.mark.parametrize("env", ENV_NAMES)
def test_no_env_lists_a_package_pyproject_lacks(env):
    extra = sorted(set(env_requirements(env)) - set(project_requirements()))
    assert not extra, f"envs/{env}.yaml lists {extra}, which pyproject.toml lacks"


def requirement_closure(names: set[str]) -> set[str]:
    """Installed distributions that ``names`` pull in, transitively (markers evaluated)."""
    seen, todo = set(), list(names)
    env = default_environment()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return seen


def steps_in_env(env: str) -> dict[str, str]:
    """{rule: the ihsweep.steps module its shell command runs} for the rules using envs/<env>."""
    steps = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for rule, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), re.M):
            if f'"../../envs/{env}.yaml"' in body:
                modules = set(re.findall(r"python -m (ihsweep\.steps\.\w+)", body))
                assert len(modules) == 1, f"rule {rule}: {modules}"
                steps[rule] = modules.pop()
    return steps


ANALYSIS_STEPS = steps_in_env("analysis")


def test_the_analysis_env_runs_the_aggregates_and_figures():
    assert ANALYSIS_STEPS == {
        "aggregate_natural": "ihsweep.steps.aggregate_natural",
        "aggregate_markov": "ihsweep.steps.aggregate_markov",
        "heldout_natural": "ihsweep.steps.heldout_natural",
        "run_figure": "ihsweep.steps.run_figure",
    }


@pytest.mark.parametrize("module", sorted(set(ANALYSIS_STEPS.values())))
def test_analysis_env_is_enough_to_import_the_aggregate_job(module):
    """Import a step of the analysis env with torch blocked; every package it loads is in it."""
    code = textwrap.dedent(
        """
        import importlib, json, sys

        class NoTorch:  # the analysis env has no torch: importing it must fail
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    raise ImportError("torch is not in envs/analysis.yaml")

        sys.meta_path.insert(0, NoTorch())
        before = set(sys.modules)  # what the interpreter loads by itself (site, .pth hooks)
        importlib.import_module(sys.argv[1])
        print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, module],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "workflow",
    )
    assert proc.returncode == 0, proc.stderr
    top_levels = json.loads(proc.stdout.splitlines()[-1])
    dists_of = metadata.packages_distributions()
    used = {canonicalize_name(d) for m in top_levels for d in dists_of.get(m, [])}
    used.discard("ihsweep")
    allowed = requirement_closure(set(env_requirements("analysis")))
    assert not sorted(used - allowed), f"{module} imports {sorted(used - allowed)}"


# --------------------------------------------------------------------------------------------
# The lock (requirements/cpu.lock.txt) that `make install` and CI install from, with hashes

LOCK = REPO / "requirements" / "cpu.lock.txt"
# Left out of the lock: torch's CPU and CUDA builds are different files (docs/development.md).
UNLOCKED = {"torch"}
CUDA_ONLY = ("nvidia-", "triton", "cuda-")  # what a CUDA build of torch brings with it


def locked() -> dict[str, tuple[Requirement, list[str]]]:
    """{canonical name: (requirement, its hashes)} of the lock, continuation lines joined."""
    text = re.sub(r"\\\n", " ", LOCK.read_text())
    entries = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split(" --")
        req = Requirement(spec.strip())
        hashes = [o.strip().removeprefix("hash=") for o in options if o.startswith("hash=")]
        assert canonicalize_name(req.name) not in entries, f"the lock lists {req.name} twice"
        entries[canonicalize_name(req.name)] = (req, hashes)
    return entries


def all_project_requirements() -> list[Requirement]:
    """[project].dependencies and every optional-dependencies list."""
    project = pyproject()["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    return [Requirement(line) for line in lines]


def test_every_locked_requirement_is_pinned_with_hashes():
    entries = locked()
    assert len(entries) > 50, "the lock looks cut short"
    for name, (req, hashes) in entries.items():
        assert pinned_version(req.specifier) is not None, f"{LOCK.name}: {req} is not pinned"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), (
            f"{LOCK.name}: {name} has no sha256 hash; run make lock"
        )


def test_the_lock_covers_every_dependency_of_pyproject_but_torch():
    entries = locked()
    wanted = {canonicalize_name(r.name) for r in all_project_requirements()}
    missing = sorted(wanted - UNLOCKED - set(entries))
    assert not missing, f"{LOCK.name} lacks {missing}: run make lock"
    assert not UNLOCKED & set(entries), f"{LOCK.name} must leave torch to the Makefile"


def test_the_locked_versions_fit_pyproject():
    entries = locked()
    for req in all_project_requirements():
        name = canonicalize_name(req.name)
        if name in UNLOCKED:
            continue
        version = pinned_version(entries[name][0].specifier)
        assert req.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {name}=={version}, outside pyproject's {req}: run make lock"
        )


def test_the_lock_holds_the_cpu_wheels_dependencies_and_no_cuda_package():
    """The lock, installed before torch, brings torch's dependencies, hashed, so that the CPU
    wheel adds none. It must not bring CUDA's: the CPU wheel needs none, and a CUDA build
    brings its own."""
    entries = locked()
    torch_needs = {
        canonicalize_name(Requirement(line).name)
        for line in metadata.requires("torch") or []
        if Requirement(line).marker is None
        or Requirement(line).marker.evaluate({**default_environment(), "extra": ""})
    }
    if metadata.version("torch").endswith("+cpu"):
        assert {"sympy", "networkx", "filelock", "jinja2", "fsspec"} <= torch_needs
    missing = sorted(n for n in torch_needs - set(entries) if not n.startswith(CUDA_ONLY))
    assert not missing, f"{LOCK.name} lacks torch's {missing}"
    cuda = sorted(n for n in entries if n.startswith(CUDA_ONLY))
    assert not cuda, f"{LOCK.name} holds CUDA packages {cuda}"


def upper_bounded(spec: SpecifierSet) -> bool:
    return any(s.operator in {"<", "<=", "==", "~=", "==="} for s in spec)


def test_every_dependency_has_an_upper_bound():
    unbounded = [str(r) for r in all_project_requirements() if not upper_bounded(r.specifier)]
    assert not unbounded, f"pyproject.toml: give these an upper bound (<next major): {unbounded}"
