"""ihsweep.data.chains: bigram chains match hand counts; synthetic chains hit their targets.

Synthetic tolerances (V = 500, 10 blocks of 50, 300 Adam steps, seed 0). Achieved values when the
tolerances were set are in brackets (+C Zipfian; -C Gaussian); the tolerances leave room for
platform and thread-count differences, not for a broken optimiser:

- KL(sorted stationary || sorted target) < 1e-3 nats [9e-7; 1e-6];
- entropy rate within 0.1 bits of the target 4.18 bits (the paper's 6.2 bits at V = 10,000
  scaled by log2 V) [+0.001; +0.03];
- mean within-block cosine within 0.05 of its target, 0.4 for +C and 0.1 for -C [0.399; 0.088],
  every block's within 0.1 [0.398-0.400; 0.079-0.091]; mean across-block cosine within 0.03 of
  0.1 [0.099; 0.090];
- mean row max below 0.5 [0.23; 0.09].

The uniform marginal cannot meet all targets at once (module docstring of chains): there the test
checks the compromise keeps the +C/-C contrast [+C: within 0.290, across 0.012, entropy +0.22
bits; -C: within 0.043, across 0.046, +0.09 bits].
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from ihsweep.config import ConfigError, complete
from ihsweep.data import chains
from ihsweep.steps import chain as chain_step

V, BLOCKS, ITERS = 500, 10, 300
TOL = {"kl": 1e-3, "entropy": 0.1, "within": 0.05, "within_block": 0.1, "across": 0.03}


# --- bigram chain ----------------------------------------------------------------------------


def _smoothed(counts) -> np.ndarray:
    c = np.asarray(counts, dtype=np.float64) + 1e-6
    return c / c.sum(axis=1, keepdims=True)


def test_bigram_chain_equals_hand_counts_with_cap_and_smoothing():
    # Frequencies: 5 and 3 four times (tie -> 3 first, smaller id), 7 and 9 once (tie -> 7).
    # With cap 3, 9 is dropped and breaks adjacency: "5 9 3" adds no (5, 3) bigram.
    stream = np.array([5, 3, 5, 3, 7, 5, 9, 3, 5, 3], dtype=np.uint16)
    P, types = chains.bigram_chain(stream, 3)
    assert types.tolist() == [3, 5, 7]
    # Kept bigrams: (5,3) x3, (3,5) x2, (3,7), (7,5); states 3->0, 5->1, 7->2.
    expected = _smoothed([[0, 2, 1], [3, 0, 0], [0, 1, 0]])
    np.testing.assert_allclose(P, expected, rtol=1e-12, atol=0)
    assert P[1, 1] == pytest.approx(1e-6 / (3 + 3e-6), rel=1e-12)
    # Reading the stream in blocks of 2 must count the bigrams across block edges exactly once.
    P_blocks, _ = chains.bigram_chain(stream, 3, block=2)
    np.testing.assert_allclose(P_blocks, P, rtol=1e-12)


def test_a_kept_type_without_kept_successor_gets_a_uniform_row():
    P, types = chains.bigram_chain(np.array([0, 1, 0, 1, 2]), 3)
    assert types.tolist() == [0, 1, 2]
    np.testing.assert_allclose(P[2], np.full(3, 1 / 3), rtol=1e-12)
    np.testing.assert_allclose(P[0], _smoothed([[0, 2, 0]])[0], rtol=1e-12)


def test_excluded_ids_are_dropped_like_rare_tokens():
    stream = np.array([0, 1, 9, 0, 1, 9, 1, 0])  # 9 (say, the separator) is frequent, but excluded
    P, types = chains.bigram_chain(stream, 5, exclude=[9])
    assert types.tolist() == [0, 1]  # both seen three times: the smaller id ranks first
    np.testing.assert_allclose(P, _smoothed([[0, 2], [1, 0]]), rtol=1e-12)


def test_bigram_chain_matches_a_brute_force_count_on_random_text():
    rng = np.random.default_rng(1)
    stream = (rng.zipf(1.5, 5000) % 60).astype(np.uint32)
    cap = 25
    P, types = chains.bigram_chain(stream, cap, block=333)
    freq = {t: int((stream == t).sum()) for t in set(stream.tolist())}
    ranked = sorted(freq, key=lambda t: (-freq[t], t))[:cap]
    assert types.tolist() == ranked
    index = {t: i for i, t in enumerate(ranked)}
    counts = np.zeros((cap, cap))
    for a, b in zip(stream[:-1].tolist(), stream[1:].tolist(), strict=True):
        if a in index and b in index:
            counts[index[a], index[b]] += 1
    np.testing.assert_allclose(P, _smoothed(counts), rtol=1e-12)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)


def test_bigram_chain_rejects_bad_input():
    with pytest.raises(ValueError, match="vocab_cap"):
        chains.bigram_chain(np.array([1, 2]), 0)
    with pytest.raises(ValueError, match="no"):
        chains.bigram_chain(np.array([3, 3]), 2, exclude=[3])


# --- marginals and measurement ---------------------------------------------------------------


def test_target_marginal_shapes():
    for kind in chains.MARGINALS:
        p = chains.target_marginal(V, kind)
        assert p.shape == (V,) and p.sum() == pytest.approx(1.0, abs=1e-12) and p.min() > 0
    np.testing.assert_allclose(chains.target_marginal(V, "uniform"), 1 / V, rtol=1e-12)
    z = chains.target_marginal(V, "zipfian")
    for k in (2, 10, 100):
        assert z[0] / z[k - 1] == pytest.approx(k, rel=1e-3)  # 1e-6 smoothing shifts it a little
    g = chains.target_marginal(V, "gaussian")
    assert int(np.argmax(g)) == V // 2
    np.testing.assert_allclose(g[V // 2 - 40], g[V // 2 + 40], rtol=1e-12)
    # About one standard deviation (V/8 = 62.5) from the peak the density falls by ~exp(-1/2).
    k = V // 8
    assert g[V // 2 + k] / g[V // 2] == pytest.approx(math.exp(-0.5 * (k * 8 / V) ** 2), rel=1e-3)
    with pytest.raises(ValueError, match="marginal"):
        chains.target_marginal(V, "pareto")


def test_default_entropy_target_scales_the_papers_share_of_log_v():
    assert chains.default_entropy_bits(10_000) == pytest.approx(6.2)
    assert chains.default_entropy_bits(500) == pytest.approx(
        6.2 * math.log2(500) / 4 / math.log2(10)
    )


def _brute_force_cosines(P, blocks):
    unit = P / np.linalg.norm(P, axis=1, keepdims=True)
    cos = unit @ unit.T
    same = blocks[:, None] == blocks[None, :]
    off_diag = ~np.eye(len(P), dtype=bool)
    return cos[same & off_diag].mean(), cos[~same].mean()


def test_measure_chain_matches_direct_computation():
    rng = np.random.default_rng(0)
    P = rng.random((14, 14)) ** 3
    P /= P.sum(axis=1, keepdims=True)
    m = chains.measure_chain(P, chains.target_marginal(14, "zipfian"), 2)
    pi = m["stationary"]
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    within, across = _brute_force_cosines(P, np.repeat([0, 1], 7))
    assert m["within_cos"] == pytest.approx(within, rel=1e-10)
    assert m["across_cos"] == pytest.approx(across, rel=1e-10)
    h = -(P * np.log2(P)).sum(axis=1)
    assert m["entropy_rate_bits"] == pytest.approx(pi @ h, rel=1e-10)
    assert m["mean_row_max"] == pytest.approx(P.max(axis=1).mean())
    t = chains.target_marginal(14, "zipfian")
    ps, ts = np.sort(pi)[::-1], np.sort(t)[::-1]
    assert m["kl_sorted"] == pytest.approx((ps * np.log(ps / ts)).sum(), rel=1e-10)
    assert m["kl_sorted"] <= m["kl_unsorted"] + 1e-12  # sorting both can only bring them closer


@pytest.mark.parametrize("max_iter, method", [(100_000, "power"), (1, "solve")])
def test_stationary_of_a_periodic_chain(max_iter, method):
    # 0 -> 1 -> {0, 2} -> 1: period 2, so plain power iteration from uniform would oscillate;
    # the lazy chain converges, and a too-short iteration falls back to a direct solve.
    P = np.array([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]]) * (1 - 3e-6) + 1e-6
    pi, used = chains.stationary_distribution(P, max_iter=max_iter)
    assert used == method
    np.testing.assert_allclose(pi, [0.25, 0.5, 0.25], atol=1e-5)
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)


# --- synthetic chains ------------------------------------------------------------------------


def synthetic_params(**given) -> dict:
    """synthetic_chain's arguments: a synthetic chain spec completed by the schema, less kind."""
    spec = complete("chain", {"kind": "synthetic", **given})
    assert spec.pop("kind") == "synthetic"
    return spec


def synthetic(**given):
    return chains.synthetic_chain(**synthetic_params(**given))


def test_minus_d_rows_are_identical_and_equal_the_marginal():
    for kind in chains.MARGINALS:
        P, report = synthetic(vocab_size=V, dependency=False, marginal=kind, n_blocks=BLOCKS)
        target = chains.target_marginal(V, kind)
        assert (P == target[None, :]).all()
        m = report["measured"]
        assert m["kl_sorted"] == pytest.approx(0, abs=1e-12)
        assert m["entropy_rate_bits"] == pytest.approx(m["marginal_entropy_bits"], rel=1e-10)
        assert m["within_cos"] == pytest.approx(1.0) and m["across_cos"] == pytest.approx(1.0)
        assert report["categoriality_applies"] is False


def _plus_d(categorial: bool, marginal: str):
    return synthetic(
        vocab_size=V,
        dependency=True,
        categorial=categorial,
        marginal=marginal,
        n_blocks=BLOCKS,
        iterations=ITERS,
        seed=0,
    )


@pytest.mark.parametrize(("categorial", "marginal"), [(True, "zipfian"), (False, "gaussian")])
def test_plus_d_chain_hits_its_targets(categorial, marginal):
    P, report = _plus_d(categorial, marginal)
    m, spec = report["measured"], report["spec"]
    assert P.shape == (V, V) and P.dtype == np.float64
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert spec["within_cos"] == (0.4 if categorial else 0.1) and spec["across_cos"] == 0.1
    assert spec["entropy_bits"] == pytest.approx(chains.default_entropy_bits(V))
    assert m["kl_sorted"] < TOL["kl"]
    assert abs(m["entropy_rate_bits"] - spec["entropy_bits"]) < TOL["entropy"]
    assert abs(m["within_cos"] - spec["within_cos"]) < TOL["within"]
    assert m["within_cos_min"] > spec["within_cos"] - TOL["within_block"]
    assert m["within_cos_max"] < spec["within_cos"] + TOL["within_block"]
    assert abs(m["across_cos"] - 0.1) < TOL["across"]
    assert m["mean_row_max"] < 0.5
    # Rows really depend on the previous token: far below the marginal's entropy.
    assert m["entropy_rate_bits"] < m["marginal_entropy_bits"] - 1.0
    json.dumps({k: v for k, v in report.items() if k != "stationary"}, allow_nan=False)
    # The optimisation did the work: at step 0 (rows = noisy marginal) the targets were far off.
    first = report["history"][0]
    assert abs(first["entropy_rate_bits"] - spec["entropy_bits"]) > 1.0
    assert abs(first["across_cos"] - 0.1) > 0.2


def test_uniform_marginal_keeps_the_categoriality_contrast_when_levels_are_out_of_reach():
    # A uniform stationary distribution makes P doubly stochastic, which caps the mean row
    # cosine near 2^H / V (0.036 here): within 0.4 / across 0.1 cannot coexist with 4.18 bits.
    (_, plus_c), (_, minus_c) = _plus_d(True, "uniform"), _plus_d(False, "uniform")
    plus, minus = plus_c["measured"], minus_c["measured"]
    # The decision of chains' docstring: the levels give way, the +C contrast (target 0.4 - 0.1)
    # and the entropy rate are kept.
    assert abs(plus["within_cos"] - plus["across_cos"] - 0.3) < 0.05
    assert abs(minus["within_cos"] - minus["across_cos"]) < 0.02
    for m in (plus, minus):
        assert m["kl_sorted"] < TOL["kl"]
        assert abs(m["entropy_rate_bits"] - plus_c["spec"]["entropy_bits"]) < 0.3


def test_synthetic_chain_is_deterministic_per_seed():
    kw = {"vocab_size": 60, "n_blocks": 3, "iterations": 15, "marginal": "uniform"}
    a, _ = synthetic(seed=3, **kw)
    b, _ = synthetic(seed=3, **kw)
    c, _ = synthetic(seed=4, **kw)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_auto_device_is_cuda_or_cpu():
    assert chains.resolve_device("auto") in ("cuda", "cpu")
    assert chains.resolve_device("cpu") == "cpu"


def test_synthetic_spec_rejects_unknown_keys():
    # Unknown keys are the schema's to reject now (a typo must not silently use a default).
    with pytest.raises(ConfigError, match=r"n_blcoks: unknown key.*did you mean 'n_blocks'"):
        complete("chain", {"kind": "synthetic", "vocab_size": 100, "n_blcoks": 5})
    with pytest.raises(ConfigError, match="vocab_size"):
        complete("chain", {"kind": "synthetic", "vocab_sise": 100})
    with pytest.raises(ValueError, match="n_blocks"):
        synthetic(vocab_size=10, n_blocks=6, iterations=1)


def test_synthetic_chain_takes_no_defaults_of_its_own():
    # The schema is the only home of the defaults: every parameter must be given, by name.
    params = synthetic_params(vocab_size=20, n_blocks=2, iterations=1)
    assert params == {
        "vocab_size": 20,
        "dependency": True,
        "categorial": True,
        "marginal": "zipfian",
        "n_blocks": 2,
        "entropy_bits": None,
        "within_cos": None,
        "across_cos": 0.1,
        "iterations": 1,
        "lr": 0.1,
        "seed": 0,
        "weights": None,
    }
    with pytest.raises(TypeError):
        chains.synthetic_chain(20, n_blocks=2, iterations=1)  # positional: refused
    without_seed = {k: v for k, v in params.items() if k != "seed"}
    with pytest.raises(TypeError, match="seed"):
        chains.synthetic_chain(**without_seed)


# --- command line ----------------------------------------------------------------------------


def _tokens_dir(path, stream):
    path.mkdir()
    stream = np.asarray(stream, dtype="<u2")
    (path / "tokens.bin").write_bytes(stream.tobytes())
    meta = {
        "format": "ihsweep.natural.tokens/1",
        "tokens_file": "tokens.bin",
        "dtype": "uint16",
        "n_tokens": int(stream.size),
        "vocab_size": 16,
        "eot_id": 15,
        "tokens_sha256": hashlib.sha256(stream.tobytes()).hexdigest(),  # open_tokens checks it
        "tokenizer_kind": "bpe",
    }
    (path / "tokens.json").write_text(json.dumps(meta))
    return path


def test_bigram_cli_writes_chain_types_and_sidecar(tmp_path):
    stream = [5, 3, 5, 15, 3, 7, 5, 9, 3, 5, 3, 15]
    tokens = _tokens_dir(tmp_path / "tok", stream)
    out = tmp_path / "chain"
    spec = {"kind": "bigram", "source": "tok", "vocab_cap": 3, "drop_eot": True}
    argv = ["--spec", json.dumps(spec), "--source-dir", str(tokens), "--out-dir", str(out)]
    assert chain_step.main(argv) == 0
    P, pi, meta = chains.load_chain(out)
    expected, types = chains.bigram_chain(np.array(stream), 3, exclude=[15])
    np.testing.assert_array_equal(P, expected)
    np.testing.assert_array_equal(np.load(out / "types.npy", allow_pickle=False), types)
    assert meta["kind"] == "bigram" and meta["vocab_size"] == 3
    assert meta["spec"] == {"tokens_dir": str(tokens), "vocab_cap": 3, "drop_eot": True}
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    for key in ("kl_sorted", "entropy_rate_bits", "mean_row_max", "within_cos"):
        assert meta["measured"][key] is not None
    assert not list(out.glob(".*.tmp"))
    assert set(meta) == set(chains.CHAIN_KEYS) | set(chains.BIGRAM_KEYS)


def test_synthetic_cli_writes_chain_stationary_and_sidecar(tmp_path):
    spec = {"vocab_size": 40, "n_blocks": 4, "iterations": 10, "marginal": "zipfian", "seed": 1}
    out = tmp_path / "chain"
    # cpu, not auto: the comparison below is bit-exact against a CPU build.
    given = json.dumps({"kind": "synthetic", **spec})
    argv = ["--spec", given, "--out-dir", str(out), "--device", "cpu"]
    assert chain_step.main(argv) == 0
    P = np.load(out / "chain.npy", allow_pickle=False)
    pi = np.load(out / "stationary.npy", allow_pickle=False)
    meta = json.loads((out / "chain.json").read_text())
    assert P.shape == (40, 40) and P.dtype == np.float64 and pi.shape == (40,)
    assert meta["format"] == chains.CHAIN_FORMAT and meta["kind"] == "synthetic"
    assert meta["spec"]["vocab_size"] == 40 and meta["spec"]["within_cos"] == 0.4
    assert meta["spec"]["lr"] == 0.1 and meta["spec"]["weights"] == chains.LOSS_WEIGHTS
    direct, report = synthetic(**spec)
    np.testing.assert_array_equal(P, direct)
    assert meta["measured"] == report["measured"]
    assert set(meta) == set(chains.CHAIN_KEYS) | set(chains.SYNTHETIC_KEYS)
