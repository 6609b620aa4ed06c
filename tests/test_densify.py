"""``checkpoints.densify``: log-spaced checkpoints around each run's predicted emergence point.

The law U_pt = T / (B^a C^b) (docs/method.md#the-law-and-its-fit), given inline or read from a
pilot study's lawfit.json, predicts each natural-data run's emergence point; the token counts
added around it are merged with the fixed schedule and converted to steps like it. Studies are
the tiny ones of tests/studies/, with overrides merged as several ``--configfile`` files merge.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import job_stats, snakemake, study_text
from ihsweep.analysis.lawfit import fit_law, predict_updates
from ihsweep.config import ConfigError, Run
from ihsweep.cost.study import StudyCost
from ihsweep.steps.prepare import prepare
from snakemake.utils import update_config

LAW = {"a": 0.37, "b": 0.62, "log10_T": 4.0}
DENSIFY = {"law": LAW, "window_decades": 0.5, "per_decade": 8}


def study_config(name: str = "base", override: str | dict = "{}") -> dict:
    """A tests/studies/ study with ``override`` merged in (mappings key by key)."""
    config = yaml.safe_load(study_text(name))
    if isinstance(override, str):
        override = yaml.safe_load(textwrap.dedent(override))
    update_config(config, override)
    return config


def densified(densify: dict, name: str = "base") -> dict:
    return study_config(name, {"checkpoints": {"densify": densify}})


def step_of(tokens: int, run: Run, total_steps: int) -> int:
    return min(max(round(tokens / run.tokens_per_step), 1), total_steps)


def write_lawfit(path: Path, law: dict = LAW, **extra) -> Path:
    """A lawfit.json as ``fit_law`` writes it, holding ``law`` (plus or minus ``extra``)."""
    fit = {
        "ok": True,
        "reason": "",
        "formula": "log10 U_pt = ...",
        **law,
        "T": 10.0 ** law["log10_T"],
    }
    fit.update(residual_sd_log10=0.05, n_runs=9, **extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fit), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    # lawfit paths are relative to the working directory, as in a Snakemake run.
    monkeypatch.chdir(tmp_path)


def test_added_checkpoints_are_converted_like_the_fixed_ones():
    plain = prepare(study_config())
    study = prepare(densified(DENSIFY))
    for run in study.runs:
        total = study.total_steps(run)
        updates = 10 ** LAW["log10_T"] / (run.batch_size ** LAW["a"] * run.context_size ** LAW["b"])
        prediction = study.prediction(run)
        assert prediction["updates"] == pytest.approx(updates, rel=1e-12)
        assert prediction["tokens"] == pytest.approx(updates * run.tokens_per_step, rel=1e-12)
        assert prediction["updates"] == pytest.approx(
            predict_updates(LAW, run.batch_size, run.context_size)
        )
        # 9 counts: k = -4..4 at 8 per decade, half a decade either side, all within budget here.
        added = study.densified_tokens(run)
        expected = [round(prediction["tokens"] * 10 ** (k / 8)) for k in range(-4, 5)]
        assert added == expected
        assert all(0 < t <= study.training(run)["tokens"] for t in added)
        steps = study.checkpoint_steps(run)
        assert {step_of(t, run, total) for t in added} <= set(steps)
        assert set(plain.checkpoint_steps(run)) <= set(steps)  # the fixed ones are still there
        assert steps == sorted(set(steps)) and steps[-1] == total
        assert set(steps) == set(plain.checkpoint_steps(run)) | {
            step_of(t, run, total) for t in added
        }
        spec = study.train_spec(run)
        assert spec["checkpoint_steps"] == steps
        assert spec["checkpoint_tokens"] == [s * run.tokens_per_step for s in steps]
        assert spec["prediction"] == {
            "tokens": prediction["tokens"],
            "updates": prediction["updates"],
            "law": LAW,
            "source": "config",
            "window_decades": 0.5,
            "per_decade": 8,
        }
        assert json.loads(json.dumps(spec)) == spec
        # What counts checkpoints counts these: the cost table's column.
        assert StudyCost(study).row(run)["checkpoints"] == len(steps)


def test_window_and_density_and_budget():
    # A prediction near the budget: the upper half of the window is cut at the budget.
    config = densified({"law": {"a": 0.0, "b": 0.0, "log10_T": 5.0}, "window_decades": 1,
                        "per_decade": 2})  # fmt: skip
    config["training"]["tokens"] = 2 * 10**6
    config["runs"] = [{"data": "kjv-copy", "model": "tiny", "batch_size": 1, "context_size": 32}]
    study = prepare(config)
    (run,) = study.runs
    predicted = study.prediction(run)["tokens"]
    assert predicted == 10**5 * 32  # 3.2M tokens, beyond the 2M budget
    # k = -2..2 at 2 per decade: 3.2e5, 1.01e6, then 3.2e6 and beyond are cut at the budget.
    assert study.densified_tokens(run) == [320000, round(predicted * 10 ** (-1 / 2))]
    assert study.total_steps(run) == 62500
    assert {10000, 31623} <= set(study.checkpoint_steps(run))


def test_defaults_fill_in_and_densify_works_with_both_schedule_forms():
    config = densified({"law": LAW})
    study = prepare(config)
    assert config["checkpoints"]["densify"] == {**DENSIFY}
    assert study.densified_tokens(study.runs[0])
    explicit = study_config()
    explicit["checkpoints"] = {"tokens": [100000, 1000000], "densify": {"law": LAW}}
    study = prepare(explicit)
    run = study.runs[0]
    steps = study.checkpoint_steps(run)
    assert {step_of(t, run, study.total_steps(run)) for t in (100000, 1000000)} <= set(steps)
    assert {step_of(t, run, study.total_steps(run)) for t in study.densified_tokens(run)} <= set(
        steps
    )


def test_preparing_twice_gives_identical_schedules_and_specs(tmp_path):
    path = write_lawfit(tmp_path / "results/pilot/natural/lawfit.json")
    config = densified({"lawfit": "results/pilot/natural/lawfit.json"})
    first, second = prepare(json.loads(json.dumps(config))), prepare(json.loads(json.dumps(config)))
    for run in first.runs:
        assert first.checkpoint_steps(run) == second.checkpoint_steps(run)
        assert json.dumps(first.train_spec(run), sort_keys=True) == json.dumps(
            second.train_spec(run), sort_keys=True
        )
    spec = first.train_spec(first.runs[0])
    assert spec["prediction"]["source"] == "results/pilot/natural/lawfit.json"
    assert path.exists()


def test_inline_law_and_lawfit_file_give_the_same_schedule(tmp_path):
    # A real fit_law output, fitted to emergence points that follow a known law exactly.
    B, C = np.meshgrid([8, 16, 32, 64], [32, 64, 128])
    B, C = B.ravel(), C.ravel()
    emergence = pd.DataFrame({
        "run_id": [f"r{i}" for i in range(len(B))], "emerged": True,
        "updates_pt": 10**3.9 / (B**0.4 * C**0.6), "batch_size": B, "context_size": C,
        "n_params": 1000, "metric": "ps_max", "method": "sigmoid", "data": "kjv-copy",
    })  # fmt: skip
    fit = fit_law(emergence, n_boot=20, seed=0)
    assert fit["ok"]
    (tmp_path / "lawfit.json").write_text(json.dumps(fit, allow_nan=False), encoding="utf-8")
    from_file = prepare(densified({"lawfit": "lawfit.json"}))
    law = {k: fit[k] for k in ("a", "b", "log10_T")}
    inline = prepare(densified({"law": law}))
    for run in inline.runs:
        assert from_file.checkpoint_steps(run) == inline.checkpoint_steps(run)
        a, b = from_file.prediction(run), inline.prediction(run)
        assert (a["source"], b["source"]) == ("lawfit.json", "config")
        assert {**a, "source": None} == {**b, "source": None}
        assert a["updates"] == pytest.approx(predict_updates(fit, run.batch_size, run.context_size))


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("missing", ["does not exist", "run the pilot study first", "checkpoints.densify.law"]),
        ("malformed", ["is not valid JSON"]),
        ("not-fitted", ["no fitted law", "ok: False", "only 2 emerged runs"]),
        ("no-b", ["no numeric b", "it is missing"]),
        ("b-null", ["no numeric b", "got None"]),
        ("a-list", ["holds list"]),
    ],
)
def test_bad_lawfit_is_a_config_error_naming_the_key(tmp_path, case, fragments):
    path = tmp_path / "pilot" / "lawfit.json"
    if case == "malformed":
        path.parent.mkdir()
        path.write_text('{"ok": true, "a": 0.3,', encoding="utf-8")
    elif case == "not-fitted":
        law = dict.fromkeys(LAW)
        write_lawfit(path, {**law, "log10_T": 0.0}, ok=False, reason="only 2 emerged runs; ...")
    elif case == "no-b":
        write_lawfit(path)
        fit = json.loads(path.read_text())
        del fit["b"]
        path.write_text(json.dumps(fit))
    elif case == "b-null":
        write_lawfit(path, {**LAW, "b": None})
    elif case == "a-list":
        path.parent.mkdir()
        path.write_text("[0.37, 0.62, 4.0]")
    with pytest.raises(ConfigError) as err:
        prepare(densified({"lawfit": "pilot/lawfit.json"}))
    message = str(err.value)
    assert message.startswith("checkpoints.densify.lawfit: 'pilot/lawfit.json'"), message
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("densify", "fragments"),
    [
        ({"law": {"a": 0.37, "log10_T": 4.0}}, ["checkpoints.densify.law", "'b'"]),
        ({"law": {**LAW, "b": "0.62"}}, ["checkpoints.densify.law.b", "expected a number"]),
        ({"law": {**LAW, "a": math.nan}}, ["checkpoints.densify.law.a", "not a finite number"]),
        ({"law": LAW, "lawfit": "x.json"}, ["checkpoints.densify", "both law and lawfit"]),
        ({"window_decades": 0.5}, ["checkpoints.densify", "lawfit", "law: {a, b, log10_T}"]),
        ({"law": LAW, "window_decades": 0}, ["checkpoints.densify.window_decades", "> 0"]),
        ({"law": LAW, "per_decade": 0}, ["checkpoints.densify.per_decade", ">= 1"]),
        ({"law": LAW, "per_decade": 2.5}, ["checkpoints.densify.per_decade", "an integer"]),
        ({"law": LAW, "every": 3}, ["checkpoints.densify.every", "unknown key"]),
        ({"law": {**LAW, "log10_T": 400.0}}, ["checkpoints.densify.law", "check a, b"]),
    ],
)
def test_bad_densify_settings(densify, fragments):
    with pytest.raises(ConfigError) as err:
        prepare(densified(densify))
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_densify_off_leaves_specs_exactly_as_before():
    plain = prepare(study_config())
    for off in (study_config(), densified(None)):
        study = prepare(off)
        assert study.densify is None
        for run in study.runs:
            assert study.prediction(run) is None and study.densified_tokens(run) == []
            spec = study.train_spec(run)
            assert "prediction" not in spec
            assert json.dumps(spec, sort_keys=True) == json.dumps(
                plain.train_spec(run), sort_keys=True
            )
    # Absent, no key appears in the config either (its hash, the provenance, is unchanged).
    config = study_config()
    prepare(config)
    assert "densify" not in config["checkpoints"]


def test_markov_runs_are_not_densified():
    extra = {"data": "kjv", "model": "tiny", "batch_size": 4, "context_size": 32, "seed": 0}
    plain_config = study_config("markov")
    plain_config["runs"].append(extra)
    config = densified({"law": {"a": 0.0, "b": 0.0, "log10_T": 2.0}}, "markov")
    config["runs"].append(extra)
    plain, study = prepare(plain_config), prepare(config)
    markov = study.runs_of_family("markov")
    assert markov
    for run in markov:
        assert study.prediction(run) is None
        assert "prediction" not in study.train_spec(run)
        assert study.checkpoint_steps(run) == plain.checkpoint_steps(run)
    (natural,) = study.runs_of_family("natural")
    assert study.prediction(natural)["tokens"] == 100 * 128
    assert len(study.checkpoint_steps(natural)) > len(plain.checkpoint_steps(natural))


def test_snakemake_dry_run_of_a_densified_study(tmp_path):
    write_lawfit(tmp_path / "results/pilot/natural/lawfit.json")
    config = densified({"lawfit": "results/pilot/natural/lawfit.json"})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = snakemake(tmp_path, "-n", timeout=300)
    assert result.rc == 0, result.out[-4000:]
    study = prepare(config)
    assert job_stats(result.out)["train"] == len(study.runs)
    # The cost table (python -m ihsweep.cost, make cost) counts the densified checkpoints.
    table = subprocess.run(
        [sys.executable, "-m", "ihsweep.cost", "--configfile", "config.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = list(map(str.split, table.stdout.splitlines()))
    column = next(row for row in rows if row[:2] == ["run", "updates"]).index("ckpts")
    for run in study.runs:
        row = next(row for row in rows if row[:1] == [run.id])
        assert int(row[column]) == len(study.checkpoint_steps(run)), row
