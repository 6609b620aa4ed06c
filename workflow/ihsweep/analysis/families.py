"""Each model family's law side by side (docs/method.md#model-families).

Where a study's runs span more than one family (``models.<name>.family``), the law is fitted
to each family's emerged runs alone (``lawfit.fit_law``, every model of the family), with its
own bootstrap, and every other family is compared with the reference family (gpt2, the paper's):
the differences of a, b and log10 T, each with the 95% interval of the differences of the two
fits' bootstrap draws. The two bootstraps are independent (each family's runs are resampled
by a seed of its own), so the interval of a difference is that of two independent estimates.

log10 T is the law at B = C = 1, far outside any grid, and it moves with b: a family whose b
is lower has a lower T for the same updates inside the grid. So each law is also read at the
grid's centre (the geometric means of the runs' B and C, the same point for every family):
``log10_U_centre = log10 T - a log10 B* - b log10 C*``, the log10 updates to IHs it predicts
there, with its interval and the difference's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ihsweep.analysis.lawfit import CONFIDENCE, fit_law, percentile_ci

REFERENCE = "gpt2"
COEFFICIENTS = ("log10_T", "a", "b")  # the order of a fit's bootstrap draws
CENTRE = "log10_U_centre"  # the law's log10 updates at the grid's centre
COMPARED = (*COEFFICIENTS, CENTRE)
SHOWN = ("a", "b", "log10_T", CENTRE, "r", "n_runs")
COLUMNS = ["family", "quantity", "estimate", "ci_low", "ci_high"]


def compare_families(
    emergence: pd.DataFrame, families: dict[str, str], n_boot: int, seed: int
) -> dict | None:
    """Per family its law (``SHOWN`` with intervals, ``ok`` and ``reason``, ``models``), the
    differences from the reference family and the emergence ``metric`` they date; None where
    the table's runs span one family only. ``families`` maps each model name of the ``model``
    column to its family."""
    runs = emergence[emergence["model"].isin(families)]
    present = sorted({families[m] for m in runs["model"]}, key=lambda f: (f != REFERENCE, f))
    if len(present) < 2:
        return None
    centre = {key: float(np.exp(np.log(runs[key].astype(float)).mean()))
              for key in ("batch_size", "context_size")}  # fmt: skip
    fits, per_family = {}, {}
    for index, family in enumerate(present):
        models = sorted(m for m, f in families.items() if f == family)
        own_seed = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        fit = fit_law(runs[runs["model"].isin(models)], n_boot, own_seed)  # n_runs: emerged
        fit = fits[family] = {**fit, **_at_centre(fit, centre)}
        per_family[family] = {
            "ok": fit["ok"], "reason": fit["reason"], "models": models, "seed": own_seed,
            **{key: fit.get(key) for key in SHOWN},
            **{f"{key}_ci": fit.get(f"{key}_ci") for key in COMPARED},
        }  # fmt: skip
    reference = present[0]
    differences = {family: _difference(fits[family], fits[reference]) for family in present[1:]}
    return {"reference": reference, "families": per_family, "differences": differences,
            "confidence": CONFIDENCE, "metric": fits[reference]["metric"],
            "centre": centre}  # fmt: skip


def _at_centre(fit: dict, centre: dict) -> dict:
    """The law's log10 updates at the grid's centre, its interval, and one value per bootstrap
    draw (``centre_draws``); None and no draws for a law that did not fit."""
    if not fit["ok"]:
        return {CENTRE: None, f"{CENTRE}_ci": None, "centre_draws": []}
    point = np.array([1.0, -np.log10(centre["batch_size"]), -np.log10(centre["context_size"])])
    draws = np.asarray(fit["boot_draws"], dtype=float) @ point
    estimate = float(np.dot([fit[key] for key in COEFFICIENTS], point))
    return {CENTRE: estimate, f"{CENTRE}_ci": percentile_ci(draws),
            "centre_draws": draws.tolist()}  # fmt: skip


def _difference(fit: dict, reference: dict) -> dict:
    """``fit`` minus ``reference`` per coefficient and at the grid's centre: the estimate and
    its bootstrap interval."""
    if not (fit["ok"] and reference["ok"]):
        return {"ok": False, "reason": fit["reason"] or reference["reason"]}
    mine, theirs = (np.column_stack([f["boot_draws"], f["centre_draws"]]) for f in (fit, reference))
    n = min(len(mine), len(theirs))
    out = {"ok": True, "reason": ""}
    tail = 100 * (1 - CONFIDENCE) / 2
    for column, key in enumerate(COMPARED):
        draws = mine[:n, column] - theirs[:n, column]
        low, high = np.percentile(draws, [tail, 100 - tail])
        out[key] = float(fit[key] - reference[key])
        out[f"{key}_ci"] = [float(low), float(high)]
        out[f"{key}_excludes_zero"] = bool(low > 0 or high < 0)
    return out


def families_table(comparison: dict | None) -> pd.DataFrame:
    """``compare_families``'s result as rows ``COLUMNS``: each family's a, b, log10 T, r and run
    count, then each difference (family ``llama - gpt2``); empty for a one-family study."""
    rows = []
    if comparison is None:
        return pd.DataFrame(rows, columns=COLUMNS)
    for family, law in comparison["families"].items():
        for key in SHOWN:
            ci = law.get(f"{key}_ci") or [None, None]
            rows.append([family, key, law.get(key), *ci])
    for family, diff in comparison["differences"].items():
        for key in COMPARED if diff["ok"] else ():
            rows.append([f"{family} - {comparison['reference']}", key, diff[key],
                         *diff[f"{key}_ci"]])  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
