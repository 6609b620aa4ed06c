"""Where a study stands: one line per configuration (training run), from the files on disk.

    python -m ihsweep.status                      # the study in config.yaml
    python -m ihsweep.status --configfile my.yaml --csv status.csv

Run it in the repository root (or wherever ``results/`` is). It starts nothing and needs no
Snakemake lock, so it works while a study runs, locally or on SLURM. States:

- ``done``: trained and probed; ``trained``: run.json is there, the probe tables are not yet;
- ``running``: the training log was written within the last ``--active-minutes`` (default 5);
- ``interrupted``: the log ends with a saved state after a signal (the retry resumes it);
- ``failed``: the log stopped for another reason (read its last lines);
- ``missing``: not started.

Columns: ``run_id, state, tokens`` (reached: the last logged or checkpointed count),
``budget``, ``emerged`` and ``tokens_pt`` (from the aggregates' emergence tables, when built)
and, for natural-data runs, ``predicted_tokens``: the emergence point the current law fit
(``results/natural/lawfit.json``) predicts for the run's B and C.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import update_config

from ihsweep.checkpoints import list_checkpoints
from ihsweep.config import ConfigError, Study, prepare
from ihsweep.lawfit import predict_updates

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
COLUMNS = ["run_id", "state", "tokens", "budget", "emerged", "tokens_pt", "predicted_tokens"]
EMERGENCE_TABLES = ("results/natural/emergence.csv", "results/markov/emergence.csv")
LAWFIT = "results/natural/lawfit.json"
TOKENS_LINE = re.compile(r"\] step \d+/\d+ \| tokens ([0-9.]+)M")


def run_state(run_dir: Path, log: Path, text: str | None, active_minutes: float, now: float):
    """The run's state from its folder and its training log (``text``: None when absent)."""
    if (run_dir / "run.json").exists():
        probed = all((run_dir / "probes" / f"{t}.parquet").exists() for t in ("heads", "model"))
        return "done" if probed else "trained"
    if text is None:
        return "missing"
    if now - log.stat().st_mtime < 60 * active_minutes:
        return "running"
    if any("state saved at step" in line for line in text.splitlines()[-3:]):
        return "interrupted"
    return "failed"


def tokens_reached(run_dir: Path, text: str | None) -> int:
    reached = [int(m["tokens"]) for m in list_checkpoints(run_dir)] if run_dir.exists() else []
    if text is not None:
        reached += [int(float(t) * 1e6) for t in TOKENS_LINE.findall(text)[-1:]]
    return max(reached, default=0)


def status_table(study: Study, root: Path = Path("."), active_minutes: float = 5.0):
    now = time.time()
    emergence = pd.concat(
        [pd.read_csv(root / p) for p in EMERGENCE_TABLES if (root / p).exists()]
        or [pd.DataFrame(columns=["run_id", "emerged", "tokens_pt"])]
    ).set_index("run_id")
    fit = json.loads((root / LAWFIT).read_text()) if (root / LAWFIT).exists() else None
    rows = []
    for run in study.runs:
        run_dir = root / run.dir
        log = root / "results" / "logs" / "train" / f"{run.id}.log"
        text = log.read_text(errors="replace") if log.exists() else None  # read once
        row = {
            "run_id": run.id,
            "state": run_state(run_dir, log, text, active_minutes, now),
            "tokens": tokens_reached(run_dir, text),
            "budget": study.total_steps(run) * run.tokens_per_step,
            "emerged": None,
            "tokens_pt": None,
            "predicted_tokens": None,
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
    ).drop(columns="budget")
    counts = table["state"].value_counts()
    summary = ", ".join(f"{counts[s]} {s}" for s in counts.index)
    return shown.to_string(index=False) + f"\n{len(table)} runs: {summary}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ihsweep.status", description=__doc__)
    parser.add_argument("--configfile", nargs="+", default=[Path("config.yaml")], type=Path)
    parser.add_argument("--active-minutes", type=float, default=5.0)
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)
    config: dict = {}
    for path in args.configfile:  # merged in order, as snakemake --configfile does
        update_config(config, yaml.safe_load(path.read_text()))
    try:
        study = prepare(config, SCHEMA)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    table = status_table(study, Path("."), args.active_minutes)
    print(format_table(table))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
