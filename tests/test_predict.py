"""ihsweep.predict and ihsweep.analysis.predict: the published law by hand, intervals that cover
new runs drawn from a known law, the fixed-exponent calibration, and the command's errors.

The coverage tests fit 200 synthetic tables each; they stay fast because a fit is vectorised
(one einsum solve for all bootstrap resamples) and use 200 resamples, enough for a standard
deviation (the prediction interval) and for 2.5th/97.5th percentiles to about +-1 point of
coverage.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
from ihsweep import predict as command
from ihsweep.analysis.lawfit import PUBLISHED, fit_law, fixed_exponents
from ihsweep.analysis.predict import (
    law_from_fit,
    log10_updates,
    predict,
    published_law,
    warnings,
    within_tokens,
)

A, B_EXP, LOG10_T, NOISE = 0.6, 0.5, 5.2, 0.1
BATCHES, CONTEXTS = [8, 16, 32, 64], [8, 16, 32, 64]


def table(rng, seeds=2, batches=BATCHES, contexts=CONTEXTS) -> pd.DataFrame:
    """Emerged runs drawn from the known law with normal noise of sd NOISE in log10 updates."""
    b, c, s = (x.ravel() for x in np.meshgrid(batches, contexts, range(seeds), indexing="ij"))
    log_u = LOG10_T - A * np.log10(b) - B_EXP * np.log10(c) + rng.normal(0, NOISE, b.size)
    return pd.DataFrame({
        "run_id": [f"B{x}-C{y}-s{z}" for x, y, z in zip(b, c, s, strict=True)],
        "model": "m", "n_params": 1000, "batch_size": b, "context_size": c, "seed": s,
        "emerged": True, "updates_pt": 10.0**log_u,
    })  # fmt: skip


# --- the published law, worked by hand ---------------------------------------------------------
# ln U = 13.26 - 0.37 ln B - 0.62 ln C. Pythia (B 1024, C 2048): 13.26 - 0.37 * 6.93147
# - 0.62 * 7.62462 = 5.96809, e^5.96809 = 390.8 updates, x 1024 x 2048 = 8.195e8 tokens.
HAND = [(1024, 2048, "390.8", "8.195e+08"), (16, 32, "2.399e+04", "1.228e+07"),
        (512, 4096, "328.6", "6.891e+08")]  # fmt: skip


@pytest.mark.parametrize("B, C, updates, tokens", HAND)
def test_the_published_law_by_hand(B, C, updates, tokens):
    row = predict(published_law(), [B], [C]).iloc[0]
    assert f"{row.updates:.4g}" == updates and f"{row.tokens:.4g}" == tokens
    assert math.isnan(row.updates_low)  # no interval published
    assert f"{PUBLISHED['log10_T']:.3f}" == "5.759"


def test_extrapolation_is_measured_per_axis_and_in_law_units():
    law = published_law()
    pythia = predict(law, [1024], [2048])
    assert pythia.outside_B.item() == 2.0 and pythia.outside_C.item() == 1.0
    assert pythia.outside_law_units.item() == 1.0  # B^a C^b stays inside the grid's range
    (line,) = warnings(law, pythia)
    assert "B is 2x outside the fitted range 4-512" in line
    far = predict(law, [1], [1])  # B^a C^b = 1 vs 4^0.37 4^0.62 = 3.95 at the grid's corner
    assert far.outside_law_units.item() == pytest.approx(4**0.99)
    tiny = predict(law, [1], [0.01])
    assert tiny.outside_law_units.item() > 10
    assert any("in the law's units B^a C^b" in w for w in warnings(law, tiny))


def test_the_inverse_question_lands_on_the_budget():
    law = published_law()
    (at_b,) = within_tokens(law, 1e9, batch_size=[1024])
    assert at_b["side"] == "at most"  # b < 1: tokens grow with C
    assert predict(law, [1024], [at_b["bound"]]).tokens.item() == pytest.approx(1e9)
    (at_c,) = within_tokens(law, 1e9, context_size=[2048])
    assert predict(law, [at_c["bound"]], [2048]).tokens.item() == pytest.approx(1e9)


# --- intervals on synthetic tables from a known law --------------------------------------------


def test_the_fixed_exponent_fit_recovers_log10_T_inside_its_interval():
    rng = np.random.default_rng(0)
    exponents = {"a": A, "b": B_EXP, "source": "config"}
    hits = []
    for seed in range(200):
        fit = fit_law(table(rng, seeds=1), n_boot=200, seed=seed, exponents=exponents)
        assert fit["a"] == A and fit["a_ci"] is None and fit["exponents_source"] == "config"
        lo, hi = fit["log10_T_ci"]
        hits.append(lo <= LOG10_T <= hi)
    assert np.mean(hits) >= 0.90, np.mean(hits)


@pytest.mark.parametrize("exponents", [None, {"a": A, "b": B_EXP, "source": "config"}])
def test_prediction_intervals_cover_new_runs(exponents):
    """New runs at cells inside the grid and between its values, drawn from the same law."""
    rng = np.random.default_rng(1)
    new_b, new_c = np.array([8, 24, 64, 12]), np.array([64, 24, 8, 40])
    truth = LOG10_T - A * np.log10(new_b) - B_EXP * np.log10(new_c)
    inside = []
    for seed in range(200):
        law = law_from_fit(fit_law(table(rng), 200, seed, exponents=exponents), "synthetic")
        _, low, high = log10_updates(law, new_b, new_c)
        new = truth + rng.normal(0, NOISE, truth.size)
        inside.append((low <= new) & (new <= high))
    coverage = np.mean(inside)
    assert 0.90 <= coverage <= 0.99, coverage


def test_fixed_exponents_come_from_the_config():
    assert fixed_exponents(None) is None
    assert fixed_exponents("published") == {"a": 0.37, "b": 0.62, "source": "published"}
    assert fixed_exponents({"a": 1, "b": 0.5})["source"] == "config"
    few = table(np.random.default_rng(2), seeds=1, batches=[16], contexts=[32, 64])
    assert fit_law(few, 50, 0)["ok"] is False  # B does not vary: no free fit
    fit = fit_law(few, 50, 0, exponents=fixed_exponents("published"))
    assert fit["ok"] and fit["batch_sizes"] == [16] and fit["context_sizes"] == [32, 64]
    assert len(fit["boot_draws"]) == 50 and fit["boot_draws"][0][1:] == [0.37, 0.62]


def test_a_study_law_with_a_size_term():
    rng = np.random.default_rng(3)
    sizes = [table(rng, seeds=1).assign(n_params=n) for n in (1e4, 1e5)]
    runs = pd.concat([t.assign(run_id=t.run_id + f"-{i}") for i, t in enumerate(sizes)])
    fit = fit_law(runs, 100, 0)
    law = law_from_fit(fit, "synthetic", size=True)
    row = predict(law, [16], [32], n_params=1e5).iloc[0]
    assert row.updates_low < row.updates < row.updates_high and row.outside_N == 1.0
    assert law.c == fit["c"]


# --- the command --------------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = command.main(list(argv))
    except SystemExit as exit_:
        rc = exit_.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def write_fit(path, **change) -> str:
    fit = fit_law(table(np.random.default_rng(4)), 100, 0)
    fit.update(change)
    path.write_text(json.dumps(fit))
    return str(path)


def test_the_command_prints_a_table_and_json(capsys, tmp_path):
    rc, out, err = run(capsys, "-B", "1024", "-C", "2048")
    assert rc == 0 and "no interval published" in out and "391" in out
    assert "B is 2x outside" in err
    law = write_fit(tmp_path / "lawfit.json")
    rc, out, _ = run(capsys, "-B", "16", "64", "-C", "32", "--law", law, "--json")
    result = json.loads(out)
    assert rc == 0 and len(result["predictions"]) == 2
    assert result["interval"] == "95% prediction interval for a new run"
    first = result["predictions"][0]
    assert first["updates_low"] < first["updates"] < first["updates_high"]
    rc, out, _ = run(capsys, "-C", "2048", "--within-tokens", "1e9")
    assert rc == 0 and "for B at most" in out


def test_a_study_law_is_read_from_its_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "results" / "studies" / "pilot" / "natural"
    folder.mkdir(parents=True)
    write_fit(folder / "lawfit.json")
    rc, out, _ = run(capsys, "-B", "16", "-C", "32", "--law", "study:pilot")
    assert rc == 0 and "law results/studies/pilot/natural/lawfit.json" in out


def one_error(capsys, *argv) -> str:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("value", ["0", "-4", "2.5", "many"])
def test_a_size_that_is_not_a_positive_integer(capsys, value):
    assert f"{value!r} is not a positive integer" in one_error(capsys, "-B", value, "-C", "8")


def test_a_missing_law_file(capsys, tmp_path):
    err = one_error(capsys, "-B", "8", "-C", "8", "--law", str(tmp_path / "nope.json"))
    assert "no such file; give published, study:NAME" in err


def test_a_law_that_did_not_fit(capsys, tmp_path):
    law = write_fit(tmp_path / "lawfit.json", ok=False, reason="only 3 emerged runs")
    assert "holds no fitted law (only 3 emerged runs)" in one_error(capsys, "-B", "8", "-C", "8",
                                                                    "--law", law)  # fmt: skip


def test_a_study_without_a_law_fit_names_the_command(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_error(capsys, "-B", "8", "-C", "8", "--law", "study:calibrate")
    assert "snakemake --cores all results/studies/calibrate/natural/lawfit.json" in err


def test_a_size_term_asked_of_a_law_without_one(capsys, tmp_path):
    assert "no size term" in one_error(capsys, "-B", "8", "-C", "8", "--params", "1e6")
    law = write_fit(tmp_path / "lawfit.json")  # one n_params: no size term fitted
    err = one_error(capsys, "-B", "8", "-C", "8", "--params", "1e6", "--law", law)
    assert "no law with a size term" in err


def test_an_older_law_file_says_which_aggregate_to_rerun(capsys, tmp_path):
    law = tmp_path / "lawfit.json"
    write_fit(law)
    old = {k: v for k, v in json.loads(law.read_text()).items() if k != "boot_draws"}
    law.write_text(json.dumps(old))
    err = one_error(capsys, "-B", "8", "-C", "8", "--law", str(law))
    assert "--forcerun aggregate_natural" in err
