"""Figures, provenance and the Snakemake report of a finished tiny study (real CLI, real files).

One module-scoped study (natural data at two batch sizes, and a two-cell Markov grid) is run
once; then:

- deleting every figure folder and running the ``figures`` target rebuilds them byte for byte
  and starts no training or probe job;
- every aggregate and per-run figure folder has a provenance.json with the config hash, the
  code version and the run ids;
- ``snakemake --report report.html`` embeds every figure; a real headless browser (Debian's
  chromium) decodes every embedded figure and renders the report's front page to a screenshot.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_workflow import job_stats, logs_of, snakemake

pytestmark = pytest.mark.slow

CONFIG = """\
models:
  tiny: {n_layer: 2, n_head: 4, d_model: 32, mlp: false, n_ctx: 64}
datasets:
  kjv: {family: natural, corpus: {source: kjv}, tokenizer: {kind: bpe, vocab_size: 300}}
  semi:
    family: markov
    chain: {kind: bigram, source: kjv, vocab_cap: 64}
    frequency: [0.3, 0.5]
    reliability: 0.5
    n_train_sequences: 1000
    n_val_sequences: 200
runs:
  - {data: kjv, model: tiny, batch_size: [4, 8], context_size: 16, seed: 0}
  - {data: semi, model: tiny, batch_size: 8, context_size: 32, seed: 0}
training: {tokens: 20000, lr: 0.003}
checkpoints: {tokens: [5000, 10000, 20000]}
"""
FIGURE_DIRS = ["results/natural/figures", "results/markov/figures"]
RUNS = ["kjv/tiny/B4-C16-s0", "kjv/tiny/B8-C16-s0"]
MARKOV_RUNS = ["semi-f0.3-r0.5/tiny/B8-C32-s0", "semi-f0.5-r0.5/tiny/B8-C32-s0"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> SimpleNamespace:
    workdir = tmp_path_factory.mktemp("report")
    (workdir / "config.yaml").write_text(CONFIG)
    first = snakemake(workdir)
    assert first.rc == 0, first.out[-6000:] + logs_of(workdir)
    return SimpleNamespace(dir=workdir)


def figure_files(workdir: Path) -> dict[str, bytes]:
    paths = [p for d in FIGURE_DIRS for p in (workdir / d).iterdir()]
    paths += [
        p
        for run in RUNS + MARKOV_RUNS
        for p in (workdir / "results/runs" / run).glob("figures/run.*")
    ]
    return {str(p.relative_to(workdir)): p.read_bytes() for p in paths}


def test_figures_target_rebuilds_byte_identical_files_without_training(study):
    before = figure_files(study.dir)
    assert len(before) == 2 * (4 + 2 + 4)  # natural, Markov, per run; PNG and PDF each
    for folder in FIGURE_DIRS:
        shutil.rmtree(study.dir / folder)
    for run in RUNS + MARKOV_RUNS:
        shutil.rmtree(study.dir / "results/runs" / run / "figures")
    rerun = snakemake(study.dir, "figures")
    assert rerun.rc == 0, rerun.out[-4000:]
    stats = job_stats(rerun.out)
    assert stats == {"aggregate_natural": 1, "aggregate_markov": 1, "run_figure": 4, "figures": 1}
    assert figure_files(study.dir) == before


def test_every_output_folder_records_its_provenance(study):
    folders = ["results/natural", "results/markov"]
    folders += [f"results/runs/{run}/figures" for run in RUNS + MARKOV_RUNS]
    hashes = set()
    for folder in folders:
        record = json.loads((study.dir / folder / "provenance.json").read_text())
        assert re.fullmatch(r"[0-9a-f]{64}", record["config_sha256"])
        assert record["code_version"].startswith(("git:", "ihsweep "))
        assert record["runs"] and record["outputs"]
        hashes.add(record["config_sha256"])
    assert len(hashes) == 1
    natural = json.loads((study.dir / "results/natural/provenance.json").read_text())
    assert natural["runs"] == RUNS
    assert "figures/law_fit.png" in natural["outputs"]


def embedded_figures(html: str) -> dict[str, bytes]:
    found = re.findall(
        r"data:image/png;charset=utf8;filename=([^;]+);base64,([A-Za-z0-9+/=]+)", html
    )
    return {f"{i}-{name}": base64.b64decode(data) for i, (name, data) in enumerate(found)}


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium (apt-get install chromium, as .ci/run does)"
)
def test_report_embeds_every_figure_and_renders_in_a_browser(study, tmp_path):
    report = study.dir / "report.html"
    built = snakemake(study.dir, "--report", str(report))
    assert built.rc == 0, built.out[-4000:]
    html = report.read_text()
    figures = embedded_figures(html)
    # 4 natural figures, the frontier and generator figures, one figure per run (4 runs).
    assert len(figures) == 4 + 2 + 4
    for label in ("1. When: batch size, context size, model size", "Runs", "C", "seed"):
        assert label in html

    # The browser decodes every embedded figure: a page loads each one as an <img>.
    images = "".join(
        f'<img src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        for data in figures.values()
    )
    probe = tmp_path / "probe.html"
    probe.write_text(
        f"<html><body>{images}<script>"
        "window.onload = () => { const imgs = [...document.images];"
        " const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;"
        " document.body.setAttribute('data-loaded', ok + '/' + imgs.length); };"
        "</script></body></html>"
    )
    dom = browser("--dump-dom", probe)
    assert f'data-loaded="{len(figures)}/{len(figures)}"' in dom

    # And renders the report itself: a screenshot of its front page that is not blank.
    shot = tmp_path / "report.png"
    browser(f"--screenshot={shot}", report)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] >= 800 and pixels.std() > 0.05  # text and a graph, not a blank page


def browser(action: str, page: Path) -> str:
    proc = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1400,1000", "--virtual-time-budget=5000", action, page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
