"""The repetition-controlled Markov sequence generator of experiments 2 and 3 (SPEC section 4).

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
generator's contexts are exactly the ones :func:`measure` counts. The allowed set is never empty
when ``V >= C`` (a never-seen type always remains) and ``C >= 5``: at a second-half step A has
occurred at most once in the first half and at most ``ceil((i - 2 - h) / 2)`` times (never
adjacently) in ``[h, i-3]``, so ``|S_A| <= 1 + ceil((C - 3 - h) / 2) <= h - 2`` while at least h
types have been seen; an earlier-seen type outside ``S_A`` and other than A always exists. Both
bounds are checked up front.

**Measured statistics** (:func:`measure`, defined once and used for every report). A second-half
position i is an AB...A context if ``x[i-1]`` occurred at some ``j < i-1`` with a successor
``x[j+1] != x[i-1]``; it copies if ``x[i]`` is one of those successors. Measured
``f = contexts / second-half positions`` and ``r = copies / contexts``, pooled over sequences.

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

**Vectorised generation** (:func:`generate`). Sequences are made in blocks (16,384 sequences at
V = 1,000 and 6,710 at V = 10,000, :func:`default_block_size`); a block advances all its
sequences one position at a time, so the Python loop runs over positions only. Per sequence it
keeps the last position of every type (``[block, V]``, the block's largest array: uint8 when
C < 255) and, per position, the previous occurrence of the same type and the index of its type
among the sequence's distinct types. Successor sets come from walking previous occurrences;
earlier-seen candidates are the sequence's distinct types (O(C) per draw, never O(V)). A draw
from the never-seen types is rejection sampling from the whole row ``P[A]`` with Walker alias
tables (O(1) per try; given acceptance, the draw follows the restricted distribution), and rows
still rejected after :data:`MAX_REJECTION_TRIES` tries (say, most of A's mass sits on seen
types) are drawn from their masked rows directly. The alias tables (float32 thresholds, int32
aliases: 8 V^2 bytes, 0.8 GB at V = 10,000 beside the 0.8 GB of P) are built once per
:class:`PreparedChain`. Block k draws from ``SeedSequence(seed).spawn(k + 1)[k]``, so the output
depends on ``(seed, block_size)`` only and whole blocks do not depend on ``n_sequences``.

:func:`generate_reference` is the same process written one sequence and one token at a time
(Python sets, one masked numpy row per draw); it is the baseline of ``bench/markov_generator.py``
and the distributional check of the vectorised code.
"""

from __future__ import annotations

import numpy as np

from ihsweep.data.chunks import token_dtype

CALIBRATIONS = ("exact", "paper")
MIN_CONTEXT = 5
BLOCK_BYTES = 64 * 2**20  # default block: its last-position table [block, V] stays within this
BLOCK_SIZE_RANGE = (1024, 16384)  # larger blocks spread the per-position Python overhead further
MAX_REJECTION_TRIES = 8
STATIONARY_TOL = 1e-12
ROW_SUM_TOL = 1e-8
MEASURE_ROW_CHUNK = 4096
ENTROPY_ESTIMATOR = "plug-in H(x[t+1] | x[t]) from within-sequence bigram counts, bits"


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


# --- measurement -------------------------------------------------------------------------------


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


# --- vectorised generator ----------------------------------------------------------------------


class PreparedChain:
    """A checked chain with the vectorised sampler's alias tables, reusable across calls.

    :func:`generate` builds one per call; build it yourself to draw several sets (train and
    validation splits, several cells) from one chain without rebuilding the tables.
    """

    def __init__(self, P: np.ndarray, pi: np.ndarray):
        P, pi = _check_chain(P, pi)
        self.V = P.shape[0]
        self.P = P
        self.flat = P.ravel()
        self.pi = pi
        self.pi_cdf = np.cumsum(pi)
        self.alias_prob, self.alias_idx = _alias_tables(P)

    def draw_pi(self, u: np.ndarray) -> np.ndarray:
        total = self.pi_cdf[-1]
        target = np.minimum(u * total, np.nextafter(total, 0.0))
        return np.searchsorted(self.pi_cdf, target, side="right").astype(np.int64)

    def draw_rows(self, A: np.ndarray, u: np.ndarray) -> np.ndarray:
        """One unrestricted draw from ``P[A[k]]`` per k (Walker alias, one uniform each).

        The fractional part of ``u * V`` carries about 53 - log2(V) bits, so probabilities are
        resolved to ~V * 2^-53; far below any effect measurable here.
        """
        s = u * self.V
        k = np.minimum(s.astype(np.int64), self.V - 1)
        cell = A * self.V + k
        return np.where(s - k < self.alias_prob.take(cell), k, self.alias_idx.take(cell))

    def generate(
        self,
        n_sequences: int,
        context: int,
        f: float,
        r: float,
        seed: int,
        calibration: str,
        block_size: int | None = None,
    ) -> np.ndarray:
        """:func:`generate` on this chain."""
        _check_sizes(self.V, context, n_sequences)
        if block_size is None:
            block_size = default_block_size(self.V, context)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        e = context_start_probability(f, r, context, calibration)
        out = np.empty((n_sequences, context), token_dtype(self.V))
        starts = range(0, n_sequences, block_size)
        streams = np.random.SeedSequence(seed).spawn(len(starts))
        for start, stream in zip(starts, streams, strict=True):
            n = min(block_size, n_sequences - start)
            block = _Block(self, n, context, np.random.default_rng(stream))
            out[start : start + n] = block.run(e, r)
        return out


def default_block_size(vocab_size: int, context: int) -> int:
    """Sequences per block: as many as :data:`BLOCK_BYTES` allows, within BLOCK_SIZE_RANGE."""
    itemsize = 1 if context < 255 else 2 if context < 65535 else 4
    lo, hi = BLOCK_SIZE_RANGE
    return int(min(hi, max(lo, BLOCK_BYTES // (vocab_size * itemsize))))


def _alias_tables(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker alias tables of every row, flat over cells ``a * V + k``: (threshold, alias).

    Thresholds are float32 and aliases int32 (8 bytes a cell, so the tables stay cache-sized
    longer); rounding a threshold to float32 moves a row's distribution by at most 2^-24 (6e-8)
    in total variation, far below the sampling noise of any dataset this makes.
    """
    V = P.shape[0]
    prob = np.empty((V, V), np.float32)
    alias = np.empty((V, V), np.int32)
    for a in range(V):
        prob[a], alias[a] = _alias_row(P[a] * V)
    return prob.ravel(), alias.ravel()


def _alias_row(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias pairing for one row of scaled probabilities ``q`` (mean 1), without a loop.

    Vose pairs each small column (q < 1) with the current large one, which gives up the small's
    deficit ``1 - q``; a large whose q drops below 1 is paired next with the following large.
    Laid out as cumulative sums (smalls' deficits ``D``, larges' surpluses ``E``), the small i
    goes to the first large j with ``E_j >= D_{i-1}``, and large j (not the last) falls at the
    first small with ``D_i > E_j``, keeping ``1 + E_j - D_i`` and aliasing to large j+1. Columns
    left over by rounding keep themselves with probability 1.
    """
    V = q.size
    prob = np.ones(V)
    alias = np.arange(V)
    small = np.flatnonzero(q < 1.0)
    large = np.flatnonzero(q >= 1.0)
    if small.size == 0 or large.size == 0:
        return prob, alias
    deficit = np.cumsum(1.0 - q[small])
    surplus = np.cumsum(q[large] - 1.0)
    j = np.searchsorted(surplus, deficit - (1.0 - q[small]), side="left")
    paired = j < large.size
    prob[small[paired]] = q[small[paired]]
    alias[small[paired]] = large[j[paired]]
    i = np.searchsorted(deficit, surplus[:-1], side="right")
    fell = i < small.size
    prob[large[:-1][fell]] = np.clip(1.0 + surplus[:-1][fell] - deficit[i[fell]], 0.0, 1.0)
    alias[large[:-1][fell]] = large[1:][fell]
    return prob, alias


def _inverse_cdf(w: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per column of ``w`` [K, m] (C-ordered, positive totals), the candidate drawn by ``u``.

    The candidate is the number of cumulative sums <= ``u * total``. For wide blocks the sums
    are accumulated one candidate row at a time (numpy's cumsum along axis 0 walks each column
    separately, several times slower); narrow ones use cumsum.
    """
    K, m = w.shape
    if m < 64:
        c = np.cumsum(w, axis=0)
        total = c[-1]
        target = np.minimum(u * total, np.nextafter(total, 0.0))
        return np.argmax(c > target, axis=0)
    total = w.sum(axis=0)
    target = np.minimum(u * total, np.nextafter(total, 0.0))
    acc = np.zeros(m)
    idx = np.zeros(m, np.int64)
    for k in range(K - 1):
        acc += w[k]
        idx += acc <= target
    # Summation order differs from w.sum's, so a target within rounding of the total can step
    # past the last positive weight (rare: ~1e-16); such columns take that weight's candidate.
    over = w[idx, np.arange(m)] <= 0
    if over.any():
        cols = np.flatnonzero(over)
        idx[cols] = K - 1 - np.argmax(w[::-1, cols] > 0, axis=0)
    return idx


def _restricted_draw(w: np.ndarray, allowed: np.ndarray, pi_of, u: np.ndarray) -> np.ndarray:
    """Per column, a candidate (row index) drawn by weights ``w`` [K, m] within ``allowed``.

    Columns whose allowed chain mass is 0 use pi restricted to the allowed set (``pi_of(bad)``
    gives pi of those columns' candidates), and if that is 0 too, the uniform distribution.
    Inputs may be transposed views; the work array is C-ordered [K, m].
    """
    w = np.multiply(w, allowed, order="C")
    bad = w.sum(axis=0) <= 0
    if bad.any():
        wb = pi_of(bad) * allowed[:, bad]
        still = wb.sum(axis=0) <= 0
        if still.any():
            if not allowed[:, bad][:, still].any(axis=0).all():
                raise RuntimeError("internal error: a restricted draw has an empty allowed set")
            wb[:, still] = allowed[:, bad][:, still]
        w[:, bad] = wb
    return _inverse_cdf(w, u)


class _Block:
    """A block of n sequences generated together.

    Per sequence b: ``x[p, b]`` the token at p; ``prev[p, b]`` the previous position of the same
    type (-1); ``tid[p, b]`` the index of its type in ``types[b]``, the distinct types in order of
    first occurrence (``n_types[b]`` of them); ``last[b, t]`` one more than the last position of
    type t, 0 if unseen (unsigned and as narrow as C allows: it is the block's largest array).
    Per-position arrays are [C, n], so each step reads and writes contiguous rows; ``types`` is
    [n, C], so a sequence's candidates (and then its row of P) are gathered from nearby memory.
    """

    def __init__(self, chain: PreparedChain, n: int, context: int, rng: np.random.Generator):
        self.chain = chain
        self.n = n
        self.C = context
        self.rng = rng
        self.rows = np.arange(n)
        self.x = np.empty((context, n), np.int64)
        self.prev = np.empty((context, n), np.int64)
        self.tid = np.empty((context, n), np.int64)
        self.types = np.zeros((n, context), np.int64)  # zeros: unused slots stay valid ids
        self.n_types = np.zeros(n, np.int64)
        pos_dtype = next(d for d in (np.uint8, np.uint16, np.uint32) if context < np.iinfo(d).max)
        self.last = np.zeros((n, chain.V), pos_dtype)
        self.last_flat = self.last.reshape(-1)

    def at(self, arr: np.ndarray, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``arr[pos[k], rows[k]]`` for a [C, n] array (a flat gather; broadcasts)."""
        return arr.reshape(-1).take(pos * self.n + rows)

    def record(self, i: int, t: np.ndarray) -> None:
        cell = self.rows * self.chain.V + t
        lp = self.last_flat[cell].astype(np.int64) - 1
        new = lp < 0
        self.prev[i] = lp
        self.tid[i] = np.where(new, self.n_types, self.at(self.tid, self.rows, np.maximum(lp, 0)))
        rn = self.rows[new]
        self.types.reshape(-1)[rn * self.C + self.n_types[rn]] = t[new]
        self.n_types += new
        self.last_flat[cell] = i + 1
        self.x[i] = t

    def draw_unseen(self, rows: np.ndarray, A: np.ndarray) -> np.ndarray:
        """For each row, a draw from ``P[A]`` restricted to the types that row has not seen."""
        V = self.chain.V
        out = np.empty(rows.size, np.int64)
        pending = np.arange(rows.size)
        for _ in range(MAX_REJECTION_TRIES):
            t = self.chain.draw_rows(A[pending], self.rng.random(pending.size))
            ok = self.last_flat[rows[pending] * V + t] == 0
            out[pending[ok]] = t[ok]
            pending = pending[~ok]
            if pending.size == 0:
                return out
        # Rows whose unseen mass is small (or zero: the pi fallback) are drawn from masked rows.
        allowed = (self.last[rows[pending]] == 0).T
        pi = self.chain.pi[:, None]
        out[pending] = _restricted_draw(
            self.chain.P[A[pending]].T,
            allowed,
            lambda bad: np.broadcast_to(pi, (V, int(bad.sum()))),
            self.rng.random(pending.size),
        )
        return out

    def successor_positions(self, rows: np.ndarray, i: int) -> np.ndarray:
        """Positions ``j + 1`` of every earlier occurrence j < i-1 of ``x[row, i-1]``, [K, m].

        Walks the previous-occurrence links back from i-1; row k holds the successor of the
        (k+1)-th most recent occurrence, -1 where a sequence has fewer. Rows must be contexts.
        """
        cols = []
        active = np.arange(rows.size)
        p = self.prev[i - 1, rows]
        while active.size:
            cols.append((active, p + 1))
            p = self.at(self.prev, rows[active], p)
            keep = p >= 0
            active, p = active[keep], p[keep]
        succ = np.full((max(len(cols), 1), rows.size), -1, np.int64)
        for k, (a, sp) in enumerate(cols):
            succ[k, a] = sp
        return succ

    def draw_copy(self, rows: np.ndarray, i: int, succ: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Copy: one of A's earlier successors, by ``P[A, .]`` over the distinct types."""
        K, m = succ.shape
        valid = succ >= 0
        sp = np.where(valid, succ, 0)
        tok = self.at(self.x, rows, sp)
        typ = self.at(self.tid, rows, sp)
        # A type that followed A twice must count once: each type keeps the one candidate that
        # wins the scatter below (whichever it is); its other candidates drop out.
        owner = np.empty((self.C, m), np.int64)
        kk, cc = np.nonzero(valid)
        owner[typ[kk, cc], cc] = kk
        keep = valid & (owner[typ, np.arange(m)] == np.arange(K)[:, None])
        w = self.chain.flat.take(self.x[i - 1, rows] * self.chain.V + tok)
        pi = self.chain.pi
        col = _restricted_draw(w, keep, lambda bad: pi[tok[:, bad]], u)
        return tok[col, np.arange(m)]

    def draw_from_seen(
        self, rows: np.ndarray, i: int, succ_rows: np.ndarray, succ: np.ndarray, u: np.ndarray
    ) -> np.ndarray:
        """An earlier-seen type other than A and (for ``succ_rows``) not one of A's successors."""
        m = rows.size
        A = self.x[i - 1, rows]
        # Sequences with the same A go together, so the gathers below reuse each row of P.
        order = np.argsort(A, kind="stable")
        ro = rows[order]
        nt = self.n_types[ro]
        T = self.types[ro, : nt.max()]  # [m, K]; slots past n_types are masked below
        w = self.chain.flat.take((A[order] * self.chain.V)[:, None] + T)
        allowed = np.arange(T.shape[1])[:, None] < nt  # [K, m]
        allowed[self.tid[i - 1, ro], np.arange(m)] = False  # not A itself
        if succ_rows.size:
            slot = np.empty(m, np.int64)
            slot[order] = np.arange(m)
            local = slot[np.searchsorted(rows, succ_rows)]
            kk, cc = np.nonzero(succ >= 0)
            allowed[self.at(self.tid, succ_rows[cc], succ[kk, cc]), local[cc]] = False
        pi = self.chain.pi
        col = _restricted_draw(w.T, allowed, lambda bad: pi[T[bad]].T, u[order])
        out = np.empty(m, np.int64)
        out[order] = T[np.arange(m), col]
        return out

    def second_half_step(self, i: int, e: float, r: float) -> np.ndarray:
        """The tokens at second-half position i for every row of the block."""
        u = self.rng.random((3, self.n))
        ctx = self.prev[i - 1] >= 0
        copy = ctx & (u[0] < r)
        seen_pick = ~copy & (u[1] < e)
        new = ~(copy | seen_pick)
        t = np.empty(self.n, np.int64)
        need = np.flatnonzero(ctx & ~new)  # the rows whose draw depends on A's successors
        succ = self.successor_positions(need, i)
        is_copy = copy[need]
        if is_copy.any():
            rc = need[is_copy]
            t[rc] = self.draw_copy(rc, i, succ[:, is_copy], u[2, rc])
        rs = np.flatnonzero(seen_pick)
        if rs.size:
            t[rs] = self.draw_from_seen(rs, i, need[~is_copy], succ[:, ~is_copy], u[2, rs])
        rn = np.flatnonzero(new)
        if rn.size:
            t[rn] = self.draw_unseen(rn, self.x[i - 1, rn])
        return t

    def run(self, e: float, r: float) -> np.ndarray:
        """Generate the block; returns tokens [n, C]."""
        h = second_half_start(self.C)
        self.record(0, self.chain.draw_pi(self.rng.random(self.n)))
        for i in range(1, self.C):
            if i < h:
                t = self.draw_unseen(self.rows, self.x[i - 1])
            else:
                t = self.second_half_step(i, e, r)
            self.record(i, t)
        return self.x.T


def generate(
    P: np.ndarray,
    pi: np.ndarray,
    n_sequences: int,
    context: int,
    f: float,
    r: float,
    seed: int,
    calibration: str,
    block_size: int | None = None,
) -> np.ndarray:
    """``n_sequences`` sequences of length ``context`` [n, C], uint16 (V <= 65536) or uint32.

    Needs ``V >= context >= 5``. Deterministic in ``(seed, block_size)``, and the default
    block size depends only on V and C (:func:`default_block_size`); a larger ``n_sequences``
    leaves the complete blocks of a smaller one unchanged. A block's largest array is
    ``block_size * V`` bytes (twice that for C >= 255).
    """
    # A bad request fails before the chain is checked and its tables are built.
    _check_sizes(np.shape(P)[0], context, n_sequences)
    context_start_probability(f, r, context, calibration)
    chain = PreparedChain(P, pi)
    return chain.generate(n_sequences, context, f, r, seed, calibration, block_size)


# --- reference implementation ------------------------------------------------------------------


def generate_reference(
    P: np.ndarray,
    pi: np.ndarray,
    n_sequences: int,
    context: int,
    f: float,
    r: float,
    seed: int,
    calibration: str,
) -> np.ndarray:
    """The same process as :func:`generate`, one sequence and one token at a time.

    Same distribution, different random stream: outputs are not equal to generate()'s.
    """
    P, pi = _check_chain(P, pi)
    V = P.shape[0]
    _check_sizes(V, context, n_sequences)
    e = context_start_probability(f, r, context, calibration)
    rng = np.random.default_rng(seed)
    out = np.empty((n_sequences, context), token_dtype(V))
    for s in range(n_sequences):
        out[s] = _reference_sequence(P, pi, context, e, r, rng)
    return out


def _reference_sequence(P, pi, C: int, e: float, r: float, rng: np.random.Generator) -> list:
    V = P.shape[0]
    h = second_half_start(C)
    everything = np.arange(V)
    x = [_reference_draw(pi, pi, everything, rng)]
    unseen = np.ones(V, bool)
    unseen[x[0]] = False
    seen_types = [x[0]]
    successors: dict[int, set] = {}  # type -> types that followed it before the previous token
    for i in range(1, C):
        a = x[-1]
        candidates = None  # None: the never-seen types
        if i >= h and a in successors:
            if rng.random() < r:
                candidates = sorted(successors[a])
            elif rng.random() < e:
                candidates = [t for t in seen_types if t != a and t not in successors[a]]
        elif i >= h and rng.random() < e:
            candidates = [t for t in seen_types if t != a]
        cand = np.flatnonzero(unseen) if candidates is None else np.array(candidates)
        t = _reference_draw(P[a, cand], pi[cand], cand, rng)
        successors.setdefault(a, set()).add(t)
        if unseen[t]:
            unseen[t] = False
            seen_types.append(t)
        x.append(t)
    return x


def _reference_draw(w: np.ndarray, w_pi: np.ndarray, cand: np.ndarray, rng) -> int:
    if w.sum() <= 0:
        w = w_pi if w_pi.sum() > 0 else np.ones(len(cand))
    c = np.cumsum(w)
    target = min(rng.random() * c[-1], np.nextafter(c[-1], 0.0))
    return int(cand[np.searchsorted(c, target, side="right")])
