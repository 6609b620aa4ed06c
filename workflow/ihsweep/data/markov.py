"""The repetition-controlled Markov process of experiments 2 and 3
(docs/method.md#semi-natural-markov-data-frequency-and-reliability).

This module defines the process and holds what every part of it shares: the chain utilities
(checks, stationary distribution, entropy rate) and the calibration of the context-start
probability e. Sequences are drawn by :mod:`ihsweep.data.markov_generator` and their statistics
measured by :mod:`ihsweep.data.markov_measure`.

**The process.** A sequence ``x`` of length C is drawn from a first-order chain ``P[prev, next]``
(float64 [V, V], rows sum to 1). Let ``h = ceil(C / 2)``, the first position with ``i >= C/2``.

- ``x[0]`` is drawn from the chain's stationary distribution ``pi``.
- First half (``0 < i < h``): ``x[i]`` is drawn from ``P[x[i-1]]`` restricted to the types not
  seen yet, so no type repeats (not even as ``A A``).
- Second half (``h <= i < C``), with ``A = x[i-1]`` and ``S_A`` the set of types that followed an
  earlier occurrence of A (at ``j < i-1``):

  - A occurred earlier (an *AB...A context*): with probability r *copy*, i.e. draw from
    ``S_A``; otherwise with probability e draw an earlier-seen type outside ``S_A`` and other
    than A, else a never-seen type;
  - A did not occur earlier: with probability e draw an earlier-seen type other than A (so the
    next context is an ``A...A``), else a never-seen type.

  Every draw is ``P[A, allowed]`` renormalised. If ``P[A, allowed]`` sums to 0 (a chain with
  exact zeros), the draw falls back to ``pi`` restricted to the allowed set, and if that sums to
  0 too, to the uniform distribution on it; the draw never leaves the allowed set.

No draw ever repeats the previous token, so a successor of A is never A itself and the
generator's contexts are exactly the ones :func:`ihsweep.data.markov_measure.measure` counts.
The allowed set is never empty when ``V >= C`` (a never-seen type always remains) and
``C >= 5``: at a second-half step A has occurred at most once in the first half and at most
``ceil((i - 2 - h) / 2)`` times (never adjacently) in ``[h, i-3]``, so
``|S_A| <= 1 + ceil((C - 3 - h) / 2) <= h - 2`` while at least h types have been seen; an
earlier-seen type outside ``S_A`` and other than A always exists. Both bounds are checked up
front.

**Calibration.** Whether position i+1 is a context depends only on whether ``x[i]`` had been seen
before, and the branch probabilities above do not depend on the chain: a copy or an
earlier-seen pick makes the next position a context, a never-seen pick does not. With ``c_i =
P(position i is a context)``::

    c_{i+1} = c_i * (r + (1 - r) * e) + (1 - c_i) * e = e + r * (1 - e) * c_i,

and ``c_h = 0`` because ``x[h-1]`` belongs to the repeat-free first half. The expected measured f
is ``F(e) = mean(c_h, ..., c_{C-1})`` (its denominator is fixed, so the pooled ratio's
expectation is exactly this mean), and the expected measured r is r, since the non-copy branches
exclude ``S_A``. The recursion is exact, not a first-order approximation, because the allowed
sets are never empty (above). ``F`` is continuous and strictly increasing in e, with ``F(0) = 0``
and ``F(1) = (n - 1) / n`` for ``n = C - h`` second-half positions (position h is never a
context), so ``calibration="exact"`` solves ``F(e) = f`` by bisection: deterministic, no pilot
sampling, and it accounts for the start-up transient from ``c_h = 0`` that a stationary formula
misses. Requests above ``(n - 1) / n`` are unreachable by any e and raise. The paper's rule
``e = f / (1 + r)`` is kept as ``calibration="paper"``; its stationary context rate is ``e / (1 - r
+ r e)``, e.g. 0.36 for a request (0.1, 0.9), which is why it overshoots small f at high r. At
C = 64 the recursion predicts F = 0.28, 0.85 and 0.81 for the paper's rule at (0.1, 0.9), (0.9,
0.9) and (0.9, 0.1), the values the authors measured on their generator (0.275, 0.85, 0.81).
"""

from __future__ import annotations

import numpy as np

CALIBRATIONS = ("exact", "paper")
MIN_CONTEXT = 5
STATIONARY_TOL = 1e-12
ROW_SUM_TOL = 1e-8


# --- chain utilities ---------------------------------------------------------------------------


def second_half_start(context: int) -> int:
    """h, the first position i with i >= C/2."""
    return (context + 1) // 2


def stationary(P: np.ndarray, tol: float = STATIONARY_TOL, max_iter: int = 100_000) -> np.ndarray:
    """Stationary distribution of P (see :func:`stationary_distribution`)."""
    return stationary_distribution(_check_transition(P), tol, max_iter)[0]


def stationary_distribution(
    P: np.ndarray, tol: float = STATIONARY_TOL, max_iter: int = 100_000
) -> tuple[np.ndarray, str]:
    """Stationary distribution of P: power iteration on the lazy chain ``(I + P) / 2``.

    The lazy chain has the same stationary distribution and is aperiodic, so the iteration also
    converges for periodic P. Starts from uniform and stops when successive iterates differ by
    less than ``tol`` in L1 norm. A chain that mixes too slowly for ``max_iter`` steps (e.g. a
    near-reducible one) falls back to a direct O(V^3) solve. Returns (pi, 'power' or 'solve').
    """
    v = P.shape[0]
    pi = np.full(v, 1.0 / v)
    for _ in range(max_iter):
        nxt = 0.5 * (pi + pi @ P)
        nxt /= nxt.sum()
        if np.abs(nxt - pi).sum() < tol:
            return nxt, "power"
        pi = nxt
    # pi (P - I) = 0 with sum(pi) = 1: replace one equation of the transposed system by the sum.
    a = P.T - np.eye(v)
    a[-1, :] = 1.0
    b = np.zeros(v)
    b[-1] = 1.0
    pi = np.clip(np.linalg.solve(a, b), 0.0, None)
    return pi / pi.sum(), "solve"


def chain_entropy_rate(P: np.ndarray, pi: np.ndarray) -> float:
    """The chain's own entropy rate ``-sum_a pi_a sum_b P_ab log2 P_ab``, bits."""
    logs = np.log2(P, out=np.zeros_like(P), where=P > 0)
    return float(-(pi @ (P * logs).sum(axis=1)))


def _check_transition(P) -> np.ndarray:
    P = np.ascontiguousarray(P, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or P.shape[0] == 0:
        raise ValueError(f"P must be a square [V, V] matrix, got shape {P.shape}")
    if not np.isfinite(P).all() or (P < 0).any():
        raise ValueError("P must be finite and non-negative")
    worst = np.abs(P.sum(axis=1) - 1.0).max()
    if worst > ROW_SUM_TOL:
        raise ValueError(f"rows of P must sum to 1 (worst row is off by {worst:.3g})")
    return P


def _check_chain(P, pi) -> tuple[np.ndarray, np.ndarray]:
    P = _check_transition(P)
    pi = np.ascontiguousarray(pi, dtype=np.float64)
    if pi.shape != (P.shape[0],):
        raise ValueError(f"pi must have shape ({P.shape[0]},), got {pi.shape}")
    if not np.isfinite(pi).all() or (pi < 0).any() or abs(pi.sum() - 1.0) > ROW_SUM_TOL:
        raise ValueError("pi must be a probability vector (finite, non-negative, sums to 1)")
    return P, pi


def _check_sizes(vocab_size: int, context: int, n_sequences: int) -> None:
    if context < MIN_CONTEXT:
        raise ValueError(f"context must be >= {MIN_CONTEXT} (so every allowed set is non-empty)")
    if vocab_size < context:
        raise ValueError(
            f"vocabulary {vocab_size} < context {context}: a never-seen type must always remain"
        )
    if n_sequences < 0:
        raise ValueError(f"n_sequences must be >= 0, got {n_sequences}")


# --- calibration -------------------------------------------------------------------------------


def expected_frequency(e: float, r: float, context: int) -> float:
    """Expected measured f of the process for context-start probability e (module docstring)."""
    h = second_half_start(context)
    n = context - h
    c, total = 0.0, 0.0
    for _ in range(n):
        total += c
        c = e + r * (1.0 - e) * c
    return total / n


def max_frequency(r: float, context: int) -> float:
    """The largest expected f any e can give: ``(n - 1) / n`` for n second-half positions."""
    return expected_frequency(1.0, r, context)


def context_start_probability(f: float, r: float, context: int, calibration: str) -> float:
    """The e that makes the generator's expected measured f equal ``f`` (or the paper's rule)."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    if context < MIN_CONTEXT:
        raise ValueError(f"context must be >= {MIN_CONTEXT}, got {context}")
    if not (0.0 <= f <= 1.0 and 0.0 <= r <= 1.0):
        raise ValueError(f"requested (f={f}, r={r}): f and r must both lie in [0, 1]")
    f_max = max_frequency(r, context)
    if f > f_max + 1e-12:
        raise ValueError(
            f"requested f={f} (r={r}, context={context}) is unreachable: position C/2 is never a "
            f"context, so the reachable range is f in [0, {f_max:.6g}]"
        )
    if calibration == "paper":
        return f / (1.0 + r)
    return _solve_e(f, r, context)


def _solve_e(f: float, r: float, context: int) -> float:
    # F is strictly increasing on [0, 1]; 60 halvings pin e to ~1e-18, below float resolution.
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_frequency(mid, r, context) < f:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
