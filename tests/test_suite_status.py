"""A study of checkpoint suites only, in `status` and `where`: its suites, their revisions and
each revision's probe state, from the files the real probe step writes for tiny `transformers`
suites; `where` resolves suite and revision patterns."""

from __future__ import annotations

import json

import pytest
import yaml

transformers = pytest.importorskip("transformers")

from ihsweep import where  # noqa: E402
from ihsweep.config import StudyPaths, study_of_files  # noqa: E402
from ihsweep.status import main as status  # noqa: E402
from ihsweep.steps import probe_suite as step  # noqa: E402
from test_hf import PROBE, REVISIONS, C, V, save_revisions, tiny  # noqa: E402


def probe(root, paths, name: str, spec: dict) -> None:
    """The suite's probe job, into the study's folder for it."""
    argv = ["--name", name, "--suite", json.dumps(spec), "--probe", json.dumps(PROBE),
            "--heads", str(root / paths.suite_table("heads", name)),
            "--model-table", str(root / paths.suite_table("model", name)),
            "--device", "cpu", "--threads", "1"]  # fmt: skip
    assert step.main(argv) == 0


def test_a_suites_only_study_lists_its_suites_revisions_and_probe_state(
    tmp_path, monkeypatch, capsys
):
    save_revisions(tiny("gpt2"), tmp_path / "weights")
    spec = {"model": str(tmp_path / "weights"), "revisions": REVISIONS, "batch_size": 8,
            "context_size": C, "vocab_size": V}  # fmt: skip
    config = {"study": "suites", "suites": {"tiny": spec, "late": spec | {"revisions": ["step2"]}},
              "probe": PROBE, "execution": {"device": "cpu"}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    paths = StudyPaths(study_of_files([tmp_path / "config.yaml"]))

    probe(tmp_path, paths, "tiny", spec | {"revisions": REVISIONS[:2]})  # stopped after two
    capsys.readouterr()
    assert status(["--configfile", "config.yaml"]) == 0
    out = capsys.readouterr().out
    assert "runs:" not in out and "ETA" not in out  # no table of runs it does not have
    weights = str(tmp_path / "weights")
    assert table_row(out, "tiny") == ["tiny", weights, "8", str(C), "3", "2", "probed 2 of 3"]
    assert table_row(out, "late") == ["late", weights, "8", str(C), "1", "0", "missing"]
    assert "tiny probed: step0 step1" in out and "tiny not yet: step2" in out
    assert "late not yet: step2" in out
    assert "2 checkpoint suites (probed, not trained): 0 done; 2 of 4 revisions probed" in out

    probe(tmp_path, paths, "tiny", spec)  # the whole suite: step2 alone is probed
    capsys.readouterr()
    assert status(["--configfile", "config.yaml"]) == 0
    out = capsys.readouterr().out
    assert table_row(out, "tiny")[-1] == "done" and "tiny probed: step0 step1 step2" in out

    assert where.main(["tiny/step*", "--configfile", "config.yaml"]) == 0
    found = capsys.readouterr().out.split()
    assert found == [paths.revision_cache("tiny", r) for r in REVISIONS]
    assert all((tmp_path / f).is_file() for f in found)
    assert where.main(["*/step2", "--configfile", "config.yaml"]) == 0
    assert capsys.readouterr().out.split() == [
        paths.revision_cache("late", "step2"), paths.revision_cache("tiny", "step2")
    ]  # the study's order (its config's keys, which safe_dump sorts)  # fmt: skip
    assert where.main(["l*", "--configfile", "config.yaml"]) == 0
    assert capsys.readouterr().out.split() == [paths.suite_dir("late")]
    assert where.main(["tiny/step7", "--configfile", "config.yaml"]) == 1
    assert "no run, dataset, chain, suite or suite revision" in capsys.readouterr().err


def table_row(out: str, suite: str) -> list[str]:
    """The suite's row of the printed table: its cells (the state's words joined)."""
    (cells,) = [line.split() for line in out.splitlines() if line.split()[:1] == [suite]
                and len(line.split()) > 2 and line.split()[1].startswith("/")]  # fmt: skip
    return cells[:6] + [" ".join(cells[6:])]
