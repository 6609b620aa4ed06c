"""The report's front page: what this study found, beside what the paper found.

Each aggregate step ends by writing its experiments' findings as reStructuredText,
``findings.rst`` in its folder (``write_findings``), from the tables it has just written; the
report's front page (workflow/report/workflow.rst) includes them before anything else. Every
statement is computed from those tables with the analysis modules' own results, not recomputed:
the law fit of ``lawfit.fit_law`` (lawfit.json), the frontier cells and sensitivity verdict per
setting (frontier.json: ``Frontier.summary`` and ``frontier.sensitivity``), the cell outcomes
(cells.csv: ``frontier.cell_outcomes``), and the experiment-3 cells of
``frontier.property_table`` over the synthetic runs of emergence.csv. The only findings written
down here are the paper's, in ``PAPER``. An experiment the study does not run, or whose runs
are too few (or too uniform) to fit or compare, says so in words, and each paragraph links to
its detailed page in the report (``name``_ references resolve against the targets Snakemake's
report defines for its results, by file name).

- **Experiment 1.** The fitted law ``U_pt = T / (B^a C^b)``: a and b with their 95% bootstrap
  intervals and r, next to the paper's values (and whether each lies inside the interval); the
  model-size coefficient c of the extended fit (the paper: none); how many runs the fit used
  and what it left out (``tables.left_out``), and how seeds enter (each run one observation).
- **Experiment 2.** Per (f, r) setting over a bigram chain: the cells where IHs emerged (a cell
  emerges when a strict majority of its runs do), the frontier as its minimal cells, whether
  every cell of the region above it emerged, and the two sensitivity verdicts (whether and
  when IHs form) with their measures and intervals ("undecided" and "undetermined" shown as
  such), against the paper's "reliability".
- **Experiment 3.** Per (f, r) cell of the synthetic chains: which chains (+D/-D, +C/-C,
  marginal) formed IHs; then the paper's three claims judged on those cells: -D never forms
  IHs, high f and r suffice (every +D chain at the highest cell), and near the frontier only
  Zipfian, categorial data forms IHs: at the paper's cell (``PAPER["near_frontier_cell"]``)
  when the study has it, otherwise at the study's own edge, the lowest cells where any chain
  formed IHs.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType

import pandas as pd

from ihsweep.analysis import frontier
from ihsweep.analysis.markov import SETTING_KEYS
from ihsweep.files import layout
from ihsweep.files.io import RERUN, atomic_path, read_json_file
from ihsweep.report import rst, trained
from ihsweep.report.families import family_findings
from ihsweep.report.tables import left_out

# The paper's results (Aoyama, Wilcox and Schneider, arXiv 2511.16893;
# docs/method.md#the-law-and-its-fit, #the-pareto-frontier and #data-families): the only findings
# not computed from this study's tables.
PAPER = MappingProxyType(
    {
        "a": 0.37,
        "b": 0.62,
        "r": 0.98,
        "c": 0.0,  # no model-size dependence, 50M to 7B parameters
        "model_size": "no dependence on model size (50M to 7B parameters)",
        "frontier": "IHs form only above an effective Pareto frontier in the (f, r) plane",
        "sensitivity": "reliability",  # the axis emergence is more sensitive to
        "dependency": "+D is necessary: -D (i.i.d.) data never forms IHs",
        "sufficient": "high f and r are sufficient",
        "near_frontier_cell": (0.1, 0.3),
        "near_frontier": "near the frontier (f = 0.1, r = 0.3) only Zipfian, categorial data"
        " forms IHs",
    }
)

LAW = "U_pt = T / (B^a C^b)"
MARGINAL_NAMES = {"zipfian": "Zipfian", "gaussian": "Gaussian", "uniform": "uniform"}
EXPERIMENT_1 = "**Experiment 1: when IHs emerge (natural data).**"
EXPERIMENT_2 = "**Experiment 2: which (f, r) make IHs form (semi-natural Markov data).**"
EXPERIMENT_3 = "**Experiment 3: which data properties make IHs form (synthetic Markov data).**"


# --- experiment 1 --------------------------------------------------------------------------


def law_findings(
    fit: dict | None, emergence: pd.DataFrame | None = None, records: list[dict] | None = None
) -> str:
    """Experiment 1 from a ``lawfit.fit_law`` result (lawfit.json) and, for the seed count,
    the emergence table it was fitted to; ``fit`` None: the study has no natural-data runs.
    With the runs' completion records, it opens with how they were trained."""
    if fit is None:
        return f"{EXPERIMENT_1} Not in this study: no run trains on natural data."
    heading = EXPERIMENT_1 + _trained(records)
    details = f"Details: {rst.link('lawfit.html')}, {rst.link('law_fit.png')}."
    paper = f"a = {PAPER['a']:g}, b = {PAPER['b']:g}, r = {PAPER['r']:g}"
    if not fit.get("ok"):
        return (
            f"{heading} The law {rst.literal(LAW)} was not fitted: "
            + rst.text(f"{fit.get('reason') or 'no fit'}. {_emerged_counts(fit)}")
            + f" (The paper: {paper}.) {details}"
        )
    fitted = ["by least squares on log10 U_pt, with its 95% bootstrap intervals below.",
              left_out(fit), _seeds(fit, emergence)]  # fmt: skip
    if (source := fit.get("exponents_source", "fitted")) != "fitted":  # lawfit.exponents
        log10_T = f"{rst.number(fit['log10_T'])} {rst.interval(fit['log10_T_ci'])}"
        fitted[0] = f"with a and b fixed ({source}), log10 T = {log10_T} fitted on log10 U_pt."
    intro = f"{heading} The law {rst.literal(LAW)}, " + rst.text(" ".join(x for x in fitted if x))
    rows = [
        ["", "this study [95% bootstrap CI]", "the paper"],
        ["a (exponent of B)", *_estimate_and_paper(fit, "a")],
        ["b (exponent of C)", *_estimate_and_paper(fit, "b")],
        ["r (predicted vs observed)", rst.number(fit.get("r")), f"{PAPER['r']:g}"],
        ["c (of log10 N_params)", *_size_and_paper(fit)],
    ]
    return "\n\n".join(x for x in [intro, rst.list_table(rows), _seed_noise(fit), details] if x)


def _seed_noise(fit: dict) -> str:
    """How much of the scatter around the law the seeds alone make (lawfit's seed-noise part)."""
    if fit.get("r_ceiling") is None:
        return ""
    text = (
        f"Runs of one (B, C) cell differ by {rst.number(fit['seed_sd_log10'])} decades (standard"
        f" deviation), so no law of B and C could reach r above {rst.number(fit['r_ceiling'])} on"
        f" these runs; over the {fit['n_cells']} cells' mean log updates the law gives"
        f" r = {rst.number(fit['r_cells'])}."
    )
    if fit.get("lack_of_fit_p") is not None:
        verdict = "more than" if fit["lack_of_fit_p"] < 0.05 else "no more than"
        text += (
            f" The law misses the cells' means by {verdict} the seeds scatter (lack-of-fit"
            f" F = {rst.number(fit['lack_of_fit_F'])}, p = {rst.number(fit['lack_of_fit_p'])})."
        )
    return rst.text(text)


def _emerged_counts(fit: dict) -> str:
    return (
        f"{fit.get('n_runs', 0)} of {fit.get('n_table_runs', '?')} runs emerged;"
        f" {fit.get('n_not_emerged', 0)} had no transition within the budget,"
        f" {fit.get('n_diverged', 0)} diverged."
    )


def _seeds(fit: dict, emergence: pd.DataFrame | None) -> str:
    """How seeds enter the fit (lawfit: each run is one observation), with the seed count."""
    if emergence is None or not len(emergence):
        return "Each run is one observation, whatever its seed."
    runs = emergence[emergence["run_id"].astype(str).isin(fit.get("run_ids") or [])]
    per_cell = runs.groupby(["data", "model", "batch_size", "context_size"])["seed"].nunique()
    most = int(per_cell.max()) if len(per_cell) else 0
    if most <= 1:
        return "One seed per (data, model, B, C) cell."
    return (
        f"Up to {most} seeds per (data, model, B, C) cell, each run one observation (not averaged:"
        " a cell with more seeds weighs more), so r includes seed-to-seed noise, like the paper's"
        " r over single-seed runs."
    )


def _estimate_and_paper(fit: dict, key: str) -> list[str]:
    value, ci, paper = fit.get(key), fit.get(f"{key}_ci"), PAPER[key]
    if value is None:
        return ["not fitted", f"{paper:g}"]
    if not ci:
        fixed = fit.get("exponents_source", "fitted") != "fitted"
        return [f"{rst.number(value)} ({'fixed' if fixed else 'no interval'})", f"{paper:g}"]
    where = "inside" if ci[0] <= paper <= ci[1] else "outside"
    return [f"{rst.number(value)} {rst.interval(ci)}", f"{paper:g} ({where} the interval)"]


def _size_and_paper(fit: dict) -> list[str]:
    """The model-size coefficient c of the extended fit against the paper's c = 0."""
    paper = f"{PAPER['c']:g}, no size effect"
    if fit.get("c") is None:
        return [f"not tested: {fit.get('c_note') or 'no size fit'}", paper]
    if not fit.get("c_ci"):
        return [f"{rst.number(fit['c'])} (no interval)", paper]
    if fit.get("c_excludes_zero"):
        where = "outside the interval: a size effect here"
    else:
        where = "inside the interval"
    return [f"{rst.number(fit['c'])} {rst.interval(fit['c_ci'])}", f"{paper} ({where})"]


# --- experiment 2 --------------------------------------------------------------------------


def frontier_findings(
    runs: pd.DataFrame, cells: pd.DataFrame, fronts: dict, records: list[dict] | None = None
) -> str:
    """Experiment 2 from the Markov aggregate's run table (emergence.csv), cell table
    (cells.csv) and frontier record (frontier.json): one item per setting over a bigram chain.
    With the runs' completion records, it opens with how its runs were trained."""
    bigram = sorted(set(runs.loc[runs["chain_kind"] == "bigram", "grid"].astype(str)))
    if not bigram:
        return f"{EXPERIMENT_2} Not in this study: no run trains on a bigram Markov chain."
    heading = EXPERIMENT_2 + _trained(_of_kind(records, runs, "bigram"))
    stems = set(layout.markov_figures(runs.to_dict("records")))
    items = []
    bigram_cells = cells[cells["grid"].astype(str).isin(bigram)]
    for key, table in bigram_cells.groupby(SETTING_KEYS, sort=True):
        name = layout.setting_name(*key)
        item = f"*{rst.text(name)}*: " + rst.text(_setting(table, fronts.get(name)))
        if f"frontier-{name}" in stems:
            item += f" Details: {rst.link(f'frontier-{name}.png')}."
        items.append(item)
    paper = (
        f"The paper found that {PAPER['frontier']}, and that emergence is more sensitive to"
        f" {PAPER['sensitivity']} than to {_other_axis(PAPER['sensitivity'])}."
    )
    pooled = (
        " A cell emerged when a strict majority of its runs did."
        if (cells["n_runs"] > 1).any()
        else ""
    )
    return "\n\n".join([f"{heading} {rst.text(paper + pooled)}", rst.bullets(items)])


def _setting(table: pd.DataFrame, front: dict | None) -> str:
    """One setting's cells, frontier and verdict, in words."""
    emerged = table[table["emerged"].astype(bool)]
    diverged = table[(table["n_runs"] == 0) & (table.get("n_diverged", 0) > 0)]
    parts = [f"IHs emerged in {len(emerged)} of {len(table)} (f, r) cells"]
    parts[0] += f": {_cells(emerged)}." if len(emerged) else "."
    if len(diverged):
        parts.append(f"Every run diverged in {_cells(diverged)}.")
    if front is None:
        parts.append("A single (f, r) cell: no frontier and no sensitivity verdict.")
        return " ".join(parts)
    if front["frontier"]:
        parts.append(f"Frontier (the minimal emerging cells): {_pairs(front['frontier'])}.")
        if front.get("monotone", True):
            parts.append("Every cell above it emerged, so one frontier separates the grid.")
        else:
            parts.append(
                f"Not monotone: {_pairs(front['violations'])} lie above the frontier but did"
                " not emerge, so no single frontier separates the grid."
            )
    else:
        parts.append("No cell emerged, so there is no frontier.")
    parts.append(_verdict(front.get("sensitivity") or {}))
    if front.get("timing"):
        parts.append(_timing(front["timing"]))
    return " ".join(parts)


def _timing(timing: dict) -> str:
    """The timing-based sensitivity (``frontier.timing_sensitivity``) in words."""
    name, paper = timing["verdict"], PAPER["sensitivity"]
    if name in ("reliability", "frequency"):
        text = f"Emergence is delayed more by less {name} than by less {_other_axis(name)}"
        text += ", as in the paper" if name == paper else f", unlike the paper ({paper})"
    elif name == "undecided":
        text = "When IHs emerge does not decide between the axes (the interval includes 0.5)"
    else:
        text = "No timing verdict"
    return f"{text}: {timing['reason']}."


def _verdict(verdict: dict) -> str:
    """The sensitivity verdict, how it compares with the paper's, and its reason."""
    name, paper = verdict.get("verdict", "undetermined"), PAPER["sensitivity"]
    if name in ("reliability", "frequency"):
        text = f"More sensitive to {name} than to {_other_axis(name)}"
        text += ", as in the paper" if name == paper else f", unlike the paper ({paper})"
    elif name == "undecided":
        text = (
            "Whether IHs form does not decide between the axes (the interval includes 0.5;"
            f" the paper: {paper})"
        )
    else:
        text = f"Sensitivity undetermined (the paper: {paper} matters more)"
    return f"{text}: {verdict['reason']}." if verdict.get("reason") else f"{text}."


def _other_axis(name: str) -> str:
    return "frequency" if name == "reliability" else "reliability"


# --- experiment 3 --------------------------------------------------------------------------


def property_findings(runs: pd.DataFrame, records: list[dict] | None = None) -> str:
    """Experiment 3 from the Markov aggregate's run table (emergence.csv): its synthetic runs
    pooled by ``frontier.property_table`` (every model, B and C of a cell together). With the
    runs' completion records, it opens with how its runs were trained."""
    synthetic = runs[runs["chain_kind"] == "synthetic"]
    if not len(synthetic):
        return f"{EXPERIMENT_3} Not in this study: no run trains on a synthetic Markov chain."
    heading = EXPERIMENT_3 + _trained(_of_kind(records, runs, "synthetic"))
    table = frontier.property_table(synthetic)
    f, r = table["frequency"].astype(float), table["reliability"].astype(float)
    items = []
    for (fv, rv), cell in table.groupby([f, r], sort=True):
        items.append(f"At (f, r) = {_pair(fv, rv)}: " + rst.text(_property_cell(cell)))
    items.reverse()  # the highest (f, r) first
    claims = [_minus_d(table), _sufficient(table), _near_frontier(table)]
    intro = f"{heading} " + rst.text(
        "Chains that formed IHs at each (f, r), every model, B and C of a cell pooled (+D: local"
        " dependency, -D: i.i.d. tokens; +C/-C: categorial or not; then the marginal):"
    )
    return "\n\n".join(
        [intro, rst.bullets(items), "Against the paper:", rst.bullets(claims),
         f"Details: {rst.link('properties.png')}."]
    )  # fmt: skip


def chain_label(row) -> str:
    """``+D+C Zipfian``, ``+D-C uniform``, ``-D Gaussian`` (-D has no categoriality)."""
    marginal = MARGINAL_NAMES.get(str(row["marginal"]).lower(), str(row["marginal"]))
    if not bool(row["dependency"]):
        return f"-D {marginal}"
    return f"+D{'+C' if bool(row['categorial']) else '-C'} {marginal}"


def _property_cell(cell: pd.DataFrame) -> str:
    voting = cell[cell["n_runs"] > 0]
    formed = voting[voting["emerged"].astype(bool)]
    not_formed = voting[~voting["emerged"].astype(bool)]
    parts = []
    if len(formed):
        labels = [f"{chain_label(row)} ({row['label']} tokens)" for _, row in formed.iterrows()]
        parts.append("IHs formed with " + ", ".join(labels))
    else:
        parts.append("no chain formed IHs")
    if len(not_formed) and len(formed):
        parts.append("not with " + _labels(not_formed))
    elif len(not_formed):
        parts[0] += " (" + _labels(not_formed) + ")"
    diverged = cell[cell["n_runs"] == 0]
    if len(diverged):
        parts.append("every run diverged with " + _labels(diverged))
    return "; ".join(parts) + "."


def _minus_d(table: pd.DataFrame) -> str:
    claim = f"*{rst.text(PAPER['dependency'])}*: "
    minus = table[~table["dependency"].astype(bool) & (table["n_runs"] > 0)]
    if not len(minus):
        return claim + rst.text("not tested here (no -D chain with a run that did not diverge).")
    formed = minus[minus["emerged"].astype(bool)]
    if len(formed):
        return claim + rst.text(f"does not hold here: {_labelled_cells(formed)} formed IHs.")
    return claim + rst.text(
        f"holds here: no -D chain formed IHs ({len(minus)} tested, at {_cells(_fr_cells(minus))})."
    )


def _sufficient(table: pd.DataFrame) -> str:
    claim = f"*{rst.text(PAPER['sufficient'])}*: "
    f, r = table["frequency"].astype(float), table["reliability"].astype(float)
    top = table[(f == f.max()) & (r == r.max())]
    plus = top[top["dependency"].astype(bool) & (top["n_runs"] > 0)]
    where = f"at the highest cell, (f, r) = {_pair(f.max(), r.max())}"
    if not len(plus):
        return claim + rst.text(f"not tested here (no +D chain {where}).")
    formed = plus[plus["emerged"].astype(bool)]
    if len(formed) == len(plus):
        return claim + rst.text(f"holds here: all {len(plus)} +D chains formed IHs {where}.")
    missing = plus[~plus["emerged"].astype(bool)]
    return claim + rst.text(
        f"does not hold here: {len(formed)} of {len(plus)} +D chains formed IHs {where}"
        f" (not {_labels(missing)})."
    )


def _near_frontier(table: pd.DataFrame) -> str:
    """The paper's claim judged at its cell when the study has it; otherwise at the study's own
    edge, the minimal (f, r) cells where any synthetic chain formed IHs (the paper's cell lies
    far below what this scale reaches), saying whether a cell below them was tested. A study
    that tested the chains at one cell only, or in which none formed IHs, has no such edge."""
    claim = f"*{rst.text(PAPER['near_frontier'])}*: "
    fv, rv = PAPER["near_frontier_cell"]
    tested = table[table["n_runs"] > 0]
    f, r = tested["frequency"].astype(float), tested["reliability"].astype(float)
    at_paper = [math.isclose(a, fv) and math.isclose(b, rv) for a, b in zip(f, r, strict=True)]
    if any(at_paper):
        return claim + _judged(tested[at_paper], f"at {_pair(fv, rv)}")
    cells = set(zip(f, r, strict=True))
    formed = {(a, b) for a, b, e in zip(f, r, tested["emerged"].astype(bool), strict=True) if e}
    if len(cells) < 2 or not formed:
        why = (
            f"the chains were tested only at {_pairs(sorted(cells))}"
            if len(cells) < 2
            else "no chain formed IHs at any cell"
        )
        return claim + rst.text(
            f"not tested here (no synthetic chain at {_pair(fv, rv)}; {why}, so the study has"
            " no edge of its own to judge it at)."
        )
    edge = sorted(c for c in formed if _below(c, formed) == [c])
    below = sorted({(a, b) for a, b in zip(f, r, strict=True) if _below_any((a, b), edge)})
    lower = (
        f"below it, no chain formed IHs at {_pairs(below)}" if below else "no cell below it tested"
    )
    at_edge = tested[[(a, b) in edge for a, b in zip(f, r, strict=True)]]
    where = (
        f"at this study's lowest cell where any chain formed IHs, {_pairs(edge)} ({lower}; the"
        f" paper's cell {_pair(fv, rv)} is below what this scale reaches)"
    )
    return claim + _judged(at_edge, where)


def _below(cell: tuple, cells: set) -> list:
    """The cells of ``cells`` at or below ``cell`` on both axes."""
    return [o for o in cells if o[0] <= cell[0] and o[1] <= cell[1]]


def _below_any(cell: tuple, edge: list) -> bool:
    """Whether ``cell`` lies at or below some edge cell on both axes, and is not one."""
    return cell not in edge and any(_below(e, {cell}) for e in edge)


def _judged(at: pd.DataFrame, where: str) -> str:
    """Whether only Zipfian +D+C formed IHs among the chains of ``at``, tested ``where``."""
    is_zipf_c = [
        bool(row["dependency"])
        and bool(row["categorial"])
        and str(row["marginal"]).lower() == "zipfian"
        for _, row in at.iterrows()
    ]
    zipf_c, others = at[is_zipf_c], at[[not z for z in is_zipf_c]]
    others_formed = others[others["emerged"].astype(bool)]
    if len(others_formed):
        return rst.text(f"does not hold here: {where}, {_labels(others_formed)} formed IHs too.")
    n_others = len(dict.fromkeys(chain_label(row) for _, row in others.iterrows()))
    if not len(zipf_c):
        return rst.text(
            f"cannot be judged here: no Zipfian +D+C chain {where} (none of the {n_others}"
            " chains tested formed IHs)."
        )
    if not zipf_c["emerged"].astype(bool).all():
        return rst.text(f"does not hold here: {where}, no chain formed IHs, not even Zipfian +D+C.")
    if not len(others):
        return rst.text(f"cannot be judged here: only Zipfian +D+C was tested {where}.")
    return rst.text(
        f"holds here: {where}, of the {n_others + 1} chains tested only Zipfian +D+C formed IHs"
        f" (not {_labels(others)})."
    )


def _labels(table: pd.DataFrame) -> str:
    """The chains of ``table``, each named once."""
    return ", ".join(dict.fromkeys(chain_label(row) for _, row in table.iterrows()))


def _labelled_cells(table: pd.DataFrame) -> str:
    return ", ".join(
        f"{chain_label(row)} at {_pair(row['frequency'], row['reliability'])}"
        for _, row in table.iterrows()
    )


def _fr_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The distinct (f, r) cells of a table, highest first."""
    cells = table[["frequency", "reliability"]].drop_duplicates()
    return cells.sort_values(["frequency", "reliability"], ascending=False)


# --- the files -----------------------------------------------------------------------------


def natural_findings(
    folder: str | Path, records: list[dict] | None = None, run_figure: Path | None = None
) -> str:
    """Experiment 1's findings from the natural aggregate's cached tables in ``folder`` and,
    when given, its runs' completion records (how they were trained, and where); the law fit
    shown inline, and ``run_figure``, one run's figure, when given."""
    folder = Path(folder)
    path = folder / "lawfit.json"
    fit = read_json_file(path, "law fit", remedy=RERUN.format(path=path, step="aggregate"))
    emergence = pd.read_csv(folder / "emergence.csv")
    sections = [
        law_findings(fit, emergence, records),
        family_findings(fit),
        rst.inline_figure(folder / "figures" / "law_fit.png", "The law fit", "law_fit.png"),
        run_figure_section(run_figure),
        environments(records, "natural-data"),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def markov_findings(
    folder: str | Path, records: list[dict] | None = None, run_figure: Path | None = None
) -> str:
    """Experiments 2 and 3's findings from the Markov aggregate's cached tables in ``folder``
    and, when given, its runs' completion records (how they were trained, and where); the
    first setting's frontier shown inline, and ``run_figure``, one run's figure, when given."""
    folder = Path(folder)
    runs = pd.read_csv(folder / "emergence.csv")
    cells = pd.read_csv(folder / "cells.csv")
    path = folder / "frontier.json"
    fronts = read_json_file(path, "frontier", remedy=RERUN.format(path=path, step="aggregate"))
    frontiers = sorted((folder / "figures").glob("frontier-*.png"))
    first_frontier = frontiers[0] if frontiers else folder / "figures" / "frontier.png"
    sections = [
        frontier_findings(runs, cells, fronts, records),
        rst.inline_figure(first_frontier, "The first setting's frontier", first_frontier.name),
        property_findings(runs, records),
        run_figure_section(run_figure),
        environments(records, "Markov-data"),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def write_findings(
    folder: str | Path,
    aggregate: str,
    records: list[dict] | None = None,
    run_figure: str | Path | None = None,
) -> Path:
    """Write ``folder/findings.rst`` for the ``natural`` or ``markov`` aggregate's tables, its
    runs' completion records (``trained.read_records``) and one run's figure to show."""
    read = natural_findings if aggregate == "natural" else markov_findings
    out = Path(folder) / layout.FINDINGS
    text = read(folder, records, Path(run_figure) if run_figure else None)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(text)
    return out


# --- one run's figure on the front page ------------------------------------------------------


def run_figure_section(png: Path | None) -> str:
    """One run's figure, named by the run id its provenance record holds."""
    if png is None:
        return ""
    record = read_json_file(png.parent / layout.PROVENANCE, "provenance", ("runs",))
    (run_id,) = record["runs"]
    intro = (
        f"**One run**, {rst.literal(run_id)}: the middle of the runs sorted by data, model, B, C"
        " and seed; every run's figure is under *Runs*."
    )
    # No link: every run's figure is named run.png, and a link by name reaches only one.
    return intro + "\n\n" + rst.inline_figure(png, f"The figure of run {run_id}")


# --- how the runs were trained -------------------------------------------------------------


def environments(records: list[dict] | None, which: str) -> str:
    """The distinct environments the runs trained in, with how many runs each, as a table."""
    if not records:
        return ""
    intro = f"**Where the {which} runs trained** (from each run's run.json):"
    return "\n\n".join([intro, rst.list_table(trained.environment_rows(records))])


def _trained(records: list[dict] | None) -> str:
    """ " Trained 8,000,000 tokens per run at lr 0.002 (16 runs)." ("" without records)."""
    sentence = trained.training_sentence(records or [])
    return f" Trained {rst.text(sentence)}." if sentence else ""


def _of_kind(records: list[dict] | None, runs: pd.DataFrame, kind: str) -> list[dict]:
    """The records of the runs on chains of ``kind`` (the run table's ``chain_kind``)."""
    ids = set(runs.loc[runs["chain_kind"] == kind, "run_id"].astype(str))
    return [r for r in records or [] if str(r.get("run_id", r["spec"].get("run_id"))) in ids]


# --- numbers ---------------------------------------------------------------------------------


def _pair(f, r) -> str:
    return f"({float(f):g}, {float(r):g})"


def _pairs(pairs) -> str:
    return ", ".join(_pair(f, r) for f, r in pairs)


def _cells(table: pd.DataFrame) -> str:
    return _pairs(zip(table["frequency"], table["reliability"], strict=True))
