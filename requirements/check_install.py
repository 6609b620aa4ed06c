"""Resolve `make install` as plain PyPI serves it, from package metadata alone, against the lock.

    python requirements/check_install.py --torch torch==2.13.0    # make check-install runs this

A user away from this project's machines gets torch from PyPI: on Linux x86_64 its CUDA build,
which brings the CUDA libraries (nvidia-*, triton, cuda-toolkit) that the lock leaves out. This
resolves that install with `pip install --dry-run --report`: pip's configuration (a local wheel
folder, extra indexes, constraints) switched off, PyPI as the only index, the lock's versions
as constraints. It fails, naming what to do, when pip cannot resolve it with the lock's
versions, when the lock holds a package the install no longer needs, or when a package reached
other than through torch is missing from the lock. It prints what the install comes to: the
packages, the ones torch adds, and their download size (read from the index with one HEAD
request a file: pip's report states no sizes). When the index is unreachable it says so in one
line and succeeds.

Nothing large is downloaded: pip reads each wheel's metadata from the index (PEP 658) or, where
an index serves none (a mirror that strips it), from the wheel's end with HTTP range requests
(`--use-feature=fast-deps`). Should pip start downloading a whole file above
LARGEST_DOWNLOAD_MB anyway (an index without range requests), the check stops it and fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements" / "cpu.lock.txt"
PYPI = "https://pypi.org/simple"
PROJECT = "ihsweep"
# The sdists and small wheels pip fetches to build metadata stay far below this; torch's wheel
# is ~0.5 GB and its CUDA libraries up to ~1 GB each.
LARGEST_DOWNLOAD_MB = 50
# pip settings kept from the environment: how to reach the network, not where packages come from.
NETWORK_SETTINGS = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_TIMEOUT"}
DOWNLOADING = re.compile(r"Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)")
UNIT_MB = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def locked_versions(lock: Path = LOCK) -> dict[str, str]:
    """{canonical name: version} of every pin in the lock."""
    text = re.sub(r"\\\n", " ", lock.read_text())
    pins = {}
    for line in text.splitlines():
        spec = line.split(" #", 1)[0].split(" --", 1)[0].strip()
        if spec and not spec.startswith("#"):
            req = Requirement(spec)
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return pins


def pip_environment() -> dict[str, str]:
    """The environment without pip's package settings, and no configuration file read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in NETWORK_SETTINGS}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def unreachable(index_url: str) -> str | None:
    """Why ``index_url`` cannot be read (None when it can)."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/pip/", timeout=15):
            return None
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))


def resolve(index_url: str, torch: str, pins: dict[str, str], report: Path) -> None:
    """Run pip's dry run into ``report``; SystemExit with pip's words when it fails, or when it
    starts to download a large file."""
    constraints = report.with_name("lock-versions.txt")
    constraints.write_text("".join(f"{name}=={v}\n" for name, v in sorted(pins.items())))
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--use-feature=fast-deps", "--report", str(report), "--index-url", index_url,
        "--constraint", str(constraints), torch, f"{REPO}[dev]",
    ]  # fmt: skip
    pip = subprocess.Popen(
        command, env=pip_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in pip.stdout:
        lines.append(line.rstrip())
        big = DOWNLOADING.search(line)
        if big and float(big[2]) * UNIT_MB[big[3]] > LARGEST_DOWNLOAD_MB:
            pip.kill()
            pip.wait()
            sys.exit(
                f"check-install: pip began downloading {big[1]} ({big[2]} {big[3]}) for its "
                f"metadata: {index_url} serves no metadata files and no range requests; stopped"
            )
    if pip.wait() != 0:
        errors = [line for line in lines if "ERROR" in line or "conflict" in line.lower()]
        sys.exit(
            "check-install: plain PyPI cannot resolve the install with the lock's versions "
            "(run make lock, then make check-install again):\n" + "\n".join(errors or lines[-20:])
        )


def requirements_of(item: dict, environment: dict[str, str]) -> set[str]:
    """The canonical names a report item requires in ``environment``, with its extras."""
    needed = set()
    for line in item["metadata"].get("requires_dist", []):
        req = Requirement(line)
        extras = item.get("requested_extras") or [""]
        if req.marker is None or any(
            req.marker.evaluate(environment | {"extra": e}) for e in extras
        ):
            needed.add(canonicalize_name(req.name))
    return needed


def problems(report: dict, pins: dict[str, str], torch: str) -> tuple[list[str], list[str]]:
    """(what is wrong, the packages only torch needs) of a resolution against the lock."""
    items = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    found = []
    torch_name = canonicalize_name(Requirement(torch).name)
    if torch_name not in items:
        found.append(f"the resolution holds no {torch_name}")
    for name, version in sorted(pins.items()):
        got = items.get(name, {}).get("metadata", {}).get("version")
        if got is None:
            found.append(f"the lock holds {name}=={version}, which the install does not need")
        elif Version(got) != Version(version):
            found.append(f"the lock pins {name}=={version}, the resolution has {got}")
    reached, queue = {PROJECT}, deque([PROJECT])  # every package needed other than via torch
    while queue:
        name = queue.popleft()
        for dep in requirements_of(items[name], report["environment"]) - reached - {torch_name}:
            if dep in items:
                reached.add(dep)
                queue.append(dep)
    for name in sorted(reached - set(pins) - {PROJECT}):
        found.append(f"{name}=={items[name]['metadata']['version']} is not in the lock")
    torch_only = sorted(set(items) - reached - set(pins) - {torch_name})
    return found, torch_only


def download_mb(report: dict) -> float:
    """The size of every file the install would download, from the index's HEAD answers."""

    def size(url: str) -> int:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.headers["Content-Length"])

    urls = [i["download_info"]["url"] for i in report["install"]]
    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(size, [u for u in urls if u.startswith("http")])) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python requirements/check_install.py")
    parser.add_argument("--torch", default="torch==2.13.0", help="the Makefile's TORCH")
    parser.add_argument("--index-url", default=PYPI, help=f"the index (default {PYPI})")
    parser.add_argument("--report", type=Path, help="also keep pip's report in this file")
    args = parser.parse_args(argv)
    why = unreachable(args.index_url)
    if why:
        print(f"check-install: skipped, {args.index_url} is unreachable ({why})")
        return 0
    pins = locked_versions()
    with tempfile.TemporaryDirectory() as scratch:
        report_file = Path(scratch, "report.json")
        resolve(args.index_url, args.torch, pins, report_file)
        report = json.loads(report_file.read_text())
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    found, torch_only = problems(report, pins, args.torch)
    if found:
        sys.exit(f"check-install: {args.index_url} and {LOCK.name} disagree (run make lock):\n  "
                 + "\n  ".join(found))  # fmt: skip
    print(
        f"check-install: {args.index_url} resolves the install to {len(report['install'])} "
        f"packages, {download_mb(report) / 1e3:.2f} GB to download: the lock's {len(pins)} at "
        f"its versions, {PROJECT}, {args.torch} and the {len(torch_only)} it adds "
        f"({', '.join(torch_only)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
