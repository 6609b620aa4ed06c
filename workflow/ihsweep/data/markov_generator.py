"""Drawing sequences from the repetition-controlled Markov process (:mod:`ihsweep.data.markov`).

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
from ihsweep.data.markov import (
    _check_chain,
    _check_sizes,
    context_start_probability,
    second_half_start,
)

BLOCK_BYTES = 64 * 2**20  # default block: its last-position table [block, V] stays within this
BLOCK_SIZE_RANGE = (1024, 16384)  # larger blocks spread the per-position Python overhead further
MAX_REJECTION_TRIES = 8


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
