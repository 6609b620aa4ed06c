"""Figures of the Markov-data experiments (docs/method.md#data-families), in
``ihsweep.figures.style``.

- ``plot_frontier``: experiment 2's (f, r) grid, each cell coloured by its emergence point
  (log tokens) or hatched grey with "none", the frontier staircase over it, cells that break
  monotonicity outlined, and the sensitivity verdict in the title.
- ``plot_property_grid``: experiment 3, one panel per (f, r) setting; rows are the D x C
  combinations, columns the marginals, each cell showing its emergence point or "none".
- ``plot_generator_stats``: measured against requested f and r per dataset, with the identity
  line, so a generator that misses its requests is visible at a glance.

Cells are drawn on an index grid (every cell the same size, ticks labelled with the grid
values) rather than at their (f, r) values: grids mix near-zero cells with 0.1-spaced ones, and
equal cells keep every label readable. The staircase from ``frontier.pareto_frontier`` is in
cell-edge coordinates and maps exactly onto that index grid (edge k -> k - 0.5).

Diverged runs: a cell table with an ``n_diverged`` column (runs whose training diverged) shows
them. A cell whose every run diverged reads "diverged" on a vermillion-hatched face, not "none"
(it says nothing about whether induction heads form there); a cell with some diverged runs adds
"k diverged" to its label; the titles count them. Without that column (cell tables from
``frontier.cell_outcomes``, which pools outcomes only) the figures are as before.

Emergence points use the sequential, colour-blind-safe ``cividis`` map on a log scale, one
scale per figure, so the same colour means the same token count in every panel. Style, palette
and the deterministic PNG + PDF writer (``figure_style``, ``new_figure``, ``save_figure``) are
shared with ``ihsweep.figures.natural``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ihsweep.analysis.frontier import (
    Frontier,
    format_tokens,
    grid_edges,
    marginal_rank,
    pareto_frontier,
    sensitivity,
)
from ihsweep.figures.style import MARKERS, PALETTE, figure_style, new_figure, save_figure

CMAP = "cividis"
NONE_FACE = "0.93"
NONE_HATCH = "0.72"
FRONTIER_COLOUR = "#000000"
VIOLATION_COLOUR = PALETTE[1]  # vermillion: stands out against cividis and grey
F_LABEL = "frequency f = P(AB...A)"
R_LABEL = "reliability r = P(B | AB...A)"


def plot_frontier(
    cells: pd.DataFrame,
    frontier: Frontier | None,
    out_stem,
    verdict: dict | None = None,
) -> list[Path]:
    """The (f, r) grid coloured by emergence point, with the frontier staircase drawn over it.

    ``cells`` is ``frontier.cell_outcomes``; ``frontier`` and ``verdict`` (``sensitivity``) are
    computed from it when not given.
    """
    frontier = pareto_frontier(cells) if frontier is None else frontier
    verdict = sensitivity(cells) if verdict is None else verdict
    f_values = np.unique(cells["frequency"].to_numpy(dtype=float))
    r_values = np.unique(cells["reliability"].to_numpy(dtype=float))
    norm = _token_norm(cells)
    with figure_style():
        fig = new_figure(4.8, 4.9)
        ax = fig.subplots()
        for row in cells.itertuples(index=False):
            x = int(np.searchsorted(f_values, row.frequency))
            y = int(np.searchsorted(r_values, row.reliability))
            _draw_cell(ax, x, y, row, norm)
        for row in frontier.violations.itertuples(index=False):
            x = int(np.searchsorted(f_values, row.frequency))
            y = int(np.searchsorted(r_values, row.reliability))
            ax.add_patch(_outline(x, y, VIOLATION_COLOUR, lw=1.8, ls="--"))
        _draw_staircase(ax, frontier.staircase, f_values, r_values)
        _index_axis(ax, "x", f_values, F_LABEL)
        _index_axis(ax, "y", r_values, R_LABEL)
        ax.set_aspect("equal")
        ax.grid(False)
        _colorbar(fig, ax, norm)
        handles = _frontier_handles(frontier) + _diverged_handles(cells)
        fig.legend(handles=handles, loc="outside lower center", ncols=1)
        n_up = int(cells["emerged"].astype(bool).sum())
        # Short lines only: the verdict's reason is a paragraph, which the setting's findings on
        # the front page carry (as a title it ran past the figure's edges).
        fig.suptitle(
            f"Where IHs form: {n_up} of {len(cells)} (f, r) cells emerged{_diverged_note(cells)}"
            f"\nmore sensitive to: {verdict['verdict']}"
        )
        return save_figure(fig, out_stem)


def plot_property_grid(table: pd.DataFrame, out_stem) -> list[Path]:
    """Experiment 3: per (f, r) setting, emergence point (or "none") per D x C x marginal cell.

    ``table`` is ``frontier.property_table``.
    """
    settings = sorted({(float(f), float(r)) for f, r in zip(*_fr(table), strict=True)})
    combos = sorted(
        {(bool(d), bool(c)) for d, c in zip(table["dependency"], table["categorial"], strict=True)},
        reverse=True,  # +D +C first, -D -C last
    )
    marginals = sorted({str(m) for m in table["marginal"]}, key=lambda m: (marginal_rank(m), m))
    norm = _token_norm(table)
    n = max(len(settings), 1)
    ncols = min(3, int(np.ceil(np.sqrt(n))))
    nrows = -(-n // ncols)
    with figure_style():
        fig = new_figure(0.75 * len(marginals) * ncols + 1.6, 0.42 * len(combos) * nrows + 1.5)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for i, ax in enumerate(axes):
            if i >= len(settings):
                ax.set_visible(False)
                continue
            f, r = settings[i]
            panel = table[np.isclose(table["frequency"], f) & np.isclose(table["reliability"], r)]
            _property_panel(ax, panel, combos, marginals, norm)
            ax.set_title(f"f = {f:g}, r = {r:g}")
            if i % ncols:
                ax.set_yticklabels([])
        _colorbar(fig, axes[: len(settings)].tolist(), norm)
        # What D, C and the hatching mean is in the caption (workflow/report/properties.rst).
        fig.suptitle("Emergence point by data property (tokens)" + _diverged_note(table))
        return save_figure(fig, out_stem)


def plot_generator_stats(stats: pd.DataFrame, out_stem) -> list[Path]:
    """Measured vs requested f and r, one point per dataset, identity line.

    ``stats`` columns: ``frequency``, ``reliability`` (requested), ``measured_frequency``,
    ``measured_reliability``, and optionally ``generator`` (one colour and marker each).
    """
    needed = ["frequency", "reliability", "measured_frequency", "measured_reliability"]
    missing = [c for c in needed if c not in stats.columns]
    if missing:
        raise ValueError(f"generator stats lack columns {missing}")
    groups = (
        sorted(stats["generator"].astype(str).unique()) if "generator" in stats else ["datasets"]
    )
    with figure_style():
        fig = new_figure(6.4, 3.5)
        axes = fig.subplots(1, 2)
        for ax, knob, label in zip(
            axes, ("frequency", "reliability"), (F_LABEL, R_LABEL), strict=True
        ):
            _requested_vs_measured(ax, stats, knob, groups)
            ax.set_xlabel(f"requested {label}")
            ax.set_ylabel(f"measured {knob}")
        handles = [Line2D([], [], ls="--", color="0.5", label="measured = requested")]
        note = "; generators dodged sideways" if len(groups) > 1 else ""
        if len(groups) > 1:
            handles += [
                Line2D(
                    [],
                    [],
                    ls="",
                    marker=MARKERS[i % len(MARKERS)],
                    color=PALETTE[i % len(PALETTE)],
                    fillstyle="none",
                    label=g,
                )
                for i, g in enumerate(groups)
            ]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
        fig.suptitle(f"Measured vs requested f and r ({len(stats)} datasets{note})")
        return save_figure(fig, out_stem)


# --- helpers -------------------------------------------------------------------------------


def _fr(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return table["frequency"].to_numpy(dtype=float), table["reliability"].to_numpy(dtype=float)


def _token_norm(table: pd.DataFrame) -> LogNorm | None:
    """One log colour scale over the emerged cells; None when no cell emerged."""
    tokens = table.loc[table["emerged"].astype(bool), "tokens_pt"].to_numpy(dtype=float)
    tokens = tokens[np.isfinite(tokens) & (tokens > 0)]
    if not len(tokens):
        return None
    lo, hi = float(tokens.min()), float(tokens.max())
    if hi / lo < 2:  # a near-constant scale would paint one cell black and the next yellow
        mid = (lo * hi) ** 0.5
        lo, hi = mid / 1.5, mid * 1.5
    return LogNorm(vmin=lo, vmax=hi)


def _n_diverged(row) -> int:
    value = getattr(row, "n_diverged", 0)
    return 0 if value is None or pd.isna(value) else int(value)


def _diverged_note(cells: pd.DataFrame) -> str:
    """' (k runs diverged)' when a cell table counts diverged runs and some did, else ''."""
    if "n_diverged" not in cells:
        return ""
    k = int(pd.to_numeric(cells["n_diverged"], errors="coerce").fillna(0).sum())
    return f" ({k} run{'s' if k != 1 else ''} diverged)" if k else ""


def _diverged_handles(cells: pd.DataFrame) -> list:
    if "n_diverged" not in cells or not (cells["n_diverged"].fillna(0) > 0).any():
        return []
    return [
        Patch(
            facecolor=NONE_FACE,
            edgecolor=VIOLATION_COLOUR,
            hatch="xx",
            lw=0,
            label="every run diverged (says nothing about emergence)",
        )
    ]


def _draw_cell(ax, x: int, y: int, row, norm: LogNorm | None) -> None:
    """A unit square at (x, y): coloured with its emergence point, or hatched with "none" (or
    "diverged" when every run of the cell diverged: ``n_runs``, the runs that vote, is 0)."""
    emerged = bool(row.emerged) and norm is not None and np.isfinite(row.tokens_pt)
    diverged = _n_diverged(row)
    if not emerged and row.n_runs == 0 and diverged > 0:
        _hatched_square(ax, x, y, VIOLATION_COLOUR, "xx")
        text, colour = "diverged", VIOLATION_COLOUR
    elif emerged:
        face = mpl.colormaps[CMAP](norm(row.tokens_pt))
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, lw=0))
        text, colour = format_tokens(row.tokens_pt), _text_colour(face)
    else:
        _hatched_square(ax, x, y, NONE_HATCH, "///")
        text, colour = "none", "0.15"
    ax.add_patch(_outline(x, y, "white", lw=1.0))
    if row.n_runs > 1 and 0 < row.n_emerged < row.n_runs:
        text += f"\n{row.n_emerged}/{row.n_runs} seeds"  # a split cell: show the vote
    if diverged > 0 and row.n_runs > 0:
        text += f"\n{diverged} diverged"
    # On hatching, a plain background behind the text keeps it legible.
    box = None if emerged else {"facecolor": NONE_FACE, "edgecolor": "none", "pad": 0.6}
    ax.text(x, y, text, ha="center", va="center", fontsize=6.5, color=colour, bbox=box, zorder=6)


def _hatched_square(ax, x: int, y: int, edge, hatch: str) -> None:
    # lw=0 hides the border, not the hatch; the hatch takes the edge colour.
    ax.add_patch(
        Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=NONE_FACE, edgecolor=edge, hatch=hatch, lw=0)
    )


def _text_colour(face) -> str:
    # Relative luminance (ITU-R BT.601 weights): dark text on the light end of cividis.
    lum = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2]
    return "black" if lum > 0.5 else "white"


def _outline(x: int, y: int, colour, lw: float, ls: str = "-") -> Rectangle:
    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor=colour, lw=lw, ls=ls, zorder=3)


def _draw_staircase(ax, staircase: pd.DataFrame, f_values, r_values) -> None:
    if not len(staircase):
        return
    # Edge k of the value grid is index k - 0.5; interpolation maps every edge exactly.
    x = np.interp(staircase["frequency"], grid_edges(f_values), np.arange(len(f_values) + 1) - 0.5)
    y = np.interp(
        staircase["reliability"], grid_edges(r_values), np.arange(len(r_values) + 1) - 0.5
    )
    # A white underlay keeps the black line visible on the darkest cells.
    ax.plot(x, y, color="white", lw=4.2, solid_joinstyle="miter", zorder=4, clip_on=False)
    ax.plot(x, y, color=FRONTIER_COLOUR, lw=2.2, solid_joinstyle="miter", zorder=5, clip_on=False)


def _index_axis(ax, which: str, values, label: str) -> None:
    ticks = np.arange(len(values))
    getattr(ax, f"set_{which}ticks")(ticks, [f"{v:g}" for v in values])
    getattr(ax, f"set_{which}lim")(-0.5, len(values) - 0.5)
    getattr(ax, f"set_{which}label")(label)
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)


def _colorbar(fig, ax, norm: LogNorm | None) -> None:
    if norm is None:
        return
    bar = fig.colorbar(
        ScalarMappable(norm=norm, cmap=mpl.colormaps[CMAP]), ax=ax, shrink=0.8, pad=0.03
    )
    bar.set_label("emergence point (tokens)\nmedian of emerged seeds")
    # Emergence points often span less than a decade; denser ticks keep the bar labelled.
    decades = np.log10(norm.vmax / norm.vmin)
    subs = (1.0,) if decades > 3 else (1.0, 2.0, 5.0) if decades > 1 else (1.0, 2.0, 3.0, 5.0, 7.0)
    bar.ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_tokens(v)))
    bar.ax.yaxis.set_minor_formatter(NullFormatter())


def _frontier_handles(frontier: Frontier) -> list:
    frontier_label = (
        "frontier: lower-left edge of the emerging cells"
        if len(frontier.staircase)
        else "no frontier: no cell emerged"
    )
    handles = [
        Line2D([], [], color=FRONTIER_COLOUR, lw=2.2, label=frontier_label),
        Patch(
            facecolor=NONE_FACE,
            edgecolor=NONE_HATCH,
            hatch="///",
            lw=0,
            label="no emergence within the budget (seed majority)",
        ),
    ]
    if not frontier.monotone:
        handles.append(
            Patch(
                fill=False,
                edgecolor=VIOLATION_COLOUR,
                ls="--",
                lw=1.5,
                label="no emergence, yet inside the region (non-monotone)",
            )
        )
    return handles


def _property_panel(ax, panel: pd.DataFrame, combos, marginals, norm) -> None:
    for y, (d, c) in enumerate(combos):
        for x, marginal in enumerate(marginals):
            sel = (
                (panel["dependency"].astype(bool) == d)
                & (panel["categorial"].astype(bool) == c)
                & (panel["marginal"].astype(str) == marginal)
            )
            if sel.any():
                _draw_cell(ax, x, y, next(panel[sel].itertuples(index=False)), norm)
            else:
                ax.text(x, y, "not run", ha="center", va="center", fontsize=6, color="0.6")
    ax.set_xticks(range(len(marginals)), marginals)
    ax.set_yticks(
        range(len(combos)), [f"{'+' if d else '-'}D {'+' if c else '-'}C" for d, c in combos]
    )
    ax.set_xlim(-0.5, len(marginals) - 0.5)
    ax.set_ylim(len(combos) - 0.5, -0.5)  # +D +C on top
    ax.tick_params(length=0)
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)


def _requested_vs_measured(ax, stats: pd.DataFrame, knob: str, groups: list[str]) -> None:
    requested = stats[knob].to_numpy(dtype=float)
    measured = stats[f"measured_{knob}"].to_numpy(dtype=float)
    labels = stats["generator"].astype(str).to_numpy() if "generator" in stats else None
    for i, group in enumerate(groups):
        sel = labels == group if labels is not None else np.ones(len(stats), dtype=bool)
        # Many datasets share a requested value; open markers, and a small sideways dodge per
        # generator, keep overlapping points visible.
        dodge = 0.012 * (i - (len(groups) - 1) / 2)
        ax.plot(
            requested[sel] + dodge,
            measured[sel],
            ls="",
            marker=MARKERS[i % len(MARKERS)],
            color=PALETTE[i % len(PALETTE)],
            fillstyle="none",
            markersize=4.5,
        )
    ax.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1, zorder=0)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_aspect("equal")
    # The worst miss per generator: the number a reader checks against the method's tolerance
    # (docs/method.md#semi-natural-markov-data-frequency-and-reliability).
    misses = []
    for group in groups:
        sel = labels == group if labels is not None else np.ones(len(stats), dtype=bool)
        error = np.abs(measured[sel] - requested[sel])
        misses.append(f"{group} {np.nanmax(error):.3f}" if np.isfinite(error).any() else "n/a")
    # One line per generator at most: a long list would run past the panel's edges.
    ax.set_title(f"{knob}: largest miss\n" + "\n".join(misses))
