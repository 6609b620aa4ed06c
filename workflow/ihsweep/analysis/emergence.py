"""When do induction heads emerge in one run? (docs/method.md#the-emergence-rule).

Input is one run's checkpoint series: ``tokens`` (tokens seen at each checkpoint, > 0, strictly
ascending) and ``values``, one probe metric at each checkpoint: the max-over-heads
prefix-matching score ``ps_max``, the max-over-heads logit attribution ``la_max``, or the
model-level associative-recall accuracy ``ar_acc``. All three sit near 0 before induction heads
exist and rise towards 1 when they form. Everything is fitted against x = log10(tokens), because
the transition is sharp on a log-token axis and the checkpoint schedule is roughly log-spaced.

The output is one emergence point in tokens with an interval, or a statement that no transition
happened within the budget. The paper publishes no such rule; we offer three, chosen in config
(``emergence.method``): two fits of one rise (``breakpoint``, ``sigmoid``) and a model-free
level crossing (``crossing``).

``breakpoint``: a continuous piecewise-linear "ramp",

    y = lo + s * (clip(x, x1, x2) - x1),   s > 0,  x1 < x2,

i.e. a flat baseline up to x1, a straight rise from x1 to x2, flat again after x2. When x2 sits
at the last checkpoint this is the "plateau then rise" model of a metric that has not
saturated yet. For fixed (x1, x2) it is a simple linear regression, so both breakpoints are
searched exhaustively on a fine grid of log-tokens (``GRID_POINTS`` points from the first to
the last checkpoint, so a breakpoint can fall between checkpoints). The emergence point is x1,
where the rise starts. Why this model rather than one two-segment hinge: the metric is flat,
rises, then saturates, and a single hinge fitted to that shape lands part-way up the rise; a
free pre-break slope, on the other hand, leaves the onset unidentified whenever the metric
climbs from the first checkpoint on.
Uncertainty: the profile-likelihood (F-test) set for x1 (Hudson 1966, JASA 61:1097). For each
grid x1, SSE(x1) is the best residual sum of squares over x2; the set is every x1 with
``SSE(x1) <= SSE_min * (1 + F_0.95(1, n - 4) / (n - 4))`` (4 fitted parameters: lo, s, x1, x2),
and [lo, hi] is its hull (the set need not be connected). Change points are not regular
parameters, so the 95% is approximate. A jump between two checkpoints is only located to
within that gap, and the set then spans the gap, which is the honest answer. When several x1
tie for the minimum (a step inside one gap), the point is the middle of the tied ones. On
synthetic ramps with noise sd 0.02 the set covered the true onset in 85-98% of noise draws.

``sigmoid``: ``y = lo + (hi - lo) / (1 + exp(-k (x - x0)))`` fitted by
``scipy.optimize.curve_fit`` (bounded trust-region, several starting midpoints and slopes, the
best SSE kept). The point is x0, the steepest rise (the midpoint). Uncertainty: x0 +- 1.96 sd
from the fit's covariance, clipped to the observed range. When the covariance is not finite, or
the fitted rise (10-90% width 2 ln 9 / k) is narrower than the checkpoint gap around x0, no
checkpoint lies on the slope, x0 is only known to be inside that gap, and the interval is the
gap between the checkpoints either side of x0. On synthetic logistic curves with noise sd 0.02
the interval covered the true midpoint in 90-98% of noise draws.

``crossing`` (default): where the 3-checkpoint running median first holds ``min_rise`` above its
lowest value so far, and keeps it to the end of the series: the first checkpoint at which the
model-free rise (``sustained_rise``, below) reaches ``min_rise``. The level baseline + min_rise is
crossed between that running median and the one before it; the point interpolates the crossing
linearly in log tokens and the interval is the gap between the two. So a run emerges under this
rule exactly when its rise reaches min_rise (no fit can fail), and the point is where it got there.
On a noise-free ramp the point is exact, and a step under noise is bracketed by its checkpoint gap
(tests). Why a third rule: it fits nothing, so no fit can fail, and where a series rises in two
steps it dates the first, where both fits follow the larger. (Such two-step rises of max PS on our
text turned out to be a layer-0 head looking back by position, then, later or never, the induction
head; ``probe.min_layer`` leaves layer 0 out, ``ihsweep.probing.scores``.) Its interval is the
checkpoint gap, which understates the uncertainty of a slow rise, where noise can move the crossing
by more than one gap. The running median delays nothing on a monotone step and ignores a
one-checkpoint spike. Like the fits, it needs a baseline seen before the rise: at least
``MIN_BEFORE`` running medians below the level (three checkpoints before the point); the two
checkpoints after it hold by construction.

The fitted points measure different things: the onset comes before the midpoint by about half the
transition's width in log-tokens. Fitted law exponents are unchanged by that offset only when it
is the same for every run, so compare laws within one method. Caveat, measured on synthetic
curves with the default schedule (doubling to 1M tokens, then every 250k): on smooth
sigmoid-shaped curves the ramp's onset depends on where the checkpoints fall (0.07 to 0.3
decades before the midpoint, further where checkpoints are sparse). Runs with small B * C
emerge in the sparse early part of the schedule, so this pulled the fitted exponent a down
(0.26-0.29 for a true 0.37; b 0.57 for 0.62), while the sigmoid midpoint was unbiased. On
ramp-shaped curves both methods were unbiased.

No transition within the budget: ``emerged`` is False, the point fields are NaN and ``reason``
says which rule fired, checked in this order:

1. fewer than ``MIN_CHECKPOINTS`` checkpoints with a finite metric;
2. ``rise < min_rise``. The rise is model-free and the same for both methods: the largest
   sustained increase of the running median over 3 checkpoints, i.e. the largest step from the
   lowest value up to some checkpoint to the lowest value from there to the end (``sustained_
   rise``). The 3-point median ignores a one-checkpoint spike, so a metric that jumps only at
   the very last checkpoint does not count as a transition (our decision: one point cannot tell
   a transition from noise, and the onset could not be bracketed); a rise that decays again
   counts only for the part it keeps until the end of the budget (induction heads, once formed,
   persist);
3. the fit fails (for the sigmoid: the fitted curve does not rise; for the crossing: fewer than
   ``MIN_BEFORE`` running medians lie before it, reported as a transition at the start);
4. fewer than ``MIN_BEFORE`` checkpoints lie at or before the point: with one checkpoint
   before it, the "baseline" may already be on the rise, so the onset is not observed
   (left-censored; the ramp can always put x1 just after the first checkpoint);
5. fewer than ``MIN_AFTER`` checkpoints lie after the point, which includes a point at or after
   the last checkpoint: the transition is not confirmed within the budget.

So a transition needs two checkpoints on each side of its point. A metric that starts rising
only at the very last checkpoint gives ``emerged = False`` (rule 2, and rule 5 if the rise were
large enough); one that rises over the last two checkpoints gives a point between the third-
and second-to-last checkpoints. A sigmoid whose midpoint lies beyond the budget is "not
emerged" even when its early rise is visible; the breakpoint method then reports the onset,
which did happen within the budget.

Updates are tokens / (B * C) (docs/method.md#the-model-and-training-runs); ``emergence_table``
reports both.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

# scipy is imported inside the fitted rules that use it: importing scipy.stats and
# scipy.optimize takes ~0.8 s, and every training, probe and figure job imports this module for
# the default `crossing` rule, which needs neither (bench/step_startup.py).

METHODS = ("breakpoint", "sigmoid", "crossing")

MIN_CHECKPOINTS = 7  # the ramp has 4 parameters; leave at least 3 residual degrees of freedom
MIN_BEFORE = 2  # checkpoints at or before the point needed to establish the baseline
MIN_AFTER = 2  # checkpoints after the point needed to confirm a transition
GRID_POINTS = 401  # breakpoint grid over [x_first, x_last]: ~0.005 decades on our schedules
CONFIDENCE = 0.95

# Columns of the per-run table, in output order.
RUN_KEYS = ["run_id", "data", "model", "n_params", "batch_size", "context_size", "seed"]
TABLE_COLUMNS = RUN_KEYS + [
    "metric",
    "method",
    "emerged",
    "tokens_pt",
    "tokens_lo",
    "tokens_hi",
    "updates_pt",
    "updates_lo",
    "updates_hi",
    "rise",
    "reason",
    "outcome",
    "outcome_detail",
    "tokens_trained",
    "budget",
    "predicted_tokens",
    "predicted_within",
]
# How a run's training ended (run.json ``outcome``): trained to its budget, stopped once its
# emergence was confirmed (``training.stop_after_emergence``), or diverged.
OUTCOMES = ("completed", "stopped_early", "diverged")


def detect(tokens, values, method: str, min_rise: float) -> dict:
    """Emergence point of one run's metric series (see the module docstring for the rules).

    Returns a dict with ``emerged`` (bool), ``tokens_pt``, ``tokens_lo``, ``tokens_hi``
    (tokens; NaN when not emerged), ``method``, ``rise`` (the model-free rise, metric units)
    and ``reason`` ("" when emerged). Checkpoints whose metric is not finite are dropped.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    x, y = _prepare(tokens, values)
    if len(x) < MIN_CHECKPOINTS:
        return _no_transition(
            method,
            math.nan,
            f"only {len(x)} checkpoints with a finite metric (need {MIN_CHECKPOINTS})",
        )
    rise = sustained_rise(y)
    if not rise >= min_rise:
        return _no_transition(method, rise, _small_rise_reason(y, rise, min_rise))
    if method == "breakpoint":
        fit = _fit_ramp(x, y)
    elif method == "sigmoid":
        fit = _fit_sigmoid(x, y)
    else:
        fit = _first_crossing(x, y, min_rise)
    if fit.get("failed"):
        return _no_transition(method, rise, fit["failed"])
    point = fit["x"]
    n_before = int(np.sum(x <= point))
    if n_before < MIN_BEFORE:
        return _no_transition(
            method,
            rise,
            f"transition at the start of the budget: {n_before} checkpoint(s) at or before"
            f" the point (need {MIN_BEFORE}); its onset is not observed",
        )
    n_after = int(np.sum(x > point))
    if n_after < MIN_AFTER:
        return _no_transition(
            method,
            rise,
            f"transition at the end of the budget: {n_after} checkpoint(s) after the point"
            f" (need {MIN_AFTER})",
        )
    return {
        "emerged": True,
        "tokens_pt": float(10.0**point),
        "tokens_lo": float(10.0 ** fit["lo"]),
        "tokens_hi": float(10.0 ** fit["hi"]),
        "method": method,
        "rise": float(rise),
        "reason": "",
    }


def sustained_rise(values) -> float:
    """Largest increase of the 3-checkpoint running median that holds to the end of the budget.

    For each checkpoint t: the lowest running median from t on minus the lowest up to t; the
    maximum over t. A single-checkpoint spike, including one at either end of the series, moves
    no 3-point median, so it cannot make a rise on its own; a bump that decays again (seen on
    i.i.d. Markov data: the score rose by 0.07 for three checkpoints, then fell back to chance)
    counts only for what it keeps.
    """
    y = np.asarray(values, dtype=float)
    if len(y) < 3:
        return math.nan
    return float(np.max(_held_gains(y)[2]))


def _held_gains(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running median of checkpoints i - 1, i, i + 1 (i = 1 .. n - 2), its lowest value up
    to each i, and how far its lowest value from i to the end lies above that: the rise held
    from i on, whose maximum is ``sustained_rise`` and whose first reach of min_rise is the
    crossing."""
    med = np.median(np.lib.stride_tricks.sliding_window_view(y, 3), axis=1)
    low_before = np.minimum.accumulate(med)
    low_after = np.minimum.accumulate(med[::-1])[::-1]
    return med, low_before, low_after - low_before


def run_point(run: pd.DataFrame, spec: dict) -> dict:
    """``detect`` on one run's model-level probe table with the study's ``emergence`` block
    (``metric``, ``method``, ``min_rise``). Checkpoints with tokens <= 0 (an initialisation
    checkpoint) are dropped, since the fit is on log tokens. The one path from a run's table
    to its point: the aggregate tables and the per-run figure agree by construction."""
    run = run[run["tokens"] > 0].sort_values("tokens")
    return detect(run["tokens"], run[spec["metric"]], spec["method"], spec["min_rise"])


def confirmed_emergence(run: pd.DataFrame, spec: dict, margin_decades: float) -> str | None:
    """Why a run may stop training now, or None: the early-stopping rule of
    ``training.stop_after_emergence``, on one run's model-level table so far.

    Emergence is confirmed when ``run_point`` reports a transition on the series up to the last
    checkpoint and on the series without it (the point holds when one more checkpoint comes in),
    and the last checkpoint lies ``margin_decades`` of log tokens past the upper end of both
    intervals. A pure function of the checkpoints so far, so a resumed run decides the same at
    the same step."""
    run = run[run["tokens"] > 0].sort_values("tokens")
    if len(run) < 2:
        return None
    points = [run_point(run, spec), run_point(run.iloc[:-1], spec)]
    if not all(p["emerged"] for p in points):
        return None
    tokens, upper = float(run["tokens"].iat[-1]), max(p["tokens_hi"] for p in points)
    if math.log10(tokens) < math.log10(upper) + margin_decades:
        return None
    p = points[0]
    return (
        f"emergence confirmed: {spec['metric']} {spec['method']} point {p['tokens_pt']:.4g} tokens"
        f" [{p['tokens_lo']:.4g}, {p['tokens_hi']:.4g}] at two checkpoints in a row; stopped at"
        f" {tokens:.4g} tokens, {margin_decades:g} decades or more past {upper:.4g}"
    )


def replay_stop(run: pd.DataFrame, spec: dict, margin_decades: float) -> dict:
    """Where ``confirmed_emergence`` with this margin stops a run, checked at each checkpoint in
    turn as training checks it, and the point ``run_point`` reports on the series up to there.

    Exact for any margin on a run trained to its budget, and for margins up to its own on a run
    stopped early (a stopped run is the exact prefix of the full run; past its stop the series
    is unknown). Returns ``run_point``'s dict plus ``stopped`` (whether the rule stops the run
    before its last checkpoint's series ends) and ``tokens_trained`` (the checkpoint it stops
    at, else the last one)."""
    run = run[run["tokens"] > 0].sort_values("tokens")
    for end in range(2, len(run) + 1):
        if confirmed_emergence(run.iloc[:end], spec, margin_decades):
            prefix = run.iloc[:end]
            return {
                **run_point(prefix, spec),
                "stopped": True,
                "tokens_trained": float(prefix["tokens"].iat[-1]),
            }
    return {
        **run_point(run, spec),
        "stopped": False,
        "tokens_trained": float(run["tokens"].iat[-1]),
    }


def predicted_within(emerged, predicted, lo, hi) -> bool | None:
    """Whether an emerged run's predicted point lies inside its observed interval [lo, hi];
    None when the run did not emerge, or has no prediction or no interval."""
    values = (predicted, lo, hi)
    if emerged is not True or any(v is None or pd.isna(v) for v in values):
        return None
    return bool(lo <= predicted <= hi)


def emergence_table(model_table: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """One row per run: the emergence point (``run_point``) in tokens and in updates.

    ``model_table`` is the concatenation of per-run model-level probe tables (one row per
    checkpoint per run); ``spec`` is the study's ``emergence`` block.
    """
    metric, method = spec["metric"], spec["method"]
    missing = [c for c in RUN_KEYS + ["tokens", metric] if c not in model_table.columns]
    if missing:
        raise ValueError(f"model table lacks columns {missing}")
    rows = []
    for run_id, whole in model_table.groupby("run_id", sort=True):
        run = whole[whole["tokens"] > 0]
        first = (run if len(run) else whole).iloc[0]
        outcome = _run_outcome(first)
        if outcome["outcome"] == "diverged":  # listed as such, never fitted around
            result = _no_transition(method, math.nan, f"diverged: {outcome['outcome_detail']}")
        else:
            result = run_point(whole, spec)
        row = {key: first[key] for key in RUN_KEYS}
        row["run_id"] = run_id
        tokens_per_update = float(first["batch_size"]) * float(first["context_size"])
        row.update(metric=metric, method=method, emerged=result["emerged"])
        for end in ("pt", "lo", "hi"):
            row[f"tokens_{end}"] = result[f"tokens_{end}"]
            row[f"updates_{end}"] = result[f"tokens_{end}"] / tokens_per_update
        row.update(rise=result["rise"], reason=result["reason"], **outcome)
        row["tokens_trained"] = int(whole["tokens"].max())
        inside = predicted_within(
            result["emerged"], row["predicted_tokens"], row["tokens_lo"], row["tokens_hi"]
        )
        row["predicted_within"] = pd.NA if inside is None else inside
        rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["emerged"] = table["emerged"].astype(bool)
    table["predicted_within"] = table["predicted_within"].astype("boolean")
    return table.sort_values("run_id", kind="stable").reset_index(drop=True)


# --- helpers -------------------------------------------------------------------------------


def _run_outcome(row: pd.Series) -> dict:
    """The run-level columns a probe table repeats on every row; a table written before runs
    recorded their outcome counts as completed, with an unknown budget and no prediction."""

    def get(key, default):
        value = row.get(key, default)
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        return default if missing else value

    return {
        "outcome": str(get("outcome", "completed")),
        "outcome_detail": str(get("outcome_detail", "")),
        "budget": get("budget", math.nan),
        "predicted_tokens": float(get("predicted_tokens", math.nan)),
    }


def _prepare(tokens, values) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(values, dtype=float)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError("tokens and values must be 1-D and of equal length")
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("tokens must be finite and > 0 (fits are on log10 tokens)")
    if np.any(np.diff(t) <= 0):
        raise ValueError("tokens must be strictly ascending")
    keep = np.isfinite(y)
    return np.log10(t[keep]), y[keep]


def _small_rise_reason(y: np.ndarray, rise: float, min_rise: float) -> str:
    reason = f"rise {rise:.3g} below min_rise {min_rise:g}: no transition within the budget"
    if np.max(y) - y[0] >= min_rise:
        reason += " (a jump at a single checkpoint does not count)"
    return reason


def _no_transition(method: str, rise: float, reason: str) -> dict:
    return {
        "emerged": False,
        "tokens_pt": math.nan,
        "tokens_lo": math.nan,
        "tokens_hi": math.nan,
        "method": method,
        "rise": float(rise),
        "reason": reason,
    }


def _ramp_profile(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Best SSE over x2 > x1 for each grid x1 (inf where no rising ramp fits)."""
    yc = y - y.mean()
    syy = float(yc @ yc)
    profile = np.full(len(grid), np.inf)
    for i, x1 in enumerate(grid[:-1]):
        x2 = grid[i + 1 :, None]
        g = np.clip(x[None, :], x1, x2) - x1
        gc = g - g.mean(axis=1, keepdims=True)
        sgg = np.einsum("ij,ij->i", gc, gc)
        sgy = gc @ yc
        ok = (sgg > 1e-15) & (sgy > 0)  # sgy > 0 <=> fitted slope s > 0: the ramp rises
        if ok.any():
            profile[i] = np.min(syy - sgy[ok] ** 2 / sgg[ok])
    return np.maximum(profile, 0.0)


def _fit_ramp(x: np.ndarray, y: np.ndarray) -> dict:
    grid = np.linspace(x[0], x[-1], GRID_POINTS)
    profile = _ramp_profile(x, y, grid)
    if not np.isfinite(profile).any():
        return {"failed": "breakpoint fit failed: no rising ramp fits the series"}
    sse_min = float(np.min(profile))
    # Exact ties (a step inside one checkpoint gap) are resolved to their middle.
    tol = 1e-12 * max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
    tied = grid[profile <= sse_min + tol]
    dof = len(x) - 4
    from scipy import stats

    bound = sse_min * (1.0 + stats.f.ppf(CONFIDENCE, 1, dof) / dof) + tol
    inside = grid[profile <= bound]
    return {"x": float(np.median(tied)), "lo": float(inside.min()), "hi": float(inside.max())}


def _first_crossing(x: np.ndarray, y: np.ndarray, min_rise: float) -> dict:
    """Where the 3-checkpoint running median first holds ``min_rise`` above its lowest value so
    far, to the end of the series: the first checkpoint at which ``sustained_rise`` reaches
    ``min_rise``. The median there is at or above baseline + min_rise and the one before it is
    below (a new lowest value cannot be min_rise above itself), so the crossing of that level is
    interpolated linearly in log tokens between the two, and the interval is their gap. Called
    only once ``sustained_rise`` has reached min_rise, so such a checkpoint exists."""
    med, low_before, gains = _held_gains(y)
    xm = x[1:-1]  # the median of checkpoints i - 1, i, i + 1 sits at checkpoint i
    j = int(np.flatnonzero(gains >= min_rise)[0])
    if j < MIN_BEFORE:  # a baseline seen at one running median may already be on the rise
        return {
            "failed": f"transition at the start of the budget: {j} running median(s) before the"
            f" crossing (need {MIN_BEFORE}); its onset is not observed"
        }
    level = low_before[j] + min_rise
    fraction = float(np.clip((level - med[j - 1]) / (med[j] - med[j - 1]), 0.0, 1.0))
    return {"x": float(xm[j - 1] + fraction * (xm[j] - xm[j - 1])), "lo": xm[j - 1], "hi": xm[j]}


def _sigmoid(x, lo, hi, k, x0):
    from scipy import special

    return lo + (hi - lo) * special.expit(k * (x - x0))


def _sigmoid_jac(x, lo, hi, k, x0):
    # Analytic Jacobian: several times fewer function calls than finite differences.
    from scipy import special

    s = special.expit(k * (x - x0))
    ds = (hi - lo) * s * (1.0 - s)
    return np.column_stack([1.0 - s, s, ds * (x - x0), -ds * k])


def _fit_sigmoid(x: np.ndarray, y: np.ndarray) -> dict:
    width = x[-1] - x[0]
    span = max(float(np.ptp(y)), 1e-6)
    # Wide level bounds: when only the foot of the rise is visible, hi lies well above the data.
    y_lo, y_hi = float(y.min()) - 3 * span, float(y.max()) + 3 * span
    # k is per decade; 2000 gives a 10-90% width of 0.002 decades, sharper than any schedule.
    # x0 may leave the observed range so that "no transition within budget" can be detected.
    bounds = ([y_lo, y_lo, 1e-3, x[0] - width], [y_hi, y_hi, 2000.0, x[-1] + width])
    start_lo, start_hi = float(np.median(y[:3])), float(np.max(y))
    fits = [_curve_fit_once(x, y, [start_lo, start_hi, k, x0], bounds) for x0, k in _starts(x, y)]
    fits = [f for f in fits if f is not None]
    best = min(fits, key=lambda f: f[0]) if fits else None
    if best is None:
        return {"failed": "sigmoid fit failed to converge from every start"}
    _, popt, pcov = best
    lo, hi, k, x0 = (float(v) for v in popt)
    if not hi > lo:
        return {"failed": "fitted sigmoid does not rise (hi <= lo)"}
    sd = math.sqrt(pcov[3, 3]) if np.isfinite(pcov[3, 3]) and pcov[3, 3] >= 0 else math.nan
    gap_lo, gap_hi = _bracket(x, x0)
    # A rise (10-90% width 2 ln 9 / k) narrower than the checkpoint gap around x0 puts no
    # checkpoint on the slope: x0 is then only known to lie in that gap, and the linearised
    # covariance is meaningless (often huge, sometimes zero).
    if math.isfinite(sd) and 2 * math.log(9) / k >= gap_hi - gap_lo:
        from scipy import stats

        z = stats.norm.ppf(0.5 + CONFIDENCE / 2)
        a, b = x0 - z * sd, x0 + z * sd
    else:
        a, b = gap_lo, gap_hi
    return {"x": x0, "lo": float(np.clip(a, x[0], x[-1])), "hi": float(np.clip(b, x[0], x[-1]))}


def _curve_fit_once(x, y, p0, bounds):
    """(SSE, parameters, covariance) of one curve_fit from ``p0``, or None if it fails."""
    from scipy import optimize

    try:
        with warnings.catch_warnings():
            # Covariance warnings are handled by the caller's interval rule.
            warnings.simplefilter("ignore")
            popt, pcov = optimize.curve_fit(
                _sigmoid, x, y, p0=p0, bounds=bounds, jac=_sigmoid_jac, method="trf", maxfev=5000
            )
    except (RuntimeError, ValueError):
        return None
    return float(np.sum((y - _sigmoid(x, *popt)) ** 2)), popt, pcov


def _starts(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
    """Starting (x0, k): the first half-height crossing, gentle and steep, plus spread-out x0.

    The least-squares surface has flat regions wherever the trial midpoint sits far from the
    data's rise, so a few starts across the range guard against a local minimum.
    """
    width = x[-1] - x[0]
    gentle, steep = 4.0 / width, 20.0 / width
    starts = [(float(x0), gentle) for x0 in np.quantile(x, [0.25, 0.5, 0.75])]
    half = 0.5 * (np.median(y[:3]) + np.max(y))
    above = np.flatnonzero(y >= half)
    if len(above) and above[0] > 0:
        x_half = float(0.5 * (x[above[0] - 1] + x[above[0]]))
        starts += [(x_half, gentle), (x_half, steep)]
    return starts


def _bracket(x: np.ndarray, x0: float) -> tuple[float, float]:
    i = int(np.searchsorted(x, x0))
    return float(x[max(i - 1, 0)]), float(x[min(i, len(x) - 1)])
