"""The figures of the emergence analysis (docs/method.md#the-emergence-rule and
#the-law-and-its-fit), in one shared style.

- ``plot_run_curves``: one small panel per run, the emergence metric and AR accuracy against
  tokens seen (log axis), with the detected emergence point and its interval, or "no transition".
  A run stopped early (emergence confirmed) or diverged ends where it stopped, at a line
  (``ENDING_STYLE``), and its panel title says so ("stopped early at 3M", "diverged at 1.2M");
  a diverged run's panel says why instead of "no transition".
- ``plot_emergence_vs_BC``: emergence point against batch size B (one line per context size
  C) and against C (one line per B), in updates (top) and tokens (bottom), log-log, with the
  intervals as error bars.
- ``plot_model_size``: emergence point against parameter count at fixed (B, C), with the
  law fit's model-size coefficient.
- ``plot_law_fit``: predicted against observed emergence point (updates, log-log), the identity
  line, and the fitted a, b, T, r (with 95% intervals) and the model-size coefficient c.

Runs whose training diverged are never drawn as emergence points (the law fit leaves them out
too); the titles count them, and the law-fit figure says how many runs the fit left out and why.
Tables written before runs recorded their ``outcome`` count every run as completed, and a run
whose model table is a single row at 0 tokens (diverged before its first checkpoint) gets an
empty panel with its verdict.

Each function writes ``<out_stem>.png`` and ``<out_stem>.pdf`` in the shared style
(``ihsweep.figures.style``).
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
)

from ihsweep.analysis.frontier import format_tokens
from ihsweep.analysis.lawfit import predict_updates
from ihsweep.figures.style import (
    MARKERS,
    METRIC_LABELS,
    PALETTE,
    POINT_COLOUR,
    figure_style,
    new_figure,
    save_figure,
)
from ihsweep.report.findings import PAPER


def plot_run_curves(model_table: pd.DataFrame, emergence: pd.DataFrame, out_stem) -> list[Path]:
    """Small multiples: metric (and AR accuracy) vs tokens per run, emergence point marked."""
    metric = _single_value(emergence, "metric", "ps_max")
    runs = model_table.sort_values(["run_id", "tokens"]).groupby("run_id", sort=True)
    by_run = emergence.set_index("run_id") if len(emergence) else pd.DataFrame()
    n = max(runs.ngroups, 1)
    ncols = min(n, max(1, math.ceil(math.sqrt(n))), 5)
    nrows = math.ceil(n / ncols)
    with figure_style():
        fig = new_figure(2.2 * ncols + 0.6, 1.7 * nrows + 0.9)
        axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
        varying = {c for c in ("data", "seed") if c in model_table and model_table[c].nunique() > 1}
        ended = set()
        positive = model_table.loc[model_table["tokens"] > 0, "tokens"]
        first_tokens = float(positive.min()) if len(positive) else math.inf
        for ax, (run_id, whole) in zip(axes, runs, strict=False):
            run = whole[whole["tokens"] > 0]
            ax.plot(run["tokens"], run[metric], marker="o", color=PALETTE[0])
            if metric != "ar_acc" and "ar_acc" in run:
                ax.plot(run["tokens"], run["ar_acc"], ls="--", marker=".", color=PALETTE[1])
            row = by_run.loc[run_id] if run_id in by_run.index else None
            ending = run_ending(whole, row)
            if row is not None:
                _mark_emergence(ax, row, ending)
            # Where it ended, when inside the plotted range (a run that diverged before the
            # first checkpoint would stretch every panel's shared axis; its title says where).
            if ending["outcome"] in ENDING_STYLE and ending["tokens"] >= first_tokens:
                ax.axvline(ending["tokens"], **ENDING_STYLE[ending["outcome"]])
                ended.add(ending["outcome"])
            title = _run_label(whole.iloc[0] if len(whole) else None, run_id, varying)
            ax.set_title(title + (f"\n{ending['label']}" if ending["label"] else ""))
        _label_outer(axes, runs.ngroups, ncols)
        axes[0].set_xscale("log")
        axes[0].set_ylim(-0.03, 1.05)
        handles = [Line2D([], [], color=PALETTE[0], marker="o", label=METRIC_LABELS.get(metric))]
        if metric != "ar_acc":
            handles.append(
                Line2D([], [], color=PALETTE[1], ls="--", marker=".", label=METRIC_LABELS["ar_acc"])
            )
        handles += [
            Line2D([], [], color=POINT_COLOUR, label="emergence point"),
            Patch(color=POINT_COLOUR, alpha=0.25, label="95% interval"),
        ]
        handles += [
            Line2D([], [], **ENDING_STYLE[o], label=o.replace("_", " "))
            for o in ("stopped_early", "diverged")
            if o in ended
        ]
        method = _single_value(emergence, "method", "")
        data = ", ".join(sorted(model_table["data"].unique())) if "data" in model_table else "?"
        # Short lines, and a legend column per panel column at most: a narrow grid (two
        # runs) is narrower than one line of either.
        fig.suptitle(
            f"Emergence per run on data {data}\n{METRIC_LABELS.get(metric, metric)},"
            f" method: {method}"
        )
        legend_columns = min(len(handles), 4, ncols)
        fig.legend(handles=handles, loc="outside lower center", ncols=legend_columns)
        return save_figure(fig, out_stem)


def plot_emergence_vs_BC(emergence: pd.DataFrame, out_stem) -> list[Path]:
    """Emergence point vs B (lines per C) and vs C (lines per B), in updates and in tokens."""
    done = emerged_runs(emergence)
    models = _models_by_size(emergence)
    with figure_style():
        fig = new_figure(7.2, 5.8)
        axes = fig.subplots(2, 2, sharey="row")
        columns = [
            ("batch_size", "context_size", "batch size B (sequences per update)", "C"),
            ("context_size", "batch_size", "context size C (tokens per sequence)", "B"),
        ]
        for row, unit in enumerate(("updates", "tokens")):
            for ax, (x_col, group_col, xlabel, group_name) in zip(axes[row], columns, strict=True):
                _plot_vs(ax, done, x_col, group_col, group_name, models, unit)
                ax.set_xlabel(xlabel)
            axes[row, 0].set_ylabel(f"emergence point ({unit})")
        if len(models) > 1:
            fig.legend(
                handles=[
                    Line2D([], [], ls="", marker=MARKERS[i % len(MARKERS)], color="0.3", label=m)
                    for i, m in enumerate(models)
                ],
                title="model",
                loc="outside right center",
            )
        fig.suptitle(_emerged_summary(emergence))
        return save_figure(fig, out_stem)


def plot_model_size(emergence: pd.DataFrame, fit: dict, out_stem) -> list[Path]:
    """Emergence point (updates) vs parameter count, one line per (B, C) with several models.

    The paper's claim is that the point does not depend on model size; the fitted size
    coefficient c (``lawfit``, log10 U on log10 N beside log B and log C) is printed.
    """
    done = emerged_runs(emergence)
    with figure_style():
        fig = new_figure(4.6, 3.6)
        ax = fig.subplots()
        settings = (
            done.groupby(["batch_size", "context_size"])["model"].nunique().loc[lambda n: n > 1]
            if len(done)
            else pd.Series(dtype=int)
        )
        for i, (b, c) in enumerate(settings.index):
            pts = done[(done["batch_size"] == b) & (done["context_size"] == c)]
            pts = pts.sort_values("n_params")
            ax.errorbar(
                pts["n_params"],
                pts["updates_pt"],
                yerr=_yerr(pts, "updates"),
                marker=MARKERS[i % len(MARKERS)],
                color=PALETTE[i % len(PALETTE)],
                capsize=2,
                elinewidth=0.8,
                label=f"B={b}, C={c}",
            )
        if len(settings):
            _plain_log_ticks(ax, "y")
            ax.set_xscale("log")
            ax.legend(title="fixed (B, C)", loc="best")
        else:
            ax.text(
                0.5, 0.5, "no (B, C) with two or more emerged model sizes",
                transform=ax.transAxes, ha="center",
            )  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel("parameters N (log scale)")
        ax.set_ylabel("emergence point (updates)")
        c, ci = fit.get("c"), fit.get("c_ci")
        size = (
            f"size coefficient c = {c:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] (log10 U per log10 N)"
            if c is not None and ci
            else "size coefficient: not fitted"
        )
        ax.set_title(f"Model size: {size}\n(paper: no dependence, c = 0)")
        return save_figure(fig, out_stem)


def plot_law_fit(emergence: pd.DataFrame, fit: dict, out_stem) -> list[Path]:
    """Predicted vs observed emergence point (updates), identity line, fitted law printed."""
    done = emerged_runs(emergence)
    done = done[done["run_id"].astype(str).isin(fit["run_ids"])] if "run_ids" in fit else done
    with figure_style():
        # The fitted law gets a panel of its own beside the points, so it hides none of them.
        fig = new_figure(7.4, 4.0)
        ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        side.axis("off")
        if fit.get("ok"):
            _plot_law_points(ax, done, fit)
            side.text(0.0, 1.0, _law_text(fit, emergence), transform=side.transAxes, va="top",
                      family="monospace")  # fmt: skip
        else:
            ax.text(
                0.5,
                0.5,
                "law not fitted:\n"
                + textwrap.fill(str(fit.get("reason", "")), 40)
                + "\n"
                + _left_out_text(fit, emergence),
                transform=ax.transAxes,
                ha="center",
                va="center",
            )
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel("predicted emergence point (updates)")
        ax.set_ylabel("observed emergence point (updates)")
        ax.set_title(_emerged_summary(emergence))
        return save_figure(fig, out_stem)


# The line where a run's curves end when it did not train to its budget.
ENDING_STYLE = {
    "stopped_early": {"color": PALETTE[4], "ls": ":", "lw": 1.5},
    "diverged": {"color": PALETTE[3], "ls": "-.", "lw": 1.2},
}


def outcomes(table: pd.DataFrame) -> pd.Series:
    """Each row's ``outcome`` ("completed" where the column or the value is missing)."""
    if "outcome" not in table:
        return pd.Series("completed", index=table.index, dtype=object)
    return table["outcome"].where(table["outcome"].notna(), "completed").astype(str)


def emerged_runs(emergence: pd.DataFrame) -> pd.DataFrame:
    """The runs drawn as emergence points: emerged and not diverged."""
    if not len(emergence):
        return emergence
    keep = emergence["emerged"].astype(bool) & (outcomes(emergence) != "diverged")
    return emergence[keep]


def run_ending(run: pd.DataFrame, row=None) -> dict:
    """How one run's training ended, from its emergence row (``row``, may be None) or else its
    model table: ``outcome``, ``detail``, ``tokens`` (where it stopped; 0 when unknown) and
    ``label``, the panel title's suffix ("" for a completed run)."""

    def get(key, default):
        for source in (row, run.iloc[0] if len(run) else None):
            if source is not None and key in source and not _missing(source[key]):
                return source[key]
        return default

    outcome, detail = str(get("outcome", "completed")), str(get("outcome_detail", ""))
    trained = pd.to_numeric(run["tokens"], errors="coerce").max() if len(run) else 0
    tokens = float(trained) if np.isfinite(trained) else 0.0
    label = ""
    if outcome == "stopped_early":
        label = f"stopped early at {format_tokens(tokens)}"
    elif outcome == "diverged":
        step = re.search(r"\bat step (\d+)", detail)
        per_step = _tokens_per_step(run)
        if step and per_step:
            tokens = float(step.group(1)) * per_step  # where the loss went, past the checkpoint
        label = (
            f"diverged at {format_tokens(tokens)}"
            if tokens > 0
            else "diverged before its first checkpoint"
        )
    return {"outcome": outcome, "detail": detail, "tokens": tokens, "label": label}


def _tokens_per_step(run: pd.DataFrame) -> float | None:
    if not len(run) or not {"batch_size", "context_size"} <= set(run.columns):
        return None
    value = float(run["batch_size"].iloc[0]) * float(run["context_size"].iloc[0])
    return value if np.isfinite(value) and value > 0 else None


def _missing(value) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


# --- helpers -------------------------------------------------------------------------------


def _single_value(table: pd.DataFrame, column: str, default: str) -> str:
    if column not in table or not len(table):
        return default
    values = table[column].dropna().unique()
    return str(values[0]) if len(values) == 1 else default


def _run_label(row, run_id, varying: set) -> str:
    """Model, B and C, plus data and seed when those vary between runs."""
    if row is None or "batch_size" not in row:
        return str(run_id)
    label = f"{row['model']}  B={row['batch_size']}  C={row['context_size']}"
    if "seed" in varying:
        label += f"  seed {row['seed']}"
    return f"{row['data']}: {label}" if "data" in varying else label


def _label_outer(axes, n_used: int, ncols: int) -> None:
    """Hide unused panels; axis labels on the left column and on the lowest panel per column."""
    for i, ax in enumerate(axes):
        if i >= n_used:
            ax.set_visible(False)
            continue
        if i % ncols == 0:
            ax.set_ylabel("score (0 to 1)")
        if i + ncols >= n_used:  # nothing drawn below this panel
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("tokens seen (log scale)")


def _mark_emergence(ax, row, ending: dict | None = None) -> None:
    diverged = ending is not None and ending["outcome"] == "diverged"
    if bool(row["emerged"]) and not diverged:
        ax.axvspan(row["tokens_lo"], row["tokens_hi"], color=POINT_COLOUR, alpha=0.25, lw=0)
        ax.axvline(row["tokens_pt"], color=POINT_COLOUR, lw=1.2)
    else:
        # The reason's first clause says which rule fired; the rest is in the CSV.
        reason = str(row["reason"]).split(":")[0]
        text = "no transition\n" + textwrap.fill(reason, 34)
        if diverged:  # not "no transition": the run said nothing about emergence
            text = "diverged\n" + textwrap.fill(ending["detail"], 34)
        ax.text(
            0.04,
            0.95,
            text,
            transform=ax.transAxes,
            va="top",
            fontsize=7,
            color="0.2",
        )


def _models_by_size(emergence: pd.DataFrame) -> list[str]:
    if not len(emergence):
        return []
    sizes = emergence.groupby("model")["n_params"].first().sort_values(kind="stable")
    return [str(m) for m in sizes.index]


def _plot_vs(ax, done, x_col, group_col, group_name, models, unit: str = "updates") -> None:
    """One colour per level of group_col; markers per model, dodged so that they do not hide."""
    if not len(done):
        ax.text(0.5, 0.5, "no run emerged", transform=ax.transAxes, ha="center")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    levels = sorted(done[group_col].unique())
    # The model with the most runs sits on the grid; the others step left or right of it.
    counts = done["model"].astype(str).value_counts()
    centre = models.index(max(models, key=lambda m: counts.get(m, 0)))
    for i, level in enumerate(levels):
        colour = PALETTE[i % len(PALETTE)]
        sub = done[done[group_col] == level]
        labelled = False
        for j, model in enumerate(models):
            pts = sub[sub["model"].astype(str) == model].sort_values(x_col)
            if not len(pts):
                continue
            dodge = 10 ** (0.03 * (j - centre))
            # The line joins the geometric mean over seeds at each x, per model.
            means = pts.groupby(x_col)[f"{unit}_pt"].apply(lambda u: 10 ** np.mean(np.log10(u)))
            if len(means) > 1:
                ax.plot(means.index * dodge, means.to_numpy(), color=colour, lw=1, alpha=0.8)
            ax.errorbar(
                pts[x_col] * dodge,
                pts[f"{unit}_pt"],
                yerr=_yerr(pts, unit),
                ls="",
                marker=MARKERS[j % len(MARKERS)],
                color=colour,
                capsize=2,
                elinewidth=0.8,
                label=None if labelled else f"{group_name}={level}",
            )
            labelled = True
    ax.set_xscale("log")
    _plain_log_ticks(ax, "y")
    ticks = sorted(done[x_col].unique())
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(mpl.ticker.FixedFormatter([str(t) for t in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(title=f"one line per {group_name}", loc="best")


def _plain_log_ticks(ax, which: str) -> None:
    """Log scale labelled 1, 2, 5 per decade in plain numbers (points span 1-3 decades)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _short_number(v)))
    axis.set_minor_formatter(NullFormatter())


def _short_number(v: float) -> str:
    """500, 2000, 50k, 1.5M: plain numbers with a k / M suffix from ten thousand on."""
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _yerr(pts: pd.DataFrame, unit: str = "updates") -> np.ndarray:
    below = (pts[f"{unit}_pt"] - pts[f"{unit}_lo"]).clip(lower=0)
    above = (pts[f"{unit}_hi"] - pts[f"{unit}_pt"]).clip(lower=0)
    return np.vstack([below.to_numpy(), above.to_numpy()])


def _plot_law_points(ax, done: pd.DataFrame, fit: dict) -> None:
    predicted = predict_updates(fit, done["batch_size"].to_numpy(), done["context_size"].to_numpy())
    contexts = sorted(done["context_size"].unique())
    batches = sorted(done["batch_size"].unique())
    for i, c in enumerate(contexts):
        for j, b in enumerate(batches):
            sel = ((done["context_size"] == c) & (done["batch_size"] == b)).to_numpy()
            if sel.any():
                ax.errorbar(
                    predicted[sel],
                    done["updates_pt"].to_numpy()[sel],
                    yerr=_yerr(done[sel]),
                    ls="",
                    marker=MARKERS[j % len(MARKERS)],
                    color=PALETTE[i % len(PALETTE)],
                    capsize=2,
                    elinewidth=0.8,
                )
    values = np.concatenate([predicted, done["updates_lo"], done["updates_hi"]])
    lo, hi = np.nanmin(values) / 1.5, np.nanmax(values) * 1.5
    ax.plot([lo, hi], [lo, hi], ls="--", color="0.5", lw=1, label="observed = predicted")
    _plain_log_ticks(ax, "x")
    _plain_log_ticks(ax, "y")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    handles = [Line2D([], [], ls="--", color="0.5", label="identity")]
    handles += [
        Patch(color=PALETTE[i % len(PALETTE)], label=f"C={c}") for i, c in enumerate(contexts)
    ]
    handles += [
        Line2D([], [], ls="", marker=MARKERS[j % len(MARKERS)], color="0.3", label=f"B={b}")
        for j, b in enumerate(batches)
    ]
    ax.legend(handles=handles, loc="lower right", ncols=2)


def _left_out_text(fit: dict, emergence: pd.DataFrame) -> str:
    """'left out: k not emerged, d diverged', from the fit (or counted on the table)."""
    if "n_diverged" in fit:
        not_emerged, diverged = fit.get("n_not_emerged", 0), fit["n_diverged"]
    else:  # a fit from before outcomes were recorded
        diverged = int((outcomes(emergence) == "diverged").sum()) if len(emergence) else 0
        not_emerged = len(emergence) - len(emerged_runs(emergence)) - diverged
    return f"left out: {not_emerged} not emerged, {diverged} diverged"


def _law_text(fit: dict, emergence: pd.DataFrame | None = None) -> str:
    def est(name: str, key: str, digits: int = 2) -> str:
        ci = fit.get(f"{key}_ci")
        interval = f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else ""
        return f"{name} = {fit[key]:.{digits}f}{interval}"

    lines = [
        "U = T / (B^a C^b)",
        est("a", "a"),
        est("b", "b"),
        est("log10 T", "log10_T"),
        f"r = {fit['r']:.3f}" if fit.get("r") is not None else "r = n/a",
        f"LOO RMSE = {fit['loo_rmse_log10']:.3f} dex" if fit.get("loo_rmse_log10") else "",
        est("c (log10 N)", "c") if fit.get("c") is not None else "c: not tested",
        f"n = {fit['n_runs']} runs, 95% bootstrap CIs",
        _left_out_text(fit, pd.DataFrame() if emergence is None else emergence),
        f"(paper: a = {PAPER['a']:g}, b = {PAPER['b']:g})",
    ]
    return "\n".join(line for line in lines if line)


def _emerged_summary(emergence: pd.DataFrame) -> str:
    n = len(emergence)
    k = len(emerged_runs(emergence)) if n else 0
    diverged = int((outcomes(emergence) == "diverged").sum()) if n else 0
    metric = _single_value(emergence, "metric", "?")
    method = _single_value(emergence, "method", "?")
    summary = f"{metric}, {method}: {k} of {n} runs emerged"
    if diverged:
        summary += f" ({diverged} diverged)"
    return summary + ("; the others are not shown" if k < n else "")
