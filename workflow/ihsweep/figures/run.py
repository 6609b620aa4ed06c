"""One run's figure: its probe curves and its per-head prefix-matching heat map (SPEC section 1).

``plot_run``; the command is ``python -m ihsweep.steps.run_figure``.

Left: max-over-heads prefix-matching score (PS), max-over-heads logit attribution (LA) and
associative-recall accuracy (AR) against tokens seen (log axis), with train and validation loss
on the right axis, and the run's emergence point (``ihsweep.analysis.emergence.run_point`` with
the study's settings, so it is the point of the aggregate tables) and its interval. Right: PS of
every (layer, head) at every checkpoint, so one sees which heads became induction heads and
when. Writes ``<out>.png`` and ``<out>.pdf`` (``ihsweep.figures.style.save_figure``:
byte-identical reruns) and ``provenance.json`` beside them (``ihsweep.provenance``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ihsweep.analysis.frontier import format_tokens
from ihsweep.figures import style

CURVES = [
    ("ps_max", "PS (max over heads)"),
    ("la_max", "LA (max over heads)"),
    ("ar_acc", "AR accuracy"),
]
LOSS_COLOURS = {"train_loss": "0.45", "val_loss": "0.15"}


def plot_run(model: pd.DataFrame, heads: pd.DataFrame, point: dict, metric: str, out_stem):
    """The two panels for one run; ``point`` is ``emergence.detect``'s result."""
    model = model[model["tokens"] > 0].sort_values("tokens")
    heads = heads[heads["tokens"] > 0]
    first = model.iloc[0]
    with style.figure_style():
        fig = style.new_figure(7.6, 3.1)
        left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
        for i, (column, label) in enumerate(CURVES):
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
        left.set_xscale("log")
        left.set_ylim(-0.03, 1.05)
        left.set_xlabel("tokens seen (log scale)")
        left.set_ylabel("score (0 to 1)")
        handles = left.get_lines()[: len(CURVES)] + loss_ax.get_lines()
        left.legend(handles=handles, loc="upper left", fontsize=6)
        _heatmap(fig, right, heads)
        verdict = (
            f"emerged at {format_tokens(point['tokens_pt'])} tokens"
            if point["emerged"]
            else "no transition within the budget"
        )
        label = style.METRIC_LABELS.get(metric, metric)
        fig.suptitle(f"{first['run_id']}: {verdict} ({label}, {point['method']})")
        return style.save_figure(fig, out_stem)


def _mark(ax, point: dict) -> None:
    if point["emerged"]:
        span = (point["tokens_lo"], point["tokens_hi"])
        ax.axvspan(*span, color=style.POINT_COLOUR, alpha=0.2, lw=0)
        ax.axvline(point["tokens_pt"], color=style.POINT_COLOUR, lw=1.2)


def _heatmap(fig, ax, heads: pd.DataFrame) -> None:
    grid = heads.pivot_table(index=["layer", "head"], columns="tokens", values="ps")
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
