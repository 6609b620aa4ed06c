"""Where a table or figure came from: the config, the code, the runs (a sidecar JSON).

Every aggregate step writes ``provenance.json`` beside its outputs::

    {"config_sha256": "...", "code_sha256": "...", "code_version": "git:3f2c1ab" | "ihsweep 0.1.0",
     "runs": ["kjv-copy/w64/B8-C16-s0", ...], "outputs": ["emergence.csv", ...]}

``config_sha256`` hashes the validated study config (defaults filled in, keys sorted) without
its ``execution`` section (``ihsweep.config.study_definition``), so two result folders with the
same hash came from the same study definition, wherever it ran. A run's figure folder records
``run_sha256`` instead: the hash of the run's training spec and the study's ``emergence``
settings, all that its figure depends on besides the probe tables. It is the same for that run in
every study that plans it with the same spec, so a study that adds runs to another (cpu-full to
the default study) redraws none of the other's run figures. The code version is the git
commit of the checkout the step ran from (with ``-dirty`` for uncommitted changes), or the
installed package version when there is no git checkout; ``code_sha256``, in both kinds of
folder, hashes the package's source itself, which also tells apart two uncommitted states, and
is what makes Snakemake redo the aggregates after an update of the package.

A study's folder (``results/studies/<study>/``) is named by its ``study`` key alone, the one
folder no key can tell apart, so ``study.json`` there records which config files and which
definition made it (``StudyClaim``): another study under the same name, from other files with
other settings, is refused before any job (``claim_clash``) instead of rewriting its tables.
It also records the folder the study ran in and when it last started, so that
``python -m ihsweep.status`` can list the studies of a ``results/`` and report the one running.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from ihsweep.config import study_definition
from ihsweep.files import layout
from ihsweep.files.io import write_json

STUDY_JSON = "study.json"

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ihsweep: this module lives in ihsweep/report
# What the aggregates are made from: the Python source and the report's templates.
CODE_SUFFIXES = (".py", ".j2", ".css")


def config_sha256(config: dict) -> str:
    """Hash of the study definition: moving a study to a cluster keeps it (and its figures)."""
    return _sha256(study_definition(config))


def run_sha256(train_spec: dict, emergence: dict) -> str:
    """Hash of what one run's figure is drawn from besides its probe tables."""
    return _sha256({"run": train_spec, "emergence": emergence})


def code_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of the package's source (paths and contents): Python and the report's templates.

    The aggregate rules take it as a parameter, so updating ihsweep (a fit, a verdict's
    wording) redoes every aggregate, which takes seconds, while runs, probes and run figures
    stay cached: Snakemake does not see code that its rules' commands only import.
    """
    digest = hashlib.sha256()
    sources = [p for p in package_dir.rglob("*") if p.suffix in CODE_SUFFIXES and p.is_file()]
    for path in sorted(sources):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _sha256(definition: dict) -> str:
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def code_version() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip():
            return f"git:{out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"ihsweep {metadata.version('ihsweep')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def write_provenance(folder, hashes: dict[str, str | None], run_ids, outputs) -> Path:
    """``hashes``: {"config_sha256": ...} for an aggregate, {"run_sha256": ...} for a run."""
    path = Path(folder) / "provenance.json"
    write_json(
        path,
        {
            **hashes,
            "code_sha256": code_sha256(),
            "code_version": code_version(),
            "runs": sorted(str(r) for r in run_ids),
            "outputs": sorted(str(o) for o in outputs),
        },
    )
    return path


@dataclass(frozen=True)
class StudyClaim:
    """What made a study's folder: its name, config files and definition's hash; where it
    ran (the absolute working folder, Snakemake's ``--directory``) and when it last started
    (ISO 8601, UTC), which ``python -m ihsweep.status`` reads to find and name the study.
    Records written before those two fields read as None."""

    study: str
    configfiles: tuple[str, ...]
    config_sha256: str
    directory: str | None = None
    started: str | None = None

    @classmethod
    def of(cls, study: str, configfiles, definition_sha256: str) -> StudyClaim:
        """Config files as given, relative to the working folder when inside it."""
        files = tuple(_shown_path(Path(path)) for path in configfiles)
        return cls(study, files, definition_sha256, directory=os.getcwd())

    @classmethod
    def read(cls, path: Path) -> StudyClaim:
        """The claim recorded in ``path`` (a study.json); OSError, ValueError, KeyError or
        TypeError when it is missing or unreadable."""
        held = json.loads(Path(path).read_text())
        return cls(
            held["study"], tuple(held["configfiles"]), held["config_sha256"],
            held.get("directory"), held.get("started"),
        )  # fmt: skip

    def configfile_paths(self) -> list[Path]:
        """The config files as paths that resolve from anywhere: relative ones against the
        recorded directory (as recorded: relative to where the study ran)."""
        base = Path(self.directory or ".")
        return [base / path for path in self.configfiles]

    def path(self, root: Path = Path(".")) -> Path:
        return root / layout.study_dir(self.study) / STUDY_JSON

    def describe(self) -> str:
        files = " ".join(self.configfiles) or "no config file"
        return f"{files} (definition sha256 {self.config_sha256[:12]})"


def _shown_path(path: Path) -> str:
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


def claim_clash(claim: StudyClaim, root: Path = Path(".")) -> str | None:
    """One line when another study holds ``claim``'s name: other config files and another
    definition. The same files with an edited definition are the same study, changed; other
    files with an equal definition are a copy of it."""
    try:
        holder = StudyClaim.read(claim.path(root))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record yet (or an unreadable one): the first run writes it
    if holder.configfiles == claim.configfiles or holder.config_sha256 == claim.config_sha256:
        return None
    folder = layout.study_dir(claim.study)
    return (
        f"study {claim.study!r}: {folder}/ holds the study of {holder.describe()}; "
        f"{claim.describe()} defines another study under that name. Give it its own name "
        f"(`study: <name>` in its file, or --config study=<name>), or delete "
        f"{folder}/{STUDY_JSON} to let it replace that study's tables"
    )


def write_claim(claim: StudyClaim, root: Path = Path(".")) -> None:
    """Record that ``claim``'s config files made the study's folder (before its first job),
    with the time it started now."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    record = {**asdict(claim), "configfiles": list(claim.configfiles), "started": started}
    write_json(claim.path(root), record)
