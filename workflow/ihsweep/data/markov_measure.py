"""Measured statistics of repetition-controlled Markov sequences (:mod:`ihsweep.data.markov`).

Defined once here and used for every report. A second-half position i is an AB...A context if
``x[i-1]`` occurred at some ``j < i-1`` with a successor ``x[j+1] != x[i-1]``; it copies if
``x[i]`` is one of those successors. Measured ``f = contexts / second-half positions`` and
``r = copies / contexts``, pooled over sequences. :func:`measure` gives both with their counts
and the other per-dataset statistics; :func:`context_copy_counts` the per-sequence counts.
"""

from __future__ import annotations

import numpy as np

from ihsweep.data.markov import second_half_start

MEASURE_ROW_CHUNK = 4096
ENTROPY_ESTIMATOR = "plug-in H(x[t+1] | x[t]) from within-sequence bigram counts, bits"


def context_copy_counts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: the number of second-half AB...A contexts and of copies among them.

    A direct reading of the definition: about C^2 / 2 comparisons per sequence (0.1 s for
    10,000 sequences of C = 64); for long contexts, measure a sample of the sequences.
    """
    x = np.atleast_2d(np.asarray(x))
    n, C = x.shape
    contexts = np.zeros(n, np.int64)
    copies = np.zeros(n, np.int64)
    for lo in range(0, n, MEASURE_ROW_CHUNK):
        xb = x[lo : lo + MEASURE_ROW_CHUNK].astype(np.int64)
        for i in range(max(second_half_start(C), 1), C):
            a = xb[:, i - 1 : i]
            succ = xb[:, 1:i]
            valid = (xb[:, : i - 1] == a) & (succ != a)
            contexts[lo : lo + len(xb)] += valid.any(axis=1)
            copies[lo : lo + len(xb)] += (valid & (succ == xb[:, i : i + 1])).any(axis=1)
    return contexts, copies


def measure(x: np.ndarray, vocab_size: int) -> dict:
    """The statistics of a set of sequences ``x`` [n, C] (module docstring for definitions).

    Returns ``f``, ``r`` (None without contexts), their counts, ``first_half_repeats`` (extra
    occurrences of a type within positions < C/2; 0 for this generator), ``unigram_counts``
    (int64 array [V]) and ``entropy_rate_bits`` (:data:`ENTROPY_ESTIMATOR`; biased low when
    bigrams are sparse). Everything except ``unigram_counts`` is a plain Python value.
    """
    x = np.atleast_2d(np.asarray(x))
    n, C = x.shape
    if x.size and (x.min() < 0 or x.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    h = second_half_start(C)
    positions = n * (C - h)
    contexts, copies = (int(c.sum()) for c in context_copy_counts(x))
    first = np.sort(x[:, :h], axis=1)
    return {
        "n_sequences": n,
        "context": C,
        "second_half_positions": positions,
        "contexts": contexts,
        "copies": copies,
        "f": contexts / positions if positions else None,
        "r": copies / contexts if contexts else None,
        "first_half_repeats": int((first[:, 1:] == first[:, :-1]).sum()),
        "unigram_counts": np.bincount(x.ravel().astype(np.int64), minlength=vocab_size),
        "entropy_rate_bits": bigram_entropy_rate(x, vocab_size),
        "entropy_rate_estimator": ENTROPY_ESTIMATOR,
    }


def bigram_entropy_rate(x: np.ndarray, vocab_size: int) -> float:
    """Plug-in conditional entropy of the empirical within-sequence bigrams, bits."""
    x = np.atleast_2d(np.asarray(x)).astype(np.int64)
    pairs = (x[:, :-1] * vocab_size + x[:, 1:]).ravel()
    if pairs.size == 0:
        return 0.0
    keys, counts = np.unique(pairs, return_counts=True)
    prev_counts = np.bincount(keys // vocab_size, weights=counts)[keys // vocab_size]
    return float(-(counts * np.log2(counts / prev_counts)).sum() / pairs.size)
