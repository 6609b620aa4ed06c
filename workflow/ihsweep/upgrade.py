"""Move a results/ laid out by names alone into the keyed folders of a study.

    python -m ihsweep.upgrade                       # the study in config.yaml
    python -m ihsweep.upgrade --configfile config.yaml workflow/studies/cpu-full.yaml
    python -m ihsweep.upgrade --dry-run             # what it would move, moving nothing

Run it where ``results/`` is, once per study, before that study's next Snakemake run. A
results/ laid out by names (``results/runs/<run id>/``, ``results/data/<name>/``,
``results/chains/<name>/``, ``results/suites/<name>/``) holds one version of each name: the
last study that made it. Each such folder moves into the keyed folder of the study given
(``ihsweep.config.keys``) when what the folder records agrees with that study's settings:

- a natural dataset: its corpus and tokenizer (tokens.json), and each context's repetition,
  seed and validation share (chunks.json);
- a chain: its kind and the settings its chain.json records (a bigram chain: counted from the
  study's source dataset); a Markov cell: each context's f, r, calibration, sizes, seed and
  chain kind (chunks.json), and its chain moved too;
- a run: run.json's and every checkpoint's training spec equal the study's, and its dataset
  moved too; its probe tables move when every checkpoint's cached probe result is keyed with
  the study's ``probe`` settings, its figure when its provenance records the study's run hash;
- a suite: its probe cache (each entry keyed, so a stale one is never used); its tables too
  when ``vocab_size`` is given and every revision's entry agrees.

A folder that does not agree stays where it is (another study made it: upgrade with that
study's config files, or delete it), and so does everything that depends on it. Files are
renamed, not rewritten: they keep their modification times, so Snakemake plans none of the
moved jobs again. Logs follow their folders. Nothing is trained or probed; the first workflow
run afterwards redoes the study's aggregates (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ihsweep.config import (
    Run,
    Study,
    StudyPaths,
    add_configfile,
    reports_config_errors,
    study_of_files,
)
from ihsweep.files import layout
from ihsweep.files.io import holds_key
from ihsweep.report.provenance import run_sha256
from ihsweep.training.checkpoints import list_checkpoints


def agrees(expected, recorded) -> bool:
    """Whether a record agrees with the settings: every setting the record holds is equal.
    A setting left to its default (None) or not recorded is not compared."""
    if isinstance(expected, dict) and isinstance(recorded, dict):
        return all(
            agrees(value, recorded[key])
            for key, value in expected.items()
            if value is not None and key in recorded
        )
    return expected == recorded


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Upgrade:
    """One study's upgrade of the results/ under ``root`` (see the module docstring)."""

    study: Study
    root: Path
    dry_run: bool = False
    moved: list[tuple[str, str, str]] = field(default_factory=list)  # (what, old, new)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (old, why it stayed)
    ready: set[str] = field(default_factory=set)  # keyed folders in place after the upgrade

    def __post_init__(self):
        self.paths = StudyPaths(self.study)

    def run(self) -> Upgrade:
        datasets = self.study.config.get("datasets", {})
        for name, spec in datasets.items():
            if spec["family"] == "natural":
                self.dataset(name, self.natural_disagrees)
        for grid in self.study.grids:
            self.chain(grid)
        for name, spec in datasets.items():
            if spec["family"] == "markov":
                self.dataset(name, self.cell_disagrees)
        for run in self.study.runs:
            self.run_folder(run)
        for suite in self.study.suites:
            self.suite(suite)
        return self

    # ---- moving ------------------------------------------------------------------------------

    def move(self, old: str | Path, new: str | Path, what: str) -> None:
        """Rename ``old`` to ``new`` (under ``root``), counted as a ``what``."""
        old, new = self.root / old, self.root / new
        if not self.dry_run:
            new.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, new)  # keeps every file's mtime
        self.moved.append((what, str(old.relative_to(self.root)), str(new.relative_to(self.root))))

    def move_log(self, old: str, new: str) -> None:
        if (self.root / old).is_file() and not (self.root / new).exists():
            self.move(old, new, "log")

    def found(self, old: str, new: str) -> bool:
        """Whether ``old`` is there to move to ``new`` (``new`` counts as ready if it exists)."""
        if (self.root / new).exists():
            self.ready.add(new)
            return False
        return (self.root / old).is_dir()

    # ---- datasets and chains -----------------------------------------------------------------

    def dataset(self, name: str, disagreement) -> None:
        old, new = f"{layout.RESULTS}/data/{name}", self.paths.dataset_dir(name)
        if not self.found(old, new):
            return
        why = disagreement(name, self.root / old)
        if why:
            self.kept.append((old, why))
            return
        contexts = [chunks.name for chunks in sorted((self.root / old).glob("C*/"))]
        self.move(old, new, "dataset")
        self.ready.add(new)
        self.move_log(layout.log("tokenize", name), layout.log("tokenize", Path(new).name))
        for context in contexts:
            old_log = layout.log("chunk", name, context)
            self.move_log(old_log, layout.log("chunk", Path(new).name, context))

    def natural_disagrees(self, name: str, folder: Path) -> str | None:
        spec = self.study.dataset_spec(name)
        tokens = _json(folder / "tokens.json")
        if not agrees({"source": spec["corpus"], "tokenizer": spec["tokenizer"]}, tokens):
            return "tokens.json records another corpus or tokenizer"
        settings = {key: spec[key] for key in ("repetition", "seed", "val_fraction")}
        return self._chunks_disagree(folder, settings)

    def cell_disagrees(self, name: str, folder: Path) -> str | None:
        spec = self.study.dataset_spec(name)
        if self.paths.chain_dir(spec["grid"]) not in self.ready:
            return f"its chain {spec['grid']} was not moved"
        requested = {k: spec[k] for k in ("frequency", "reliability", "calibration")}
        settings = {
            "requested": requested,
            "n_train": spec["n_train_sequences"],
            "n_val": spec["n_val_sequences"],
            "seed": spec["seed"],
            "chain": {"kind": spec["chain"]["kind"]},
        }
        return self._chunks_disagree(folder, settings)

    @staticmethod
    def _chunks_disagree(folder: Path, settings: dict) -> str | None:
        for meta in sorted(folder.glob("C*/chunks.json")):
            if not agrees(settings, _json(meta)):
                return f"{meta.parent.name}/chunks.json records other settings"
        return None

    def chain(self, grid: str) -> None:
        old, new = f"{layout.RESULTS}/chains/{grid}", self.paths.chain_dir(grid)
        if not self.found(old, new):
            return
        chain = self.study.chain_spec(grid)
        recorded = _json(self.root / old / "chain.json")
        settings = {k: v for k, v in chain.items() if k not in ("kind", "source")}
        why = None
        if not agrees({"kind": chain["kind"], "spec": settings}, recorded):
            why = "chain.json records other settings"
        elif chain["kind"] == "bigram":
            source = self.paths.dataset_dir(chain["source"])
            counted = recorded.get("spec", {}).get("tokens_dir")
            if source not in self.ready or counted != f"{layout.RESULTS}/data/{chain['source']}":
                why = f"its source {chain['source']} was not moved"
        if why:
            self.kept.append((old, why))
            return
        self.move(old, new, "chain")
        self.ready.add(new)
        self.move_log(layout.log("chain", grid), layout.log("chain", Path(new).name))

    # ---- runs and suites ---------------------------------------------------------------------

    def run_folder(self, run: Run) -> None:
        old, new = f"{layout.RESULTS}/runs/{run.id}", self.paths.run_dir(run)
        if not self.found(old, new):
            return
        spec = json.loads(json.dumps(self.study.train_spec(run)))
        record = _json(self.root / old / layout.RUN_JSON)
        checkpoints = list_checkpoints(self.root / old, verify=False)
        why = None
        if self.paths.dataset_dir(run.data) not in self.ready:
            why = f"its dataset {run.data} was not moved"
        elif record and record.get("spec") != spec:
            why = "run.json records another training spec"
        elif any(ckpt["spec"] != spec for ckpt in checkpoints):
            why = "a checkpoint records another training spec"
        if why:
            self.kept.append((old, why))
            return
        self.move(old, new, "run")
        for rule in ("train", "export"):
            self.move_log(layout.log(rule, run.id), self.paths.run_log(rule, run))
        folder = old if self.dry_run else new  # where its files are now
        if self.probes(self.root / folder, checkpoints, new, run):
            self.figures(self.root / folder, spec, new, run)

    def probes(self, folder: Path, checkpoints: list[dict], new: str, run: Run) -> bool:
        """Move a run's probe cache and, when it agrees, its tables; whether they moved."""
        from ihsweep.probing.run import cache_key, settings_key

        probe, cache = self.study.config["probe"], folder / "probes" / "cache"
        target = layout.probe_dir(new, self.paths.probe_key)
        if not cache.is_dir():
            return False
        agreed = all(
            any(
                holds_key(cache / f"step_{ckpt['step']:06d}.parquet", key(ckpt, probe))
                for key in (cache_key, settings_key)
            )
            for ckpt in checkpoints
        )
        tables = [folder / "probes" / f"{name}.parquet" for name in layout.PROBE_TABLES]
        self.move(cache.relative_to(self.root), f"{target}/cache", "probe cache")
        if not (agreed and checkpoints and all(t.is_file() for t in tables)):
            return False
        for table in tables:
            self.move(table.relative_to(self.root), f"{target}/{table.name}", "probe table")
        self.move_log(layout.log("probe", run.id), self.paths.run_log("probe", run))
        return True

    def figures(self, folder: Path, spec: dict, new: str, run: Run) -> None:
        recorded = _json(folder / "figures" / layout.PROVENANCE).get("run_sha256")
        if recorded != run_sha256(spec, self.study.config["emergence"]):
            return
        targets = layout.run_figures(new, self.paths.figure_key)
        files = [folder / "figures" / Path(target).name for target in targets]
        if not all(file.is_file() for file in files):
            return
        for file, target in zip(files, targets, strict=True):
            self.move(file.relative_to(self.root), target, "run figure file")
        self.move_log(layout.log("run_figure", run.id), self.paths.run_log("run_figure", run))

    def suite(self, name: str) -> None:
        old, new = f"{layout.RESULTS}/suites/{name}", self.paths.suite_dir(name)
        if not self.found(old, new):
            return
        suite, probe = self.study.suites[name], self.study.config["probe"]
        agreed = suite.get("vocab_size") and _suite_cache_agrees(self.root / old, suite, probe)
        self.move(old, new, "suite")
        new_log = layout.log("probe_suite", Path(new).name, self.paths.probe_key)
        self.move_log(layout.log("probe_suite", name), new_log)
        probes = self.root / (old if self.dry_run else new) / "probes"
        target = layout.probe_dir(new, self.paths.probe_key)
        if (probes / "cache").is_dir():
            self.move((probes / "cache").relative_to(self.root), f"{target}/cache", "probe cache")
        if agreed:
            for table in layout.PROBE_TABLES:
                path = probes / f"{table}.parquet"
                target_table = f"{target}/{table}.parquet"
                self.move(path.relative_to(self.root), target_table, "probe table")

    def summary(self, verbose: bool = False) -> str:
        """What moved, counted by kind (each move with ``verbose``), and what stayed and why."""
        counts: dict[str, int] = {}
        for what, _, _ in self.moved:
            counts[what] = counts.get(what, 0) + 1
        verb = "would move" if self.dry_run else "moved"
        shown = ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for what, n in counts.items())
        lines = [f"{verb} into keyed folders: {shown or 'nothing'}"]
        lines += [f"  {old} -> {new}" for _, old, new in self.moved if verbose]
        if self.kept:
            lines.append(f"left {len(self.kept)} folders made with other settings in place:")
            lines += [f"  {old}: {why}" for old, why in self.kept]
        return "\n".join(lines)


def _suite_cache_agrees(folder: Path, suite: dict, probe: dict) -> bool:
    """Whether a suite folder's tables and every revision's cached result are ``probe``'s."""
    from ihsweep.config.revisions import revision_names
    from ihsweep.probing.suite import cache_key

    probes = folder / "probes"
    if not all((probes / f"{table}.parquet").is_file() for table in layout.PROBE_TABLES):
        return False
    vocab_size = suite["vocab_size"]
    return all(
        holds_key(probes / "cache" / f"{rev}.parquet", cache_key(suite, rev, vocab_size, probe))
        for rev in revision_names(suite)
    )


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ihsweep.upgrade",
        description="Move results/ folders named by names alone into a study's keyed folders.",
    )
    add_configfile(p)
    p.add_argument("--dry-run", action="store_true", help="print what would move, move nothing")
    p.add_argument("--directory", type=Path, default=Path("."), help="where results/ is")
    p.add_argument("--verbose", action="store_true", help="print every move")
    args = p.parse_args(argv)
    study = study_of_files(args.configfile, args.config)
    print(Upgrade(study, args.directory, args.dry_run).run().summary(args.verbose))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
