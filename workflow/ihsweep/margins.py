"""Would another early-stopping margin have changed a study's results? A replay on its files.

    python -m ihsweep.margins --margins 0.3 0.4 0.5
    python -m ihsweep.margins --configfile config.yaml workflow/studies/cpu-full.yaml --csv m.csv

Run it where ``results/`` is, after the probe step. For each run with a ``run.json`` and a
model-level probe table it applies the rule of ``training.stop_after_emergence``
(``ihsweep.analysis.emergence.replay_stop``: the study's ``emergence`` block, checked at every
checkpoint as training checks it) at each margin, and compares the point it would report with
the point the study reports now. A stopped run is the exact prefix of the full run, so the
replay is exact on runs trained to their budget at any margin and on runs stopped early at
margins up to their own; other pairs are counted as not replayable. Diverged runs are left out.
Nothing is trained or probed.

Per margin it prints the replayable runs, how many change outcome (emerged or not), how many
points move and the largest move in decades, and the tokens the runs would have trained against
the tokens they trained. ``--csv`` writes one row per run and margin: ``run_id, margin,
replayable, emerged, tokens_pt, tokens_trained`` (as the study has them), ``replay_emerged,
replay_tokens_pt, replay_tokens_trained`` (at that margin; empty where not replayable),
``shift_decades`` (log10 of replayed over reported point, where both emerged), and
``outcome_changed`` and ``point_moved`` (False where not replayable).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from ihsweep.analysis.emergence import replay_stop, run_point
from ihsweep.config import Study, StudyPaths, add_configfile, reports_config_errors, study_of_files
from ihsweep.files.io import DamagedFile, read_probe_table
from ihsweep.files.records import read_run
from ihsweep.status import run_outcome

# A replayed point within this many decades of the reported one has not moved (float noise of
# the crossing's interpolation; a moved point moves by at least a checkpoint gap, ~0.1 decade).
MOVED_DECADES = 1e-6


def replay_table(study: Study, margins: list[float], root: Path = Path(".")) -> pd.DataFrame:
    """One row per (run with a record and a probe table, margin): see the module docstring."""
    emergence = study.config["emergence"]
    rows = []
    paths = StudyPaths(study)
    for run in study.runs:
        record = read_run(root / paths.run_dir(run))
        table_path = root / paths.probe_table("model", run)
        if record is None or not table_path.exists():
            continue
        outcome = run_outcome(record, {})
        if outcome == "diverged":
            continue
        own_margin = (record["spec"].get("early_stop") or {}).get("margin_decades")
        series = read_probe_table(table_path)
        reported = run_point(series, emergence)
        for margin in margins:
            replayable = outcome == "completed" or (own_margin is not None and margin <= own_margin)
            row = {
                "run_id": run.id,
                "margin": margin,
                "replayable": replayable,
                "emerged": reported["emerged"],
                "tokens_pt": reported["tokens_pt"],
                "tokens_trained": float(series["tokens"].max()),
                "replay_emerged": None,
                "replay_tokens_pt": math.nan,
                "replay_tokens_trained": math.nan,
                "shift_decades": math.nan,
                "outcome_changed": False,
                "point_moved": False,
            }
            if replayable:
                replay = replay_stop(series, emergence, margin)
                row.update(
                    replay_emerged=replay["emerged"],
                    replay_tokens_pt=replay["tokens_pt"],
                    replay_tokens_trained=replay["tokens_trained"],
                )
                row["outcome_changed"] = replay["emerged"] != reported["emerged"]
                if replay["emerged"] and reported["emerged"]:
                    shift = math.log10(replay["tokens_pt"] / reported["tokens_pt"])
                    row.update(shift_decades=shift, point_moved=abs(shift) > MOVED_DECADES)
            rows.append(row)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per margin: replayable runs, outcome changes, moved points, the largest move, tokens."""
    rows = []
    for margin, group in table.groupby("margin", sort=True):
        done = group[group["replayable"]]
        shift = done["shift_decades"].abs()
        rows.append(
            {
                "margin": margin,
                "runs": len(done),
                "not_replayable": int((~group["replayable"]).sum()),
                "outcome_changed": int(done["outcome_changed"].sum()),
                "points_moved": int(done["point_moved"].sum()),
                "max_shift_decades": float(shift.max()) if shift.notna().any() else 0.0,
                "tokens_fraction": float(
                    done["replay_tokens_trained"].sum() / done["tokens_trained"].sum()
                )
                if len(done)
                else math.nan,
            }
        )
    return pd.DataFrame(rows)


@reports_config_errors
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ihsweep.margins", description=__doc__)
    add_configfile(parser)
    parser.add_argument("--margins", type=float, nargs="+", default=[0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--csv", type=Path, help="also write the per-run table as CSV")
    args = parser.parse_args(argv)
    try:
        table = replay_table(study_of_files(args.configfile, args.config), args.margins)
    except DamagedFile as err:  # a table to rewrite: its name and fix, not a traceback
        print(err, file=sys.stderr)
        return 1
    if table.empty:
        print("no run has both run.json and a model-level probe table yet")
        return 0
    print(summary(table).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    moved = table[table["outcome_changed"] | table["point_moved"]]
    for row in moved.itertuples():
        print(
            f"margin {row.margin:g}: {row.run_id} stops at {row.replay_tokens_trained:.4g} tokens"
            f" with point {row.replay_tokens_pt:.4g} (reported {row.tokens_pt:.4g},"
            f" trained {row.tokens_trained:.4g})"
        )
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
