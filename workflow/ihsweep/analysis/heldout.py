"""How well a law predicts runs it never saw (docs/method.md#held-out-validation).

Two kinds of split of a study's emerged runs (those ``fit_law`` would fit):

- ``cell``: leave out one (B, C) cell with all its seeds (and models), refit on the rest,
  predict the left-out cell; once per cell.
- ``extrapolation``: order the cells by B * C (then B), fit on the smaller two thirds, predict
  the largest third (``ceil(n_cells / 3)`` cells).

A kind is measured only where every one of its fits keeps at least 2 values of B, 2 of C and
``MIN_RUNS`` runs (and the free fit succeeds); otherwise it records why not. Each split is
predicted by three laws (``LAWS``): the study's own fit (a, b and log10 T), the published
exponents with log10 T calibrated on the training runs, and the published law as it stands
(a point, no interval). Every held-out run is one row: its observed log10 updates, the law's
point and 95% prediction interval for a new run (``ihsweep.analysis.predict``) and whether it
falls inside. The summary gives, per law and kind, the coverage of the intervals and the RMSE
of the points in log10 updates.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ihsweep.analysis.lawfit import CELL, MIN_RUNS, emerged_runs, fit_law, fixed_exponents
from ihsweep.analysis.predict import law_from_fit, log10_updates, published_law

LAWS = {
    "study": "the study's own fit",
    "calibrated": "published a, b; log10 T fitted on the study",
    "published": "the published law",
}
KINDS = {
    "cell": "each (B, C) cell left out in turn",
    "extrapolation": "the largest third of B * C, fitted on the rest",
}
COLUMNS = [
    "kind", "split", "law", "run_id", "batch_size", "context_size", "seed",
    "observed_log10_updates", "predicted_log10_updates", "low_log10_updates",
    "high_log10_updates", "inside",
]  # fmt: skip


def held_out(emergence: pd.DataFrame, n_boot: int, seed: int, model: str | None = None):
    """The held-out table (``COLUMNS``, one row per law and held-out run) and its summary (a
    plain dict: ``kinds`` with each kind's ok/reason, ``summary`` rows per law and kind)."""
    runs = emerged_runs(emergence)
    if model is not None:
        runs = runs[runs["model"] == model].reset_index(drop=True)
    rows, kinds = [], {}
    n_cells = runs.groupby(CELL).ngroups if len(runs) else 0
    for kind, splits in _splits(runs).items():
        problem = next((f"{name}: {p}" for name, test in splits
                        if (p := _problem(runs[~test]))), "")  # fmt: skip
        if n_cells < 2:
            problem = f"{len(runs)} emerged runs in {n_cells} (B, C) cells; it needs 2 cells"
        kind_rows = [] if problem else _predict_splits(runs, splits, n_boot, seed)
        problem = problem or next((r["problem"] for r in kind_rows if "problem" in r), "")
        kinds[kind] = {"ok": not problem, "reason": problem, "n_splits": len(splits)}
        if not problem:
            rows += [{"kind": kind, **r} for r in kind_rows]
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table, {
        "ok": any(k["ok"] for k in kinds.values()),
        "kinds": kinds,
        "laws": LAWS,
        "summary": summarise(table),
        "confidence": 0.95,
        "n_boot": int(n_boot),
        "seed": int(seed),
        "model": model,
        "n_runs": len(runs),
    }


def _splits(runs: pd.DataFrame) -> dict[str, list[tuple[str, np.ndarray]]]:
    cells = runs[CELL].drop_duplicates().astype(int)
    cells = cells.assign(area=cells.batch_size * cells.context_size)
    cells = cells.sort_values(["area", "batch_size"], kind="stable")
    key = list(zip(runs.batch_size.astype(int), runs.context_size.astype(int), strict=True))

    def held(chosen) -> np.ndarray:
        return np.array([k in chosen for k in key], dtype=bool)

    names = [(int(b), int(c)) for b, c in zip(cells.batch_size, cells.context_size, strict=True)]
    by_cell = [(f"B{b}-C{c}", held({(b, c)})) for b, c in names]
    if len(names) < 2:
        return {"cell": by_cell, "extrapolation": []}
    largest = names[len(names) - math.ceil(len(names) / 3) :]
    span = ", ".join(f"B{b}-C{c}" for b, c in largest)
    return {"cell": by_cell, "extrapolation": [(f"largest B*C: {span}", held(set(largest)))]}


def _problem(train: pd.DataFrame) -> str:
    for column, symbol in (("batch_size", "B"), ("context_size", "C")):
        if train[column].nunique() < 2:
            return f"the fit keeps one value of {symbol}; it needs 2"
    if len(train) < MIN_RUNS:
        return f"the fit keeps {len(train)} runs; it needs {MIN_RUNS}"
    return ""


def _predict_splits(runs, splits, n_boot: int, seed: int) -> list[dict]:
    out = []
    for name, test in splits:
        train, held = runs[~test], runs[test]
        fits = {
            "study": fit_law(train, n_boot, seed),
            "calibrated": fit_law(train, n_boot, seed, exponents=fixed_exponents("published")),
        }
        failed = [f"{name}: {f['reason']}" for f in fits.values() if not f["ok"]]
        if failed:
            return [{"problem": failed[0]}]
        laws = {law: law_from_fit(fit, law) for law, fit in fits.items()}
        laws["published"] = published_law()
        for law_name, law in laws.items():
            point, low, high = log10_updates(law, held.batch_size, held.context_size)
            observed = np.log10(held.updates_pt.to_numpy(float))
            for i, run in enumerate(held.itertuples(index=False)):
                inside = None if np.isnan(low[i]) else bool(low[i] <= observed[i] <= high[i])
                out.append({
                    "split": name, "law": law_name, "run_id": run.run_id,
                    "batch_size": int(run.batch_size), "context_size": int(run.context_size),
                    "seed": int(run.seed), "observed_log10_updates": float(observed[i]),
                    "predicted_log10_updates": float(point[i]),
                    "low_log10_updates": _finite(low[i]), "high_log10_updates": _finite(high[i]),
                    "inside": inside,
                })  # fmt: skip
    return out


SUMMARY = ["kind", "law", "n_runs", "n_inside", "coverage", "rmse_log10", "bias_log10"]


def summarise(table: pd.DataFrame) -> list[dict]:
    """Per law and kind: held-out runs, how many fell inside their interval, the coverage
    (None for a law without intervals) and the RMSE of the points in log10 updates."""
    out = []
    for (kind, law), group in table.groupby(["kind", "law"], sort=False):
        error = group.predicted_log10_updates - group.observed_log10_updates
        judged = group.inside.dropna()
        out.append({
            "kind": kind, "law": law, "n_runs": len(group), "n_inside": int(judged.sum()),
            "coverage": float(judged.mean()) if len(judged) else None,
            "rmse_log10": float(np.sqrt(np.mean(error**2))),
            "bias_log10": float(error.mean()),
        })  # fmt: skip
    return out


def _finite(value) -> float | None:
    return float(value) if np.isfinite(value) else None
