"""When will a model form induction heads? The law's prediction for a batch and context size.

    python -m ihsweep.predict -B 1024 -C 2048                    # the published law (Pythia)
    python -m ihsweep.predict -B 64 256 -C 512 1024 --law study:cpu-full
    python -m ihsweep.predict -B 16 -C 32 --params 1e5 --law study:cpu-full   # with the size term
    python -m ihsweep.predict -B 512 --within-tokens 1e8 --law study:calibrate   # which C?
    python -m ihsweep.predict -B 1024 -C 2048 --law results/studies/x/natural/lawfit.json --json

The law (``--law``): ``published`` (the paper's, arXiv 2511.16893v2; a point, no interval
published), ``study:NAME`` (results/studies/NAME/natural/lawfit.json, written by the study's
aggregate) or the path of a lawfit.json. Per (B, C) of the grid of ``-B`` and ``-C`` it prints
the predicted updates and tokens (updates x B x C) to emergence with the 95% prediction interval
for a new run (docs/method.md#predicting-a-new-run), how far the configuration lies outside the
grid the law was fitted on (per axis and in the law's units B^a C^b), and a warning line for
each extrapolation. ``--within-tokens N`` with only ``-B`` (or only ``-C``) answers the inverse
question: which C (or B) brings emergence within N tokens. ``--json`` prints one JSON object.
Bad input gets one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from ihsweep.analysis.predict import (
    Law,
    LawError,
    law_from_fit,
    predict,
    published_law,
    warnings,
    within_tokens,
)
from ihsweep.files import layout
from ihsweep.report.provenance import STUDY_JSON, StudyClaim

STUDY_PREFIX = "study:"


def law_file(name: str) -> Path:
    """A study's lawfit.json (``study:NAME``)."""
    return Path(layout.aggregate_file("lawfit.json", layout.natural_dir(name)))


def read_law(spec: str, size: bool = False) -> Law:
    """The law ``--law`` names; LawError (one line) when it cannot predict."""
    if spec == "published":
        if size:
            raise LawError("the published law has no size term; drop --params, or use a "
                           "study's law with one (--law study:NAME)")  # fmt: skip
        return published_law()
    if spec.startswith(STUDY_PREFIX):
        study = spec[len(STUDY_PREFIX) :]
        path = law_file(study)
        if not path.is_file():
            raise LawError(
                f"study {study!r} has no law fit yet ({path} does not exist); make it with: "
                f"snakemake --cores all {path} --configfile {_configfiles(study)}"
            )
    else:
        path = Path(spec)
        if not path.is_file():
            raise LawError(f"--law {spec}: no such file; give published, study:NAME or the path "
                           "of a lawfit.json")  # fmt: skip
    try:
        fit = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LawError(f"{path} is not a readable lawfit.json ({err}); rerun the study's "
                       "aggregate_natural") from None  # fmt: skip
    if not isinstance(fit, dict):
        raise LawError(f"{path} is not a lawfit.json (no JSON object)")
    return law_from_fit(fit, str(path), size=size)


def _configfiles(study: str) -> str:
    """The config files that made a study (its study.json), else a guess to check."""
    try:
        return " ".join(StudyClaim.read(Path(layout.study_dir(study)) / STUDY_JSON).configfiles)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if study == "default":
        return "config.yaml"
    guess = Path("workflow/studies") / f"{study}.yaml"
    return str(guess) if guess.is_file() else f"<{study}'s config files>"


def positive_int(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(value)


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one line (no usage block): what is wrong and with which option."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ihsweep.predict", description=__doc__.split("\n")[0])
    p.add_argument(
        "-B",
        "--batch-size",
        nargs="+",
        type=positive_int,
        default=None,
        help="batch sizes (sequences per update); several give a grid",
    )
    p.add_argument(
        "-C",
        "--context-size",
        nargs="+",
        type=positive_int,
        default=None,
        help="context sizes (tokens per sequence); several give a grid",
    )
    p.add_argument(
        "--params",
        type=positive_number,
        default=None,
        help="parameter count, for a study's law with a model-size term",
    )
    p.add_argument(
        "--law",
        default="published",
        help="published (default), study:NAME, or the path of a lawfit.json",
    )
    p.add_argument(
        "--within-tokens",
        type=positive_number,
        default=None,
        help="with only -B (or -C): which C (or B) brings emergence within N tokens",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.batch_size is None and args.context_size is None:
        p.error("give -B/--batch-size and -C/--context-size (or one of them with --within-tokens)")
    inverse = args.batch_size is None or args.context_size is None
    if inverse and args.within_tokens is None:
        p.error("give both -B and -C, or one of them with --within-tokens N")
    try:
        law = read_law(args.law, size=args.params is not None)
        if inverse:
            rows = within_tokens(law, args.within_tokens, args.batch_size, args.context_size,
                                 args.params)  # fmt: skip
            print(json.dumps(_header(law) | {"within_tokens": rows}, indent=2) if args.json
                  else _inverse_text(law, rows))  # fmt: skip
            return 0
        table = predict(law, args.batch_size, args.context_size, args.params)
    except LawError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    lines = warnings(law, table)
    if args.json:
        rows = json.loads(table.to_json(orient="records"))
        print(json.dumps(_header(law) | {"predictions": rows, "warnings": lines}, indent=2))
        return 0
    print(_table_text(law, table))
    for line in lines:
        print(line, file=sys.stderr)
    return 0


def _header(law: Law) -> dict:
    return {"law": law.name, "a": law.a, "b": law.b, "log10_T": law.log10_T, "c": law.c,
            "fitted_grid": {k: list(v) for k, v in law.grid.items()}, "note": law.note,
            "interval": "95% prediction interval for a new run" if law.has_interval
            else "no interval published"}  # fmt: skip


def _law_line(law: Law) -> str:
    size = f" N^{law.c:+.3f}" if law.c is not None else ""
    grid = ", ".join(
        f"{k} {lo:g}" + (f"-{hi:g}" if hi > lo else "") for k, (lo, hi) in law.grid.items()
    )
    return (f"law {law.name}: U = 10^{law.log10_T:.3f} / (B^{law.a:.3f} C^{law.b:.3f}){size} "
            f"updates ({law.note}; fitted over {grid})")  # fmt: skip


def _table_text(law: Law, table: pd.DataFrame) -> str:
    shown = pd.DataFrame({"B": table["batch_size"], "C": table["context_size"]})
    for unit in ("updates", "tokens"):
        shown[unit] = table[unit].map(_sig)
        shown[f"{unit} 95% (new run)"] = [
            "no interval published" if pd.isna(lo) else f"{_sig(lo)} - {_sig(hi)}"
            for lo, hi in zip(table[f"{unit}_low"], table[f"{unit}_high"], strict=True)
        ]
    outside = [c for c in table.columns if c.startswith("outside_")]
    for column in outside:
        shown[column.replace("_", " ")] = table[column].map(lambda f: f"{f:.3g}x")
    return _law_line(law) + "\n\n" + shown.to_string(index=False)


def _inverse_text(law: Law, rows: list[dict]) -> str:
    lines = [_law_line(law), ""]
    for row in rows:
        given = next(k for k in ("B", "C") if k in row)
        where = f"at {given} = {row[given]}"
        if row["bound"] is None:
            verdict = "every" if row["side"] == "every" else "no"
            lines.append(f"{where}: {verdict} {row['solve']} emerges within {row['tokens']:.3g} "
                         "tokens (the law's tokens do not depend on it)")  # fmt: skip
        else:
            bound = f"{row['solve']} {row['side']} {row['bound']:.4g}"
            lines.append(f"{where}: emergence within {row['tokens']:.3g} tokens for {bound} "
                         "(the law's point)")  # fmt: skip
    return "\n".join(lines)


def _sig(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
