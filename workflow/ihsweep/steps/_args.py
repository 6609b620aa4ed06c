"""What every step's command line shares: JSON specs on the command line, and how a step fails
on a damaged file (``reports_damage``). The execution flags are ``ihsweep.config.execution``'s."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

from ihsweep.files.io import DamagedFile, json_arg


def reports_damage(main: Callable[..., int]) -> Callable[..., int]:
    """A step's ``main`` that, when a file it reads is damaged (``DamagedFile``), prints the
    one line that names the file and its fix to stderr and returns 1: the file is to rewrite,
    not a bug to debug, so the job's log gets no traceback. The steps check what they read
    before they write, so a failing step leaves every file as it found it."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except DamagedFile as err:
            print(err, file=sys.stderr, flush=True)
            return 1

    return wrapped


def parser(rule: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"python -m ihsweep.steps.{rule}", description=description)


def add_spec(p: argparse.ArgumentParser, flag: str, section: str, required: bool = True) -> None:
    """A JSON flag holding one schema section; given by hand it may be partial (or, when not
    required, absent): ``complete`` fills in the schema's defaults, as ``prepare`` does."""
    p.add_argument(
        flag,
        type=json_arg,
        required=required,
        default=None,
        help=f"the study's `{section}` as JSON (or @file); absent keys take the schema's defaults",
    )


def add_findings_inputs(p: argparse.ArgumentParser) -> None:
    """An aggregate's inputs for its front-page findings besides its tables."""
    p.add_argument(
        "--run-records", nargs="*", default=[], type=Path,
        help="the runs' run.json files: how they were trained, for the findings",
    )  # fmt: skip
    p.add_argument(
        "--run-figure", nargs="*", default=[], type=Path,
        help="one run's figure (run.png) to show with the findings; none: no run figure",
    )  # fmt: skip
