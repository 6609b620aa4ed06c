"""ihsweep.analysis.emergence: known transitions are found; flat or late curves are "no transition".

Synthetic metric curves on the default checkpoint schedule (tokens doubling from 62,500 to 1M,
then every 250k to 6M: 25 checkpoints, log10 tokens 4.80 to 6.78), with Gaussian noise of sd
0.02 from a fixed seed. Tolerance for a recovered point: 0.1 decades of tokens (a factor of
1.26), against checkpoint gaps of 0.3 decades early and 0.02-0.1 late.
"""

import math

import numpy as np
import pandas as pd
import pytest
from ihsweep.analysis.emergence import (
    METHODS,
    TABLE_COLUMNS,
    confirmed_emergence,
    detect,
    emergence_table,
    replay_stop,
    run_point,
    sustained_rise,
)
from scipy.special import expit

TOKENS = np.array([62_500 * 2**i for i in range(5)] + list(range(1_250_000, 6_000_001, 250_000)))
X = np.log10(TOKENS)
TOLERANCE = 0.1  # decades of tokens
NOISE = 0.02
MIN_RISE = 0.1  # the study default (schema), passed explicitly: detect has no defaults
RULE = {"metric": "ps_max", "method": "breakpoint", "min_rise": MIN_RISE}


def logistic(x0, k=15.0):
    """Metric rising from 0.05 to 0.85 with midpoint x0 (log10 tokens), slope k per decade."""
    return 0.05 + 0.8 * expit(k * (X - x0))


def ramp(x1, width=None):
    """Flat at 0.05 until x1, then linear; saturating at 0.85 after ``width`` decades if given."""
    if width is None:  # a pure hinge: rises until the budget ends
        return 0.05 + 0.6 * np.maximum(X - x1, 0.0)
    return 0.05 + 0.8 * (np.clip(X, x1, x1 + width) - x1) / width


def noisy(y, seed=0):
    return y + np.random.default_rng(seed).normal(0.0, NOISE, len(y))


def log_point(result):
    return tuple(math.log10(result[k]) for k in ("tokens_pt", "tokens_lo", "tokens_hi"))


def check_recovery(method, curve, truth, n_draws=10):
    """Over noise draws: every point within TOLERANCE, intervals narrow and mostly covering.

    The intervals are approximate 95% ones (profile F-bound, linearised covariance); across
    40 draws per case we measured 85-98% coverage, so 8 of 10 is the bar here.
    """
    covered = 0
    for seed in range(n_draws):
        result = detect(TOKENS, noisy(curve, seed), method=method, min_rise=MIN_RISE)
        assert result["emerged"] and result["reason"] == "", result["reason"]
        point, lo, hi = log_point(result)
        assert abs(point - truth) < TOLERANCE
        assert lo <= point <= hi
        assert hi - lo < 0.35  # at most about one early checkpoint gap (0.3 decades)
        covered += lo <= truth <= hi
    assert covered >= 0.8 * n_draws


@pytest.mark.parametrize("x0", [5.45, 5.85, 6.25, 6.55])
def test_sigmoid_recovers_the_midpoint(x0):
    check_recovery("sigmoid", logistic(x0), x0)


@pytest.mark.parametrize(
    "x1, width", [(5.3, 0.4), (5.6, 0.4), (5.9, 0.3), (6.2, 0.3), (5.5, None), (6.45, None)]
)
def test_breakpoint_recovers_the_onset(x1, width):
    check_recovery("breakpoint", ramp(x1, width), x1)


@pytest.mark.parametrize("method", METHODS)
def test_wrong_point_lies_outside_the_interval(method):
    # Guards against intervals so wide that the recovery tests cannot fail.
    result = detect(
        TOKENS,
        noisy(ramp(6.1, 0.3) if method == "breakpoint" else logistic(6.2)),
        method=method,
        min_rise=MIN_RISE,
    )
    _, lo, hi = log_point(result)
    assert not lo <= 6.4 <= hi
    assert not lo <= 5.9 <= hi


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_noise_does_not_emerge(method, seed):
    result = detect(TOKENS, noisy(np.full(len(X), 0.05), seed), method=method, min_rise=MIN_RISE)
    assert result["emerged"] is False
    assert all(math.isnan(result[k]) for k in ("tokens_pt", "tokens_lo", "tokens_hi"))
    assert "min_rise" in result["reason"]
    assert result["rise"] < 0.1
    assert result["method"] == method


@pytest.mark.parametrize("method", METHODS)
def test_jump_at_the_last_checkpoint_is_not_a_transition(method):
    # Our rule: a rise seen at one checkpoint only is indistinguishable from noise.
    y = noisy(np.full(len(X), 0.05))
    y[-1] = 0.85
    result = detect(TOKENS, y, method=method, min_rise=MIN_RISE)
    assert result["emerged"] is False
    assert "single checkpoint" in result["reason"]


def test_rise_over_the_last_two_checkpoints_emerges_just_before_them():
    y = noisy(np.full(len(X), 0.05))
    y[-2:] = 0.85
    result = detect(TOKENS, y, method="breakpoint", min_rise=MIN_RISE)
    assert result["emerged"]
    point, lo, hi = log_point(result)
    assert X[-3] <= lo <= point <= hi <= X[-2]


def test_sigmoid_midpoint_beyond_the_budget_is_not_emerged():
    # Only the foot of the rise is visible (it reaches 0.22); the midpoint is at 10M tokens.
    # Noise-free on purpose: with noise of 0.02 on so small a rise, about a third of draws fit
    # a small sharp step near the end instead, which the data cannot rule out.
    y = logistic(7.0, k=6.0)
    assert sustained_rise(y) > 0.1
    result = detect(TOKENS, y, method="sigmoid", min_rise=MIN_RISE)
    assert result["emerged"] is False
    assert "end of the budget" in result["reason"]


@pytest.mark.parametrize("method", METHODS)
def test_rise_from_the_first_checkpoint_is_left_censored(method):
    result = detect(TOKENS, noisy(ramp(4.6, 0.6)), method=method, min_rise=MIN_RISE)
    assert result["emerged"] is False
    assert "start of the budget" in result["reason"]


def test_min_rise_decides():
    y = 0.05 + 0.3 * (noisy(ramp(6.0, 0.3)) - 0.05) / 0.8  # rises by 0.3
    assert detect(TOKENS, y, method="breakpoint", min_rise=0.1)["emerged"]
    result = detect(TOKENS, y, method="breakpoint", min_rise=0.5)
    assert not result["emerged"] and "min_rise 0.5" in result["reason"]


def test_sustained_rise_ignores_single_spikes():
    y = np.zeros(10)
    y[4] = 1.0
    assert sustained_rise(y) == 0.0
    y[4:6] = 1.0
    assert sustained_rise(y) == 0.0  # a bump that falls back keeps nothing
    y[4:] = 1.0
    assert sustained_rise(y) == 1.0
    y[7:] = 0.4
    assert sustained_rise(y) == pytest.approx(0.4)  # only what is held to the end counts
    assert sustained_rise(np.linspace(1.0, 0.0, 10)) == 0.0  # falling curves do not rise


def test_missing_values_are_dropped_and_too_few_checkpoints_refused():
    y = noisy(ramp(6.0, 0.3))
    y[3] = np.nan
    assert detect(TOKENS, y, "breakpoint", MIN_RISE)["emerged"]
    result = detect(TOKENS[:5], y[:5], "breakpoint", MIN_RISE)
    assert not result["emerged"] and "checkpoints" in result["reason"]


def test_bad_input_raises():
    with pytest.raises(ValueError, match="ascending"):
        detect(TOKENS[::-1], logistic(6.0)[::-1], "breakpoint", MIN_RISE)
    with pytest.raises(ValueError, match="> 0"):
        detect(np.r_[0, TOKENS[1:]], logistic(6.0), "breakpoint", MIN_RISE)
    with pytest.raises(ValueError, match="method"):
        detect(TOKENS, logistic(6.0), method="threshold", min_rise=MIN_RISE)


def model_table_row(run_id, B, C, tokens, ps):
    return {
        "run_id": run_id,
        "data": "synthetic",
        "model": "tiny",
        "n_params": 1000,
        "batch_size": B,
        "context_size": C,
        "seed": 0,
        "step": tokens // (B * C),
        "tokens": tokens,
        "ar_acc": ps,
        "ar_rank": 1.0,
        "ps_max": ps,
        "la_max": ps,
        "ps_la_corr": 0.0,
        "val_loss": 5.0,
        "train_loss": 5.0,
    }


def test_emergence_table_one_row_per_run_in_tokens_and_updates():
    curves = {"run_b": (8, 32, noisy(ramp(6.0, 0.3))), "run_a": (16, 64, noisy(ramp(5.9, 0.3), 1))}
    curves["run_c"] = (32, 32, noisy(np.full(len(X), 0.05), 2))
    rows = [
        model_table_row(rid, B, C, int(t), float(v))
        for rid, (B, C, y) in curves.items()
        for t, v in zip(TOKENS[::-1], y[::-1], strict=True)  # order must not matter
    ]
    rows.append(model_table_row("run_a", 16, 64, 0, 0.9))  # an init checkpoint: dropped
    table = emergence_table(pd.DataFrame(rows), RULE)

    assert list(table.columns) == TABLE_COLUMNS
    assert list(table["run_id"]) == ["run_a", "run_b", "run_c"]
    assert list(table["emerged"]) == [True, True, False]
    assert (table["metric"] == "ps_max").all() and (table["method"] == "breakpoint").all()
    for end in ("pt", "lo", "hi"):
        expected = table[f"tokens_{end}"] / (table["batch_size"] * table["context_size"])
        np.testing.assert_allclose(table[f"updates_{end}"], expected)
    assert abs(math.log10(table.loc[0, "tokens_pt"]) - 5.9) < TOLERANCE
    assert abs(math.log10(table.loc[1, "tokens_pt"]) - 6.0) < TOLERANCE
    assert table.loc[2, ["tokens_pt", "updates_pt"]].isna().all()
    assert table.loc[2, "reason"] != "" and (table.loc[:1, "reason"] == "").all()


@pytest.mark.parametrize("method", METHODS)
def test_run_point_is_the_tables_point(method):
    # run_point is the one path from a run's table to its point (the run figure uses it too):
    # unsorted rows and an init checkpoint at 0 tokens give the table's row exactly.
    y = noisy(ramp(5.9, 0.3) if method == "breakpoint" else logistic(6.0), 3)
    rows = [model_table_row("r", 8, 32, int(t), float(v)) for t, v in zip(TOKENS, y, strict=True)]
    rows = rows[::-1] + [model_table_row("r", 8, 32, 0, 0.9)]
    spec = {"metric": "la_max", "method": method, "min_rise": MIN_RISE}
    point = run_point(pd.DataFrame(rows), spec)
    assert point == detect(TOKENS, y, method, MIN_RISE)
    assert point["emerged"] and point["method"] == method
    row = emergence_table(pd.DataFrame(rows), spec).iloc[0]
    assert row["metric"] == "la_max" and row["method"] == method
    for end in ("pt", "lo", "hi"):
        assert row[f"tokens_{end}"] == point[f"tokens_{end}"]
        assert row[f"updates_{end}"] == point[f"tokens_{end}"] / (8 * 32)


def test_emergence_table_rejects_a_missing_metric():
    table = pd.DataFrame([model_table_row("r", 8, 32, 62_500, 0.1)]).drop(columns="la_max")
    with pytest.raises(ValueError, match="la_max"):
        emergence_table(table, {**RULE, "metric": "la_max"})


# --------------------------------------------------------------------------------------------
# How runs ended: outcome, budget and prediction columns; the early-stopping rule


def with_record(rows, outcome="completed", detail="", budget=6_000_000, predicted=math.nan):
    return [
        {**row, "outcome": outcome, "outcome_detail": detail, "budget": budget,
         "predicted_tokens": predicted}
        for row in rows
    ]  # fmt: skip


def curve_rows(run_id, y, tokens=TOKENS):
    return [
        model_table_row(run_id, 8, 32, int(t), float(v)) for t, v in zip(tokens, y, strict=True)
    ]


def test_emergence_table_states_outcome_tokens_trained_and_the_prediction():
    y = noisy(logistic(6.0))
    spec = {**RULE, "method": "sigmoid"}
    inside = with_record(curve_rows("inside", y), predicted=1e6)
    outside = with_record(curve_rows("outside", y), predicted=1e5)
    none = with_record(curve_rows("none", y))
    short = with_record(curve_rows("short", y[:-5], TOKENS[:-5]), "stopped_early", "confirmed")
    # Diverged at the 10th checkpoint: the earlier checkpoints are probed, but never fitted.
    diverged = with_record(curve_rows("diverged", y[:10], TOKENS[:10]), "diverged", "loss nan")
    never = with_record([{**model_table_row("never", 8, 32, 0, 0.0), "ps_max": math.nan}],
                        "diverged", "train loss nan at step 3")  # fmt: skip
    table = emergence_table(pd.DataFrame(inside + outside + none + short + diverged + never), spec)
    table = table.set_index("run_id")
    assert list(table.columns) == TABLE_COLUMNS[1:]
    assert table.loc["inside", "emerged"] and table.loc["inside", "predicted_within"]
    assert not table.loc["outside", "predicted_within"]
    assert pd.isna(table.loc["none", "predicted_within"])
    assert table.loc["short", "outcome"] == "stopped_early"
    assert table.loc["short", "tokens_trained"] == TOKENS[-6] < table.loc["short", "budget"]
    assert table.loc["inside", "tokens_trained"] == TOKENS[-1]
    for run_id, detail in (("diverged", "loss nan"), ("never", "train loss nan at step 3")):
        row = table.loc[run_id]
        assert row["outcome"] == "diverged" and not row["emerged"]
        assert row["reason"] == f"diverged: {detail}" and math.isnan(row["tokens_pt"])
    assert table.loc["never", "tokens_trained"] == 0


def test_emergence_table_of_old_probe_tables_counts_runs_as_completed():
    table = emergence_table(pd.DataFrame(curve_rows("r", noisy(logistic(6.0)))), RULE)
    assert table.loc[0, "outcome"] == "completed" and table.loc[0, "outcome_detail"] == ""
    assert math.isnan(table.loc[0, "budget"]) and pd.isna(table.loc[0, "predicted_within"])


@pytest.mark.parametrize("method", METHODS)
def test_early_stop_waits_for_a_confirmed_point_and_the_margin(method):
    """Fed the checkpoints one at a time, the rule stops once the point holds at two
    checkpoints and the margin past its interval is trained, never before; the point found on
    the stopped series lies within the full series' interval."""
    curve = logistic(5.6) if method == "sigmoid" else ramp(5.5, 0.3)
    table = pd.DataFrame(curve_rows("r", noisy(curve, 4)))
    spec = {**RULE, "method": method}
    margin = 0.3
    decisions = [confirmed_emergence(table.iloc[:n], spec, margin) for n in range(1, len(X) + 1)]
    stop = next(n for n, reason in enumerate(decisions, start=1) if reason)
    stopped, full = run_point(table.iloc[:stop], spec), run_point(table, spec)
    before = run_point(table.iloc[: stop - 1], spec)
    assert stopped["emerged"] and before["emerged"]
    upper = max(stopped["tokens_hi"], before["tokens_hi"])
    assert X[stop - 1] >= math.log10(upper) + margin
    # The checkpoint before the stop was not past the margin, or the point did not hold yet.
    assert decisions[stop - 2] is None
    assert full["tokens_lo"] <= stopped["tokens_pt"] <= full["tokens_hi"]
    assert stop < len(X)  # it did stop before the budget
    assert "emergence confirmed" in decisions[stop - 1]


def test_early_stop_never_fires_without_a_transition_and_waits_for_a_larger_margin():
    flat = pd.DataFrame(curve_rows("r", noisy(np.full(len(X), 0.05), 5)))
    assert all(confirmed_emergence(flat.iloc[:n], RULE, 0.0) is None for n in range(1, len(X) + 1))
    rising = pd.DataFrame(curve_rows("r", noisy(ramp(5.9, 0.3), 6)))

    def first_stop(margin):
        return next(
            (n for n in range(1, len(X) + 1) if confirmed_emergence(rising.iloc[:n], RULE, margin)),
            None,
        )

    assert first_stop(0.0) < first_stop(0.5)
    assert first_stop(3.0) is None  # the budget ends before 3 decades past the point


def test_replay_stop_at_a_small_margin_stops_on_a_rise_that_falls_back():
    """Ten checkpoints per decade from 1k tokens; the metric sits at 0.02, holds 0.12 at
    checkpoints 10-14, falls back to 0.03, and rises to 0.5 from checkpoint 25. On the whole
    series the crossing rule (0.05 above 0.02) dates the lasting rise: between checkpoints 24
    and 25, a fraction (0.07 - 0.03) / (0.5 - 0.03) of the way, i.e. 10^5.4085 tokens. Series
    ending at checkpoints 11-15 date the bump instead, halfway up from 0.02 to 0.12 between
    checkpoints 9 and 10 (10^3.95), with interval [10^3.9, 10^4.0]; so the rule stops there once
    a checkpoint lies the margin past 10^4.0 within those five: at 13 for margin 0.25 (10^4.3
    >= 10^4.25), never for 0.65, which stops at 32 on the lasting rise (10^6.2 >= 10^6.15, its
    interval ending at checkpoint 25); at margin 2 nothing stops within the series."""
    tokens = 10.0 ** (3 + np.arange(41) / 10)
    y = np.full(41, 0.02)
    y[10:15], y[15:25], y[25:] = 0.12, 0.03, 0.5
    run = pd.DataFrame({"tokens": tokens, "ps_max": y})
    spec = {"metric": "ps_max", "method": "crossing", "min_rise": 0.05}
    full = run_point(run, spec)
    assert math.log10(full["tokens_pt"]) == pytest.approx(5.4 + 0.1 * 0.04 / 0.47)

    bump = replay_stop(run, spec, 0.25)
    assert bump["stopped"] and bump["emerged"] and bump["tokens_trained"] == tokens[13]
    assert math.log10(bump["tokens_pt"]) == pytest.approx(3.95)
    lasting = replay_stop(run, spec, 0.65)
    assert lasting["stopped"] and lasting["tokens_trained"] == tokens[32]
    assert lasting["tokens_pt"] == full["tokens_pt"]
    never = replay_stop(run, spec, 2.0)
    assert not never["stopped"] and never["tokens_trained"] == tokens[-1]
    assert never["tokens_pt"] == full["tokens_pt"]


# --------------------------------------------------------------------------------------------
# The crossing rule: where the sustained rise first reaches min_rise


@pytest.mark.parametrize("x1", [5.9, 6.05, 6.2, 6.4])
def test_crossing_of_a_noise_free_ramp_is_exact(x1):
    # Flat at 0.05, then 0.6 per decade: baseline + min_rise is reached exactly 1/6 decade after
    # x1. On a monotone series the running median is the series itself, and with both
    # checkpoints around the crossing on the ramp the interpolation is exact.
    truth = x1 + MIN_RISE / 0.6
    result = detect(TOKENS, ramp(x1), method="crossing", min_rise=MIN_RISE)
    point, lo, hi = log_point(result)
    assert point == pytest.approx(truth, abs=1e-9)
    i = np.searchsorted(X, truth)
    assert (lo, hi) == pytest.approx((X[i - 1], X[i]), abs=1e-9)  # the gap around the crossing


@pytest.mark.parametrize("seed", range(10))
def test_crossing_brackets_a_step_in_its_checkpoint_gap(seed):
    # A step between checkpoints 11 and 12 under noise: the interval is exactly that gap.
    y = noisy(np.where(np.arange(len(X)) >= 12, 0.35, 0.05), seed)
    result = detect(TOKENS, y, method="crossing", min_rise=MIN_RISE)
    point, lo, hi = log_point(result)
    assert result["emerged"] and (lo, hi) == pytest.approx((X[11], X[12]))
    assert lo <= point <= hi


def test_crossing_takes_the_first_of_two_stages_where_the_fits_take_the_larger():
    # Measured on the default study's text runs: max PS steps up weakly (0.03 to 0.12), then,
    # in some runs only, strongly (to 0.6) much later. Crossing dates the first step in every
    # run; the sigmoid and the ramp follow the larger step, so they date whichever stage a run
    # reached within its training.
    i = np.arange(len(X))
    y = noisy(0.03 + 0.09 * (i >= 6) + 0.5 * (i >= 20), 7)
    crossing = detect(TOKENS, y, method="crossing", min_rise=0.05)
    _, lo, hi = log_point(crossing)
    assert (lo, hi) == pytest.approx((X[5], X[6]))
    for method in ("sigmoid", "breakpoint"):
        point, _, _ = log_point(detect(TOKENS, y, method=method, min_rise=0.05))
        assert X[18] <= point <= X[20], method
    # Without the second stage all three date the first one.
    first_only = detect(TOKENS[:15], y[:15], method="sigmoid", min_rise=0.05)
    assert X[5] <= math.log10(first_only["tokens_pt"]) <= X[6]


def test_crossing_needs_a_rise_held_to_the_end():
    # A bump that falls back does not count; a later rise that holds does.
    i = np.arange(len(X))
    y = 0.05 + 0.3 * ((i >= 5) & (i < 9)) + 0.2 * (i >= 16)
    result = detect(TOKENS, y, method="crossing", min_rise=MIN_RISE)
    _, lo, hi = log_point(result)
    assert (lo, hi) == pytest.approx((X[15], X[16]))
    assert not detect(TOKENS[:14], y[:14], method="crossing", min_rise=MIN_RISE)["emerged"]


def test_crossing_and_the_rise_agree_on_whether_a_run_emerged():
    # The crossing exists exactly when the sustained rise reaches min_rise (no fit can fail).
    rng = np.random.default_rng(0)
    for _ in range(200):
        y = np.cumsum(rng.normal(0.0, 0.03, len(X)))
        rise = sustained_rise(y)
        result = detect(TOKENS, y, method="crossing", min_rise=MIN_RISE)
        assert result["emerged"] == (rise >= MIN_RISE), result["reason"]
