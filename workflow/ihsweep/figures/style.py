"""The one figure style of the package: palette, markers, rc settings and reproducible saving.

Style: the Okabe-Ito colour-blind-safe palette, 8-point text, units on every axis. Figures are
built on matplotlib's ``Figure`` with the Agg canvas directly (no pyplot), so importing this
module never changes the caller's backend or leaks open figures. ``save_figure`` writes
``<out_stem>.png`` and ``<out_stem>.pdf`` with the timestamp and software metadata removed, so
rerunning on the same input gives byte-identical files.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import matplotlib as mpl
from cycler import cycler
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ihsweep.probing.metrics import EMERGENCE_METRICS

# Okabe & Ito (2008), reordered so that the first colours are the most distinct on white;
# yellow comes last because it is faint on a white background.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
POINT_COLOUR = "#009E73"

STYLE = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "axes.prop_cycle": cycler(color=PALETTE),
    "legend.frameon": False,
    "savefig.dpi": 200,
    "pdf.fonttype": 42,  # embed TrueType, so text in the PDF stays editable
}

METRIC_LABELS = EMERGENCE_METRICS


@contextmanager
def figure_style():
    with mpl.rc_context(STYLE):
        yield


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, out_stem) -> list[Path]:
    stem = Path(out_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, pdf = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")
    # Software and dates are the only varying bytes; dropping them makes reruns identical.
    fig.savefig(png, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "ModDate": None})
    return [png, pdf]
