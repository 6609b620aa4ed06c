"""workflow/studies/calibrate.yaml: pilot runs on a folder of .txt files, whose fit of log10 T
(the published exponents fixed) ``ihsweep.predict --law study:calibrate`` reads. The corpus
folder's problems are one line each before any job; the template validates and dry-runs; a tiny
version of it trains, fits and predicts end to end.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, job_stats, logs_of, snakemake
from ihsweep import cost
from ihsweep.config import ConfigError, load_configfiles
from ihsweep.data.corpus import kjv_chapters
from ihsweep.steps.prepare import prepare

TEMPLATE = REPO / "workflow" / "studies" / "calibrate.yaml"
FOLDER = "calibrate-corpus"  # the template's folder, relative to the working folder
# A tiny version of the template: two runs at C 8, a 512-type BPE, lr 3e-3 and at most 400k
# tokens. On 300 KJV chapters their best layer-1 PS rose by 0.03-0.06 (B 16 by 0.057, B 32 by
# 0.028 with the study's rule; B 8 by 0.025), so the tiny study counts a rise of 0.02: it tests
# the plumbing from a folder of text to a prediction, not the science.
TINY = {
    "datasets": {"mytext": {"tokenizer": {"vocab_size": 512}}},
    "runs": [{"data": "mytext", "model": "w64", "batch_size": [16, 32], "context_size": 8,
              "seed": 0}],
    "training": {"tokens": 400000, "lr": 0.003},
    "checkpoints": {"start": 3125, "per_decade": 10, "linear_from": 100000, "every": 50000},
    "lawfit": {"bootstrap": 100},
    "emergence": {"min_rise": 0.02},
}  # fmt: skip


def write_corpus(folder: Path, chapters: int) -> None:
    """The first ``chapters`` chapters of the King James Bible, 50 to a .txt file."""
    folder.mkdir(parents=True, exist_ok=True)
    text = kjv_chapters()[:chapters]
    for i in range(0, len(text), 50):
        (folder / f"part{i // 50}.txt").write_text("\n\n".join(text[i : i + 50]), "utf-8")


def template(monkeypatch, tmp_path) -> dict:
    monkeypatch.chdir(tmp_path)
    return load_configfiles([TEMPLATE])


def test_the_template_validates_and_fits_log10_T_alone(monkeypatch, tmp_path):
    config = template(monkeypatch, tmp_path)
    write_corpus(tmp_path / FOLDER, chapters=60)
    study = prepare(config)
    assert study.name == "calibrate" and len(study.runs) == 6
    assert config["lawfit"]["exponents"] == "published"
    assert cost.corpus_bytes(config["datasets"]["mytext"]["corpus"]) > 100_000


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda d: None, "'calibrate-corpus' matches no file"),
        (lambda d: d.mkdir(), "folder ./calibrate-corpus is empty; put the corpus's UTF-8 .txt"),
        (lambda d: (d.mkdir(), (d / "a.pdf").write_bytes(b"%PDF")),
         "folder ./calibrate-corpus holds no .txt file (it holds a.pdf)"),
        (lambda d: (d.mkdir(), (d / "a.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))),
         "calibrate-corpus/a.txt is not UTF-8 (byte 0xe9 at offset 3); convert it"),
    ],
    ids=["missing", "empty", "no-txt", "not-utf8"],
)  # fmt: skip
def test_a_bad_corpus_folder_is_one_line(monkeypatch, tmp_path, make, problem):
    config = template(monkeypatch, tmp_path)
    make(tmp_path / FOLDER)
    with pytest.raises(ConfigError) as err:
        prepare(config)
    message = str(err.value)
    assert "\n" not in message and message.startswith("datasets.mytext.corpus.paths[0]: ")
    assert problem in message


@pytest.mark.slow
def test_the_template_dry_runs_and_names_a_bad_folder_before_any_job(tmp_path):
    (tmp_path / "config.yaml").write_text(TEMPLATE.read_text())
    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / "a.txt").write_bytes(b"\xff\xfe")
    bad = snakemake(tmp_path, "-n")
    assert bad.rc != 0 and "is not UTF-8" in bad.out and "Job stats" not in bad.out
    (tmp_path / FOLDER / "a.txt").unlink()
    write_corpus(tmp_path / FOLDER, chapters=60)
    planned = snakemake(tmp_path, "-n")
    assert planned.rc == 0, planned.out[-3000:]
    assert job_stats(planned.out) == {"tokenize": 1, "chunk": 3, "train": 6, "probe": 6,
                                      "run_figure": 6, "aggregate_natural": 1,
                                      "heldout_natural": 1, "all": 1}  # fmt: skip


@pytest.mark.slow
def test_a_tiny_calibration_predicts_end_to_end(tmp_path):
    (tmp_path / "config.yaml").write_text(TEMPLATE.read_text())
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    write_corpus(tmp_path / FOLDER, chapters=300)
    result = snakemake(tmp_path, configfiles=(tmp_path / "tiny.yaml",))
    assert result.rc == 0, result.out[-4000:] + logs_of(tmp_path)
    fit = json.loads((tmp_path / "results/studies/calibrate/natural/lawfit.json").read_text())
    assert fit["ok"], fit["reason"]
    assert (fit["a"], fit["b"], fit["exponents_source"]) == (0.37, 0.62, "published")
    heldout = json.loads(
        (tmp_path / "results/studies/calibrate/natural/heldout/heldout.json").read_text()
    )
    assert heldout["kinds"]["cell"]["reason"] == "B16-C8: the fit keeps one value of B; it needs 2"
    predicted = subprocess.run(
        [sys.executable, "-m", "ihsweep.predict", "-B", "1024", "-C", "2048", "--law",
         "study:calibrate", "--json"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(predicted.stdout)["predictions"][0]
    assert row["updates_low"] < row["updates"] < row["updates_high"]
    assert row["outside_B"] == 1024 / 32  # fitted at B 16 and 32
