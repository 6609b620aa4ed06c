"""One run's figure: its probe curves and its per-head prefix-matching heat map
(docs/method.md#prefix-matching-score-ps).

``plot_run``; the command is ``python -m ihsweep.steps.run_figure``.

Left: max-over-heads prefix-matching score (PS), max-over-heads logit attribution (LA) and
associative-recall accuracy (AR) against tokens seen (log axis), with train and validation loss
on the right axis, and the run's emergence point (``ihsweep.analysis.emergence.run_point`` with
the study's settings, so it is the point of the aggregate tables) and its interval. Right: PS of
every (layer, head) at every checkpoint, so one sees which heads became induction heads and
when. Writes ``<out>.png`` and ``<out>.pdf`` (``ihsweep.figures.style.save_figure``:
byte-identical reruns) and ``provenance.json`` beside them (``ihsweep.report.provenance``).

How the run ended comes from its model table's ``outcome`` columns (``completed`` when the
table predates them): a run stopped early once its emergence was confirmed, or one that
diverged, ends at a line where it stopped, and the title says "stopped early at 3M
tokens (budget 10M)" or "diverged at 1.2M tokens: <detail>". A diverged run is never given an
emergence point; one that diverged before its first checkpoint (a single row at 0 tokens, NaN
metrics) gets empty panels that say so. The emergence point the law predicted for the run
(``predicted_tokens``, when recorded) is a dashed line.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from ihsweep.analysis.frontier import format_tokens
from ihsweep.figures import style
from ihsweep.figures.natural import ENDING_STYLE, run_ending
from ihsweep.probing.metrics import CURVE_LABELS

CURVES = list(CURVE_LABELS.items())
LOSS_COLOURS = {"train_loss": "0.45", "val_loss": "0.15"}


def plot_run(model: pd.DataFrame, heads: pd.DataFrame, point: dict, metric: str, out_stem):
    """The two panels for one run; ``point`` is ``emergence.detect``'s result."""
    whole = model
    model = model[model["tokens"] > 0].sort_values("tokens")
    heads = heads[heads["tokens"] > 0]
    first = whole.iloc[0]
    ending = run_ending(whole)
    if _diverged(ending):
        point = {**point, "emerged": False}  # a diverged run has no emergence point
    with style.figure_style():
        fig = style.new_figure(7.6, 3.1)
        left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
        drawn = 0
        for i, (column, label) in enumerate(CURVES):
            if column not in model:  # a table from before this score existed
                continue
            drawn += 1
            ax_line = left.plot(
                model["tokens"], model[column], marker="o", color=style.PALETTE[i], label=label
            )
            if column == metric:
                ax_line[0].set_linewidth(2.0)
        loss_ax = left.twinx()
        for column, colour in LOSS_COLOURS.items():
            if column in model and model[column].notna().any():
                loss_ax.plot(
                    model["tokens"], model[column], color=colour, ls=":", lw=1,
                    label=column.replace("_", " "),
                )  # fmt: skip
        loss_ax.set_ylabel("loss (nats per token)")
        loss_ax.spines["right"].set_visible(True)
        loss_ax.grid(False)
        _mark(left, point)
        extra = _mark_ending(left, ending, _predicted(whole))
        left.set_xscale("log")
        left.set_ylim(-0.03, 1.05)
        left.set_xlabel("tokens seen (log scale)")
        left.set_ylabel("score (0 to 1)")
        if not len(model):
            left.set_xlim(*_empty_xlim(whole, ending))
            empty = "no checkpoint" + (" before it diverged" if _diverged(ending) else "")
            left.text(0.5, 0.5, empty, transform=left.transAxes, ha="center")
        handles = left.get_lines()[:drawn] + loss_ax.get_lines() + extra
        # Below the axes, not on them: inside, it hid the loss curves' start.
        fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=6)
        _heatmap(fig, right, heads)
        if _diverged(ending):
            verdict = ending["label"] + (" tokens" if ending["tokens"] > 0 else "")
            verdict += f": {ending['detail']}" if ending["detail"] else ""
        else:
            verdict = (
                f"emerged at {format_tokens(point['tokens_pt'])} tokens"
                if point["emerged"]
                else "no transition within the budget"
            )
            if ending["outcome"] == "stopped_early":
                verdict += f", {ending['label']} tokens" + _budget(whole)
        label = style.METRIC_LABELS.get(metric, metric)
        # Wrapped to the figure's width: a divergence's detail would run past its edges.
        verdict = textwrap.fill(f"{first['run_id']}: {verdict}", 90)
        fig.suptitle(f"{verdict}\n({label}, {point['method']})")
        return style.save_figure(fig, out_stem)


def _diverged(ending: dict) -> bool:
    return ending["outcome"] == "diverged"


def _predicted(model: pd.DataFrame) -> float | None:
    if "predicted_tokens" not in model or not len(model):
        return None
    value = pd.to_numeric(model["predicted_tokens"], errors="coerce").iloc[0]
    return float(value) if np.isfinite(value) and value > 0 else None


def _budget(model: pd.DataFrame) -> str:
    budget = pd.to_numeric(model["budget"], errors="coerce").max() if "budget" in model else None
    return f" (budget {format_tokens(budget)})" if budget is not None and budget > 0 else ""


def _mark_ending(ax, ending: dict, predicted: float | None) -> list:
    """A line where a stopped-early or diverged run ended, a dashed one at the law's
    predicted point; returns their legend handles."""
    handles = []
    lo = ax.dataLim.x0 if ax.dataLim.width > 0 else 0.0  # inside the drawn checkpoints' range
    if ending["outcome"] in ENDING_STYLE and ending["tokens"] >= lo and ending["tokens"] > 0:
        handles += [
            ax.axvline(ending["tokens"], **ENDING_STYLE[ending["outcome"]],
                       label=ending["outcome"].replace("_", " "))
        ]  # fmt: skip
    if predicted is not None:
        handles.append(ax.axvline(predicted, color="0.5", ls="--", lw=1, label="law's prediction"))
    return handles


def _empty_xlim(model: pd.DataFrame, ending: dict) -> tuple[float, float]:
    """An x range for a run without checkpoints: up to its budget (or where it ended)."""
    budget = pd.to_numeric(model["budget"], errors="coerce").max() if "budget" in model else 0
    hi = max(float(budget) if np.isfinite(budget) else 0.0, ending["tokens"], 10.0)
    return hi / 1e3, hi


def _mark(ax, point: dict) -> None:
    if point["emerged"]:
        span = (point["tokens_lo"], point["tokens_hi"])
        ax.axvspan(*span, color=style.POINT_COLOUR, alpha=0.2, lw=0)
        ax.axvline(point["tokens_pt"], color=style.POINT_COLOUR, lw=1.2)


def _heatmap(fig, ax, heads: pd.DataFrame) -> None:
    grid = heads.pivot_table(index=["layer", "head"], columns="tokens", values="ps")
    if grid.empty:  # diverged before its first checkpoint: nothing was probed
        ax.text(0.5, 0.5, "no checkpoint probed", transform=ax.transAxes, ha="center")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("prefix-matching score per head")
        ax.grid(False)
        return
    image = ax.imshow(
        grid.to_numpy(), aspect="auto", cmap="cividis", vmin=0, vmax=1, interpolation="nearest"
    )
    ax.set_yticks(range(len(grid.index)), [f"L{layer} H{head}" for layer, head in grid.index])
    tokens = grid.columns.to_numpy()
    ticks = np.unique(np.linspace(0, len(tokens) - 1, min(6, len(tokens))).round().astype(int))
    ax.set_xticks(ticks, [format_tokens(tokens[t]) for t in ticks])
    ax.set_xlabel("checkpoint (tokens seen)")
    ax.set_title("prefix-matching score per head")
    ax.grid(False)
    fig.colorbar(image, ax=ax, label="PS", shrink=0.9)
