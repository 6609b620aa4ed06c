"""Checkpoint suites (ihsweep.probing.suite): the probe step on a suite of local revision
folders of tiny ``transformers`` models against the independent computation of test_hf, the
revision cache, the checks made before any job, Pythia's study as a dry run, and a suite
through the whole DAG (probe, emergence table, law fit's size term, figures) next to nothing
else of ours."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

transformers = pytest.importorskip("transformers")

from conftest import REPO, job_stats, run_study, snakemake  # noqa: E402
from ihsweep.config import ConfigError  # noqa: E402
from ihsweep.config.revisions import PYTHIA_REVISIONS  # noqa: E402
from ihsweep.cost.report import cost_report  # noqa: E402
from ihsweep.files import layout  # noqa: E402
from ihsweep.probing.hf import load_revision  # noqa: E402
from ihsweep.probing.run import HEAD_COLUMNS, MODEL_COLUMNS, RECORD_COLUMNS  # noqa: E402
from ihsweep.probing.scores import make_probe_batch  # noqa: E402
from ihsweep.probing.suite import revision_step  # noqa: E402
from ihsweep.steps import probe_suite as step  # noqa: E402
from ihsweep.steps.prepare import prepare  # noqa: E402
from test_hf import PROBE, REVISIONS, C, V, reference_scores, save_revisions, tiny  # noqa: E402

# The aggregates of the test studies, which keep the schema's default name (`study`).
NATURAL = layout.natural_dir("default")

B = 8


def suite_spec(root: Path, **overrides) -> dict:
    spec = {"model": str(root), "revisions": REVISIONS, "batch_size": B, "context_size": C,
            "vocab_size": V}  # fmt: skip
    return spec | overrides


def probe_step(tmp_path: Path, spec: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = tmp_path / "results" / "suites" / "tiny" / "probes"
    argv = ["--name", "tiny", "--suite", json.dumps(spec), "--probe", json.dumps(PROBE),
            "--heads", str(out / "heads.parquet"), "--model-table", str(out / "model.parquet"),
            "--device", "cpu", "--threads", "1"]  # fmt: skip
    assert step.main(argv) == 0
    return pd.read_parquet(out / "heads.parquet"), pd.read_parquet(out / "model.parquet")


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "llama"])
def test_the_probe_step_on_a_suite_equals_the_independent_computation(model_type, tmp_path):
    save_revisions(tiny(model_type), tmp_path / "suite")
    heads, model = probe_step(tmp_path, suite_spec(tmp_path / "suite"))

    assert list(heads.columns) == HEAD_COLUMNS
    assert list(model.columns) == MODEL_COLUMNS + RECORD_COLUMNS
    tokens = make_probe_batch(V, C, PROBE["n_sequences"], PROBE["max_half_length"], PROBE["seed"])
    for revision in REVISIONS:
        hf = load_revision(tmp_path / "suite" / revision, local_files_only=True)
        ps, la, (acc, rank) = reference_scores(hf, tokens)
        step_n = revision_step(revision)
        rows = heads[heads["step"] == step_n]
        np.testing.assert_allclose(rows["ps"], ps, rtol=0, atol=1e-5)
        np.testing.assert_allclose(rows["la"], la, rtol=0, atol=1e-5)
        (row,) = model[model["step"] == step_n].to_dict("records")
        assert row["ar_acc"] == pytest.approx(acc, abs=1e-12)
        assert row["ar_rank"] == pytest.approx(rank, abs=1e-12)
        assert row["tokens"] == step_n * B * C
        assert row["n_params"] == sum(p.numel() for p in hf.parameters())
        later = rows["layer"].to_numpy() >= PROBE["min_layer"]
        assert row["ps_max"] == pytest.approx(ps[later].max(), abs=1e-5)
    assert set(model["run_id"]) == {f"tiny/tiny/B{B}-C{C}-s0"}
    assert set(model["model"]) == {"tiny"} and set(model["outcome"]) == {"completed"}
    assert model["budget"].iat[0] == revision_step(REVISIONS[-1]) * B * C


def test_revisions_probed_before_are_not_loaded_again(tmp_path, capsys):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    heads, model = probe_step(tmp_path, suite_spec(tmp_path / "suite", revisions=REVISIONS[:2]))
    assert capsys.readouterr().out.count("probed tiny") == 2
    # The first two revisions' folders go; the suite gains a third: only it is loaded.
    for revision in REVISIONS[:2]:
        for file in (tmp_path / "suite" / revision).iterdir():
            file.unlink()
    heads3, model3 = probe_step(tmp_path, suite_spec(tmp_path / "suite"))
    out = capsys.readouterr().out
    assert out.count("probed tiny") == 1 and f"probed tiny {REVISIONS[2]}" in out
    pd.testing.assert_frame_equal(model3[model3["step"] < 2][MODEL_COLUMNS], model[MODEL_COLUMNS])
    pd.testing.assert_frame_equal(heads3[heads3["step"] < 2], heads)
    assert len(model3) == 3


def test_a_revision_that_cannot_be_loaded_names_the_suite_and_revision(tmp_path, capsys):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    (tmp_path / "suite" / "step1" / "model.safetensors").write_bytes(b"not weights")
    out = tmp_path / "out"
    argv = ["--name", "tiny", "--suite", json.dumps(suite_spec(tmp_path / "suite")),
            "--heads", str(out / "h.parquet"), "--model-table", str(out / "m.parquet")]  # fmt: skip
    assert step.main(argv) == 1
    assert "suites.tiny: cannot load revision 'step1'" in capsys.readouterr().err


def test_a_missing_revision_or_architecture_fails_before_any_job(tmp_path):
    save_revisions(tiny("gpt2"), tmp_path / "suite")
    missing = suite_spec(tmp_path / "suite", revisions=["step0", "step7"])
    with pytest.raises(ConfigError, match=r"^suites\.tiny: revision 'step7' is not there"):
        prepare({"suites": {"tiny": missing}})
    with pytest.raises(ConfigError, match=r"^suites\.tiny\.revisions: revision 'main' has no"):
        prepare({"suites": {"tiny": suite_spec(tmp_path / "suite", revisions=["main"])}})

    opt = transformers.OPTForCausalLM(
        transformers.OPTConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                               num_attention_heads=4, word_embed_proj_dim=32)
    )  # fmt: skip
    opt.save_pretrained(tmp_path / "opt" / "step0")
    # On the command line: one line naming the suite and the supported types, no job.
    (tmp_path / "config.yaml").write_text(
        json.dumps({"suites": {"opt": suite_spec(tmp_path / "opt", revisions=["step0"])}})
    )
    result = snakemake(tmp_path, "-n")
    errors = [line for line in result.out.splitlines() if line.startswith("config error: ")]
    assert result.rc != 0 and errors == [
        "config error: suites.opt: model type 'opt' has no probe adapter; supported model "
        "types: gpt2, gpt_neox, llama, olmo"
    ], result.out
    assert "Job stats" not in result.out and "Traceback" not in result.out


def test_pythia_study_dry_run_probes_seven_suites(tmp_path):
    text = (REPO / "workflow" / "studies" / "pythia.yaml").read_text()
    study = prepare(yaml.safe_load(text))
    assert len(study.suites) == 7 and study.runs == []
    assert {s["batch_size"] * s["context_size"] for s in study.suites.values()} == {2_097_152}
    assert len(PYTHIA_REVISIONS) == 154 and PYTHIA_REVISIONS[-1] == "step143000"
    (tmp_path / "config.yaml").write_text(text)  # the study alone, as its --configfile gives it
    result = snakemake(tmp_path, "-n")
    assert result.rc == 0, result.out
    assert job_stats(result.out) == {"probe_suite": 7, "aggregate_natural": 1, "all": 1}
    # The cost table (make cost): a study of suites trains nothing (and once divided by zero).
    assert (
        cost_report(study)[0]
        == "no training runs: the study trains nothing (checkpoint suites only)"
    )


@pytest.mark.slow
def test_two_suites_through_the_dag_give_the_size_term(tmp_path):
    # Two "sizes" of one architecture, each a suite of three local revisions at one B and C.
    for name, width in (("small", 32), ("large", 64)):
        config = transformers.GPT2Config(
            vocab_size=V, n_positions=C, n_embd=width, n_layer=2, n_head=4, bos_token_id=None,
            eos_token_id=None,
        )  # fmt: skip
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        save_revisions(model, tmp_path / name)
    study = {"suites": {name: suite_spec(tmp_path / name) for name in ("small", "large")},
             "probe": PROBE, "execution": {"device": "cpu"}}  # fmt: skip
    result = run_study(tmp_path, json.dumps(study))
    assert job_stats(result.out) == {"probe_suite": 2, "aggregate_natural": 1, "all": 1}
    emergence = pd.read_csv(tmp_path / NATURAL / "emergence.csv")
    assert sorted(emergence["model"]) == ["large", "small"]
    assert set(emergence["batch_size"]) == {B} and set(emergence["context_size"]) == {C}
    fit = json.loads((tmp_path / NATURAL / "lawfit.json").read_text())
    assert fit["ok"] is False  # one B and C: no a, b
    for stem in ("model_size", "run_curves", "law_fit", "emergence_vs_BC"):
        assert (tmp_path / NATURAL / f"figures/{stem}.png").stat().st_size > 0
    again = snakemake(tmp_path)
    assert again.rc == 0 and "Nothing to be done" in again.out
