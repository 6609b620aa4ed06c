"""Fit the emergence law to the per-run emergence table (docs/method.md#the-law-and-its-fit).

The law: the number of updates at which induction heads emerge, U_pt, falls with batch size B
(sequences per update) and context size C (tokens per sequence) as

    U_pt = T / (B^a * C^b),   i.e.   log10 U_pt = log10 T - a log10 B - b log10 C.

The paper reports a = 0.37, b = 0.62 and r = 0.98 between predicted and observed. Only runs
with ``emerged`` True and a finite positive ``updates_pt`` enter the fit; runs without a
transition within the budget are right-censored and are left out rather than imputed. Runs
whose training diverged (``outcome`` "diverged", a non-finite loss) say nothing about when
induction heads form and are left out too, whatever their ``emerged`` says; the result names
them (``diverged_run_ids``) and counts what was left out and why (``n_not_emerged``: no
transition within the budget; ``n_diverged``). A table without an ``outcome`` column (written
before runs recorded how they ended) counts every run as completed. Runs stopped early once
their emergence was confirmed (``training.stop_after_emergence``) emerged, so they are fitted
like any other.

What is reported and how:

- a, b, log10 T: ordinary least squares on log10 U_pt. Each run is one observation, whatever
  its seed or model, so repeated seeds simply weigh their cell more.
- 95% confidence intervals: nonparametric bootstrap over runs (resample the emerged runs with
  replacement ``n_boot`` times, refit, take the 2.5th and 97.5th percentiles). Resamples whose
  design is rank-deficient (e.g. every drawn run has the same B) cannot be fitted and are
  skipped; ``n_boot_used`` counts the rest. Resampling runs, rather than residuals, keeps the
  intervals honest if the noise differs between cells. With few runs the percentile intervals
  are somewhat too narrow: on 200 simulated 4 x 4 grids (16 runs, noise sd 0.05 in log10) the
  nominal 95% intervals covered the truth 88% (a), 92% (b) and 94% (log10 T) of the time.
- r: Pearson correlation between the in-sample predicted and observed log10 U_pt (the paper's
  goodness-of-fit number), and ``residual_sd_log10``.
- Seed noise, where some (B, C) cell holds more than one emerged run (seeds, or models when
  ``model`` is None): the law predicts one value per cell, so the spread of a cell's runs is
  noise no law can explain. ``seed_sd_log10`` is the pooled within-cell standard deviation of
  log10 U_pt (``n - n_cells`` degrees of freedom). ``r_ceiling`` = sqrt(1 - SS_within /
  SS_total) is the r reached by predicting every run by its cell's mean, the highest in-sample
  r that any prediction of U_pt from (B, C) alone can reach on these runs. ``r_cells`` is r
  between the law's prediction and the cells' mean observed log10 U_pt (one point per cell).
  The lack-of-fit test compares the law's miss of the cell means with the seed noise:
  F = (SS_residual - SS_within) / (n_cells - 3) / (SS_within / (n - n_cells)), and
  ``lack_of_fit_p`` its upper tail under F(n_cells - 3, n - n_cells); a small p says the law's
  form misses the cells by more than the seeds scatter. None where no cell has two runs or the
  degrees of freedom are zero; ``seed_note`` says why.
- Leave-one-out prediction: refit without each run and predict it. ``loo_rmse_log10`` is the
  root-mean-square error in log10 units (0.1 is a factor of 1.26); ``loo`` lists per-run
  observed and predicted log10 U_pt (None where dropping the run makes the design singular).
- Which runs: every emerged run, or with ``lawfit.model`` only those of one model (the B x C
  grid's), as the paper fits its law at one model size; ``n_other_models`` counts the emerged
  runs of other models, which enter only the size test. Where emergence depends on size, as it
  can at small scale, runs of other sizes at one (B, C) cell are residuals the law cannot
  explain: they lower r and widen the intervals without saying anything about a or b.
- Model-size test: with at least 2 distinct ``n_params`` among the emerged runs (of every
  model, whatever ``model`` says), refit
  ``log10 U_pt = log10 T - a log10 B - b log10 C + c log10 N_params`` and report c with its
  bootstrap interval (same resamples). The law claims c = 0; an interval excluding 0 is evidence
  against size independence. Otherwise the c fields are None and ``c_note`` says why. A B or C
  that is the same for every run (a checkpoint suite such as Pythia trains every size at one
  B and C) drops out of the size model as a constant, so c is still tested when the law itself
  cannot be fitted; ``size_fit`` then has None for that exponent.

- For predictions (``ihsweep.analysis.predict``): the fitted grid (``batch_sizes``,
  ``context_sizes``, ``n_params_values``: the distinct values among the fitted runs) and the
  bootstrap draws themselves (``boot_draws``, one ``[log10_T, a, b]`` per used resample;
  ``size_boot_draws``, ``[log10_T, a, b, c]`` with None for a constant B or C, beside
  ``size_residual_sd_log10``), so that a prediction's interval for a new run can combine the
  fit's uncertainty with the scatter of runs around it (docs/method.md#predicting-a-new-run).
- Fixed exponents (``exponents``, config ``lawfit.exponents``): with a and b given (the
  published ones, or another study's), only log10 T is fitted: the mean of
  log10 U_pt + a log10 B + b log10 C over the runs, its bootstrap interval from the same
  resamples of runs, ``residual_sd_log10`` with n - 1 degrees of freedom, and the
  leave-one-out error. Two runs suffice, at any B and C: a calibration of the law's constant on
  a new corpus from a few pilot runs (docs/calibrate.md). ``exponents_source`` says where a and
  b came from ("fitted" when they were fitted).

Too few points (fewer than ``MIN_RUNS`` emerged runs, or B or C not varying, or B and C
collinear) give ``ok: False`` with a ``reason`` and None estimates, never an exception. Every
value in the result is a plain Python float, int, str, bool, list, dict or None, so it can be
written with ``json.dump(..., allow_nan=False)``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ihsweep.config import law_updates

MIN_RUNS = 4  # three coefficients plus at least one residual degree of freedom
MIN_RUNS_FIXED = 2  # log10 T alone, plus one residual degree of freedom
CONFIDENCE = 0.95
FORMULA = "log10 U_pt = log10 T - a log10 B - b log10 C"
SIZE_FORMULA = FORMULA + " + c log10 N_params"
# The law's two exponents: (coefficient, the emergence table's column, the symbol).
EXPONENTS = (("a", "batch_size", "B"), ("b", "context_size", "C"))
CELL = [column for _, column, _ in EXPONENTS]  # runs the law cannot tell apart
# The paper's law as published (arXiv 2511.16893v2, section 7): ln T = 13.26, a = 0.37,
# b = 0.62, fitted over B 4-512 and C 4-4096 (docs/method.md#the-published-law).
PUBLISHED = {
    "log10_T": 13.26 / math.log(10),
    "a": 0.37,
    "b": 0.62,
    "B": (4, 512),
    "C": (4, 4096),
    "source": "arXiv 2511.16893v2, section 7: ln T = 13.26, a = 0.37, b = 0.62",
}
# The fitted grid, recorded so that a prediction can say how far outside it a question lies.
GRID = {"batch_sizes": "batch_size", "context_sizes": "context_size", "n_params_values": "n_params"}


def fit_law(
    emergence: pd.DataFrame,
    n_boot: int,
    seed: int,
    model: str | None = None,
    exponents: dict | None = None,
) -> dict:
    """Fit the law to the emerged runs of an emergence table; see the module docstring.

    ``model`` (a model name, the table's ``model`` column) fits a, b and log10 T on that model's
    runs only, and the size test on every model's; None fits both on every run. ``exponents``
    (``{"a", "b", "source"}``) fixes a and b and fits log10 T alone; None fits all three."""
    every_model = emerged_runs(emergence)
    runs = every_model if model is None else every_model[every_model["model"] == model]
    runs = runs.reset_index(drop=True)
    result = _empty_result(runs, n_boot, seed)
    result.update(_left_out(emergence, every_model), model=model)
    result["n_other_models"] = len(every_model) - len(runs)
    if exponents is not None:
        result["exponents_source"] = exponents["source"]
    # The size test's own resamples, of every model's runs; a second stream of the same seed.
    size_resamples = np.random.default_rng([seed, 1]).integers(
        0, len(every_model), size=(n_boot, len(every_model))
    )
    problem = _design_problem(runs) if exponents is None else _fixed_problem(runs)
    if problem:
        result["reason"] = problem
        result.update(_size_test(every_model, size_resamples))
        return result

    y = np.log10(runs["updates_pt"].to_numpy(float))
    resamples = np.random.default_rng(seed).integers(0, len(y), size=(n_boot, len(y)))
    if exponents is None:
        result.update(_fit(runs, y, _design(runs), resamples, offset=np.zeros(len(y))))
    else:
        a, b = float(exponents["a"]), float(exponents["b"])
        offset = -a * np.log10(runs["batch_size"].to_numpy(float))
        offset -= b * np.log10(runs["context_size"].to_numpy(float))
        result.update(_fit(runs, y, np.ones((len(y), 1)), resamples, offset, fixed=(a, b)))
    if model is None:
        result.update(_size_test(runs, resamples))
    else:
        result.update(_size_test(every_model, size_resamples))
    return result


def _fit(runs, y, x, resamples, offset, fixed: tuple[float, float] | None = None) -> dict:
    """Least squares of ``y - offset`` on ``x`` (log10 T and a, b, or log10 T alone when the
    exponents are ``fixed``), with its bootstrap, leave-one-out and seed-noise fields."""
    target = y - offset
    coef = _ols(x, target)
    boot = _bootstrap(x, target, resamples)
    predicted = x @ coef + offset
    loo = [
        None if p is None else p + o for p, o in zip(_leave_one_out(x, target), offset, strict=True)
    ]
    loo_err = [p - o for p, o in zip(loo, y, strict=True) if p is not None]
    if fixed is not None:  # the draws carry the fixed exponents, so every law reads alike
        coef = np.array([coef[0], *fixed])
        boot = np.column_stack([boot[:, 0], np.tile(fixed, (len(boot), 1))])
    return {
        "ok": True,
        "reason": "",
        "log10_T": _num(coef[0]),
        "a": _num(coef[1]),
        "b": _num(coef[2]),
        "T": _num(10.0 ** coef[0]),
        "log10_T_ci": percentile_ci(boot[:, 0]),
        "a_ci": None if fixed else percentile_ci(boot[:, 1]),
        "b_ci": None if fixed else percentile_ci(boot[:, 2]),
        "n_boot_used": len(boot),
        "boot_draws": [[_num(v) for v in row] for row in boot],
        "r": _pearson(predicted, y),
        "residual_sd_log10": _num(np.sqrt(np.sum((y - predicted) ** 2) / (len(y) - x.shape[1]))),
        "loo_rmse_log10": _num(np.sqrt(np.mean(np.square(loo_err)))) if loo_err else None,
        "loo_n": len(loo_err),
        "loo": [
            {"run_id": str(rid), "observed_log10_updates": _num(o), "predicted_log10_updates": p}
            for rid, o, p in zip(runs["run_id"], y, loo, strict=True)
        ],
        **_seed_noise(runs, y, predicted, n_coef=x.shape[1]),
    }


def fixed_exponents(value) -> dict | None:
    """Config ``lawfit.exponents`` as ``fit_law``'s ``exponents``: None (fit them), "published",
    or ``{a, b}``."""
    if value is None:
        return None
    if value == "published":
        return {"a": PUBLISHED["a"], "b": PUBLISHED["b"], "source": "published"}
    return {"a": float(value["a"]), "b": float(value["b"]), "source": "config"}


def predict_updates(params: dict, B, C):
    """Predicted emergence point in updates, ``T / (B^a C^b)``, from a ``fit_law`` result.

    B and C may be scalars (a float comes back) or arrays (broadcast, an array comes back).
    """
    if not params.get("ok", True) or params.get("a") is None:
        raise ValueError(f"no fitted law to predict from: {params.get('reason', 'not fitted')}")
    return law_updates(params, B, C)


# --- helpers -------------------------------------------------------------------------------


def outcomes(emergence: pd.DataFrame) -> pd.Series:
    """Each run's ``outcome`` ("completed" where the column or the value is missing)."""
    if "outcome" not in emergence:
        return pd.Series("completed", index=emergence.index, dtype=object)
    return emergence["outcome"].where(emergence["outcome"].notna(), "completed").astype(str)


def emerged_runs(emergence: pd.DataFrame) -> pd.DataFrame:
    """The runs a fit can use: emerged, a finite positive updates_pt, not diverged."""
    u = pd.to_numeric(emergence["updates_pt"], errors="coerce")
    keep = emergence["emerged"].astype(bool) & np.isfinite(u) & (u > 0)
    keep &= outcomes(emergence) != "diverged"
    return emergence[keep].sort_values("run_id", kind="stable").reset_index(drop=True)


def _left_out(emergence: pd.DataFrame, runs: pd.DataFrame) -> dict:
    """The runs of the table that are not in the fit, by why: diverged, or not emerged."""
    diverged = outcomes(emergence) == "diverged"
    ids = sorted(str(r) for r in emergence.loc[diverged, "run_id"])
    return {
        "n_table_runs": len(emergence),
        "n_diverged": len(ids),
        "diverged_run_ids": ids,
        "n_not_emerged": len(emergence) - len(runs) - len(ids),
    }


def _empty_result(runs: pd.DataFrame, n_boot: int, seed: int) -> dict:
    """Every key the result can have, so consumers see one schema whether or not it fitted."""
    return {
        "ok": False,
        "reason": "",
        "formula": FORMULA,
        "n_runs": len(runs),
        "run_ids": [str(r) for r in runs["run_id"]],
        "metric": _single(runs, "metric"),
        "method": _single(runs, "method"),
        "data": sorted(str(d) for d in runs["data"].unique()) if "data" in runs else [],
        "confidence": CONFIDENCE,
        "n_boot": int(n_boot),
        "seed": int(seed),
        "n_boot_used": 0,
        **dict.fromkeys(["log10_T", "a", "b", "T", "log10_T_ci", "a_ci", "b_ci", "r"]),
        **dict.fromkeys(["residual_sd_log10", "loo_rmse_log10"]),
        "loo_n": 0,
        "loo": [],
        "n_cells": runs.groupby(CELL).ngroups if len(runs) else 0,
        **dict.fromkeys(["seed_sd_log10", "r_cells", "r_ceiling"]),
        **dict.fromkeys(["lack_of_fit_F", "lack_of_fit_df", "lack_of_fit_p", "seed_note"]),
        "model": None,
        "n_other_models": 0,
        "size_formula": SIZE_FORMULA,
        **dict.fromkeys(["c", "c_ci", "c_excludes_zero", "size_fit", "c_note"]),
        "c_n_boot_used": 0,
        "exponents_source": "fitted",
        "boot_draws": [],
        **{key: _distinct(runs, column) for key, column in GRID.items()},
        **dict.fromkeys(["size_boot_draws", "size_residual_sd_log10"]),
    }


def _distinct(runs: pd.DataFrame, column: str) -> list[int]:
    return sorted(int(v) for v in runs[column].unique()) if column in runs else []


def _single(runs: pd.DataFrame, column: str):
    values = runs[column].unique() if column in runs else []
    return str(values[0]) if len(values) == 1 else None


def _design_problem(runs: pd.DataFrame) -> str:
    if len(runs) < MIN_RUNS:
        return f"only {len(runs)} emerged runs; the law needs at least {MIN_RUNS}"
    for _, column, symbol in EXPONENTS:
        if runs[column].nunique() < 2:
            return f"{symbol} ({column}) does not vary among the emerged runs"
    if np.linalg.matrix_rank(_design(runs)) < 3:
        return "B and C vary together (collinear), so a and b cannot be separated"
    return ""


def _fixed_problem(runs: pd.DataFrame) -> str:
    if len(runs) < MIN_RUNS_FIXED:
        return (
            f"only {len(runs)} emerged runs; fitting log10 T with fixed exponents needs at "
            f"least {MIN_RUNS_FIXED}"
        )
    return ""


def _design(runs: pd.DataFrame, with_size: bool = False, terms=("a", "b")) -> np.ndarray:
    # Columns are signed so that the coefficients come out as (log10 T, a, b[, c]).
    cols = [np.ones(len(runs))]
    for term, column, _ in EXPONENTS:
        if term in terms:
            cols.append(-np.log10(runs[column].to_numpy(float)))
    if with_size:
        cols.append(np.log10(runs["n_params"].to_numpy(float)))
    return np.column_stack(cols)


def _ols(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(x, y, rcond=None)[0]


def _bootstrap(x: np.ndarray, y: np.ndarray, resamples: np.ndarray) -> np.ndarray:
    """Coefficients refitted on each resample of runs; rank-deficient resamples are dropped."""
    xb, yb = x[resamples], y[resamples]
    full = np.linalg.matrix_rank(xb) == x.shape[1]
    xb, yb = xb[full], yb[full]
    xtx = np.einsum("bnp,bnq->bpq", xb, xb)
    xty = np.einsum("bnp,bn->bp", xb, yb)
    return np.linalg.solve(xtx, xty[..., None])[..., 0]


def _leave_one_out(x: np.ndarray, y: np.ndarray) -> list[float | None]:
    predictions = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        if np.linalg.matrix_rank(x[keep]) < x.shape[1]:
            predictions.append(None)
        else:
            predictions.append(_num(x[i] @ _ols(x[keep], y[keep])))
    return predictions


def _seed_noise(runs: pd.DataFrame, y: np.ndarray, predicted: np.ndarray, n_coef: int = 3) -> dict:
    """How much of the scatter around the law (``n_coef`` fitted coefficients) is between runs
    of one (B, C) cell."""
    cell = runs.groupby(CELL).ngroup().to_numpy()
    n, n_cells = len(y), int(cell.max()) + 1
    out = {"n_cells": n_cells}
    if n_cells == n:
        return out | {"seed_note": "one emerged run per (B, C) cell: seed noise not separable"}
    cell_mean = np.bincount(cell, weights=y) / np.bincount(cell)
    ss_within = float(np.sum((y - cell_mean[cell]) ** 2))
    ss_total = float(np.sum((y - y.mean()) ** 2))
    predicted_cell = np.bincount(cell, weights=predicted) / np.bincount(cell)
    out.update(
        seed_sd_log10=_num(np.sqrt(ss_within / (n - n_cells))),
        r_ceiling=_num(np.sqrt(1 - ss_within / ss_total)) if ss_total > 0 else None,
        r_cells=_pearson(predicted_cell, cell_mean),
        seed_note=f"{n} runs in {n_cells} (B, C) cells",
    )
    df_lof, df_within = n_cells - n_coef, n - n_cells
    if df_lof < 1 or ss_within == 0:
        exact = f"only {n_cells} cells: the law fits their means exactly"
        why = exact if df_lof < 1 else "no seed noise"
        return out | {"seed_note": f"{out['seed_note']}; no lack-of-fit test ({why})"}
    ss_lack = max(float(np.sum((y - predicted) ** 2)) - ss_within, 0.0)
    f_stat = (ss_lack / df_lof) / (ss_within / df_within)
    from scipy import stats  # here: ihsweep.config imports this module in every job

    return out | {
        "lack_of_fit_F": _num(f_stat),
        "lack_of_fit_df": [df_lof, df_within],
        "lack_of_fit_p": _num(stats.f.sf(f_stat, df_lof, df_within)),
    }


def _size_test(runs: pd.DataFrame, resamples: np.ndarray) -> dict:
    sizes = runs["n_params"].nunique()
    y = np.log10(runs["updates_pt"].to_numpy(float))
    if sizes < 2:
        return {"c_note": f"{sizes} distinct n_params among emerged runs; need 2 to test size"}
    # A B or C shared by every run is a constant, not a term (one checkpoint suite's runs).
    terms = [t for t, column, _ in EXPONENTS if runs[column].nunique() > 1]
    x = _design(runs, with_size=True, terms=terms)
    if len(y) <= x.shape[1]:
        return {"c_note": f"{len(y)} emerged runs are too few for the {x.shape[1]}-term size model"}
    if np.linalg.matrix_rank(x) < x.shape[1]:
        return {"c_note": "n_params is collinear with B and C; its effect cannot be separated"}
    coef = _ols(x, y)
    boot = _bootstrap(x, y, resamples)
    ci = percentile_ci(boot[:, -1])
    fitted = dict(zip(["log10_T", *terms], (_num(v) for v in coef), strict=False))
    constant = [symbol for t, _, symbol in EXPONENTS if t not in terms]
    # Each draw as [log10_T, a, b, c], None for an exponent of a constant B or C.
    where = {name: i for i, name in enumerate(["log10_T", *terms, "c"])}
    draws = [[_num(row[where[k]]) if k in where else None for k in ("log10_T", "a", "b", "c")]
             for row in boot]  # fmt: skip
    residual = y - x @ coef
    return {
        "size_boot_draws": draws,
        "size_residual_sd_log10": _num(np.sqrt(residual @ residual / (len(y) - x.shape[1]))),
        "c": _num(coef[-1]),
        "c_ci": ci,
        "c_excludes_zero": None if ci is None else bool(ci[0] > 0 or ci[1] < 0),
        "c_n_boot_used": len(boot),
        "size_fit": {"log10_T": fitted["log10_T"], "a": fitted.get("a"), "b": fitted.get("b")},
        "c_note": f"{sizes} distinct n_params; c = 0 means no model-size effect"
        + (f" ({' and '.join(constant)} the same for every run)" if constant else ""),
    }


def percentile_ci(samples: np.ndarray) -> list[float] | None:
    """The ``CONFIDENCE`` percentile interval of bootstrap draws; None for fewer than two."""
    if len(samples) < 2:
        return None
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return [_num(lo), _num(hi)]


def _pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    if np.std(a) == 0 or np.std(b) == 0:
        return None
    return _num(np.corrcoef(a, b)[0, 1])


def _num(value) -> float | None:
    """A plain float for JSON, None for NaN or infinity."""
    value = float(value)
    return value if math.isfinite(value) else None


QUANTITIES = ("a", "b", "log10_T", "c", "r", "r_cells", "r_ceiling", "seed_sd_log10",
              "lack_of_fit_p", "loo_rmse_log10", "n_runs")  # fmt: skip


def fit_table(fit: dict) -> pd.DataFrame:
    """One row per fitted quantity: ``quantity, estimate, ci_low, ci_high`` (CI empty if none)."""
    rows = []
    for key in QUANTITIES:
        ci = fit.get(f"{key}_ci") or [None, None]
        rows.append({"quantity": key, "estimate": fit.get(key), "ci_low": ci[0], "ci_high": ci[1]})
    return pd.DataFrame(rows, columns=["quantity", "estimate", "ci_low", "ci_high"])
