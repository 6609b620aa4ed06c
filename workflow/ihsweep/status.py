"""Where a study stands: one line per configuration (training run), from the files on disk.

    python -m ihsweep.status                      # the study in config.yaml
    python -m ihsweep.status --configfile my.yaml --csv status.csv

Run it in the repository root (or wherever ``results/`` is). It starts nothing and needs no
Snakemake lock, so it works while a study runs, locally or on SLURM. States:

- ``done``: trained and probed; ``trained``: run.json is there, the probe tables are not yet;
- ``running``: the run's ``progress.json`` says so and was updated within the last
  ``--active-minutes`` (default 5);
- ``interrupted``: it stopped on a signal with its state saved (the retry resumes it);
- ``failed``: it stopped on an error (the ``error`` column), or says running but has not been
  updated for longer than ``--active-minutes`` (killed; read its log);
- ``missing``: not started.

Each run's state comes from its ``progress.json`` (``ihsweep.training.loop.write_progress``);
nothing here reads the training log. Columns: ``run_id, state, tokens`` (reached: the larger of
the last progress record and the last checkpoint),
``budget``, ``emerged`` and ``tokens_pt`` (from the aggregates' emergence tables, when built)
and, for natural-data runs, ``predicted_tokens``: the emergence point the current law fit
(``results/natural/lawfit.json``) predicts for the run's B and C; ``error``: why a failed run
stopped.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from ihsweep import layout
from ihsweep.analysis.lawfit import predict_updates
from ihsweep.config import Run, Study, add_configfile, study_of_files
from ihsweep.training.checkpoints import list_checkpoints
from ihsweep.training.loop import read_progress

COLUMNS = [
    "run_id", "state", "tokens", "budget", "emerged", "tokens_pt", "predicted_tokens", "error",
]  # fmt: skip
EMERGENCE_TABLES = (
    layout.aggregate_file("emergence.csv", layout.NATURAL),
    layout.aggregate_file("emergence.csv", layout.MARKOV),
)
LAWFIT = layout.aggregate_file("lawfit.json", layout.NATURAL)


def run_state(root: Path, run: Run, progress: dict, active_minutes: float, now: float) -> str:
    """The run's state from its folder and its progress record ({} when there is none)."""
    if (root / layout.run_file(layout.RUN_JSON, run)).exists():
        probed = all((root / layout.probe_table(t, run)).exists() for t in layout.PROBE_TABLES)
        return "done" if probed else "trained"
    state = progress.get("state")
    if state is None:
        return "missing"
    if state == "running" and now - progress["updated"] >= 60 * active_minutes:
        return "failed"  # said running, then went silent: killed without a chance to say so
    return state


def failure(progress: dict, run: Run, now: float) -> str:
    """Why a failed run stopped: its recorded error, or how long it has been silent."""
    if progress.get("error"):
        return progress["error"]
    silent = (now - progress["updated"]) / 60
    return f"no progress for {silent:.0f} min (killed?); see {layout.log('train', run.id)}"


def tokens_reached(run_dir: Path, progress: dict) -> int:
    reached = [int(m["tokens"]) for m in list_checkpoints(run_dir)] if run_dir.exists() else []
    return max([*reached, int(progress.get("tokens", 0))])


def status_table(study: Study, root: Path = Path("."), active_minutes: float = 5.0):
    now = time.time()
    emergence = pd.concat(
        [pd.read_csv(root / p) for p in EMERGENCE_TABLES if (root / p).exists()]
        or [pd.DataFrame(columns=["run_id", "emerged", "tokens_pt"])]
    ).set_index("run_id")
    fit = json.loads((root / LAWFIT).read_text()) if (root / LAWFIT).exists() else None
    rows = []
    for run in study.runs:
        run_dir = root / layout.run_dir(run)
        progress = read_progress(run_dir)
        state = run_state(root, run, progress, active_minutes, now)
        row = {
            "run_id": run.id,
            "state": state,
            "tokens": tokens_reached(run_dir, progress),
            "budget": study.total_steps(run) * run.tokens_per_step,
            "emerged": None,
            "tokens_pt": None,
            "predicted_tokens": None,
            "error": failure(progress, run, now) if state == "failed" else None,
        }
        if run.id in emergence.index:
            row["emerged"] = bool(emergence.loc[run.id, "emerged"])
            row["tokens_pt"] = emergence.loc[run.id, "tokens_pt"]
        family = study.config["datasets"][run.data]["family"]
        if fit is not None and fit.get("ok") and family == "natural":
            updates = predict_updates(fit, run.batch_size, run.context_size)
            row["predicted_tokens"] = float(updates) * run.tokens_per_step
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def format_table(table: pd.DataFrame) -> str:
    def millions(x) -> str:
        return "-" if x is None or pd.isna(x) else f"{x / 1e6:.2f}M"

    shown = table.assign(
        tokens=[
            f"{millions(t)}/{millions(b)}" for t, b in zip(table.tokens, table.budget, strict=True)
        ],
        emerged=["-" if e is None else ("yes" if e else "no") for e in table.emerged],
        tokens_pt=table.tokens_pt.map(millions),
        predicted_tokens=table.predicted_tokens.map(millions),
        error=table.error.fillna(""),
    ).drop(columns="budget")
    counts = table["state"].value_counts()
    summary = ", ".join(f"{counts[s]} {s}" for s in counts.index)
    return shown.to_string(index=False) + f"\n{len(table)} runs: {summary}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ihsweep.status", description=__doc__)
    add_configfile(parser)
    parser.add_argument("--active-minutes", type=float, default=5.0)
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)
    study = study_of_files(args.configfile)
    table = status_table(study, Path("."), args.active_minutes)
    print(format_table(table))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
