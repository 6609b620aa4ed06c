"""Known-answer tests for the probes of docs/method.md (ihsweep.probing.scores): the probe batch,
PS, LA and AR (#the-probe-batch, #prefix-matching-score-ps, #logit-attribution-la,
#associative-recall-ar)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ihsweep.config import load_schema
from ihsweep.probing.metrics import EMERGENCE_METRICS, HEAD_MAXIMA, HEAD_SCORES
from ihsweep.probing.run import MODEL_COLUMNS
from ihsweep.probing.scores import (
    associative_recall,
    logit_attribution,
    make_probe_batch,
    make_probe_batches,
    prefix_matching_score,
    probe_model,
)
from ihsweep.training.model import GPT, GPTConfig


def batches(vocab: int, context_size: int, n_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe batch and its control at the study's seed and half-length cap."""
    probe = {"n_sequences": n_sequences, "max_half_length": 50, "seed": 1234}
    return make_probe_batches(vocab, context_size, probe)


def uniform_causal_ps(s: int) -> float:
    """PS of a head attending uniformly to all causal keys: mean over p = s..2s-1 of 1/(p+1)."""
    return sum(1 / (p + 1) for p in range(s, 2 * s)) / s


# --- prefix-matching score ------------------------------------------------------------------


def one_hot_rows(T: int, key_of_row) -> torch.Tensor:
    pattern = torch.zeros(T, T, dtype=torch.float64)
    for p in range(T):
        pattern[p, key_of_row(p)] = 1.0
    return pattern


def test_prefix_matching_score_hand_made_patterns():
    s, T = 4, 8
    prefix = one_hot_rows(T, lambda p: p - s + 1 if p >= s else 0)
    duplicate = one_hot_rows(T, lambda p: p - s if p >= s else 0)  # earlier copy of A, not B
    uniform = torch.ones(T, T, dtype=torch.float64).tril()
    uniform = uniform / uniform.sum(dim=-1, keepdim=True)
    mixed = 0.25 * prefix + 0.75 * one_hot_rows(T, lambda p: 0)

    # [batch=2, head=4, T, T]; head 3 is a prefix head in sequence 0 only.
    pattern = torch.stack(
        [
            torch.stack([prefix, uniform, duplicate, prefix]),
            torch.stack([prefix, uniform, duplicate, mixed]),
        ]
    )
    ps = prefix_matching_score(pattern, s)
    expected = torch.tensor([1.0, uniform_causal_ps(s), 0.0, (1.0 + 0.25) / 2], dtype=torch.float64)
    assert ps.shape == (4,)
    torch.testing.assert_close(ps, expected, rtol=0, atol=1e-12)


def uniform_attention_gpt(seed: int = 0) -> GPT:
    """A real GPT whose every head attends uniformly to all causal keys (zero q and k)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=50, n_ctx=64, n_layer=2, n_head=4, d_model=32, mlp=True)
    model = GPT(cfg)
    d = cfg.d_model
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * d].zero_()
            block.attn.qkv.bias[: 2 * d].zero_()
    return model


def test_probe_model_uniform_attention_gives_closed_form_ps():
    model = uniform_attention_gpt()
    model.train()
    batch, control = batches(50, context_size=20, n_sequences=3)  # s = 10
    heads, summary = probe_model(model, batch, control=control, min_layer=0)

    assert model.training, "probe_model must restore the model's training mode"
    assert list(heads.columns) == ["layer", "head", *HEAD_SCORES]  # ps, la, ...
    assert heads[["layer", "head"]].values.tolist() == [
        [ly, h] for ly in range(2) for h in range(4)
    ]
    assert heads["layer"].dtype == np.int64 and heads["ps"].dtype == np.float64
    np.testing.assert_allclose(heads["ps"], uniform_causal_ps(10), rtol=0, atol=1e-6)
    assert summary["ps_max"] == pytest.approx(uniform_causal_ps(10), abs=1e-6)
    # Uniform attention reads no token: the control scores the same PS, so no content.
    np.testing.assert_allclose(heads["ps_content"], 0.0, rtol=0, atol=1e-6)
    assert set(summary) == {"ar_acc", "ar_rank", *HEAD_MAXIMA, "ps_la_corr"}
    assert all(isinstance(v, float) for v in summary.values())


def test_ps_la_corr_is_nan_when_ps_is_constant():
    # Zeroing q and k also zeroes the pattern's dependence on the input: every head has the same
    # PS, so the correlation across heads is undefined.
    batch, control = batches(50, 20, n_sequences=2)
    _, summary = probe_model(uniform_attention_gpt(), batch, control=control, min_layer=0)
    assert math.isnan(summary["ps_la_corr"])


def positional_gpt(s: int, layer: int = 0) -> GPT:
    """A 2-layer model that never sees a token: zero token embeddings, one-hot positions, a
    head in ``layer`` that attends from position p to p - s + 1 by position alone, and a head
    with uniform attention in the other layer."""
    C = 2 * s
    model = GPT(GPTConfig(vocab_size=50, n_ctx=C, n_layer=2, n_head=1, d_model=32, mlp=False))
    d = model.cfg.d_model
    with torch.no_grad():
        model.wte.weight.zero_()
        model.wpe.weight.copy_(torch.eye(C, d))
        for block in model.blocks:
            block.attn.qkv.weight.zero_()
            block.attn.qkv.bias.zero_()
        shift = torch.zeros(d, d)  # query at p looks for the key of position p - (s - 1)
        for p in range(s - 1, C):
            shift[p - (s - 1), p] = 1.0
        model.blocks[layer].attn.qkv.weight[:d] = 20.0 * shift
        model.blocks[layer].attn.qkv.weight[d : 2 * d] = torch.eye(d)
    return model


def test_a_layer_0_head_scores_prefix_matching_by_position_alone():
    # The probe's period is fixed, so a head that looks back s - 1 positions scores PS ~ 1
    # without reading a single token; min_layer = 1 leaves it out of ps_max.
    s = 10
    model = positional_gpt(s)
    batch, control = batches(50, 2 * s, n_sequences=5)
    heads, every_head = probe_model(model, batch, control=control, min_layer=0)
    _, from_layer_1 = probe_model(model, batch, control=control, min_layer=1)
    shuffled = batch[torch.randperm(batch.shape[0])]
    shuffled[:, :s] = torch.randint(0, 50, (batch.shape[0], s))  # other tokens, same positions

    assert heads["ps"].iloc[0] > 0.99  # layer 0
    assert every_head["ps_max"] > 0.99
    assert from_layer_1["ps_max"] == pytest.approx(uniform_causal_ps(s), abs=1e-6)
    with torch.no_grad():  # the model's output does not depend on the tokens at all
        torch.testing.assert_close(model(batch), model(shuffled), rtol=0, atol=0)
    assert every_head["ps_content_max"] == pytest.approx(0.0, abs=1e-6)  # it scores by position


def test_content_ps_is_blind_to_a_positional_head_in_layer_1():
    # What rotary models learn on our text: a head past layer 0 that looks back s - 1 positions
    # by position. min_layer cannot leave it out; ps_max dates it, ps_content_max does not.
    s = 10
    model = positional_gpt(s, layer=1)
    batch, control = batches(50, 2 * s, n_sequences=5)
    heads, summary = probe_model(model, batch, control=control, min_layer=1)
    assert heads["ps"].iloc[1] > 0.99 and summary["ps_max"] > 0.99
    assert summary["ps_content_max"] == pytest.approx(0.0, abs=1e-6)


# --- logit attribution ----------------------------------------------------------------------


def signed_permutation(n: int, gen: torch.Generator, scale: torch.Tensor | None = None):
    """A random signed permutation matrix, rows optionally scaled: exact in floating point."""
    m = torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=gen)]
    signs = torch.randint(0, 2, (n, 1), generator=gen, dtype=torch.float64) * 2 - 1
    return m * signs * (1 if scale is None else scale[:, None])


def test_logit_attribution_hand_made_heads():
    # W_U and W_O are (scaled) signed permutations, so o, and every o . e_j, is exact: the 0/0
    # case really is 0/0, and W_O is still non-symmetric enough to catch a transposed product.
    gen = torch.Generator().manual_seed(0)
    V = d = 10
    s = 4
    first = torch.tensor([[5, 2, 7, 1], [0, 9, 3, 4]])
    tokens = first.repeat(1, 2)
    outside = [6, 8]  # per sequence, a vocab id that is not in the sequence
    W_U = signed_permutation(V, gen)  # orthonormal rows e_j
    e = W_U

    n_head = 5
    n, T = tokens.shape
    o = torch.zeros(n, T, n_head, d, dtype=torch.float64)  # the head outputs we want
    for b in range(n):
        for p in range(s, 2 * s):
            A = tokens[b, p - s]
            B = tokens[b, p - s + 1] if p < 2 * s - 1 else tokens[b, 0]
            o[b, p, 0] = e[B]  # pure copy of B: LA 1
            o[b, p, 1] = 2 * e[B] + e[A]  # d = (1.25, 0.25, -.75, -.75): LA 1.25 / 1.5
            o[b, p, 2] = e[A]  # boosts the current token, not the next: LA 0
            o[b, p, 3] = e[outside[b]] if b else 0  # no in-context boost, 0/0: LA 0
            o[b, p, 4] = e[B] + 5 * e[outside[b]]  # out-of-context ids are not scored: LA 1
    o[:, :s] = torch.randn(n, s, n_head, d, generator=gen, dtype=torch.float64)  # ignored

    # W_O[h] = D_h P_h with power-of-two row scales, so z = o @ W_O[h]^-1 = o @ P_h^T D_h^-1.
    scales = 2.0 ** torch.randint(-2, 3, (n_head, d), generator=gen).double()
    perms = torch.stack([signed_permutation(d, gen) for _ in range(n_head)])
    W_O = scales[:, :, None] * perms
    z = torch.einsum("bphd,hkd->bphk", o, perms) / scales

    la = logit_attribution(z, W_O, W_U, tokens, s)
    expected = torch.tensor([1.0, 1.25 / 1.5, 0.0, 0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(la, expected, rtol=0, atol=1e-12)


# --- associative recall ---------------------------------------------------------------------


def test_associative_recall_hand_made_logits():
    s, V = 4, 8
    tokens = torch.tensor([[1, 4, 2, 6, 1, 4, 2, 6]])
    # Correct next tokens at p = 4..7: 4, 2, 6, then 1 (wraps to the first token).
    logits = torch.zeros(1, 2 * s, V)
    logits[0, :s, :] = torch.arange(V, dtype=torch.float32)  # first half: ignored
    logits[0, 4, 4] = 3.0  # unique top: rank 0
    logits[0, 5, [0, 1, 3]] = 1.0  # target 2 at 0, three above, others tied: rank 3
    # p = 6: all logits tied, none strictly greater: rank 0
    logits[0, 7, 6] = 2.0  # the wrap target 1 is second behind token 6: rank 1
    logits[0, 7, 1] = 1.0

    acc, rank = associative_recall(logits, tokens, s)
    assert isinstance(acc, float) and isinstance(rank, float)
    assert acc == pytest.approx(2 / 4)
    assert rank == pytest.approx((0 + 3 + 0 + 1) / 4)


# --- agreement with a literal per-position implementation ------------------------------------


def next_token(tokens: torch.Tensor, b: int, p: int) -> int:
    """The correct next token of docs/method.md#logit-attribution-la: the token after the earlier
    copy; at the last position, the sequence's first token."""
    s = tokens.shape[1] // 2
    return tokens[b, p - s + 1].item() if p < 2 * s - 1 else tokens[b, 0].item()


def reference_head(pattern, z, W_O_h, W_U, tokens, h: int) -> tuple[float, float]:
    """PS and LA of head ``h``, docs/method.md#prefix-matching-score-ps and
    docs/method.md#logit-attribution-la read literally, one instance at a time.

    ``pattern`` [batch, head, q, k] and ``z`` [batch, pos, head, d_head] of its layer, its output
    projection ``W_O_h`` [d_head, d_model] and the unembedding ``W_U``, all float64."""
    s = tokens.shape[1] // 2
    ps_vals, la_vals = [], []
    for b in range(tokens.shape[0]):
        types = tokens[b, :s].tolist()
        for p in range(s, 2 * s):
            ps_vals.append(pattern[b, h, p, p - s + 1].item())
            o = z[b, p, h] @ W_O_h
            dots = [(o @ W_U[j]).item() for j in types]
            mean = sum(dots) / len(dots)
            relu = [max(x - mean, 0.0) for x in dots]
            total = sum(relu)
            B = next_token(tokens, b, p)
            la_vals.append(relu[types.index(B)] / total if total > 0 else 0.0)
    return sum(ps_vals) / len(ps_vals), sum(la_vals) / len(la_vals)


def reference_ps_la(model: GPT, tokens: torch.Tensor):
    """PS and LA per head (layer-major) of one of our models, by ``reference_head``."""
    _, cache = model(tokens, cache=True)
    cfg = model.cfg
    W_U = model.W_U.double()
    ps_rows, la_rows = [], []
    for layer in range(cfg.n_layer):
        pattern = cache["pattern"][layer].double()
        z = cache["z"][layer].double()
        out_w = model.blocks[layer].attn.out.weight.double()  # [d_model, head * d_head]
        for h in range(cfg.n_head):
            W_O_h = out_w[:, h * cfg.d_head : (h + 1) * cfg.d_head].T  # head h's slice
            ps, la = reference_head(pattern, z, W_O_h, W_U, tokens, h)
            ps_rows.append(ps)
            la_rows.append(la)
    return np.array(ps_rows), np.array(la_rows)


def reference_ar(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
    n, T = tokens.shape
    s = T // 2
    ranks = []
    for b in range(n):
        for p in range(s, 2 * s):
            row = logits[b, p].tolist()
            correct = row[next_token(tokens, b, p)]
            ranks.append(sum(1 for x in row if x > correct))
    return sum(r == 0 for r in ranks) / len(ranks), sum(ranks) / len(ranks)


def random_gpt(seed: int = 0) -> GPT:
    """A small random GPT with large weights, so that scores differ from head to head."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=50, n_ctx=64, n_layer=2, n_head=4, d_model=32, mlp=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.5)
    return model.eval()


@pytest.mark.parametrize("mlp", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@torch.no_grad()
def test_probe_path_gives_the_training_paths_logits(mlp, dtype):
    # The probes read attention from the explicit path (cache=True); the model was trained,
    # and is evaluated, through the fused scaled_dot_product_attention path. Both must be the
    # same function of the weights, or the probes describe a different model. Default init in
    # float32 (the trained models' dtype) and large random weights in float64.
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=50, n_ctx=24, n_layer=2, n_head=4, d_model=32, mlp=mlp)
    model = GPT(cfg).to(dtype)
    if dtype == torch.float64:
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.5)
    model.eval()
    assert (model.blocks[0].mlp is not None) == mlp
    x = torch.randint(0, cfg.vocab_size, (3, cfg.n_ctx), generator=torch.Generator().manual_seed(2))
    for tokens in (x, x[:, :7]):  # the full context and a shorter sequence
        logits = model(tokens)
        cached, act = model(tokens, cache=True)
        assert logits.dtype == cached.dtype == dtype
        assert logits.shape == (3, tokens.shape[1], cfg.vocab_size)
        assert logits.std() > (1e-2 if dtype == torch.float32 else 1.0)  # not a trivial model
        atol = 1e-6 if dtype == torch.float32 else 1e-10
        torch.testing.assert_close(cached, logits, rtol=0, atol=atol)
        # The compiled trainer's path (execution.compile): the explicit one, without the cache.
        torch.testing.assert_close(model(tokens, explicit=True), cached, rtol=0, atol=0)
        t = tokens.shape[1]
        assert len(act["pattern"]) == len(act["z"]) == cfg.n_layer
        for pattern, z in zip(act["pattern"], act["z"], strict=True):
            assert pattern.shape == (3, cfg.n_head, t, t)
            assert z.shape == (3, t, cfg.n_head, cfg.d_head)
            assert torch.all(pattern.triu(diagonal=1) == 0)  # causal
            torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]))
        if dtype == torch.float64:  # attention far from uniform (1/t): the check has teeth
            assert min(float(p[..., -1, :].max()) for p in act["pattern"]) > 0.5


@torch.no_grad()
def test_probes_match_literal_reference_on_random_gpt():
    model = random_gpt()
    batch, control = batches(50, context_size=20, n_sequences=7)
    heads, summary = probe_model(model, batch, control=control, min_layer=0)
    ps, la = reference_ps_la(model, batch)
    control_ps, _ = reference_ps_la(model, control)  # PS reads positions only: valid here
    acc, rank = reference_ar(model(batch), batch)

    assert ps.std() > 1e-3 and la.std() > 1e-3 and rank > 0  # a non-degenerate comparison
    np.testing.assert_allclose(heads["ps"], ps, rtol=0, atol=1e-6)
    np.testing.assert_allclose(heads["la"], la, rtol=0, atol=1e-6)
    assert summary["ar_acc"] == pytest.approx(acc, abs=1e-12)
    assert summary["ar_rank"] == pytest.approx(rank, abs=1e-12)
    assert summary["ps_max"] == pytest.approx(ps.max(), abs=1e-6)
    assert summary["la_max"] == pytest.approx(la.max(), abs=1e-6)
    assert summary["ps_la_corr"] == pytest.approx(np.corrcoef(ps, la)[0, 1], abs=1e-5)
    np.testing.assert_allclose(heads["ps_content"], ps - control_ps, rtol=0, atol=1e-6)
    assert summary["ps_content_max"] == pytest.approx((ps - control_ps).max(), abs=1e-6)

    # probe.min_layer = 1: the maxima over layer 1's heads only. Layer 0 holds both maxima over
    # every head, so the filter matters.
    _, later_summary = probe_model(model, batch, control=control, min_layer=1)
    later = (heads["layer"] >= 1).to_numpy()
    assert ps[~later].max() > ps[later].max() and la[~later].max() > la[later].max()
    assert later_summary["ps_max"] == pytest.approx(ps[later].max(), abs=1e-6)
    assert later_summary["la_max"] == pytest.approx(la[later].max(), abs=1e-6)
    with pytest.raises(ValueError, match="min_layer = 2 leaves no heads in a 2-layer model"):
        probe_model(model, batch, control=control, min_layer=2)


def test_associative_recall_matches_literal_reference_with_many_ties():
    # A random model almost never ranks B first; small integer logits make rank 0 and ties common.
    gen = torch.Generator().manual_seed(0)
    tokens = make_probe_batch(12, 16, n_sequences=7, seed=5, max_half_length=50)  # s = 8
    logits = torch.randint(0, 4, (7, 16, 12), generator=gen).float()
    acc, rank = associative_recall(logits, tokens, 8)
    ref_acc, ref_rank = reference_ar(logits, tokens)
    assert 0 < ref_acc < 1
    assert acc == pytest.approx(ref_acc, abs=1e-12)
    assert rank == pytest.approx(ref_rank, abs=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_probe_model_on_cuda_matches_cpu():
    batch, control = batches(50, context_size=20, n_sequences=7)
    heads_cpu, summary_cpu = probe_model(random_gpt(), batch, control=control, min_layer=0)
    # The batches stay on the CPU: probe_model moves them to the model's device.
    heads_gpu, summary_gpu = probe_model(random_gpt().cuda(), batch, control=control, min_layer=0)
    scores = list(HEAD_SCORES)
    np.testing.assert_allclose(heads_gpu[scores], heads_cpu[scores], atol=1e-4)
    assert summary_gpu["ar_rank"] == pytest.approx(summary_cpu["ar_rank"], abs=0.05)


# --- probe batch ----------------------------------------------------------------------------


@pytest.mark.parametrize(("context_size", "s"), [(20, 10), (21, 10), (100, 50), (1000, 50)])
def test_make_probe_batch_shape_and_structure(context_size, s):
    batch = make_probe_batch(200, context_size, n_sequences=9, seed=7, max_half_length=50)
    assert batch.dtype == torch.long and batch.shape == (9, 2 * s)
    first = batch[:, :s]
    assert torch.equal(batch[:, s:], first)
    assert all(len(set(row)) == s for row in first.tolist())
    assert int(batch.min()) >= 0 and int(batch.max()) < 200


def test_make_probe_batch_half_length_cap_is_configurable():
    assert make_probe_batch(100, 1000, n_sequences=2, max_half_length=30, seed=1234).shape == (
        2,
        60,
    )


def test_make_probe_batch_is_deterministic_per_seed():
    a = make_probe_batch(500, 64, n_sequences=5, seed=3, max_half_length=50)
    assert torch.equal(a, make_probe_batch(500, 64, n_sequences=5, seed=3, max_half_length=50))
    assert not torch.equal(a, make_probe_batch(500, 64, n_sequences=5, seed=4, max_half_length=50))


def test_the_control_batch_shares_the_first_half_and_repeats_nothing():
    batch, control = batches(200, 64, n_sequences=9)  # s = 32
    assert control.shape == batch.shape and control.dtype == torch.long
    assert torch.equal(control[:, :32], batch[:, :32])
    # The probe batch is make_probe_batch's: one draw, whichever function makes it.
    alone = make_probe_batch(200, 64, n_sequences=9, max_half_length=50, seed=1234)
    assert torch.equal(batch, alone)
    assert all(len(set(row)) == 64 for row in control.tolist())  # no id twice in a row


def test_the_control_batch_needs_two_s_distinct_ids():
    make_probe_batch(50, 80, n_sequences=2, max_half_length=50, seed=1)  # s = 40 fits
    with pytest.raises(ValueError, match="2s = 80 distinct ids.*vocab_size = 50.*at most 25"):
        make_probe_batches(50, 80, {"n_sequences": 2, "max_half_length": 50, "seed": 1})


def test_probe_model_rejects_a_control_that_does_not_match_the_batch():
    batch, control = batches(50, 20, n_sequences=2)
    control[0, 0] = (control[0, 0] + 1) % 50
    with pytest.raises(ValueError, match="control batch"):
        probe_model(uniform_attention_gpt(), batch, control=control, min_layer=0)


def test_make_probe_batch_draws_uniformly():
    # 20,000 draws of 5 ids from 10: every id should appear at every position about 2,000 times
    # (binomial sd ~42). Fixed seed, so this is not flaky; a sorted or biased draw fails it.
    batch = make_probe_batch(10, 10, n_sequences=20_000, seed=0, max_half_length=50)
    for pos in range(5):
        counts = torch.bincount(batch[:, pos], minlength=10)
        assert int((counts - 2000).abs().max()) < 250, counts


@pytest.mark.parametrize(("vocab", "context"), [(5, 20), (100, 3), (100, 0)])
def test_make_probe_batch_rejects_impossible_sizes(vocab, context):
    with pytest.raises(ValueError, match="half-length"):
        make_probe_batch(vocab, context, n_sequences=100, max_half_length=50, seed=1234)


def test_probe_model_rejects_a_batch_that_is_not_repeated():
    model = uniform_attention_gpt()
    batch, control = batches(50, 20, n_sequences=2)
    batch[0, -1] = (batch[0, -1] + 1) % 50
    with pytest.raises(ValueError, match="repeated"):
        probe_model(model, batch, control=control, min_layer=0)


def test_the_schema_accepts_exactly_the_registered_emergence_metrics():
    """``emergence.metric`` names what ``ihsweep.probing.metrics`` registers: a new per-head
    score is its maximum's metric, and the model table holds a column for each."""
    schema = load_schema()
    metric = schema["properties"]["emergence"]["properties"]["metric"]
    assert metric["enum"] == list(EMERGENCE_METRICS)
    assert set(EMERGENCE_METRICS) <= set(MODEL_COLUMNS)
    assert [f"{score}_max" for score in HEAD_SCORES] == [
        m for m in EMERGENCE_METRICS if m != "ar_acc"
    ]
