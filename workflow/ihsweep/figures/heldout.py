"""The held-out figure (docs/method.md#held-out-validation): predicted against observed
emergence point in log10 updates for each held-out run, one panel per law
(``ihsweep.analysis.heldout.LAWS``), the 95% prediction interval as a vertical bar, runs of a
left-out cell as circles and runs of the extrapolation split as triangles, the identity line,
and each panel's coverage and RMSE in its title. Writes ``<out_stem>.png`` and ``.pdf``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from ihsweep.analysis.heldout import KINDS, LAWS
from ihsweep.figures.style import PALETTE, figure_style, new_figure, save_figure

MARKER = {"cell": "o", "extrapolation": "^"}


def plot_held_out(table: pd.DataFrame, summary: dict, out_stem) -> list[Path]:
    with figure_style():
        fig = new_figure(3.2 * len(LAWS), 3.6)
        if table.empty:  # one line per kind saying why, instead of empty panels
            reasons = [f"{KINDS[k]}: {v['reason']}" for k, v in summary["kinds"].items()]
            fig.text(0.5, 0.5, "\n".join(["no held-out measurement", *reasons]), ha="center",
                     va="center")  # fmt: skip
            return save_figure(fig, out_stem)
        axes = fig.subplots(1, len(LAWS), sharex=True, sharey=True)
        values = table[["observed_log10_updates", "predicted_log10_updates"]].to_numpy()
        lo, hi = np.nanmin(values) - 0.3, np.nanmax(values) + 0.3
        for ax, (law, label) in zip(np.atleast_1d(axes), LAWS.items(), strict=True):
            rows = table[table["law"] == law]
            for kind, group in rows.groupby("kind", sort=False):
                low = group["predicted_log10_updates"] - group["low_log10_updates"]
                high = group["high_log10_updates"] - group["predicted_log10_updates"]
                ax.errorbar(group["observed_log10_updates"], group["predicted_log10_updates"],
                            yerr=None if low.isna().all() else [low, high], ls="",
                            marker=MARKER[kind], color=PALETTE[list(KINDS).index(kind)],
                            capsize=2, elinewidth=0.8,
                            alpha=0.8)  # fmt: skip
            ax.plot([lo, hi], [lo, hi], ls="--", color="0.5", lw=1)
            ax.set_title(f"{label}\n{_scores(summary, law)}", fontsize="small")
            ax.set_xlabel("observed log10 updates (held out)")
        np.atleast_1d(axes)[0].set_ylabel("predicted log10 updates, 95% interval")
        handles = [Line2D([], [], ls="", marker=MARKER[k], color=PALETTE[i], label=KINDS[k])
                   for i, k in enumerate(KINDS)]  # fmt: skip
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize="small")
        return save_figure(fig, out_stem)


def _scores(summary: dict, law: str) -> str:
    parts = []
    for row in summary["summary"]:
        if row["law"] == law:
            cover = "" if row["coverage"] is None else f"cover {row['coverage']:.0%}, "
            parts.append(f"{row['kind'][:5]}: {cover}RMSE {row['rmse_log10']:.2f}")
    return "; ".join(parts)
