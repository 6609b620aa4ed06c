"""The repetition-controlled Markov generator (ihsweep.data.markov, _generator, _measure).

The main chain is V = 500 with Dirichlet(0.1) rows (sparse, like a bigram matrix) and C = 64,
10,000 sequences for each of the nine (f, r) cells (about 3 s in all on one core); the
distribution tests use tiny chains (V = 6 to 16) where every conditional can be checked by a
chi-square test. Every statistical test uses a fixed seed, so it either always passes or always
fails; the chi-square tests also check that the same statistic rejects a wrong distribution.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from ihsweep.config import complete
from ihsweep.data import chains, chunks, markov, markov_chunks, markov_generator, markov_measure
from scipy import stats

V, C = 500, 64
GRID = (0.1, 0.5, 0.9)
CELLS = list(itertools.product(GRID, GRID))
N_CELL = 10_000
P_MIN = 1e-3  # chi-square p-value below which a distribution test fails


def _dirichlet_chain(vocab: int, alpha: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    P = np.random.default_rng(seed).dirichlet(np.full(vocab, alpha), size=vocab)
    return P, markov.stationary(P)


@pytest.fixture(scope="module")
def chain():
    return _dirichlet_chain(V, 0.1, seed=2024)


@pytest.fixture(scope="module")
def grid(chain):
    """The nine cells, 10,000 sequences each: {(f, r): (x, measure(x))}."""
    P, pi = chain
    out = {}
    for k, (f, r) in enumerate(CELLS):
        x = markov_generator.generate(P, pi, N_CELL, C, f, r, seed=100 + k, calibration="exact")
        out[f, r] = (x, markov_measure.measure(x, V))
    return out


# --- measured statistics on the grid -----------------------------------------------------------


@pytest.mark.parametrize(("f", "r"), CELLS)
def test_grid_hits_requested_f_and_r(grid, f, r):
    m = grid[f, r][1]
    assert m["n_sequences"] == N_CELL
    assert abs(m["f"] - f) <= 0.02, m["f"]
    assert abs(m["r"] - r) <= 0.02, m["r"]


def test_first_halves_never_repeat_and_no_immediate_repeats(grid):
    h = markov.second_half_start(C)
    for x, m in grid.values():
        assert m["first_half_repeats"] == 0
        first = np.sort(x[:, :h], axis=1)
        assert not (first[:, 1:] == first[:, :-1]).any()
        assert not (x[:, 1:] == x[:, :-1]).any()
        assert x.dtype == np.uint16 and x.shape == (N_CELL, C) and int(x.max()) < V


def test_measure_reports_the_other_statistics(grid):
    x, m = grid[0.5, 0.5]
    assert m["unigram_counts"].shape == (V,) and m["unigram_counts"].sum() == x.size
    assert m["second_half_positions"] == N_CELL * (C - markov.second_half_start(C))
    assert 0 < m["entropy_rate_bits"] < np.log2(V)
    assert "plug-in" in m["entropy_rate_estimator"]


# --- measure on hand-made sequences -------------------------------------------------------------


def test_measure_counts_contexts_and_copies_by_definition():
    # C = 8, second half 4..7. i=5: prev 0 followed 1 at j=0, x[5]=1 copies. i=6: prev 1
    # followed 2 at j=1, x[6]=4 does not copy. i=4 and i=7: prev not seen earlier.
    m = markov_measure.measure(np.array([[0, 1, 2, 3, 0, 1, 4, 0]]), 5)
    assert (m["contexts"], m["copies"], m["f"], m["r"]) == (2, 1, 0.5, 0.5)
    assert m["first_half_repeats"] == 0
    # A successor equal to A itself (an `A A`) does not make a context: i=6 and i=7 (prev 9,
    # earlier 9s followed only by 9) are not contexts; i=4 (prev 1, earlier 1 -> 2) is one and
    # does not copy; i=5 (prev 9, first seen at 4) is not. First-half repeats: 1 twice more.
    m = markov_measure.measure(np.array([[1, 2, 1, 1, 9, 9, 9, 1]]), 10)
    assert (m["contexts"], m["copies"], m["r"], m["first_half_repeats"]) == (1, 0, 0.0, 2)
    m = markov_measure.measure(np.array([[1, 2, 3, 4, 9, 9, 9, 1]]), 10)
    assert (m["contexts"], m["r"]) == (0, None)
    assert m["unigram_counts"].tolist() == [0, 2, 1, 1, 1, 0, 0, 0, 0, 3]


def test_bigram_entropy_rate_plug_in():
    # Bigrams (0,1), (1,0), (0,2): only 0 has two successors, each once: H = 2/3 * 1 bit.
    assert markov_measure.bigram_entropy_rate(np.array([[0, 1, 0, 2]]), 3) == pytest.approx(2 / 3)
    assert markov_measure.bigram_entropy_rate(np.array([[0, 1, 2, 0, 1, 2]]), 3) == 0.0


def _python_contexts(x: np.ndarray) -> list[tuple]:
    """Per context, plain Python: (sequence, position, A, sorted distinct successors, how often
    each followed A, next token)."""
    out = []
    h = markov.second_half_start(x.shape[1])
    for s, row in enumerate(x.tolist()):
        for i in range(h, len(row)):
            a = row[i - 1]
            succ = [row[j + 1] for j in range(i - 1) if row[j] == a and row[j + 1] != a]
            if succ:
                distinct = tuple(sorted(set(succ)))
                out.append((s, i, a, distinct, tuple(map(succ.count, distinct)), row[i]))
    return out


def test_measure_matches_a_plain_python_reading_of_the_definition():
    P, pi = _dirichlet_chain(12, 0.5, seed=3)
    x = markov_generator.generate(P, pi, 300, 12, 0.7, 0.5, seed=4, calibration="exact")
    ctx = _python_contexts(x)
    m = markov_measure.measure(x, 12)
    assert m["contexts"] == len(ctx) > 100
    assert m["copies"] == sum(nxt in succ for *_, succ, _, nxt in ctx)


# --- calibration -------------------------------------------------------------------------------


def test_exact_calibration_solves_the_recursion():
    n = C - markov.second_half_start(C)
    for f, r in CELLS:
        e = markov.context_start_probability(f, r, C, calibration="exact")
        assert 0 < e < 1
        assert markov.expected_frequency(e, r, C) == pytest.approx(f, abs=1e-12)
    assert markov.expected_frequency(0.0, 0.5, C) == 0.0
    assert markov.max_frequency(0.3, C) == pytest.approx((n - 1) / n)
    assert markov.context_start_probability(0.2, 0.5, C, "paper") == pytest.approx(0.2 / 1.5)


@pytest.mark.parametrize(
    ("f", "r", "reported"), [(0.1, 0.9, 0.275), (0.9, 0.9, 0.85), (0.9, 0.1, 0.81)]
)
def test_model_predicts_the_papers_measured_misses(f, r, reported):
    """The recursion, fed the paper's e = f / (1 + r) at C = 64, gives what the authors measured."""
    e = markov.context_start_probability(f, r, 64, "paper")
    assert markov.expected_frequency(e, r, 64) == pytest.approx(reported, abs=0.01)


def test_paper_calibration_misses_the_way_the_paper_reports(chain):
    """Asked (0.1, 0.9), the paper's rule gives f far above 0.1 (they measured 0.275)."""
    P, pi = chain
    paper = markov_measure.measure(
        markov_generator.generate(P, pi, 4000, C, 0.1, 0.9, 1, "paper"), V
    )
    exact = markov_measure.measure(
        markov_generator.generate(P, pi, 4000, C, 0.1, 0.9, 1, "exact"), V
    )
    assert paper["f"] > 0.2
    e = markov.context_start_probability(0.1, 0.9, C, "paper")
    assert paper["f"] == pytest.approx(markov.expected_frequency(e, 0.9, C), abs=0.02)
    assert abs(exact["f"] - 0.1) < 0.02
    assert abs(paper["r"] - 0.9) < 0.02  # r is hit either way


@pytest.mark.parametrize(
    ("f", "r", "context", "match"),
    [
        (0.99, 0.5, C, r"unreachable.*\[0, 0\.96875\]"),
        (1.0, 0.9, C, "unreachable"),
        (0.9, 0.1, 16, r"reachable range is f in \[0, 0\.875\]"),
        (-0.1, 0.5, C, r"\[0, 1\]"),
        (0.5, 1.2, C, r"\[0, 1\]"),
        (0.5, 0.5, 4, "context must be >= 5"),
    ],
)
def test_unreachable_requests_raise(f, r, context, match):
    for calibration in markov.CALIBRATIONS:
        with pytest.raises(ValueError, match=match):
            markov.context_start_probability(f, r, context, calibration)


def test_invalid_chains_and_sizes_raise(chain):
    P, pi = chain
    with pytest.raises(ValueError, match="vocabulary 500 < context 600"):
        markov_generator.generate(P, pi, 10, 600, 0.5, 0.5, 0, calibration="exact")
    with pytest.raises(ValueError, match="rows of P must sum to 1"):
        markov_generator.generate(P * 1.1, pi, 10, C, 0.5, 0.5, 0, calibration="exact")
    with pytest.raises(ValueError, match="pi must"):
        markov_generator.generate(P, pi[:-1], 10, C, 0.5, 0.5, 0, calibration="exact")
    with pytest.raises(ValueError, match="calibration"):
        markov_generator.generate(P, pi, 10, C, 0.5, 0.5, 0, calibration="stationary")


# --- determinism -------------------------------------------------------------------------------


def test_deterministic_for_a_seed_and_prefix_stable(chain):
    P, pi = chain
    a = markov_generator.generate(
        P, pi, 300, C, 0.5, 0.5, seed=7, block_size=128, calibration="exact"
    )
    b = markov_generator.generate(
        P, pi, 300, C, 0.5, 0.5, seed=7, block_size=128, calibration="exact"
    )
    c = markov_generator.generate(
        P, pi, 300, C, 0.5, 0.5, seed=8, block_size=128, calibration="exact"
    )
    d = markov_generator.generate(
        P, pi, 256, C, 0.5, 0.5, seed=7, block_size=128, calibration="exact"
    )
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    np.testing.assert_array_equal(a[:256], d)  # whole blocks do not depend on n_sequences

    ref = [
        markov_generator.generate_reference(P, pi, 5, C, 0.5, 0.5, seed=7, calibration="exact")
        for _ in range(2)
    ]
    np.testing.assert_array_equal(*ref)


# --- stationary distribution -------------------------------------------------------------------


def test_stationary(chain):
    P, pi = chain
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    assert pi.sum() == pytest.approx(1.0)
    # A periodic chain: plain power iteration would oscillate, the lazy chain converges.
    np.testing.assert_allclose(markov.stationary(np.array([[0.0, 1.0], [1.0, 0.0]])), [0.5, 0.5])


# --- restricted draws follow the chain ---------------------------------------------------------


def _grouped_chi2(groups: dict) -> tuple[float, int]:
    """Sum of per-group Pearson statistics; groups: key -> (observed counts, expected probs).

    Groups with an expected count below 5 are left out (the chi-square approximation fails).
    """
    stat, dof = 0.0, 0
    for obs, probs in groups.values():
        obs = np.asarray(obs, float)
        expected = obs.sum() * np.asarray(probs, float)
        if expected.min() < 5:
            continue

        stat += ((obs - expected) ** 2 / expected).sum()
        dof += len(obs) - 1
    return stat, dof


def _binary_chi2(chose_first: np.ndarray, q: np.ndarray, by=None, bins: int = 10) -> float:
    """p-value that independent binary events with P(first) = q fit, pooled in deciles of ``by``
    (default q; a constant q, such as 0.5, is tested in the deciles of another q)."""
    by = q if by is None else by
    edges = np.quantile(by, np.linspace(0, 1, bins + 1)[1:-1])
    which = np.searchsorted(edges, by)
    stat, dof = 0.0, 0
    for b in np.unique(which):
        sel = which == b
        var = (q[sel] * (1 - q[sel])).sum()
        if var > 0:
            stat += (chose_first[sel].sum() - q[sel].sum()) ** 2 / var
            dof += 1
    return float(stats.chi2.sf(stat, dof))


@pytest.fixture(scope="module")
def small():
    """V = 6, C = 6 (first half 0..2, second half 3..5), a dense chain with self-loops."""
    P, pi = _dirichlet_chain(6, 0.5, seed=11)
    e = markov.context_start_probability(0.5, 0.5, 6, calibration="exact")
    return (
        P,
        pi,
        e,
        markov_generator.generate(P, pi, 60_000, 6, 0.5, 0.5, seed=12, calibration="exact").astype(
            np.int64
        ),
    )


def test_first_token_and_first_half_draws_follow_the_renormalised_rows(small):
    P, pi, _, x = small
    assert stats.chisquare(np.bincount(x[:, 0], minlength=6), pi * len(x)).pvalue > P_MIN
    # x[1] given x[0] = a: P[a] without a, renormalised.
    right, wrong = {}, {}
    for a in range(6):
        others = [b for b in range(6) if b != a]
        obs = [np.sum((x[:, 0] == a) & (x[:, 1] == b)) for b in others]
        right[a] = (obs, P[a, others] / P[a, others].sum())
        wrong[a] = (obs, np.full(5, 0.2))  # uniform over the allowed set: must be rejected
    assert stats.chi2.sf(*_grouped_chi2(right)) > P_MIN
    assert stats.chi2.sf(*_grouped_chi2(wrong)) < P_MIN


def test_second_half_start_draws_follow_the_chain(small):
    """Position 3 (= C/2) is never a context: with prob e an earlier type other than A, else new."""
    P, _, e, x = small
    a = x[:, 2]
    seen = (x[:, 3] == x[:, 0]) | (x[:, 3] == x[:, 1])
    n = len(x)
    assert abs(seen.mean() - e) < 4 * np.sqrt(e * (1 - e) / n)
    # Earlier-seen pick: x[0] against x[1], by P[A, x0] : P[A, x1].
    q = P[a, x[:, 0]] / (P[a, x[:, 0]] + P[a, x[:, 1]])
    assert _binary_chi2((x[:, 3] == x[:, 0])[seen], q[seen]) > P_MIN
    uniform = np.full(seen.sum(), 0.5)
    assert _binary_chi2((x[:, 3] == x[:, 0])[seen], uniform, by=q[seen]) < P_MIN
    # Never-seen pick: one of the 3 unseen types, by P[A, .] renormalised over them.
    groups: dict = {}
    for row in x[~seen]:
        key = tuple(row[:3])
        unseen = [t for t in range(6) if t not in key]
        obs = groups.setdefault(key, (np.zeros(3), P[key[2], unseen] / P[key[2], unseen].sum()))
        obs[0][unseen.index(row[3])] += 1
    assert stats.chi2.sf(*_grouped_chi2(groups)) > P_MIN


def test_copy_choice_follows_the_chain():
    """Copies of an A with two distinct earlier successors choose B1 : B2 as P[A, B1] : P[A, B2],
    however many times each followed A (a type that followed A twice is still one choice)."""
    P, pi = _dirichlet_chain(16, 1.0, seed=21)
    x = markov_generator.generate(
        P, pi, 40_000, 16, 0.85, 0.7, seed=22, calibration="exact"
    ).astype(np.int64)
    events = [e for e in _python_contexts(x) if len(e[3]) == 2]
    copies = [(a, *succ, *times, nxt) for _, _, a, succ, times, nxt in events if nxt in succ]
    assert len(copies) > 10_000
    a, b1, b2, n1, n2, nxt = (np.array(v) for v in zip(*copies, strict=True))
    q = P[a, b1] / (P[a, b1] + P[a, b2])
    assert _binary_chi2(nxt == b1, q) > P_MIN
    assert _binary_chi2(nxt == b1, np.full(len(q), 0.5), by=q) < P_MIN
    # Where one successor followed A more often, weighting by occurrences must be rejected.
    dup = n1 != n2
    assert dup.sum() > 2000
    assert _binary_chi2((nxt == b1)[dup], q[dup]) > P_MIN
    q_by_occurrence = n1 * P[a, b1] / (n1 * P[a, b1] + n2 * P[a, b2])
    assert _binary_chi2((nxt == b1)[dup], q_by_occurrence[dup]) < P_MIN
    # r still holds among these contexts.
    assert abs(len(copies) / len(events) - 0.7) < 4 * np.sqrt(0.21 / len(events))


def test_zero_chain_mass_falls_back_to_pi_then_uniform():
    """Rows with no mass on the allowed set draw from pi restricted to it, then uniformly."""
    P = np.zeros((8, 8))
    P[0, 1] = 1.0
    P[1:, 0] = 1.0
    pi = np.array([0.3, 0.3, 0.2, 0.1, 0.1, 0.0, 0.0, 0.0])  # any start distribution is allowed
    for gen in (markov_generator.generate, markov_generator.generate_reference):
        x = gen(P, pi, 3000 if gen is markov_generator.generate else 1500, 8, 0.5, 0.5, 5, "exact")
        x = x.astype(np.int64)
        assert markov_measure.measure(x, 8)["first_half_repeats"] == 0
        assert not (x[:, 1:] == x[:, :-1]).any()
        # After 0 -> 1, P[1] only reaches the seen 0: x[2] comes from pi on {2, 3, 4}.
        rows = x[x[:, 0] == 0]
        assert (rows[:, 1] == 1).all()
        obs = np.bincount(rows[:, 2], minlength=8)
        assert obs[[0, 1, 5, 6, 7]].sum() == 0
        assert stats.chisquare(obs[2:5], np.array([0.5, 0.25, 0.25]) * len(rows)).pvalue > P_MIN
        # Pi has no mass on 5..7: they appear only through the uniform fallback, late.
        assert np.isin(x[:, :3], [5, 6, 7]).sum() == 0 and np.isin(x, [5, 6, 7]).any()


# --- the vectorised generator against the reference loop ---------------------------------------


def _f_r_with_errors(x: np.ndarray) -> tuple[float, float, float, float]:
    """Pooled f and r with standard errors from per-sequence counts (sequences independent)."""
    ctx, cp = markov_measure.context_copy_counts(x)
    n_pos = C - markov.second_half_start(C)
    f = ctx.sum() / (len(x) * n_pos)
    r = cp.sum() / ctx.sum()
    se_f = ctx.std(ddof=1) / n_pos / np.sqrt(len(x))
    se_r = np.sqrt(((cp - r * ctx) ** 2).sum()) / ctx.sum()
    return f, r, se_f, se_r


@pytest.mark.parametrize(("f", "r"), [(0.5, 0.5), (0.9, 0.1)])
def test_vectorised_and_reference_agree(chain, grid, f, r):
    P, pi = chain
    ref = markov_generator.generate_reference(P, pi, 600, C, f, r, seed=31, calibration="exact")
    f_ref, r_ref, se_f_ref, se_r_ref = _f_r_with_errors(ref)
    f_vec, r_vec, se_f_vec, se_r_vec = _f_r_with_errors(grid[f, r][0])
    assert abs(f_ref - f_vec) < 4 * np.hypot(se_f_ref, se_f_vec)
    assert abs(r_ref - r_vec) < 4 * np.hypot(se_r_ref, se_r_vec)
    assert markov_measure.measure(ref, V)["first_half_repeats"] == 0
    # The first second-half token (one per sequence, so independent draws, mixing the seen and
    # never-seen branches) has the same distribution: chi-square homogeneity on the top types.
    h = markov.second_half_start(C)
    counts = np.stack([np.bincount(y[:, h], minlength=V) for y in (ref, grid[f, r][0])])
    top = np.argsort(counts.sum(0))[::-1][:20]
    rest = counts.sum(1) - counts[:, top].sum(1)
    table = np.column_stack([counts[:, top], rest])
    assert stats.chi2_contingency(table).pvalue > P_MIN


# --- the samplers inside the vectorised generator -------------------------------------------------


def test_alias_tables_reproduce_every_row():
    P, _ = _dirichlet_chain(50, 0.1, seed=41)
    P[0] = 0.0
    P[0, 7] = 1.0  # a deterministic row
    P[1, :25] = 0.0  # a row with exact zeros
    P[1] /= P[1].sum()
    prob, alias = markov_generator._alias_tables(P)
    prob = prob.astype(np.float64).reshape(50, 50)
    alias = alias.reshape(50, 50)
    implied = prob.copy()
    for a in range(50):
        np.add.at(implied[a], alias[a], 1.0 - prob[a])
    implied /= 50
    assert np.abs(implied - P).max() < 1e-8  # float32 thresholds
    assert (implied[P == 0] == 0).all()  # a zero-probability type is never drawn


@pytest.mark.parametrize("m", [10, 5000])  # the cumsum path and the row-by-row path
def test_inverse_cdf_draws_by_weight(m):
    rng = np.random.default_rng(m)
    weights = np.array([0.0, 0.3, 0.0, 0.1, 0.45, 0.15, 0.0])
    counts = np.zeros(7)
    for _ in range(60_000 // m):
        idx = markov_generator._inverse_cdf(np.repeat(weights[:, None], m, axis=1), rng.random(m))
        counts += np.bincount(idx, minlength=7)
    assert counts[weights == 0].sum() == 0
    assert stats.chisquare(counts[weights > 0], weights[weights > 0] * counts.sum()).pvalue > P_MIN
    # u at the top of [0, 1) must not step past the last positive weight.
    top = np.full(m, np.nextafter(1.0, 0.0))
    assert (markov_generator._inverse_cdf(np.repeat(weights[:, None], m, axis=1), top) == 5).all()


# --- the chunk files of a Markov dataset (markov_chunks) ---------------------------------------


def _markov_entry(**given) -> dict:
    """A Markov dataset entry completed by the schema; the chain is a stand-in, 16 states."""
    chain = {"kind": "synthetic", "vocab_size": 16, "dependency": False}
    entry = {"family": "markov", "chain": chain, "frequency": 0.3, "reliability": 0.5}
    return complete("dataset", {**entry, "n_train_sequences": 300, "n_val_sequences": 40, **given})


def _files(folder) -> list[bytes]:
    return [(folder / name).read_bytes() for name in ("train.bin", "val.bin")]


def test_markov_chunks_follow_the_dataset_spec(tmp_path):
    P, pi = _dirichlet_chain(16, 0.5, seed=5)
    chains.write_chain(tmp_path / "chain", P, pi, {"kind": "synthetic", "spec": {}})
    metas = {}
    for name, given in (
        ("s0", {}),
        ("s0-again", {"seed": 0}),
        ("s1", {"seed": 1}),
        ("paper", {"calibration": "paper"}),
    ):
        spec = _markov_entry(**given)
        metas[name] = markov_chunks.make_chunks(spec, tmp_path / "chain", 16, tmp_path / name)
        meta = json.loads((tmp_path / name / "chunks.json").read_text())
        assert meta == metas[name]
        assert meta["seed"] == spec["seed"]
        assert meta["split_seeds"] == markov_chunks.split_seeds(spec["seed"], 16)
        assert meta["requested"]["calibration"] == spec["calibration"]
        assert meta["dtype"] == "uint16" == chunks.token_dtype(16).name
        train = chunks.open_chunks(tmp_path / name, "train")
        assert train.shape == (300, 16) and train.dtype == np.uint16
        assert chunks.open_chunks(tmp_path / name, "val").shape == (40, 16)
    assert metas["s0"]["seed"] == 0  # the schema's default
    assert metas["s0"]["requested"]["calibration"] == "exact"  # likewise
    assert _files(tmp_path / "s0") == _files(tmp_path / "s0-again")
    assert _files(tmp_path / "s0") != _files(tmp_path / "s1")
    e = {name: meta["requested"]["e"] for name, meta in metas.items()}
    assert e["s0"] == pytest.approx(markov.context_start_probability(0.3, 0.5, 16, "exact"))
    assert e["paper"] == pytest.approx(0.3 / 1.5)  # the paper's e = f / (1 + r)
    assert e["paper"] != pytest.approx(e["s0"])
