"""``python -m ihsweep.status``: the command line (``ihsweep.status`` documents it)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ihsweep.config import add_configfile, reports_config_errors, study_of_files
from ihsweep.report.provenance import StudyClaim
from ihsweep.status.duplicates import duplicate_lines
from ihsweep.status.live import CostEstimate, study_eta_line, study_remaining
from ihsweep.status.studies import (
    DEFAULT_CONFIG,
    Chosen,
    Recorded,
    by_name,
    recorded_studies,
    running_or_default,
)
from ihsweep.status.suites import format_suites
from ihsweep.status.table import format_table, status_table

WATCH_SECONDS = 10.0
CLEAR = "\033[H\033[J"  # cursor home, erase below: a terminal redraws the frame in place


def parse_args(argv, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ihsweep.status",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_configfile(parser)
    parser.set_defaults(configfile=None)  # none given: the running study, else config.yaml
    parser.add_argument("--study", help="report the study recorded under this name")
    parser.add_argument(
        "--directory", "-d", type=Path, default=Path("."),
        help="the folder the study runs in, as snakemake's --directory",
    )  # fmt: skip
    parser.add_argument(
        "--watch", type=float, nargs="?", const=WATCH_SECONDS, metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_SECONDS:g}) until Ctrl-C",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", "-j", type=int, default=1,
        help="runs trained at a time, for the study's ETA (default 1)",
    )  # fmt: skip
    parser.add_argument("--active-minutes", type=float, default=5.0)
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        parser.error(f"--watch {args.watch:g}: give a number of seconds above 0")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    if not args.directory.is_dir():
        parser.error(f"--directory {args.directory}: no such folder")
    if args.watch is not None and args.csv:
        parser.error("--csv writes the table once: leave out --watch")
    if args.study and args.configfile:
        parser.error("--study reads the study's recorded config files: leave out --configfile")
    return args


def choose(args, configfiles: list[Path] | None) -> Chosen:
    """The study to report: ``--study``'s, ``--configfile``'s, else the running one or
    config.yaml's (``ihsweep.status.studies``). ValueError when there is none."""
    if args.study:
        return by_name(recorded_studies(Path("."), args.active_minutes), args.study)
    if configfiles:
        study = study_of_files(configfiles, args.config)
        claim = StudyClaim.of(study.name, configfiles, "")
        try:  # when these files started the study, when they did
            held = StudyClaim.read(claim.path())
            started = held.started if held.configfiles == claim.configfiles else None
        except (OSError, ValueError, KeyError, TypeError):
            started = None
        return Chosen(study, claim.configfiles, str(Path.cwd()), started, "--configfile")
    found = recorded_studies(Path("."), args.active_minutes)
    default = study_of_files([DEFAULT_CONFIG], args.config) if DEFAULT_CONFIG.exists() else None
    return running_or_default(found, default)


def listing(found: list[Recorded]) -> list[str]:
    if not found:
        return []
    return ["studies recorded here (results/studies/*/study.json):"] + [
        f"  {record.describe()}" for record in found
    ]


def frame(chosen: Chosen, args, estimate: CostEstimate):
    """(text, table): the header naming the study, the studies recorded (when none was named),
    the runs' table with its totals and the study's ETA (when it trains), and its checkpoint
    suites with their revisions' probe state (when it has any)."""
    study = chosen.study
    table = status_table(study, Path("."), args.active_minutes)
    lines = [chosen.header()]
    if not (args.study or args.configfile):
        lines += listing(recorded_studies(Path("."), args.active_minutes))
    if study.runs or not study.suites:
        left, unknown = study_remaining(study, table, Path("."), estimate, time.time())
        lines += [format_table(table), study_eta_line(left, unknown, args.jobs, estimate)]
    if study.suites:
        lines.append(format_suites(study, Path(".")))
        lines += duplicate_lines(study, Path("."))  # checkpoint suites' duplicate revisions
    return "\n".join(lines), table


def watch(render: Callable[[], str], seconds: float, out=sys.stdout) -> int:
    """Draw ``render()`` every ``seconds`` until Ctrl-C: in place on a terminal, one frame
    after another (a blank line between) into a file or pipe."""
    start = CLEAR if out.isatty() else "\n"
    try:
        while True:
            text = render()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"{start}{stamp}, every {seconds:g} s until Ctrl-C\n{text}\n")
            out.flush()
            time.sleep(seconds)
    except KeyboardInterrupt:
        return 0


@reports_config_errors
def main(argv=None, description: str = "") -> int:
    args = parse_args(argv, description)
    csv = None if args.csv is None else args.csv.absolute()
    # As snakemake: --configfile is relative to where the command is typed, all else to DIR.
    configfiles = None if args.configfile is None else [p.absolute() for p in args.configfile]
    with contextlib.chdir(args.directory):
        try:
            chosen = choose(args, configfiles)
        except ValueError as err:
            print(f"status: {err}", file=sys.stderr)
            return 1
        estimate = CostEstimate(chosen.study)
        if args.watch is not None:
            return watch(lambda: frame(chosen, args, estimate)[0], args.watch)
        text, table = frame(chosen, args, estimate)
    print(text)
    if csv:
        table.to_csv(csv, index=False)
    return 0
