"""Where in the (frequency, reliability) plane do induction heads form?
(docs/method.md#the-pareto-frontier).

Experiments 2 and 3 train one run per seed on Markov data generated with a requested frequency
``f = P(AB...A)`` and reliability ``r = P(B | AB...A)``. The input here is the per-run emergence
table (``ihsweep.analysis.emergence.emergence_table``) with two more columns, ``frequency`` and
``reliability``: the *requested* f and r of the run's dataset. Requested values, not measured
ones, because they are the grid coordinates shared by every seed of a cell; the measured values
are compared with them separately (``markov_figures.plot_generator_stats``).

Method choices (the paper publishes none of these):

- **One outcome per cell.** ``cell_outcomes`` pools the seeds of each (f, r) cell. A cell
  emerged when a strict majority of its runs emerged; a tie counts as *not* emerged, because a
  cell inside the emerging region is a claim that IHs typically form there, and half the seeds
  failing does not support that claim. With one seed per cell (as in the paper) this is just the
  run's outcome. ``n_emerged`` / ``n_runs`` keep the split visible. The cell's emergence point
  is the median ``tokens_pt`` (and ``updates_pt``) of its emerged runs only, NaN when none.

- **The frontier.** ``pareto_frontier`` returns the minimal emerging cells: those for which no
  other emerging cell has f' <= f and r' <= r (one strictly). Sorted by f, their r strictly
  decreases. Their upward closure (every point with f >= f_i and r >= r_i for some frontier
  cell i) is "the region where IHs form"; its boundary, drawn along cell edges, is the
  staircase polyline for plotting. Cell edges lie half-way between neighbouring grid values (the
  outermost edges half a gap beyond the outermost values), so the staircase separates cells, it
  does not pass through them.

- **Non-monotone grids.** An emerging cell may lie below-left of one that did not emerge (a
  stochastic failure, or a real non-monotonicity). We do not smooth this away: the frontier is
  still the set of minimal emerging cells (the least favourable statistics at which IHs were
  seen to form), so the staircase then encloses the non-emerging cell. ``Frontier.monotone`` is
  False and ``Frontier.violations`` lists every non-emerging cell inside the region, with how
  many emerging cells lie below-left of it. The figure outlines those cells.

- **Which axis matters more.** ``sensitivity`` fits a logistic regression of each run's
  outcome on f and r (binomial counts per cell, so seeds are used, not only the majority). Both
  inputs stay in probability units (only centred): f and r share that unit, so
  ``|b_r| / |b_f|`` is directly "how many units of f one unit of r is worth", and, unlike
  standardised coefficients, it does not depend on the range each axis happened to be swept
  over. Log axes were rejected because near-zero grid cells would dominate them. On a clean grid
  the outcomes are perfectly separable, the maximum-likelihood coefficients are infinite, and
  only their direction is meaningful; a small ridge penalty on the two slopes keeps them finite,
  and as the penalty goes to zero their direction tends to the maximum-margin separating line
  (Rosset, Zhu and Hastie 2004, JMLR 5:941), i.e. the straight line that best separates the two
  regions. Separability is checked exactly with a linear programme and reported. The measure is
  ``share_reliability`` = |b_r| / (|b_f| + |b_r|) (0.5 = equal), with a 95% interval from a
  bootstrap over runs (each run's outcome one observation; resamples without both outcomes or
  without spread in f or r are skipped and counted). The verdict is "reliability" (or
  "frequency") only when the whole interval lies above (below) 0.5, otherwise "undecided", the
  rule of the timing fit below, so both measures say how sure they are; "undetermined" when the
  data cannot say at all (every run had the same outcome, an axis has a single value, or f and
  r vary together, as on a diagonal of cells). A point estimate alone was the verdict until
  2026-12-05; on the cpu-full grid it named an axis that its interval does not support.

- **Which axis delays emergence more.** Outcomes are coarse: on a grid where most cells
  emerge, a yes/no fit rests on the few that did not. ``timing_sensitivity`` also uses *when*
  the emerged runs emerged: least squares of log10 tokens_pt on f and r (probability units),
  with a bootstrap over runs for the 95% interval of ``share_reliability``, and the same verdict
  rule. Runs that did not emerge are censored and left out (they would
  only make the slopes steeper), so it measures the emerging region.

- **Experiment 3.** ``property_table`` is the same per-cell pooling over the keys
  (dependency D, categoriality C, marginal, f, r), with a printable ``label``: the emergence
  point in tokens, or "none".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

CELL_KEYS = ("frequency", "reliability")
PROPERTY_KEYS = ("dependency", "categorial", "marginal", "frequency", "reliability")
MARGINAL_ORDER = ("uniform", "zipfian", "gaussian")
CELL_COLUMNS = [
    "n_runs", "n_emerged", "frac_emerged", "emerged", "tokens_pt", "updates_pt", "n_diverged",
]  # fmt: skip

RIDGE = 1e-3  # penalty on the two slopes (probability units); only matters under separation
N_BOOT = 1000  # bootstrap resamples behind each sensitivity interval


def cell_outcomes(emergence: pd.DataFrame, keys=CELL_KEYS) -> pd.DataFrame:
    """One row per cell of ``keys``: runs, emerged runs, majority outcome, median point.

    Columns: ``keys``, ``n_runs``, ``n_emerged``, ``frac_emerged``, ``emerged`` (strict
    majority; ties are not emerged), ``tokens_pt`` and ``updates_pt`` (medians over the cell's
    emerged runs, NaN when none), ``n_diverged``. Sorted by ``keys``. A diverged run (its
    ``outcome``) measured nothing, so it is no vote either way: ``n_runs`` counts the others,
    and a cell whose runs all diverged has ``frac_emerged`` NaN and does not emerge.
    """
    keys = list(keys)
    _require(emergence, keys + ["emerged", "tokens_pt", "updates_pt"], "emergence table")
    unset = [k for k in keys if emergence[k].isna().any()]
    if unset:
        raise ValueError(f"emergence table has runs without {unset}; every run needs its cell")
    rows = []
    for values, runs in emergence.groupby(keys, sort=True):
        diverged = (runs["outcome"] if "outcome" in runs else pd.Series("", runs.index)).eq(
            "diverged"
        )
        runs = runs[~diverged]
        emerged = runs["emerged"].astype(bool)
        n_runs, n_emerged = len(runs), int(emerged.sum())
        rows.append(
            dict(zip(keys, values, strict=True))
            | {
                "n_runs": n_runs,
                "n_emerged": n_emerged,
                "frac_emerged": n_emerged / n_runs if n_runs else math.nan,
                "emerged": 2 * n_emerged > n_runs,
                "tokens_pt": _median(runs.loc[emerged, "tokens_pt"]),
                "updates_pt": _median(runs.loc[emerged, "updates_pt"]),
                "n_diverged": int(diverged.sum()),
            }
        )
    table = pd.DataFrame(rows, columns=keys + CELL_COLUMNS)
    table["emerged"] = table["emerged"].astype(bool)
    return table


@dataclass(frozen=True)
class Frontier:
    """The lower-left boundary of the emerging region of an (f, r) grid.

    ``cells``: the minimal emerging cells (rows of the cell table), sorted by f, r decreasing.
    ``staircase``: polyline vertices (columns ``frequency``, ``reliability``, in cell-edge
    coordinates) from the top edge of the grid down and right to its right edge; empty when
    nothing emerged. ``monotone``: no non-emerging cell lies inside the region.
    ``violations``: the non-emerging cells inside it, with ``n_emerging_below``, the number of
    emerging cells below-left of each.
    """

    cells: pd.DataFrame
    staircase: pd.DataFrame
    monotone: bool
    violations: pd.DataFrame

    def summary(self) -> dict:
        """JSON-ready: frontier and violating cells as [f, r] pairs, and the staircase."""

        def pairs(table: pd.DataFrame) -> list:
            return [[float(f), float(r)] for f, r in zip(*_fr(table), strict=True)]

        return {
            "frontier": pairs(self.cells),
            "staircase": pairs(self.staircase),
            "monotone": bool(self.monotone),
            "violations": pairs(self.violations),
        }


def pareto_frontier(cells: pd.DataFrame) -> Frontier:
    """Minimal emerging cells, the staircase around their region, and monotonicity violations."""
    _require(cells, list(CELL_KEYS) + ["emerged"], "cell table")
    emerged = cells["emerged"].astype(bool).to_numpy()
    f, r = _fr(cells)
    up, down = emerged, ~emerged
    # below_left[i, j]: cell j has f_j <= f_i and r_j <= r_i, one of them strictly.
    weak = (f[None, :] <= f[:, None]) & (r[None, :] <= r[:, None])
    below_left = weak & ((f[None, :] < f[:, None]) | (r[None, :] < r[:, None]))
    dominated = (below_left & up[None, :]).any(axis=1)
    frontier = cells[up & ~dominated].sort_values(list(CELL_KEYS), kind="stable")
    n_below = (below_left & up[None, :]).sum(axis=1)
    violations = cells[down & (n_below > 0)].assign(n_emerging_below=n_below[down & (n_below > 0)])
    return Frontier(
        cells=frontier.reset_index(drop=True),
        staircase=_staircase(frontier, grid_edges(f), grid_edges(r)),
        monotone=not len(violations),
        violations=violations.reset_index(drop=True),
    )


def grid_edges(values) -> np.ndarray:
    """Cell edges of a 1-D grid: midpoints between sorted unique values, half a gap outside.

    A single value gets edges +-0.05 (half the 0.1 spacing of a typical f, r grid).
    """
    v = np.unique(np.asarray(values, dtype=float))
    if len(v) == 0:
        return v
    if len(v) == 1:
        return np.array([v[0] - 0.05, v[0] + 0.05])
    mids = (v[1:] + v[:-1]) / 2
    return np.concatenate([[v[0] - (v[1] - v[0]) / 2], mids, [v[-1] + (v[-1] - v[-2]) / 2]])


def sensitivity(
    cells: pd.DataFrame, ridge: float = RIDGE, n_boot: int = N_BOOT, seed: int = 0
) -> dict:
    """Is emergence more sensitive to reliability or to frequency? (See the module docstring.)

    Returns a JSON-ready dict: ``verdict`` ("reliability", "frequency", "undecided" or
    "undetermined"), ``reason`` (one line), ``method``, the fitted ``coef_frequency``,
    ``coef_reliability`` (per unit of probability) and ``intercept`` (at the run-weighted mean
    f, r), ``ratio_r_to_f`` = |b_r| / |b_f| (None when b_f = 0), ``share_reliability`` =
    |b_r| / (|b_f| + |b_r|) (0.5 = equal; always finite) with its 95% bootstrap interval
    ``share_reliability_ci``, ``r_per_f`` = b_f / b_r (how much r must rise to make up for a
    unit fall in f on the fitted 50% line; None when b_r = 0), ``separable``, ``ridge``,
    ``n_runs``, ``n_cells``, ``n_boot``, ``n_boot_used``, ``seed``.
    """
    _require(cells, list(CELL_KEYS) + ["n_runs", "n_emerged"], "cell table")
    f, r = _fr(cells)
    trials = cells["n_runs"].to_numpy(dtype=float)
    successes = cells["n_emerged"].to_numpy(dtype=float)
    result = {
        "method": "ridge-penalised logistic regression of each run's outcome on f and r"
        " (probability units, centred); bootstrap over runs",
        "ridge": ridge,
        "n_runs": int(trials.sum()),
        "n_cells": len(cells),
        "n_boot": int(n_boot),
        "seed": int(seed),
    }
    degenerate = _degenerate_reason(f, r, trials, successes)
    if degenerate:
        return result | _no_fit(degenerate)
    # One row per run (a cell's seeds become its emerged and not-emerged runs), centred:
    # centring decouples intercept and slopes, and the slopes do not depend on it.
    counts = trials.astype(int)
    x = np.repeat(np.column_stack([f, r]), counts, axis=0)
    x = x - x.mean(axis=0)
    y = np.concatenate([np.r_[np.ones(int(s)), np.zeros(n - int(s))]
                        for s, n in zip(successes, counts, strict=True)])  # fmt: skip
    # A resample is how often it drew each run; row 0 of the weights is the data itself.
    draws = np.random.default_rng(seed).integers(0, len(y), size=(n_boot, len(y)))
    weights = np.vstack([np.ones(len(y))] + [np.bincount(d, minlength=len(y)) for d in draws])
    usable = [not _degenerate_reason(*x[w > 0].T, w[w > 0], (y * w)[w > 0]) for w in weights[1:]]
    coef = _ridge_logistic(x, y, weights[np.r_[True, usable]], ridge)
    intercept, b_f, b_r = coef[0]
    # On a grid symmetric in one axis that slope is 0 up to rounding; make it exactly 0.
    scale = max(abs(b_f), abs(b_r))
    b_f, b_r = (0.0 if abs(b) < 1e-9 * scale else float(b) for b in (b_f, b_r))
    share = _share(b_f, b_r)
    shares = np.array([_share(b[1], b[2]) for b in coef[1:]])
    ci = [float(v) for v in np.percentile(shares, [2.5, 97.5])] if len(shares) else None
    separable = _separable(x, y, np.ones(len(y)))
    return result | {
        "verdict": _interval_verdict(ci),
        "reason": _reason(b_f, b_r, share, ci, separable, len(y), f"{len(shares)} of {n_boot}"),
        "coef_frequency": b_f,
        "coef_reliability": b_r,
        "intercept": float(intercept),
        "ratio_r_to_f": abs(b_r) / abs(b_f) if b_f != 0 else None,
        "share_reliability": share,
        "share_reliability_ci": ci,
        "r_per_f": b_f / b_r if b_r != 0 else None,
        "separable": separable,
        "n_boot_used": len(shares),
    }


def _interval_verdict(ci: list | None) -> str:
    """Name an axis only when the whole 95% interval of its share lies on its side of 0.5."""
    if ci is None:
        return "undecided"
    if ci[0] > 0.5:
        return "reliability"
    if ci[1] < 0.5:
        return "frequency"
    return "undecided"


def timing_sensitivity(runs: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """Does emergence come later as f or as r falls, and which more? (See the module docstring.)

    ``runs``: one setting's per-run table (``frequency``, ``reliability``, ``emerged``,
    ``tokens_pt``). Returns a JSON-ready dict: ``verdict`` ("reliability", "frequency",
    "undecided" or "undetermined": too few emerged runs or an axis without spread),
    ``reason``, ``method``, the slopes ``coef_frequency`` and ``coef_reliability`` (decades of
    tokens per unit of probability; negative: more of it, earlier), their 95% bootstrap
    intervals ``*_ci``, ``share_reliability`` with ``share_reliability_ci``, ``n_runs``,
    ``n_boot_used``.
    """
    _require(runs, [*CELL_KEYS, "emerged", "tokens_pt"], "run table")
    tokens = pd.to_numeric(runs["tokens_pt"], errors="coerce").to_numpy(float)
    keep = runs["emerged"].astype(bool).to_numpy() & np.isfinite(tokens) & (tokens > 0)
    f, r = _fr(runs[keep])
    y = np.log10(tokens[keep])
    result = {
        "method": "least squares of log10 tokens_pt on f and r over the emerged runs;"
        " bootstrap over runs",
        "n_runs": int(keep.sum()),
        "n_boot": int(n_boot),
        "seed": int(seed),
    }
    x = np.column_stack([np.ones(len(y)), f, r])
    if len(y) < 4 or np.linalg.matrix_rank(x) < 3:
        return result | {
            "verdict": "undetermined",
            "reason": f"{len(y)} emerged runs without spread in both f and r; the timing fit"
            " needs at least 4 that vary in both",
            **dict.fromkeys(["coef_frequency", "coef_reliability", "share_reliability"]),
            **dict.fromkeys(["coef_frequency_ci", "coef_reliability_ci", "share_reliability_ci"]),
            "n_boot_used": 0,
        }
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    draws = np.random.default_rng(seed).integers(0, len(y), size=(n_boot, len(y)))
    boot = np.array([np.linalg.lstsq(x[d], y[d], rcond=None)[0]
                     for d in draws if np.linalg.matrix_rank(x[d]) == 3])  # fmt: skip
    share = _share(coef[1], coef[2])
    shares = np.array([_share(b[1], b[2]) for b in boot])
    ci = [float(v) for v in np.percentile(shares, [2.5, 97.5])]
    return result | {
        "verdict": _interval_verdict(ci),
        "reason": f"share of reliability |b_r| / (|b_f| + |b_r|) = {share:.2f}"
        f" [{ci[0]:.2f}, {ci[1]:.2f}] in a fit of log10 tokens at emergence on f and r"
        f" ({len(y)} emerged runs; 0.5 = equal)",
        "coef_frequency": float(coef[1]),
        "coef_reliability": float(coef[2]),
        "share_reliability": share,
        "coef_frequency_ci": [float(v) for v in np.percentile(boot[:, 1], [2.5, 97.5])],
        "coef_reliability_ci": [float(v) for v in np.percentile(boot[:, 2], [2.5, 97.5])],
        "share_reliability_ci": ci,
        "n_boot_used": len(boot),
    }


def _share(b_f: float, b_r: float) -> float:
    total = abs(b_f) + abs(b_r)
    return float(abs(b_r) / total) if total > 0 else 0.5


def property_table(emergence: pd.DataFrame) -> pd.DataFrame:
    """Experiment 3: one row per (dependency, categorial, marginal, f, r) cell.

    Columns as ``cell_outcomes`` plus ``label``: the cell's emergence point in tokens
    (``format_tokens``), or "none" when the cell did not emerge. Sorted +D before -D, +C before
    -C, marginals uniform, Zipfian, Gaussian (others after, alphabetically), then f and r.
    """
    for key in ("dependency", "categorial"):
        if key in emergence and not emergence[key].isin([True, False]).all():
            raise ValueError(f"{key} must be boolean, got {sorted(emergence[key].unique())}")
    table = cell_outcomes(emergence, keys=PROPERTY_KEYS)
    table["dependency"] = table["dependency"].astype(bool)
    table["categorial"] = table["categorial"].astype(bool)
    table["label"] = [
        format_tokens(t) if e else "none"
        for e, t in zip(table["emerged"], table["tokens_pt"], strict=True)
    ]
    order = pd.DataFrame(
        {
            "d": ~table["dependency"],
            "c": ~table["categorial"],
            "m": [marginal_rank(m) for m in table["marginal"]],
        }
    )
    sort_keys = ["d", "c", "m", "marginal", "frequency", "reliability"]
    index = (
        pd.concat([order, table[["marginal", *CELL_KEYS]]], axis=1)
        .sort_values(sort_keys, kind="stable")
        .index
    )
    return table.loc[index].reset_index(drop=True)


def marginal_rank(name: str) -> int:
    """Position of a marginal in the display order (unknown names last)."""
    name = str(name).lower()
    return MARGINAL_ORDER.index(name) if name in MARGINAL_ORDER else len(MARGINAL_ORDER)


def format_tokens(tokens: float, digits: int = 2) -> str:
    """Token count to ``digits`` significant figures with a k / M / B suffix: 1234567 -> "1.2M"."""
    if not np.isfinite(tokens):
        return "none"
    rounded = float(f"{tokens:.{digits}g}")  # round first: 999,999 reads "1M", not "1e+03k"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if rounded >= scale:
            return f"{rounded / scale:g}{suffix}"
    return f"{rounded:g}"


# --- helpers -------------------------------------------------------------------------------


def _require(table: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}")


def _median(values: pd.Series) -> float:
    return float(values.median()) if len(values) else math.nan


def _fr(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return (
        table["frequency"].to_numpy(dtype=float),
        table["reliability"].to_numpy(dtype=float),
    )


def _staircase(frontier: pd.DataFrame, f_edges: np.ndarray, r_edges: np.ndarray) -> pd.DataFrame:
    """Boundary of the frontier's upward closure, along the lower-left edges of its cells."""
    if not len(frontier):
        return pd.DataFrame({"frequency": [], "reliability": []})
    f, r = _fr(frontier)
    # The lower edge of a value's cell is the largest edge strictly below the value.
    f_low = f_edges[np.searchsorted(f_edges, f) - 1]
    r_low = r_edges[np.searchsorted(r_edges, r) - 1]
    xs, ys = [f_low[0]], [r_edges[-1]]
    for i in range(len(f)):
        xs += [f_low[i], f_edges[-1] if i == len(f) - 1 else f_low[i + 1]]
        ys += [r_low[i], r_low[i]]
    return pd.DataFrame({"frequency": xs, "reliability": ys})


def _degenerate_reason(f, r, trials, successes) -> str:
    if trials.sum() == 0:
        return "no runs"
    if successes.sum() == 0:
        return "no run emerged"
    if successes.sum() == trials.sum():
        return "every run emerged"
    for name, values in (("frequency", f), ("reliability", r)):
        if len(np.unique(values[trials > 0])) < 2:
            return f"a single {name} value, so its effect cannot be estimated"
    used = np.column_stack([f, r])[trials > 0]
    if np.linalg.matrix_rank(used - used.mean(axis=0)) < 2:
        return "f and r vary together over these cells, so their effects cannot be separated"
    return ""


def _no_fit(reason: str) -> dict:
    return {
        "verdict": "undetermined",
        "reason": reason,
        "coef_frequency": None,
        "coef_reliability": None,
        "intercept": None,
        "ratio_r_to_f": None,
        "share_reliability": None,
        "share_reliability_ci": None,
        "r_per_f": None,
        "separable": None,
        "n_boot_used": 0,
    }


def _ridge_logistic(x, y, weights, ridge, tol=1e-9, max_iter=500) -> np.ndarray:
    """Logistic regression of outcomes ``y`` (0 or 1) on ``x``, L2 penalty on the slopes only,
    once per row of ``weights`` (how often each observation counts), by damped Newton steps
    taken for every row at once; returns (intercept, slopes...) per row. The objective is
    convex, so where its gradient vanishes (below ``tol``, or where the steps stop moving) is
    the optimum."""
    design = np.column_stack([np.ones(len(x)), x])
    penalty = np.r_[0.0, np.full(x.shape[1], ridge)]
    weights = np.asarray(weights, dtype=float)

    def objective(beta, w):
        eta = beta @ design.T
        loss = (w * (np.logaddexp(0.0, eta) - y * eta)).sum(axis=1)
        return loss + 0.5 * (penalty * beta**2).sum(axis=1)

    beta = np.zeros((len(weights), design.shape[1]))
    active = np.arange(len(weights))  # rows whose gradient is not yet below tol
    for _ in range(max_iter):
        b, w = beta[active], weights[active]
        p = _expit(b @ design.T)
        gradient = (w * (p - y)) @ design + penalty * b
        moving = np.abs(gradient).max(axis=1) >= tol
        active, b, w, p, gradient = (v[moving] for v in (active, b, w, p, gradient))
        if not len(active):
            break
        hessian = np.einsum("bi,ij,ik->bjk", w * p * (1 - p), design, design) + np.diag(penalty)
        # Separated outcomes leave the intercept direction almost flat; the jitter keeps the
        # solve finite and shapes the step only: the optimum is still where the gradient is 0.
        hessian += 1e-12 * np.eye(design.shape[1])
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        current, size = objective(b, w), np.ones(len(b))
        worse = np.ones(len(b), dtype=bool)
        for _ in range(40):  # halve each row's step until it does not raise that row's objective
            trial = b[worse] - size[worse, None] * step[worse]
            worse[worse] = objective(trial, w[worse]) > current[worse]
            if not worse.any():
                break
            size[worse] /= 2
        # A row no step can improve, or that no longer moves, is at its optimum up to rounding
        # (with separated outcomes the gradient stalls near 1e-8 there).
        change = size[:, None] * step
        beta[active[~worse]] = b[~worse] - change[~worse]
        still = np.abs(change).max(axis=1) > 1e-12 * (1 + np.abs(b).max(axis=1))
        active = active[~worse & still]
    return beta


def _expit(eta: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * eta))  # overflow-free logistic


def _separable(x, successes, trials) -> bool:
    """Is there a line with every emerged run strictly on one side and the rest on the other?"""
    pos, neg = x[successes > 0], x[trials - successes > 0]
    # Find (w, c) with w.x - c >= 1 on emerged points and <= -1 on the others; feasible or not.
    a_ub = np.vstack(
        [
            np.column_stack([-pos, np.ones(len(pos))]),
            np.column_stack([neg, -np.ones(len(neg))]),
        ]
    )
    from scipy import optimize

    lp = optimize.linprog(
        np.zeros(3),
        A_ub=a_ub,
        b_ub=-np.ones(len(a_ub)),
        bounds=[(None, None)] * 3,
        method="highs",
    )
    return lp.status == 0


def _reason(b_f, b_r, share, ci, separable, n_runs, resamples) -> str:
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else " (no usable resample)"
    ratio = f"{abs(b_r) / abs(b_f):.3g}" if b_f != 0 else "inf"
    text = (
        f"share of reliability |b_r| / (|b_f| + |b_r|) = {share:.2f}{interval} in a logistic"
        f" fit of each run's outcome on f and r (|b_r| / |b_f| = {ratio}; {n_runs} runs,"
        f" {resamples} resamples usable; 0.5 = equal)"
    )
    if separable:
        text += "; outcomes perfectly separable, so only the direction of the ridge fit counts"
    if b_f < 0 or b_r < 0:
        text += "; note a negative slope: emergence falls as that knob rises"
    return text
