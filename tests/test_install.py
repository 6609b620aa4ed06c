"""`make check-install` (requirements/check_install.py): the install as plain PyPI resolves it,
against the lock. The resolution's judge runs on small reports in pip's format; the real
resolution runs against PyPI (metadata only) where it is reachable."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO
from test_envs import LOCK, locked

spec = importlib.util.spec_from_file_location(
    "check_install", REPO / "requirements" / "check_install.py"
)
check_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_install)

ENVIRONMENT = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11"}
TORCH = "torch==2.13.0"


def item(name: str, version: str, *requires: str, extras: list[str] | None = None) -> dict:
    """One entry of pip's report ("install"), as `pip install --report` writes it."""
    meta = {"name": name, "version": version, "requires_dist": list(requires)}
    return {"metadata": meta, "requested_extras": extras, "download_info": {"url": "file:///x"}}


def report(*items: dict) -> dict:
    return {"install": list(items), "environment": ENVIRONMENT}


def cuda_resolution(**lock_extra) -> dict:
    """ihsweep needs numpy and torch (and pytest for dev); torch needs filelock and, on Linux,
    a CUDA library."""
    return report(
        item("ihsweep", "0.1.0", "numpy", "torch", 'pytest; extra == "dev"', extras=["dev"]),
        item("numpy", "2.4.6"),
        item("pytest", "9.0.0", "pluggy"),
        item("pluggy", "1.6.0"),
        item("torch", "2.13.0", "filelock", 'nvidia-cublas; platform_system == "Linux"'),
        item("filelock", "3.20.0"),
        item("nvidia-cublas", "13.1.1.3"),
    )


LOCKED = {"numpy": "2.4.6", "pytest": "9.0.0", "pluggy": "1.6.0", "filelock": "3.20.0"}


def test_a_resolution_with_the_locks_versions_passes_and_names_what_torch_adds():
    found, torch_only = check_install.problems(cuda_resolution(), LOCKED, TORCH)
    assert found == []
    assert torch_only == ["nvidia-cublas"]


def test_a_locked_package_the_install_no_longer_needs_is_named():
    found, _ = check_install.problems(cuda_resolution(), LOCKED | {"six": "1.17.0"}, TORCH)
    assert found == ["the lock holds six==1.17.0, which the install does not need"]


def test_a_version_other_than_the_locks_is_named():
    found, _ = check_install.problems(cuda_resolution(), LOCKED | {"numpy": "2.4.5"}, TORCH)
    assert found == ["the lock pins numpy==2.4.5, the resolution has 2.4.6"]


def test_a_package_needed_other_than_through_torch_must_be_locked():
    """pluggy comes through pytest, a dev requirement (its marker holds for the dev extra):
    unlocked, it is named; nvidia-cublas, needed by torch alone, never is."""
    without_pluggy = {k: v for k, v in LOCKED.items() if k != "pluggy"}
    found, torch_only = check_install.problems(cuda_resolution(), without_pluggy, TORCH)
    assert found == ["pluggy==1.6.0 is not in the lock"]
    assert torch_only == ["nvidia-cublas"]


def test_a_resolution_without_torch_is_named():
    no_torch = report(
        *[i for i in cuda_resolution()["install"] if i["metadata"]["name"] != "torch"]
    )
    found, _ = check_install.problems(no_torch, LOCKED | {"nvidia-cublas": "13.1.1.3"}, TORCH)
    assert "the resolution holds no torch" in found


def test_the_lock_is_read_with_every_pin():
    assert check_install.locked_versions() == {
        name: str(next(iter(req.specifier)).version) for name, (req, _) in locked().items()
    }
    assert check_install.LOCK == LOCK


def test_pips_own_package_settings_are_left_out(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt")
    env = check_install.pip_environment()
    assert "PIP_FIND_LINKS" not in env
    assert env["PIP_CERT"] == "/etc/ssl/certs/ca-certificates.crt"
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


@pytest.mark.slow
def test_plain_pypi_resolves_the_install_with_the_locks_versions():
    """The real resolution, from metadata alone (the check stops any download over 50 MB)."""
    why = check_install.unreachable(check_install.PYPI)
    if why:
        pytest.skip(f"{check_install.PYPI} is unreachable: {why}")
    done = subprocess.run(
        [sys.executable, str(REPO / "requirements" / "check_install.py")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resolves the install to" in done.stdout and "torch==2.13.0" in done.stdout


def test_an_unreachable_index_skips_with_one_line(capsys):
    """Port 9 (discard) of this machine refuses the connection: no network needed."""
    assert check_install.main(["--index-url", "http://127.0.0.1:9/simple"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(
        "check-install: skipped, http://127.0.0.1:9/simple is unreachable"
    )
