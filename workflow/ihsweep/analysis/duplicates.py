"""What the emergence analysis does with a checkpoint suite's duplicate revisions
(``ihsweep.probing.fingerprints``; docs/checkpoints.md#revisions-that-are-not-what-their-names-say).

A revision in a duplicate group may not hold the weights of the step it claims, and nothing says
which member of a group is the honest one, so:

- ``fitted_revisions``: every revision of a group is left out of the emergence fit, unless the
  suite's ``keep_duplicates`` keeps them;
- ``mark_undetermined``: the suite's emergence point is undetermined (``emerged`` False, the
  point and interval NaN, ``reason`` "undetermined: ..." naming the group) when a step-0
  revision shares weights with a trained one (the early grid serves trained weights, so no
  baseline before the rise is known), or when a group has revisions at or before the detected
  point and after it (the transition may be dated from weights of another step). Both hold with
  ``keep_duplicates`` too: keeping a group does not make either case datable.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ihsweep.files.io import RERUN, DamagedFile

# duplicates.csv, one row per group (ihsweep.probing.fingerprints.duplicate_groups writes it)
DUPLICATE_COLUMNS = ["suite", "kind", "revisions", "steps", "n_tensors", "tensors", "line"]
UNDETERMINED = "undetermined"
_POINT_COLUMNS = ("tokens_pt", "tokens_lo", "tokens_hi", "updates_pt", "updates_lo", "updates_hi")


def read_duplicates(paths: list[Path]) -> pd.DataFrame:
    """The suites' duplicate groups (duplicates.csv, ``DUPLICATE_COLUMNS``), all as text;
    ``DamagedFile`` naming a file that cannot be read."""
    tables = [pd.DataFrame(columns=DUPLICATE_COLUMNS, dtype=str)]
    for path in paths:
        remedy = RERUN.format(path=path, step="probe_suite")
        try:
            table = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (OSError, ValueError) as err:
            raise DamagedFile(
                "duplicate groups", path, f"not a readable CSV ({err})", remedy
            ) from err
        missing = [c for c in DUPLICATE_COLUMNS if c not in table.columns]
        if missing:
            raise DamagedFile("duplicate groups", path, f"missing {', '.join(missing)}", remedy)
        tables.append(table[DUPLICATE_COLUMNS])
    return pd.concat(tables, ignore_index=True)


def _steps(group: pd.Series) -> list[int]:
    return [int(step) for step in group["steps"].split()]


def fitted_revisions(model_table: pd.DataFrame, duplicates: pd.DataFrame, keep) -> pd.DataFrame:
    """The model table without the revisions of every duplicate group of a suite not in
    ``keep`` (suite names); the same table when nothing is left out."""
    left_out = {
        (group["suite"], step)
        for _, group in duplicates.iterrows()
        if group["suite"] not in keep
        for step in _steps(group)
    }
    if not left_out:
        return model_table
    pairs = zip(model_table["model"], model_table["step"], strict=True)
    out = pd.Series([pair in left_out for pair in pairs], index=model_table.index)
    return model_table[~out].reset_index(drop=True)


def undetermined_reason(row: pd.Series, groups: pd.DataFrame) -> str:
    """Why a suite's emergence point (its emergence table ``row``) cannot be dated from its
    duplicate ``groups``; "" when it can."""
    reasons = []
    for _, group in groups.iterrows():
        steps = _steps(group)
        tokens = [s * row["batch_size"] * row["context_size"] for s in steps]
        if 0 in steps and max(steps) > 0:
            reasons.append(f"a step-0 revision shares weights with a trained one ({group['line']})")
        elif row["emerged"] and min(tokens) <= row["tokens_pt"] < max(tokens):
            reasons.append(
                f"duplicate revisions span the transition at {row['tokens_pt']:.4g} tokens "
                f"({group['line']})"
            )
    return f"{UNDETERMINED}: {'; '.join(reasons)}" if reasons else ""


def mark_undetermined(emergence: pd.DataFrame, duplicates: pd.DataFrame) -> pd.DataFrame:
    """The emergence table with each suite whose point cannot be dated marked undetermined
    (see the module docstring)."""
    emergence = emergence.copy()
    for index, row in emergence.iterrows():
        reason = undetermined_reason(row, duplicates[duplicates["suite"] == row["model"]])
        if reason:
            emergence.loc[index, list(_POINT_COLUMNS)] = math.nan
            emergence.loc[index, ["emerged", "reason"]] = [False, reason]
            if "predicted_within" in emergence:
                emergence.at[index, "predicted_within"] = None
    return emergence
