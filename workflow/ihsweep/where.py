"""The keyed folder of a run, dataset, chain or suite of a study, by its readable name.

    python -m ihsweep.where kjv-copy/w64/B16-C32-s0          # a run's folder
    python -m ihsweep.where 'kjv-copy/w64/B16-*' --file run.json   # a pattern: every match
    python -m ihsweep.where kjv-copy/w64/B16-C32-s0 --probes # its probe table (model.parquet)
    python -m ihsweep.where kjv-copy semi                    # a dataset's, a chain's folder
    python -m ihsweep.where 'pythia-70m/step1*' --configfile workflow/studies/pythia.yaml
                                                             # suite revisions' probe results
    python -m ihsweep.where kjv-copy/w64/B16-C32-s0 --configfile my.yaml

Folders are keyed by the settings that made them (``ihsweep.config.keys``), so a path holds a
hash nobody types; this prints it, one path a line, for the study of ``--configfile`` (as
``status`` and Snakemake read it; default config.yaml). A name is a run id
``<data>/<model>/B<B>-C<C>-s<seed>`` (shell patterns match several), a dataset, a Markov
entry (its chain and, with one cell, its dataset), a checkpoint suite (patterns too) or a
suite's revision, ``<suite>/<revision>`` (patterns too: ``pythia-70m/step1*``), whose probe
result the suite's probe job caches under the study's probe settings. ``--file`` appends a
file name, ``--probes`` gives the model-level probe table of the study's probe settings (a run's
or a suite's): Snakemake targets.
Retraining one configuration::

    rm -r $(python -m ihsweep.where kjv-copy/w64/B16-C32-s0) && snakemake --cores all
"""

from __future__ import annotations

import argparse
import fnmatch
import sys

from ihsweep.config import Study, StudyPaths, add_configfile, reports_config_errors, study_of_files
from ihsweep.config.revisions import revision_names


def folders(study: Study, name: str, probes: bool = False) -> list[str]:
    """The folders ``name`` stands for in ``study`` (see the module docstring), or with
    ``probes`` the model probe tables of its runs and suites; [] if none."""
    paths = StudyPaths(study)
    runs = [run for run in study.runs if fnmatch.fnmatchcase(run.id, name)]
    suites = fnmatch.filter(study.suites, name)
    revisions = [paths.revision_cache(*pair) for pair in suite_revisions(study, name)]
    if probes:
        tables = [paths.probe_table("model", run) for run in runs]
        return tables + [paths.suite_table("model", suite) for suite in suites] + revisions
    found = [paths.run_dir(run) for run in runs]
    if name in study.config.get("datasets", {}):
        found.append(paths.dataset_dir(name))
    if name in study.grids:  # a Markov entry with one cell is a dataset and a chain
        found.append(paths.chain_dir(name))
    return found + [paths.suite_dir(suite) for suite in suites] + revisions


def suite_revisions(study: Study, name: str) -> list[tuple[str, str]]:
    """(suite, revision) of every revision ``name`` matches as ``<suite>/<revision>``."""
    if name.count("/") != 1:
        return []
    suite_pattern, revision_pattern = name.split("/")
    return [
        (suite, revision)
        for suite in fnmatch.filter(study.suites, suite_pattern)
        for revision in fnmatch.filter(revision_names(study.suites[suite]), revision_pattern)
    ]


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ihsweep.where",
        description="Print the folder of a run, dataset, chain or suite; a revision's probe file.",
    )
    p.add_argument(
        "names", nargs="+",
        help="run ids, datasets, chains, suites, <suite>/<revision> (shell patterns)",
    )  # fmt: skip
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--file", help="a file in each folder to print instead (e.g. run.json)")
    shown.add_argument("--probes", action="store_true", help="print the model probe tables")
    add_configfile(p)
    args = p.parse_args(argv)
    study = study_of_files(args.configfile, args.config)
    found = []
    for name in args.names:
        matched = folders(study, name, args.probes)
        if not matched:
            files = " ".join(map(str, args.configfile))
            print(f"{name}: no run, dataset, chain, suite or suite revision of the study in "
                  f"{files} (python -m ihsweep.status --configfile {files} lists its runs and "
                  "suites)", file=sys.stderr)  # fmt: skip
            return 1
        found += matched
    for folder in found:
        print(f"{folder}/{args.file}" if args.file else folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
