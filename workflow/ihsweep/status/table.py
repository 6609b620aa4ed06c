"""The status table: one row per training run of a study, from the files on disk, and its
totals; ``ihsweep.status`` documents the states and columns."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pandas as pd

from ihsweep.analysis.emergence import predicted_within
from ihsweep.analysis.lawfit import predict_updates
from ihsweep.config import Run, Study, StudyPaths
from ihsweep.files import layout
from ihsweep.files.io import RERUN
from ihsweep.files.records import progress_json, read_progress, read_run, run_json
from ihsweep.status.live import ENDED, format_duration, run_eta, run_speed
from ihsweep.training.checkpoints import list_checkpoints

COLUMNS = [
    "run_id", "state", "outcome", "tokens", "budget", "tokens_per_second", "percent",
    "eta_seconds", "emerged", "tokens_pt", "tokens_lo", "tokens_hi", "predicted_tokens",
    "prediction", "predicted_within", "error",
]  # fmt: skip


def damaged_records(run_dir: Path, progress: dict, record: dict | None) -> tuple | None:
    """(state, error) when the run's run.json or progress.json is there but unreadable: the
    table shows that instead of failing. A damaged run.json is the train step's to rewrite;
    progress.json is rewritten by the next training session anyway."""
    if record is None and run_json(run_dir).exists():
        fix = RERUN.format(path=run_json(run_dir), step="train")
        return "damaged", f"damaged run record {run_json(run_dir)}: unreadable; {fix}"
    if not progress and progress_json(run_dir).exists() and record is None:
        path = progress_json(run_dir)
        fix = "the next training session rewrites it"
        return "unknown", f"damaged progress record {path}: unreadable; {fix}"
    return None


def read_fit(path: Path) -> dict | None:
    """The natural aggregate's law fit, None when there is none yet or it is unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_outcome(record: dict | None, progress: dict) -> str | None:
    """How the run's training ended: run.json's ``outcome`` ("completed" when the record
    predates outcomes), else a diverged progress record; None while it has not ended."""
    if record is not None:
        return str(record.get("outcome") or "completed")
    if progress.get("state") == "diverged":
        return "diverged"
    return None


def run_state(
    root: Path, paths: StudyPaths, run: Run, progress: dict, active_minutes: float, now: float
) -> str:
    """The run's state from its folder and its progress record ({} when there is none)."""
    run_dir = root / paths.run_dir(run)
    if run_json(run_dir).exists():
        if run_outcome(read_run(run_dir) or {}, progress) == "diverged":
            return "diverged"
        probed = all((root / paths.probe_table(t, run)).exists() for t in layout.PROBE_TABLES)
        return "done" if probed else "trained"
    state = progress.get("state")
    if state is None:
        return "missing"
    if state == "running" and now - progress["updated"] >= 60 * active_minutes:
        return "failed"  # said running, then went silent: killed without a chance to say so
    return state


def failure(progress: dict, log: str, now: float) -> str:
    """Why a failed run stopped: its recorded error, or how long it has been silent."""
    if progress.get("error"):
        return progress["error"]
    silent = (now - progress["updated"]) / 60
    return f"no progress for {silent:.0f} min (killed?); see {log}"


def divergence(record: dict | None, progress: dict) -> str:
    """Where a diverged run diverged: run.json's ``outcome_detail``, else progress.json's."""
    for source in (record or {}, progress):
        for key in ("outcome_detail", "error"):
            if source.get(key):
                return str(source[key])
    return "diverged (no detail recorded)"


def tokens_reached(run_dir: Path, progress: dict, record: dict | None = None) -> int:
    # The steps reached, not the weights: no checksums (they would read every checkpoint).
    metas = list_checkpoints(run_dir, verify=False) if run_dir.exists() else []
    reached = [int(m["tokens"]) for m in metas]
    recorded = [int(record["tokens"])] if record and record.get("tokens") is not None else []
    return max([*reached, *recorded, int(progress.get("tokens", 0))])


def recorded_prediction(record: dict | None) -> float | None:
    """The emergence point (tokens) the law predicted for the run when it was planned, as its
    run.json records it (``prediction``, or the spec's), None without one."""
    record = record or {}
    prediction = record.get("prediction") or (record.get("spec") or {}).get("prediction")
    tokens = (prediction or {}).get("tokens")
    return None if tokens is None or not math.isfinite(float(tokens)) else float(tokens)


def _emergence(root: Path, study: str) -> pd.DataFrame:
    """The observed points of the study's runs, from its aggregates' emergence tables."""
    columns = ["run_id", "emerged", "tokens_pt", "tokens_lo", "tokens_hi"]
    paths = [root / layout.aggregate_file("emergence.csv", folder)
             for folder in (layout.natural_dir(study), layout.markov_dir(study))]  # fmt: skip
    tables = [pd.read_csv(p) for p in paths if p.exists()]
    table = pd.concat(tables) if tables else pd.DataFrame(columns=columns)
    return table.reindex(columns=columns).set_index("run_id")


def _value(x):
    return None if x is None or pd.isna(x) else float(x)


def status_table(study: Study, root: Path = Path("."), active_minutes: float = 5.0):
    now = time.time()
    emergence = _emergence(root, study.name)
    lawfit = root / layout.aggregate_file("lawfit.json", layout.natural_dir(study.name))
    fit = read_fit(lawfit)
    rows = []
    paths = StudyPaths(study)
    for run in study.runs:
        run_dir = root / paths.run_dir(run)
        progress = read_progress(run_dir)
        record = read_run(run_dir)
        state = run_state(root, paths, run, progress, active_minutes, now)
        budget = (record or {}).get("budget") or study.total_steps(run) * run.tokens_per_step
        row = dict.fromkeys(COLUMNS)
        row.update(
            run_id=run.id,
            state=state,
            outcome=run_outcome(record, progress),
            tokens=tokens_reached(run_dir, progress, record),
            budget=int(budget),
        )
        if state == "running":  # how fast it goes and when it ends, at its recorded speed
            row.update(tokens_per_second=run_speed(progress), eta_seconds=run_eta(progress, now))
            row["percent"] = 100 * row["tokens"] / row["budget"] if row["budget"] else None
        if state == "failed":
            row["error"] = failure(progress, paths.run_log("train", run), now)
        elif state == "diverged":
            row["error"] = divergence(record, progress)
        if (damage := damaged_records(run_dir, progress, record)) is not None:
            row.update(state=damage[0], error=damage[1])
        if run.id in emergence.index:
            observed = emergence.loc[run.id]
            row["emerged"] = bool(observed["emerged"])
            for end in ("pt", "lo", "hi"):
                row[f"tokens_{end}"] = _value(observed[f"tokens_{end}"])
        family = study.config["datasets"][run.data]["family"]
        if recorded_prediction(record) is not None:
            row.update(predicted_tokens=recorded_prediction(record), prediction="run.json")
        elif fit is not None and fit.get("ok") and family == "natural":
            updates = predict_updates(fit, run.batch_size, run.context_size)
            row.update(predicted_tokens=float(updates) * run.tokens_per_step, prediction="lawfit")
        row["predicted_within"] = predicted_within(
            row["emerged"], row["predicted_tokens"], row["tokens_lo"], row["tokens_hi"]
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def totals(table: pd.DataFrame) -> str:
    """The totals line: tokens trained vs budget (ended runs and all), the runs stopped early
    and diverged, and how many emerged runs the law predicted within their interval."""
    ended = table[table["state"].isin(ENDED)]
    trained, budget = ended["tokens"].sum(), ended["budget"].sum()
    # Saved: the budget early stops left untrained. A diverged run's is lost, not saved.
    early = ended[ended["outcome"] == "stopped_early"]
    saved_tokens = (early["budget"] - early["tokens"]).sum()
    saved = f", {100 * saved_tokens / budget:.1f}% saved by early stops" if budget else ""
    diverged = ended[ended["outcome"] == "diverged"]
    lost = (diverged["budget"] - diverged["tokens"]).sum()
    parts = [
        f"tokens trained: {_millions(trained)} of {_millions(budget)} budget over the"
        f" {len(ended)} ended runs{saved}; {_millions(table['tokens'].sum())} of"
        f" {_millions(table['budget'].sum())} over all {len(table)}",
        f"{len(early)} stopped early",
        f"{len(diverged)} diverged" + (f" ({_millions(lost)} unspent, not saved)" if lost else ""),
    ]
    judged = table["predicted_within"].dropna()
    if len(judged):
        parts.append(
            f"the law predicted {int(judged.astype(bool).sum())} of {len(judged)} emerged runs"
            " within their interval"
        )
    return "; ".join(parts)


def _absent(x) -> bool:
    return x is None or pd.isna(x)


def _millions(x) -> str:
    return "-" if x is None or pd.isna(x) else f"{x / 1e6:.2f}M"


def format_table(table: pd.DataFrame) -> str:
    def observed(row) -> str:
        if pd.isna(row.tokens_pt):
            return "-"
        if pd.isna(row.tokens_lo):
            return _millions(row.tokens_pt)
        lo, hi = _millions(row.tokens_lo), _millions(row.tokens_hi)
        return f"{_millions(row.tokens_pt)} [{lo}, {hi}]"

    def yes_no(x) -> str:
        return "-" if x is None or pd.isna(x) else ("yes" if x else "no")

    shown = pd.DataFrame(
        {
            "run_id": table.run_id,
            "state": table.state,
            "outcome": [o.replace("_", " ") if isinstance(o, str) else "" for o in table.outcome],
            "tokens/budget": [
                f"{_millions(t)}/{_millions(b)}"
                for t, b in zip(table.tokens, table.budget, strict=True)
            ],
            "speed": [
                "-" if _absent(x) else f"{x / 1e3:.1f}k tok/s" for x in table.tokens_per_second
            ],
            "%": ["-" if _absent(x) else f"{x:.0f}%" for x in table.percent],
            "ETA": ["-" if _absent(x) else format_duration(x) for x in table.eta_seconds],
            "emerged": table.emerged.map(yes_no),
            "observed [95% CI]": [observed(row) for row in table.itertuples()],
            "predicted": [
                "-" if pd.isna(p) else f"{_millions(p)} ({source})"
                for p, source in zip(table.predicted_tokens, table.prediction, strict=True)
            ],
            "within": table.predicted_within.map(yes_no),
            "error": table.error.fillna(""),
        }
    )
    counts = table["state"].value_counts()
    summary = ", ".join(f"{counts[s]} {s}" for s in counts.index)
    return shown.to_string(index=False) + f"\n{len(table)} runs: {summary}\n{totals(table)}"
