"""Figures, provenance and the Snakemake report of a finished tiny study (real CLI, real files).

One module-scoped study (tests/studies/report.yaml: natural data at two batch sizes, and a
two-cell Markov grid) is run once; then:

- deleting every figure folder and running the ``figures`` target rebuilds them (and the
  tables' pages and findings) byte for byte and starts no training or probe job;
- every aggregate and per-run figure folder has a provenance.json with the config hash, the
  code version and the run ids;
- ``snakemake --report`` as one HTML file and as a zip holds every figure and table;
- in a real headless browser (Debian's chromium, driven by ``browser.py``) a click through the
  report's menus reaches every result: each figure decodes, each table renders its rows, and the
  front page opens with the findings computed from the aggregate tables (each linking to its
  detailed result), then states the study.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from browser import CHROMIUM, Chromium
from conftest import job_stats, run_study, snakemake, study_text
from ihsweep import layout
from ihsweep.analysis.lawfit import QUANTITIES
from ihsweep.config import Run, StudyPaths
from ihsweep.provenance import code_sha256
from ihsweep.report import findings
from ihsweep.validate import prepare

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")
MARKOV = layout.markov_dir("default")

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
    **{PATHS.run_figures(run)[0]: None for run in RUNS + MARKOV_RUNS},
    layout.aggregate_file("emergence.html", NATURAL): len(RUNS),
    layout.aggregate_file("lawfit.html", NATURAL): len(QUANTITIES),  # one row each
    layout.aggregate_file("emergence.html", MARKOV): len(MARKOV_RUNS),
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
    assert len(before) == 2 * (4 + 2 + 4) + 3 + 2
    for folder in FIGURE_DIRS:
        shutil.rmtree(study.dir / folder)
    for run in RUNS + MARKOV_RUNS:
        shutil.rmtree(study.dir / run_figure_dir(run))
    rerun = snakemake(study.dir, "figures")
    assert rerun.rc == 0, rerun.out[-4000:]
    stats = job_stats(rerun.out)
    assert stats == {"aggregate_natural": 1, "aggregate_markov": 1, "run_figure": 4, "figures": 1}
    assert figure_files(study.dir) == before


def test_every_output_folder_records_its_provenance(study):
    # Aggregates record the study's hash; a run's figures the run's own (ihsweep.provenance).
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


# The report is a React app: the menu lists categories, a category its subcategories, a
# subcategory a table of results (one row per label combination, an optional two-value toggle);
# a row's eye button shows the result: an <img> for a figure, an <iframe> for an HTML page.
MENU_LINK = "[...document.querySelectorAll('nav a')].find(a => a.innerText.trim() === {!r})"
ROWS = "document.querySelectorAll('nav table tbody tr')"
READY = "typeof app !== 'undefined' && document.querySelector('nav a') !== null"
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
RESULT_PATH = {"frontier": f"{MARKOV}/figures/frontier-semi-tiny-B8-C32.png"}
TABLE_ROWS = "document.readyState === 'complete' && document.querySelectorAll('tbody tr').length"


def click_through(page, url: str) -> dict[str, object]:
    """Click every category, subcategory, toggle value and result's view button, as a reader
    would; returns what was shown for each result: an image's size or an HTML table's row count.
    """
    shown = {}
    tree = page.evaluate(
        "Object.fromEntries(Object.entries(categories).map(([c, s]) => [c, Object.keys(s)]))"
    )
    for category, subcategories in tree.items():
        for subcategory in subcategories:
            page.goto(url)  # back to the menu
            page.wait_for(READY)
            page.click(MENU_LINK.format(category))
            if len(subcategories) > 1:
                page.click(MENU_LINK.format(subcategory))
            page.wait_for(ROWS + ".length")
            toggles = page.evaluate("document.querySelectorAll('nav fieldset label').length")
            for toggle in range(toggles) or [None]:
                if toggle is not None:
                    page.click(f"document.querySelectorAll('nav fieldset label')[{toggle}]")
                for row in range(page.evaluate(ROWS + ".length")):
                    before = page.evaluate("String(app.state.renderTrigger)")
                    page.click(f"{ROWS}[{row}].querySelector('td:last-child a')")
                    page.wait_for(f"String(app.state.renderTrigger) !== {before!r}")
                    path = page.evaluate("app.state.resultPath")
                    if page.evaluate("app.state.content") == "img":
                        shown[path] = page.wait_for(IMAGE_SHOWN.format(path=path))
                    else:
                        page.wait_for(FRAME_SHOWN.format(path=path))
                        shown[path] = page.wait_for(TABLE_ROWS, in_child_frame=True)
    return shown


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium (apt-get install chromium, as .ci/run does)"
)
@pytest.mark.parametrize("kind", ["html", "zip"])
def test_clicking_through_the_report_shows_every_figure_and_table(study, reports, kind, tmp_path):
    url = reports[kind].as_uri()
    with Chromium() as browser:
        page = browser.open(url)
        page.wait_for(READY)
        front = page.evaluate("document.body.innerText")  # the study, from the config
        assert "This study (default)." in front and "Emergence rule." in front
        assert "lawfit.html" in front
        link = page.evaluate(FINDINGS_LINK.format("frontier-semi-tiny-B8-C32.png"))
        page.screenshot(tmp_path / "front.png")
        results = page.evaluate("results")
        shown = click_through(page, url)

    assert sorted(shown) == sorted(RESULTS)  # every result, reached through the menus
    for path, what in shown.items():
        assert results[path]["caption"].strip(), f"{path}: no caption"
        if path.endswith(".png"):
            assert what[0] >= 600 and what[1] >= 300, (path, what)  # a decoded figure
        else:
            assert what == RESULTS[path], path  # a rendered table, one row per run or quantity

    # The front page opens with the findings, computed from the tables (nothing emerges within
    # this study's budget: the law is not fitted, the verdict undetermined, with their reasons).
    summary = " ".join(front.replace(findings.NB_HYPHEN, "-").split())
    assert summary.index("Findings of this study") < summary.index("ihsweep measures")
    fit = json.loads((study.dir / NATURAL / "lawfit.json").read_text())
    assert not fit["ok"]
    assert (
        f"Experiment 1: when IHs emerge (natural data). The law U_pt = T / (B^a C^b) was not"
        f" fitted: {fit['reason']}. {fit['n_runs']} of {len(RUNS)} runs emerged;"
    ) in summary
    setting = json.loads((study.dir / MARKOV / "frontier.json").read_text())
    verdict, timing = (setting["semi-tiny-B8-C32"][key] for key in ("sensitivity", "timing"))
    assert verdict["verdict"] == timing["verdict"] == "undetermined"
    assert (
        f"semi-tiny-B8-C32: IHs emerged in 0 of {len(MARKOV_RUNS)} (f, r) cells. No cell emerged,"
        " so there is no frontier. Sensitivity undetermined (the paper: reliability matters"
        f" more): {verdict['reason']}. No timing verdict: {timing['reason']}. Details:"
        " frontier-semi-tiny-B8-C32.png."
    ) in summary
    assert (
        "Experiment 3: which data properties make IHs form (synthetic Markov data). Not in this"
        " study: no run trains on a synthetic Markov chain."
    ) in summary
    assert link == f"javascript:app.showResultInfo('{RESULT_PATH['frontier']}')"

    from matplotlib.image import imread

    pixels = imread(tmp_path / "front.png")
    assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05  # text and a graph
