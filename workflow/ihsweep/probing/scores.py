"""The three induction-head probes of docs/method.md (#prefix-matching-score-ps,
#logit-attribution-la, #associative-recall-ar), on one fixed probe batch (#the-probe-batch), and
PS's content part (#content-ps) from a control batch.

A probe batch holds ``n`` sequences, each ``s`` distinct token ids repeated twice (length ``2s``).
At a second-half position ``p`` (``s <= p < 2s``) the current token's earlier copy sits at
``p - s`` and the correct next token B is the one after it, ``tokens[p - s + 1]``; at the last
position ``p = 2s - 1`` that wraps to ``tokens[0]``. In first-half coordinates, second-half
offset ``i = p - s`` predicts the token at ``(i + 1) % s``.

- ``prefix_matching_score``: attention from ``p`` to ``p - s + 1``, per head.
- ``logit_attribution``: share of a head's positive, mean-centred boost over the sequence's ``s``
  token types that goes to B, per head.
- ``associative_recall``: model-level accuracy and mean rank of B over the full vocabulary.
- content PS (``ps_content``): PS on the probe batch minus PS on its control
  (``make_probe_batches``), which has the same first half and a second half that repeats
  nothing; what is left is what a head scores because the tokens repeat, per head.

Every score is a mean over the ``n * s`` (sequence, second-half position) instances. The score
functions are pure and vectorised; ``probe_model`` runs a model on the two batches and applies
them all.

The model-level maxima ``ps_max`` and ``la_max`` are taken over the heads of layers
``min_layer`` and up (the study's ``probe.min_layer``, default 1). A layer-0 head cannot match
prefixes by content: its keys hold a token and a position, never the token before, so attending
from the second A to the B after the first one is open to it only by position. The probe batch
has a fixed period ``s``, so a layer-0 head that looks back about ``s - 1`` positions scores PS
without copying anything. Models trained on text with injected copies learn exactly such heads
(the copies' distances cluster near C/2 = s); they score PS of about 5/C, and for C <= 64 that
rise passed for an induction head's first stage. ``min_layer = 0`` is the literal maximum over
every head of docs/method.md#prefix-matching-score-ps. The per-head table always holds every
head.

A head in layer 1 or later can look back by position too, where the model knows positions
relatively (rotary embeddings): on text with injected copies, llama-family runs learn a layer-1
head that scores the same PS on the control as on the probe. ``ps_content_max`` is blind to
such heads at any layer (docs/results.md#model-families).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ihsweep.probing.metrics import HEAD_SCORES

__all__ = [
    "associative_recall",
    "logit_attribution",
    "make_probe_batch",
    "make_probe_batches",
    "prefix_matching_score",
    "probe_model",
]


def make_probe_batch(
    vocab_size: int,
    context_size: int,
    n_sequences: int,
    max_half_length: int,
    seed: int,
) -> torch.Tensor:
    """A fixed probe batch, LongTensor [n_sequences, 2s] with ``s = min(max_half_length, C // 2)``.

    Each row is ``s`` distinct ids drawn uniformly without replacement from ``range(vocab_size)``,
    then repeated once; no BOS. The same arguments always give the same batch.
    """
    s = _checked_half_length(vocab_size, context_size, n_sequences, max_half_length)
    return _distinct_rows(vocab_size, n_sequences, s, seed).repeat(1, 2)


def make_probe_batches(
    vocab_size: int, context_size: int, probe: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe batch (``make_probe_batch``) and its control as a study's ``probe`` settings
    draw them, two LongTensors [n_sequences, 2s].

    Each control row starts with the probe row's ``s`` ids and goes on with ``s`` more that
    repeat none of them (one draw of ``2s`` distinct ids, the probe keeping the first ``s``), so
    the two batches differ only in whether the second half repeats the first. PS on the control
    measures what a head scores by position alone: the same token types sit at the same
    positions up to ``s``, then a copying head finds no earlier copy (docs/method.md#content-ps).
    Needs ``2s <= vocab_size``.
    """
    n, seed = probe["n_sequences"], probe["seed"]
    s = _checked_half_length(vocab_size, context_size, n, probe["max_half_length"])
    if 2 * s > vocab_size:
        raise ValueError(
            f"the probe's control batch needs 2s = {2 * s} distinct ids per row, more than "
            f"vocab_size = {vocab_size}; lower max_half_length to at most {vocab_size // 2}"
        )
    control = _distinct_rows(vocab_size, n, 2 * s, seed)
    return control[:, :s].repeat(1, 2), control


def _checked_half_length(
    vocab_size: int, context_size: int, n_sequences: int, max_half_length: int
) -> int:
    s = min(max_half_length, context_size // 2)
    if s < 2:
        raise ValueError(
            f"probe half-length s = min({max_half_length}, {context_size} // 2) = {s}; "
            "need s >= 2 for a repeated sequence with a prefix-match position"
        )
    if s > vocab_size:
        raise ValueError(
            f"probe half-length s = {s} exceeds vocab_size = {vocab_size}; "
            "cannot draw s distinct token ids"
        )
    if n_sequences < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    return s


def _distinct_rows(vocab_size: int, n_rows: int, length: int, seed: int) -> torch.Tensor:
    """[n_rows, length] ids, each row drawn uniformly without replacement. A longer draw with
    the same seed extends a shorter one, so ``make_probe_batch``'s rows are the first ``s`` of
    ``make_probe_batches``' control."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    # The ranks of i.i.d. uniform keys form a uniformly random permutation, so the first s
    # positions of an argsort are a uniform draw without replacement. float64 keys make ties,
    # which argsort would break by index (a bias), vanishingly rare even for 50k-token vocabs.
    keys = torch.rand(n_rows, vocab_size, generator=gen, dtype=torch.float64)
    return keys.argsort(dim=1)[:, :length].long()


def _half_length(tokens: torch.Tensor) -> int:
    """``s`` of a probe batch [n, 2s], after checking that it has the repeated-sequence form."""
    if tokens.ndim != 2 or tokens.shape[1] % 2 or tokens.shape[1] < 4:
        raise ValueError(
            f"probe batch must be [n, 2s] with s >= 2, got shape {tuple(tokens.shape)}"
        )
    s = tokens.shape[1] // 2
    if not torch.equal(tokens[:, :s], tokens[:, s:]):
        raise ValueError("probe batch rows must be a first half repeated exactly once")
    # LA scores against "the s token types of the sequence", which needs s distinct ids.
    if (tokens[:, :s].sort(dim=1).values.diff(dim=1) == 0).any():
        raise ValueError("probe batch rows must hold s distinct token ids in each half")
    return s


def _next_in_first_half(s: int, device: torch.device | None = None) -> torch.Tensor:
    """For second-half offset i, the first-half index of the correct next token: (i + 1) % s."""
    return torch.arange(1, s + 1, device=device) % s


def prefix_matching_score(pattern: torch.Tensor, s: int) -> torch.Tensor:
    """PS per head, [head], from one layer's post-softmax pattern [batch, head, 2s, 2s].

    Mean over batch and query positions ``p = s .. 2s-1`` of ``pattern[..., p, p - s + 1]``.
    """
    # Rows s..2s-1 against key p - s + 1 = (row offset) + 1: the first superdiagonal of the
    # lower-left block.
    prefix = torch.diagonal(pattern[..., s : 2 * s, : s + 1], offset=1, dim1=-2, dim2=-1)
    return prefix.mean(dim=(0, 2))


def logit_attribution(
    z: torch.Tensor, W_O: torch.Tensor, W_U: torch.Tensor, tokens: torch.Tensor, s: int
) -> torch.Tensor:
    """LA per head, [head], for one layer.

    Args:
        z: per-head attention output before W_O, [batch, 2s, head, d_head].
        W_O: per-head output projection, [head, d_head, d_model].
        W_U: unembedding, [vocab, d_model].
        tokens: the probe batch, [batch, 2s]; its first half lists each sequence's s token types.
        s: half length.
    """
    o = torch.einsum("bphk,hkd->bphd", z[:, s : 2 * s], W_O)  # head outputs, second half
    e = W_U[tokens[:, :s]]  # [batch, j, d_model]: the sequence's s token types
    dots = torch.einsum("bphd,bjd->bphj", o, e)
    boost = (dots - dots.mean(dim=-1, keepdim=True)).relu()
    target = _next_in_first_half(s, tokens.device).view(1, s, 1, 1).expand(*boost.shape[:3], 1)
    on_b = boost.gather(-1, target).squeeze(-1)
    total = boost.sum(dim=-1)
    # Mean-centred scores sum to zero, so total == 0 means every d_j == 0: no boost, LA := 0.
    share = torch.where(total > 0, on_b / torch.where(total > 0, total, 1), 0)
    return share.mean(dim=(0, 1))


def associative_recall(logits: torch.Tensor, tokens: torch.Tensor, s: int) -> tuple[float, float]:
    """Model-level AR ``(accuracy, mean rank)`` from logits [batch, 2s, vocab].

    Rank at a second-half position is the number of vocabulary entries whose logit is strictly
    greater than the correct next token's; accuracy is the fraction with rank 0.
    """
    logits = logits[:, s : 2 * s]
    correct = tokens[:, _next_in_first_half(s, tokens.device)]  # [batch, s]
    correct_logit = logits.gather(-1, correct.unsqueeze(-1))
    rank = (logits > correct_logit).sum(dim=-1)
    return (rank == 0).double().mean().item(), rank.double().mean().item()


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r, NaN when it is undefined (fewer than two points or a constant variable)."""
    if len(x) < 2:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return float((dx * dy).sum()) / denom if denom > 0 else math.nan


@torch.no_grad()
def probe_model(
    model: torch.nn.Module, batch: torch.Tensor, *, control: torch.Tensor, min_layer: int
) -> tuple[pd.DataFrame, dict]:
    """Run ``model`` on a probe batch and its control (``make_probe_batches``) and score every
    head.

    Returns a DataFrame with one row per (layer, head) and columns ``layer, head, ps, la,
    ps_content`` (PS on ``batch`` minus PS on ``control``), and a dict with ``ar_acc, ar_rank``,
    ``ps_max, la_max, ps_content_max`` (over the heads of layers ``min_layer`` and up; see the
    module docstring) and ``ps_la_corr`` (Pearson r across all heads, NaN if undefined). The
    model runs in eval mode; its previous training mode is restored. A ``min_layer`` that leaves
    no head raises ValueError before the model runs.
    """
    n_layer = len(model.blocks)
    if not 0 <= min_layer < n_layer:
        raise ValueError(
            f"probe.min_layer = {min_layer} leaves no heads in a {n_layer}-layer model; "
            f"use 0 <= min_layer < {n_layer}"
        )
    s = _half_length(batch)
    if control.shape != batch.shape or not torch.equal(control[:, :s], batch[:, :s]):
        raise ValueError("the control batch must have the probe batch's shape and first half")
    device = next(model.parameters()).device
    batch, control = batch.to(device), control.to(device)
    was_training = model.training
    model.eval()
    try:
        logits, cache = model(batch, cache=True)
        _, control_cache = model(control, cache=True)
    finally:
        model.train(was_training)

    # float32 at least, so that a half-precision model is scored with the same arithmetic.
    W_U = model.W_U.float()
    rows = []
    layers = zip(cache["pattern"], cache["z"], control_cache["pattern"], strict=True)
    for layer, (pattern, z, control_pattern) in enumerate(layers):
        ps = prefix_matching_score(pattern.float(), s)
        la = logit_attribution(z.float(), model.blocks[layer].attn.W_O().float(), W_U, batch, s)
        ps_content = ps - prefix_matching_score(control_pattern.float(), s)
        per_head = zip(ps.tolist(), la.tolist(), ps_content.tolist(), strict=True)
        for head, (ps_h, la_h, content_h) in enumerate(per_head):
            rows.append({"layer": layer, "head": head, "ps": ps_h, "la": la_h,
                         "ps_content": content_h})  # fmt: skip
    heads = pd.DataFrame(rows, columns=["layer", "head", *HEAD_SCORES]).astype(
        {"layer": "int64", "head": "int64", **dict.fromkeys(HEAD_SCORES, "float64")}
    )

    ar_acc, ar_rank = associative_recall(logits.float(), batch, s)
    candidates = heads[heads["layer"] >= min_layer]
    summary = {
        "ar_acc": ar_acc,
        "ar_rank": ar_rank,
        **{f"{score}_max": float(candidates[score].max()) for score in HEAD_SCORES},
        "ps_la_corr": _pearson(heads["ps"].to_numpy(), heads["la"].to_numpy()),
    }
    return heads, summary
