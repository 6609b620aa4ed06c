"""Figures, provenance and the Snakemake report of a finished tiny study (real CLI, real files).

One module-scoped study (tests/studies/report.yaml: natural data at two batch sizes, and a
two-cell Markov grid) is run once; then:

- deleting every figure folder and running the ``figures`` target rebuilds them (and the
  tables' pages and findings) byte for byte and starts no training or probe job;
- every aggregate and per-run figure folder has a provenance.json with the config hash, the
  code version and the run ids;
- ``snakemake --report`` as one HTML file and as a zip holds every figure and table;
- every figure the study draws, drawn again by its step's own command, has its titles and
  legends inside the figure and no legend over a curve (``get_window_extent`` on the drawn
  figures);
- in a real headless browser (Debian's chromium, driven by Playwright) the front page shows the
  law fit, a frontier and one run's figure inline, every image decoded and no console error,
  and states each experiment's budget and learning rate as its runs' run.json record them,
  then the findings computed from the aggregate tables; a click through the report's menus
  reaches every result: each figure decodes, each table renders its rows. Screenshots of the
  front page and a figure's page go to the test's folder, and to $IHSWEEP_SCREENSHOTS if set.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import zipfile
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import job_stats, run_study, snakemake, study_text
from ihsweep.analysis.lawfit import QUANTITIES
from ihsweep.config import Run, StudyPaths
from ihsweep.files import layout
from ihsweep.report.provenance import code_sha256
from ihsweep.report.rst import NB_HYPHEN
from ihsweep.steps.prepare import prepare
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")
MARKOV = layout.markov_dir("default")
HELDOUT = layout.heldout_dir(NATURAL)

pytestmark = pytest.mark.slow

CONFIG = study_text("report")
FOLDERS = [NATURAL, MARKOV]
FIGURE_DIRS = [f"{folder}/figures" for folder in FOLDERS]
RUNS = [Run("kjv", "tiny", 4, 16, 0), Run("kjv", "tiny", 8, 16, 0)]
MARKOV_RUNS = [Run("semi-f0.3-r0.5", "tiny", 8, 32, 0), Run("semi-f0.5-r0.5", "tiny", 8, 32, 0)]
PATHS = StudyPaths(prepare(yaml.safe_load(CONFIG)))


def run_figure_dir(run: Run) -> str:
    """A run's figures/ folder: its figure files and their provenance record."""
    return str(Path(PATHS.run_figures(run)[0]).parent)


# Every result in the report: figures (None), and tables with their number of rows.
RESULTS = {
    **{f: None for f in layout.figure_files(layout.NATURAL_FIGURES, NATURAL)[::2]},
    **{f: None for f in layout.figure_files(["frontier-semi-tiny-B8-C32"], MARKOV)[::2]},
    **{f: None for f in layout.figure_files(["generator"], MARKOV)[::2]},
    **{f: None for f in layout.figure_files(layout.HELDOUT_FIGURES, HELDOUT)[::2]},
    **{PATHS.run_figures(run)[0]: None for run in RUNS + MARKOV_RUNS},
    layout.aggregate_file("emergence.html", NATURAL): len(RUNS),
    layout.aggregate_file("lawfit.html", NATURAL): len(QUANTITIES),  # one row each
    layout.aggregate_file("emergence.html", MARKOV): len(MARKOV_RUNS),
    # Two runs at one C: no split keeps 2 values of B; a row per kind says so.
    layout.aggregate_file("heldout.html", HELDOUT): 2,
}
assert all(f.endswith((".png", ".html")) for f in RESULTS)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> SimpleNamespace:
    workdir = tmp_path_factory.mktemp("report")
    run_study(workdir, CONFIG)
    return SimpleNamespace(dir=workdir)


def figure_files(workdir: Path) -> dict[str, bytes]:
    """Every figure, the tables' HTML pages and the front page's findings, by path."""
    paths = [p for d in FIGURE_DIRS for p in (workdir / d).iterdir()]
    paths += [workdir / p for p in RESULTS if p.endswith(".html")]
    paths += [workdir / layout.aggregate_file(layout.FINDINGS, d) for d in FOLDERS]
    paths += [
        p for run in RUNS + MARKOV_RUNS for p in (workdir / run_figure_dir(run)).glob("run.*")
    ]
    return {str(p.relative_to(workdir)): p.read_bytes() for p in paths}


def test_figures_target_rebuilds_byte_identical_files_without_training(study):
    before = figure_files(study.dir)
    # natural, Markov, per run as PNG and PDF; tables; findings
    assert len(before) == 2 * (4 + 2 + 4) + 4 + 2
    for folder in FIGURE_DIRS:
        shutil.rmtree(study.dir / folder)
    for run in RUNS + MARKOV_RUNS:
        shutil.rmtree(study.dir / run_figure_dir(run))
    rerun = snakemake(study.dir, "figures")
    assert rerun.rc == 0, rerun.out[-4000:]
    stats = job_stats(rerun.out)
    assert stats == {"aggregate_natural": 1, "heldout_natural": 1, "aggregate_markov": 1,
                     "run_figure": 4, "figures": 1}  # fmt: skip
    assert figure_files(study.dir) == before


def test_every_output_folder_records_its_provenance(study):
    # Aggregates record the study's hash; a run's figures the run's own (ihsweep.report.provenance).
    hashes = {"config_sha256": set(), "run_sha256": set()}
    for folder, key in [(NATURAL, "config_sha256"), (MARKOV, "config_sha256")] + [
        (run_figure_dir(run), "run_sha256") for run in RUNS + MARKOV_RUNS
    ]:
        record = json.loads((study.dir / folder / "provenance.json").read_text())
        assert set(hashes) & set(record) == {key}
        assert re.fullmatch(r"[0-9a-f]{64}", record[key])
        assert record["code_version"].startswith(("git:", "ihsweep "))
        assert record["code_sha256"] == code_sha256()
        assert record["runs"] and record["outputs"]
        hashes[key].add(record[key])
    assert len(hashes["config_sha256"]) == 1
    assert len(hashes["run_sha256"]) == len(RUNS + MARKOV_RUNS)
    natural = json.loads((study.dir / NATURAL / layout.PROVENANCE).read_text())
    assert natural["runs"] == ["kjv/tiny/B4-C16-s0", "kjv/tiny/B8-C16-s0"]
    assert natural["runs"] == [run.id for run in RUNS]
    assert "figures/law_fit.png" in natural["outputs"]


def test_a_study_that_adds_a_run_redraws_only_that_runs_figure(study):
    # cpu-full after the default study: another study whose runs include every earlier run
    # with the same spec. Its aggregates are made; no earlier run's figure is redrawn.
    runs = yaml.safe_load(CONFIG)["runs"]
    more = study.dir / "more-seeds.yaml"
    added = [*runs, {**runs[0], "batch_size": 4, "seed": 1}]
    more.write_text(yaml.safe_dump({"study": "more-seeds", "runs": added}))
    planned = snakemake(study.dir, "-n", configfiles=(more,))
    assert planned.rc == 0, planned.out[-4000:]
    stats = job_stats(planned.out)
    assert stats["train"] == stats["probe"] == stats["run_figure"] == 1, stats
    assert stats["aggregate_natural"] == stats["aggregate_markov"] == 1, stats


@pytest.fixture(scope="module")
def reports(study) -> dict[str, Path]:
    """The report both ways: one self-contained HTML file, and a zip (unpacked here)."""
    html, archive = study.dir / "report.html", study.dir / "report.zip"
    for path in (html, archive):
        built = snakemake(study.dir, "--report", str(path))
        assert built.rc == 0, built.out[-4000:]
    unpacked = study.dir / "report-zip"
    zipfile.ZipFile(archive).extractall(unpacked)
    return {"html": html, "zip": unpacked / "report" / "report.html"}


def test_report_html_embeds_every_figure_and_table(reports):
    html = reports["html"].read_text()
    embedded = re.findall(r"data:(image/png|text/html);charset=utf8;filename=([^;]+);", html)
    assert sorted(name for _, name in embedded) == sorted(Path(p).name for p in RESULTS)
    for label in ("1. When: batch size, context size, model size", "Runs", "C", "seed"):
        assert label in html


def test_report_zip_holds_every_result_as_a_file(study, reports):
    folder = reports["zip"].parent
    names = sorted(p.name for p in folder.rglob("*") if p.is_file() and p != reports["zip"])
    assert names == sorted(Path(p).name for p in RESULTS)
    law_fit = next(folder.rglob("law_fit.png")).read_bytes()
    assert law_fit == (study.dir / NATURAL / "figures/law_fit.png").read_bytes()


# --- every figure's title and legend fit, on the figures the study's own steps draw ----------


STEPS = ("aggregate_natural", "heldout_natural", "aggregate_markov", "run_figure")


def drawn_figures(workdir: Path, out: Path, monkeypatch) -> dict[str, Figure]:
    """Every figure of the study, drawn again in this process by the commands Snakemake runs
    for it (read from a dry run), into ``out`` instead of the study's folders; by file stem."""
    planned = snakemake(workdir, "-n", "-p", "--forcerun", *STEPS)
    assert planned.rc == 0, planned.out[-4000:]
    command = r"^\s*(?:Shell command: )?python -m ihsweep\.steps\.(\w+) (.*?) > \S+ 2>&1$"
    commands = re.findall(command, planned.out, re.M)
    assert sorted({step for step, _ in commands}) == sorted(STEPS), planned.out[-4000:]
    drawn, savefig = {}, Figure.savefig

    def keep(fig, fname, *args, **kwargs):
        drawn[Path(fname).parent.name + "/" + Path(fname).stem] = fig
        return savefig(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    monkeypatch.chdir(workdir)  # the commands' paths are relative to the study's folder
    for i, (step, line) in enumerate(commands):
        argv = shlex.split(line)
        for flag in ("--out-dir", "--out"):  # the outputs go to a folder of this test's
            if flag in argv:
                at = argv.index(flag) + 1
                argv[at] = str(out / str(i) / Path(argv[at]).name)
        assert import_module(f"ihsweep.steps.{step}").main(argv) == 0, (step, argv)
    return drawn


def outside(box, bounds, slack: float = 1.0) -> bool:
    return (box.x0 < bounds.x0 - slack or box.y0 < bounds.y0 - slack
            or box.x1 > bounds.x1 + slack or box.y1 > bounds.y1 + slack)  # fmt: skip


def crossed_by(line: Line2D, box) -> bool:
    """Whether any drawn point of ``line``, or of its straight segments between them (sampled
    in display space, where they are drawn straight), lies inside ``box``."""
    xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) > 1:
        t = np.linspace(0, 1, 64)[:, None, None]
        xy = (xy[:-1] * (1 - t) + xy[1:] * t).reshape(-1, 2)
    inside = (xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1)
    return bool(inside.any())


def layout_problems(fig: Figure) -> list[str]:
    """Titles and legends outside the figure, and legends drawn over a curve."""
    fig.draw_without_rendering()  # the constrained layout's final positions
    renderer = fig.canvas.get_renderer()
    texts = [("suptitle", fig._suptitle)] if fig._suptitle else []
    axes = [ax for ax in fig.axes if ax.get_visible()]
    texts += [(f"title {ax.get_title()!r}", ax.title) for ax in axes if ax.get_title()]
    legends = [("figure legend", legend, axes) for legend in fig.legends]
    legends += [("axes legend", ax.get_legend(), [ax]) for ax in axes if ax.get_legend()]
    problems = [
        f"{name} outside the figure"
        for name, artist in texts + [(name, legend) for name, legend, _ in legends]
        if outside(artist.get_window_extent(renderer), fig.bbox)
    ]
    for name, legend, under in legends:
        box = legend.get_window_extent(renderer)
        curves = [line for ax in under for line in ax.get_lines() if line.get_visible()]
        problems += [f"{name} over {c.get_label()!r}" for c in curves if crossed_by(c, box)]
    return problems


def test_every_figure_title_and_legend_fit_inside_their_figure(study, tmp_path, monkeypatch):
    drawn = drawn_figures(study.dir, tmp_path, monkeypatch)
    stems = {Path(p).stem for p in RESULTS if p.endswith(".png")}
    assert {name.split("/")[1] for name in drawn} == stems  # every figure kind in the report
    assert sum(name.endswith("/run") for name in drawn) == len(RUNS + MARKOV_RUNS)
    problems = {name: layout_problems(fig) for name, fig in drawn.items()}
    assert not {name: found for name, found in problems.items() if found}


def test_layout_check_finds_a_title_past_the_edge_and_a_legend_on_a_curve():
    # The check itself: the two faults the report's figures had (a paragraph as a title; the
    # run figure's legend on its loss curves) are found, and a figure without them passes.
    from ihsweep.figures.style import new_figure

    fig = new_figure(4, 3)
    ax = fig.subplots()
    ax.plot([0, 1], [1, 0], label="a falling curve")
    assert layout_problems(fig) == []
    fig.suptitle("a title far longer than a figure four inches wide can hold on one line " * 2)
    ax.legend(loc="upper left")
    assert layout_problems(fig) == [
        "suptitle outside the figure",
        "axes legend over 'a falling curve'",
    ]


# --- the report in a real browser ----------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")  # Debian's, which .ci/run installs; no browser download
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SCREENSHOTS = "IHSWEEP_SCREENSHOTS"  # a folder to copy the screenshots to, to look at them


def missing_browser() -> str | None:
    if not CHROMIUM.exists():
        return f"no {CHROMIUM} (apt-get install chromium, as .ci/run does)"
    if find_spec("playwright") is None:
        return "no playwright (pip install playwright; it drives Debian's chromium)"
    return None


needs_browser = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def open_page(browser, url: str):
    """A 1400 x 1000 page at ``url`` that collects console errors and uncaught exceptions."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_function(READY)
    return page


def screenshot(page, tmp_path: Path, name: str) -> Path:
    """Save a screenshot under the test's folder, and a copy under $IHSWEEP_SCREENSHOTS."""
    path = tmp_path / name
    page.screenshot(path=path)
    if os.environ.get(SCREENSHOTS):
        Path(os.environ[SCREENSHOTS]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(os.environ[SCREENSHOTS]) / name)
    return path


# The report is a React app: the menu lists categories, a category its subcategories, a
# subcategory a table of results (one row per label combination, an optional two-value toggle);
# a row's eye button shows the result: an <img> for a figure, an <iframe> for an HTML page.
READY = "typeof app !== 'undefined' && document.querySelector('nav a') !== null"
MENU_LINK = "[...document.querySelectorAll('nav a')].find(a => a.innerText.trim() === {!r})"
ROWS = "document.querySelectorAll('nav table tbody tr')"
EVERY_IMAGE_LOADED = (
    "(() => { const imgs = [...document.images];"
    " return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0)"
    " && imgs.length; })()"
)
IMAGE_SHOWN = (
    "(() => {{ const img = [...document.images].find(i => !i.closest('nav')"
    " && i.getAttribute('src') === results[{path!r}].data_uri);"
    " return img && img.complete && img.naturalWidth > 0 && [img.naturalWidth, img.naturalHeight];"
    " }})()"
)
FRAME_SHOWN = (
    "[...document.querySelectorAll('iframe')]"
    ".some(f => f.getAttribute('src') === results[{path!r}].data_uri)"
)
FINDINGS_LINK = "[...document.querySelectorAll('.prose a')].find(a => a.innerText === {!r}).href"
INLINE_FIGURES = "[...document.querySelectorAll('.prose img')].map(i => i.naturalWidth)"
TABLE_ROWS = "document.readyState === 'complete' && document.querySelectorAll('tbody tr').length"
RESULT_PATH = {"frontier": f"{MARKOV}/figures/frontier-semi-tiny-B8-C32.png"}


def click(page, expression: str) -> None:
    """A real click (mouse events at the element's centre) on the element ``expression`` finds."""
    page.evaluate_handle(expression).as_element().click()


def show(page, url: str, category: str, subcategory: str | None) -> int:
    """Open the menu at ``category`` (and ``subcategory``); returns the number of result rows."""
    page.goto(url)  # back to the menu
    page.wait_for_function(READY)
    click(page, MENU_LINK.format(category))
    if subcategory is not None:
        click(page, MENU_LINK.format(subcategory))
    return page.wait_for_function(ROWS + ".length").json_value()


def click_through(page, url: str, tmp_path: Path) -> dict[str, object]:
    """Click every category, subcategory, toggle value and result's view button, as a reader
    would; returns what was shown for each result: an image's size or an HTML table's row count.
    Screenshots the law-fit figure's page."""
    shown = {}
    tree = page.evaluate(
        "Object.fromEntries(Object.entries(categories).map(([c, s]) => [c, Object.keys(s)]))"
    )
    for category, subcategories in tree.items():
        for subcategory in subcategories:
            show(page, url, category, subcategory if len(subcategories) > 1 else None)
            toggles = page.evaluate("document.querySelectorAll('nav fieldset label').length")
            for toggle in range(toggles) or [None]:
                if toggle is not None:
                    click(page, f"document.querySelectorAll('nav fieldset label')[{toggle}]")
                for row in range(page.evaluate(ROWS + ".length")):
                    before = page.evaluate("String(app.state.renderTrigger)")
                    click(page, f"{ROWS}[{row}].querySelector('td:last-child a')")
                    page.wait_for_function(f"String(app.state.renderTrigger) !== {before!r}")
                    path = page.evaluate("app.state.resultPath")
                    if page.evaluate("app.state.content") == "img":
                        shown[path] = page.wait_for_function(IMAGE_SHOWN.format(path=path))
                        shown[path] = shown[path].json_value()
                        if path.endswith("law_fit.png"):
                            screenshot(page, tmp_path, "figure.png")
                    else:
                        page.wait_for_function(FRAME_SHOWN.format(path=path))
                        uri = page.evaluate(f"results[{path!r}].data_uri")
                        frame = next(f for f in page.frames if f.url == uri)
                        shown[path] = frame.wait_for_function(TABLE_ROWS).json_value()
    return shown


def trained_as(study_dir: Path, runs: list[Run]) -> str:
    """How ``runs`` trained, from their run.json as the training job wrote them: one budget and
    one learning rate each in this study."""
    records = [
        json.loads((study_dir / PATHS.run_file(layout.RUN_JSON, run)).read_text()) for run in runs
    ]
    (budget,) = {r["budget"] for r in records}
    (lr,) = {r["spec"]["training"]["lr"] for r in records}
    return f"Trained {budget:,} tokens per run at lr {lr:g} ({len(runs)} runs)."


def front_page_text(page) -> str:
    text = page.evaluate("document.querySelector('.prose').innerText")
    return " ".join(text.replace(NB_HYPHEN, "-").split())


@needs_browser
@pytest.mark.parametrize("kind", ["html", "zip"])
def test_report_front_page_states_the_study_with_its_figures(
    study, reports, kind, browser, tmp_path
):
    page = open_page(browser, reports[kind].as_uri())
    assert page.wait_for_function(EVERY_IMAGE_LOADED).json_value() >= 3
    inline = page.evaluate(INLINE_FIGURES)  # law fit, frontier, one run: decoded, full size
    assert len(inline) == 3 and min(inline) >= 600, inline
    summary = front_page_text(page)
    link = page.evaluate(FINDINGS_LINK.format("frontier-semi-tiny-B8-C32.png"))
    shot = screenshot(page, tmp_path, f"front-{kind}.png")
    assert page.errors == []

    # The study as it ran: each experiment's budget and learning rate from its own runs (the
    # Markov entry overrides the study's lr), then where its runs trained.
    natural, markov = trained_as(study.dir, RUNS), trained_as(study.dir, MARKOV_RUNS)
    assert "lr 0.003 (2 runs)" in natural and "lr 0.002 (2 runs)" in markov
    assert f"Experiment 1: when IHs emerge (natural data). {natural} The law" in summary
    assert (
        f"Experiment 2: which (f, r) make IHs form (semi-natural Markov data). {markov}"
    ) in summary
    for which in ("natural-data", "Markov-data"):
        assert f"Where the {which} runs trained (from each run's run.json):" in summary
    assert "0.003" not in summary.split("This study (default).")[1]  # no top-level default
    assert link == f"javascript:app.showResultInfo('{RESULT_PATH['frontier']}')"
    # One run's figure: the first of the two natural-data runs sorted by B (the middle of two).
    assert f"One run, {RUNS[0].id}: the middle of the runs sorted by data, model" in summary

    # The findings first, computed from the tables (nothing emerges within this budget).
    assert summary.index("Findings of this study") < summary.index("ihsweep measures")
    fit = json.loads((study.dir / NATURAL / "lawfit.json").read_text())
    assert not fit["ok"]
    assert f"was not fitted: {fit['reason']}. {fit['n_runs']} of {len(RUNS)} runs" in summary
    setting = json.loads((study.dir / MARKOV / "frontier.json").read_text())
    verdict = setting["semi-tiny-B8-C32"]["sensitivity"]
    assert (
        f"semi-tiny-B8-C32: IHs emerged in 0 of {len(MARKOV_RUNS)} (f, r) cells. No cell emerged,"
        " so there is no frontier. Sensitivity undetermined (the paper: reliability matters"
        f" more): {verdict['reason']}."
    ) in summary
    assert (
        "Experiment 3: which data properties make IHs form (synthetic Markov data). Not in this"
        " study: no run trains on a synthetic Markov chain."
    ) in summary

    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05  # text and a figure


@needs_browser
def test_clicking_through_the_report_shows_every_figure_and_table(
    study, reports, browser, tmp_path
):
    url = reports["html"].as_uri()
    page = open_page(browser, url)
    results = page.evaluate("results")
    shown = click_through(page, url, tmp_path)
    assert page.errors == []
    assert (tmp_path / "figure.png").stat().st_size > 10_000

    assert sorted(shown) == sorted(RESULTS)  # every result, reached through the menus
    for path, what in shown.items():
        assert results[path]["caption"].strip(), f"{path}: no caption"
        if path.endswith(".png"):
            assert what[0] >= 600 and what[1] >= 300, (path, what)  # a decoded figure
        else:
            assert what == RESULTS[path], path  # a rendered table, one row per run or quantity
