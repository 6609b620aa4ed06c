"""When a new run forms induction heads, from a law (docs/method.md#predicting-a-new-run).

A law is ``log10 U_pt = log10 T - a log10 B - b log10 C [+ c log10 N_params]`` in updates,
read from a lawfit.json (``ihsweep.analysis.lawfit.fit_law``) or the published one
(``PUBLISHED``). For each configuration :func:`predict` gives the point (updates, and tokens:
updates x B x C) and, where the law carries its bootstrap draws, a 95% prediction interval for a
NEW run there: in log10 units,

    point +- t(0.975, dof) * sqrt(se_fit^2 + s^2),

where se_fit is the standard deviation of the point over the fit's bootstrap draws (how well the
fit pins the law down there; it grows away from the fitted grid) and s the law's residual
standard deviation (``residual_sd_log10``: the scatter of single runs around the law, seed noise
and the law's miss of the cells together), with the residual degrees of freedom. The published
law has no draws and no residual: its point only. Each configuration also says how far it lies
outside the grid the law was fitted on, per axis and in the law's own units B^a C^b (a factor,
1 inside). :func:`within_tokens` answers the inverse question: at a given B, which C (or at a
given C, which B) brings emergence within a token budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ihsweep.analysis.lawfit import CONFIDENCE, PUBLISHED

# A factor outside the fitted grid in the law's units beyond which a prediction is flagged.
FAR_OUTSIDE = 10.0
# The axes a law can be asked about: (symbol, the option's name, the lawfit.json field).
AXES = {"B": "batch_sizes", "C": "context_sizes", "N": "n_params_values"}


class LawError(ValueError):
    """A law that cannot predict: one line naming the file or field and the fix."""


@dataclass(frozen=True)
class Law:
    """A law to predict from: coefficients, bootstrap draws and scatter (None when not known),
    and the fitted range of each axis (symbol -> (lowest, highest))."""

    name: str
    log10_T: float
    a: float
    b: float
    c: float | None = None  # the model-size exponent, for a law with a size term
    draws: np.ndarray | None = None  # (n, 3) or (n, 4): log10_T, a, b[, c]
    scatter_sd: float | None = None
    dof: int | None = None
    grid: dict[str, tuple[float, float]] = field(default_factory=dict)
    note: str = ""

    @property
    def has_interval(self) -> bool:
        return self.draws is not None and self.scatter_sd is not None and bool(self.dof)


def published_law() -> Law:
    """The paper's law (arXiv 2511.16893v2, section 7): its point only, no interval published."""
    return Law(
        name="published",
        log10_T=PUBLISHED["log10_T"],
        a=PUBLISHED["a"],
        b=PUBLISHED["b"],
        grid={"B": PUBLISHED["B"], "C": PUBLISHED["C"]},
        note=PUBLISHED["source"],
    )


def law_from_fit(fit: dict, name: str, size: bool = False) -> Law:
    """The law of a lawfit.json's content; with ``size``, its model-size fit (c)."""
    if fit.get("ok") is not True:
        raise LawError(f"{name} holds no fitted law ({fit.get('reason') or 'ok is not true'})")
    if "boot_draws" not in fit:
        raise LawError(
            f"{name} was written before predictions read the bootstrap draws from it; rerun its "
            "study's aggregate: snakemake --cores all --forcerun aggregate_natural "
            "--configfile <the study's config files>"
        )
    grid = {s: (min(fit[k]), max(fit[k])) for s, k in AXES.items() if fit.get(k)}
    if not size:
        grid.pop("N", None)
        draws = np.asarray(fit["boot_draws"], dtype=float).reshape(-1, 3)
        return Law(name, fit["log10_T"], fit["a"], fit["b"], draws=draws,
                   scatter_sd=fit["residual_sd_log10"], dof=_dof(fit, 3 - _fixed(fit)),
                   grid=grid, note=_note(fit))  # fmt: skip
    law = fit.get("size_fit")
    if not law or fit.get("c") is None or law["a"] is None or law["b"] is None:
        why = fit.get("c_note") or "no size term fitted"
        raise LawError(f"{name} has no law with a size term to predict from ({why}); drop --params")
    draws = np.asarray(fit["size_boot_draws"], dtype=float).reshape(-1, 4)
    return Law(name, law["log10_T"], law["a"], law["b"], c=fit["c"], draws=draws,
               scatter_sd=fit["size_residual_sd_log10"], dof=_dof(fit, 4), grid=grid,
               note=_note(fit) + "; with the model-size term c")  # fmt: skip


def _fixed(fit: dict) -> int:
    """How many exponents the fit held fixed (2 with ``lawfit.exponents``, else 0)."""
    return 0 if fit.get("exponents_source", "fitted") == "fitted" else 2


def _dof(fit: dict, n_coef: int) -> int | None:
    n = fit["n_runs"] if n_coef < 4 else fit["n_runs"] + fit.get("n_other_models", 0)
    return n - n_coef if n > n_coef else None


def _note(fit: dict) -> str:
    source = fit.get("exponents_source", "fitted")
    how = "a, b and log10 T fitted" if source == "fitted" else f"a, b fixed ({source})"
    return f"{how} on {fit['n_runs']} runs"


def log10_updates(law: Law, B, C, N=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point and 95% prediction interval for a new run, in log10 updates (broadcast over B, C
    and N); the interval is NaN where the law has none."""
    x = _features(law, B, C, N)
    coef = np.array([law.log10_T, law.a, law.b] + ([law.c] if law.c is not None else []))
    point = x @ coef
    if not law.has_interval:
        nan = np.full_like(point, np.nan)
        return point, nan, nan
    from scipy import stats  # here: the config layer imports lawfit, not this module

    se_fit = np.std(x @ law.draws.T, axis=-1, ddof=1)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, law.dof) * np.hypot(se_fit, law.scatter_sd)
    return point, point - half, point + half


def _features(law: Law, B, C, N) -> np.ndarray:
    B, C = np.broadcast_arrays(np.asarray(B, float), np.asarray(C, float))
    cols = [np.ones_like(B), -np.log10(B), -np.log10(C)]
    if law.c is not None:
        cols.append(np.log10(np.broadcast_to(np.asarray(N, float), B.shape)))
    return np.stack(cols, axis=-1)


def outside_factor(value, bounds: tuple[float, float]):
    """How far ``value`` lies outside ``[lo, hi]``, as a factor (1 inside)."""
    lo, hi = bounds
    value = np.asarray(value, float)
    return np.maximum(np.maximum(lo / value, value / hi), 1.0)


def law_units_outside(law: Law, B, C):
    """How far B^a C^b lies outside its range over the fitted grid, as a factor (1 inside)."""
    if "B" not in law.grid or "C" not in law.grid:
        return np.full(np.broadcast(B, C).shape, np.nan)
    corners = [law.a * math.log10(b) + law.b * math.log10(c)
               for b in law.grid["B"] for c in law.grid["C"]]  # fmt: skip
    units = law.a * np.log10(np.asarray(B, float)) + law.b * np.log10(np.asarray(C, float))
    return 10.0 ** np.maximum(np.maximum(min(corners) - units, units - max(corners)), 0.0)


def predict(law: Law, batch_sizes, context_sizes, n_params: float | None = None) -> pd.DataFrame:
    """One row per (B, C) of the grid: the point and interval (updates and tokens) and how far
    outside the fitted grid it lies (``outside_B``, ``outside_C``[, ``outside_N``] and
    ``outside_law_units``: factors, 1 inside)."""
    if (law.c is not None) != (n_params is not None):
        raise LawError("a law with a size term needs --params, and only such a law takes it")
    B, C = (np.array(v, float) for v in np.meshgrid(batch_sizes, context_sizes, indexing="ij"))
    B, C = B.ravel(), C.ravel()
    point, low, high = log10_updates(law, B, C, n_params)
    table = pd.DataFrame({"batch_size": B.astype(int), "context_size": C.astype(int)})
    if n_params is not None:
        table["n_params"] = int(n_params)
    for name, log10 in (("", point), ("_low", low), ("_high", high)):
        table[f"updates{name}"] = 10.0**log10
        table[f"tokens{name}"] = 10.0**log10 * B * C
    for symbol, value in (("B", B), ("C", C), ("N", n_params)):
        if symbol in law.grid and value is not None:
            table[f"outside_{symbol}"] = outside_factor(value, law.grid[symbol])
    table["outside_law_units"] = law_units_outside(law, B, C)
    return table


def warnings(law: Law, table: pd.DataFrame) -> list[str]:
    """One line per configuration outside the fitted grid (per axis, and in law units)."""
    lines = []
    for row in table.itertuples(index=False):
        where = f"B={row.batch_size}, C={row.context_size}"
        for symbol in AXES:
            factor = getattr(row, f"outside_{symbol}", 1.0)
            if factor > 1.0:
                lo, hi = law.grid[symbol]
                fitted = f"{lo:g}-{hi:g}" if hi > lo else f"{lo:g} only"
                lines.append(f"warning: {where}: {symbol} is {factor:.3g}x outside the fitted "
                             f"range {fitted}: an extrapolation")  # fmt: skip
        if row.outside_law_units > FAR_OUTSIDE:
            factor = row.outside_law_units
            lines.append(f"warning: {where}: {factor:.3g}x outside the fitted grid in the "
                         "law's units B^a C^b: far beyond what the law has seen")  # fmt: skip
    return lines


def within_tokens(law: Law, tokens: float, batch_size=None, context_size=None, n_params=None):
    """At each given B (or C), the C (or B) at which the point reaches ``tokens`` tokens, and
    which side of it stays within: one dict per given value.

    In tokens the law is log10 T + (1 - a) log10 B + (1 - b) log10 C [+ c log10 N], so with
    b < 1 every C up to the bound stays within (``"at most"``); with b > 1 every C from it
    (``"at least"``); with b = 1 every C or none. The same for B with a."""
    if (batch_size is None) == (context_size is None):
        raise LawError("the inverse question takes batch sizes or context sizes, not both")
    given, solve = ("B", "C") if context_size is None else ("C", "B")
    values = batch_size if context_size is None else context_size
    own, other = (law.a, law.b) if given == "B" else (law.b, law.a)
    size = law.c * math.log10(n_params) if law.c is not None else 0.0
    out = []
    for value in values:
        rest = math.log10(tokens) - law.log10_T - (1 - own) * math.log10(value) - size
        slope = 1 - other
        row = {given: int(value), "tokens": float(tokens), "solve": solve}
        if abs(slope) < 1e-12:
            row.update(bound=None, side="every" if rest >= 0 else "none")
        else:
            row.update(bound=10.0 ** (rest / slope), side="at most" if slope > 0 else "at least")
        out.append(row)
    return out
