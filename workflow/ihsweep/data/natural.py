"""Natural-text data: tokenize a corpus once, then cut it into training chunks per context size.

Two steps, each a function (the commands are ``python -m ihsweep.steps.tokenize`` and
``python -m ihsweep.steps.chunk``):

``tokenize`` (:func:`tokenize_corpus`) reads the dataset entry ``{"family": "natural",
"corpus": {...}, "tokenizer": {...}, "repetition": {...}, "val_fraction": 0.05}`` and writes

- ``tokens.bin``: the whole corpus as one flat id stream, documents separated by
  ``<|endoftext|>``; raw little-endian uint16 (vocabulary < 65,536) or uint32, readable with
  ``np.memmap`` (:func:`open_tokens`);
- ``tokenizer.json``: the tokenizer (trained BPE, or a copy of GPT-2's), ``tokenizers`` format;
- ``tokens.json``: the sidecar, written last (see :data:`TOKENS_KEYS`).

``chunk`` (:func:`chunk_tokens`) cuts the stream into non-overlapping length-C chunks (the tail
is dropped), holds out the *last* ``val_fraction`` of chunks (contiguous text, so no held-out
passage is also trained on), applies the repetition control to both splits alike, shuffles the
training chunks (seeded) and writes

- ``train.bin``, ``val.bin``: ``[n, C]`` arrays of the token dtype (``chunks.open_chunks``);
- ``train_copies.npy``, ``val_copies.npy``: int32 ``[n, 3]`` rows ``(L, a, b)`` per chunk: an
  injected copy ``x[b:b+L] = x[a:a+L]``, or ``(0, -1, -1)`` for none (:func:`open_copies`);
- ``chunks.json``: the sidecar, written last (see :data:`CHUNKS_KEYS`).

Repetition control (``spec["repetition"]``; null or zero is off):

- ``repeated_bigram_fraction: p`` is the paper's manipulation. A chunk "has a repeat" when some
  bigram ``(x[i], x[i+1])`` occurs at least twice in it. The largest subset of chunks in which a
  share p (up to rounding) has a repeat is kept; the surplus of the over-represented kind is
  dropped at random.
- ``copy_fraction: q`` with ``copy_length: [lo, hi]`` (fractions of C) injects one copy into a
  random share q of chunks: length L uniform over the integers in ``[round(lo*C), round(hi*C)]``
  (a fixed length would teach a positional look-back instead of an induction head), and the
  pair (source start a, destination start b) uniform over all pairs with ``b >= a + L`` and
  ``b + L <= C``. When both controls are on, the selection runs first, on the natural text.

Every file is written to a temporary name in its directory and moved into place with
``os.replace``; the sidecar goes last, so its presence means the outputs are complete.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import tokenizers

from ihsweep.data import corpus as corpus_mod
from ihsweep.data import tokenizer as tok_mod
from ihsweep.data.chunks import (
    CHUNKS_JSON,
    SPLITS,
    open_array,
    read_chunks_meta,
    token_dtype,
    write_checksums,
)
from ihsweep.files.io import DamagedFile, atomic_path, file_sha256, read_json_file, write_json

TOKENS_FORMAT = "ihsweep.natural.tokens/1"
CHUNKS_FORMAT = "ihsweep.natural.chunks/1"
TOKENS_JSON = "tokens.json"
# The tokenize step rewrites a dataset's tokens bit for bit (tokens.json's timings aside); its
# chunk folders and the runs trained on them rerun after it (their inputs are newer), and a
# finished run only rewrites its run.json.
RETOKENIZE = (
    "remove it and run `snakemake {folder}/tokens.json`, then `snakemake`: the tokenize step"
    " rewrites the folder {folder} with the same tokens, then its chunk folders and the runs"
    " trained on them rerun (a finished run resumes at its end and only rewrites run.json)"
)

TOKENS_KEYS = {
    "format": "format tag, " + TOKENS_FORMAT,
    "tokens_file": "name of the flat id stream (tokens.bin)",
    "tokenizer_file": "name of the saved tokenizer (tokenizer.json)",
    "tokenizer_kind": "'gpt2' or 'bpe'",
    "tokenizer": "the tokenizer spec as given",
    "vocab_size": "number of token ids",
    "eot_id": "id of <|endoftext|>, placed between documents",
    "dtype": "numpy dtype name of tokens.bin ('uint16' or 'uint32')",
    "n_tokens": "ids in tokens.bin",
    "n_documents": "documents read",
    "n_text_bytes": "UTF-8 bytes of document text read",
    "source": "the corpus spec with defaults filled",
    "source_sha256": "corpus_fingerprint of the source",
    "tokenizer_sha256": "sha256 of tokenizer.json",
    "tokens_sha256": "sha256 of tokens.bin",
    "tokenizers_version": "version of the HF tokenizers package",
    "seconds": "wall time: {'tokenizer': build/train, 'encode': encode and write}",
}

CHUNKS_KEYS = {
    "format": "format tag, " + CHUNKS_FORMAT,
    "context": "C, tokens per chunk",
    "n_train": "rows of train.bin",
    "n_val": "rows of val.bin",
    "dtype": "numpy dtype name of train.bin/val.bin",
    "vocab_size": "number of token ids",
    "eot_id": "id of <|endoftext|>",
    "seed": "seed of every random choice",
    "val_fraction": "share of chunks held out (the last ones), before repetition control",
    "repetition": "the repetition spec with defaults filled (null = off)",
    "n_chunks": "length-C chunks in the token stream, before the split",
    "n_tail_tokens_dropped": "tokens after the last full chunk",
    "train_order": "'shuffled' (train rows permuted with the seed); val keeps text order",
    "splits": "per split: n_before, n_after, repeat_share_before (natural chunks), "
    "repeat_share_after (as written), copy_share, copy_length_min, copy_length_max, "
    "copy_length_mean",
    "files": "file names per split: {'train': {'chunks', 'copies'}, 'val': {...}}",
    "tokens": "provenance copied from tokens.json: source_sha256, tokenizer_sha256, "
    "tokens_sha256, tokenizer_kind",
}


# --- tokenize --------------------------------------------------------------------------------


def tokenize_corpus(spec: dict, out_dir: str | os.PathLike, base_dir=".") -> dict:
    """Tokenize the dataset entry's corpus into out_dir; return the sidecar dict."""
    corpus_spec, tok_spec = spec["corpus"], spec["tokenizer"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = corpus_mod.corpus_fingerprint(corpus_spec, base_dir)

    t0 = time.perf_counter()
    docs = corpus_mod.load_documents(corpus_spec, base_dir) if tok_spec["kind"] == "bpe" else None
    tok = tok_mod.build_tokenizer(tok_spec, docs, out / "tokenizer.json")
    t1 = time.perf_counter()

    vocab = tok.get_vocab_size()
    dtype = token_dtype(vocab)
    counter = _Counter(corpus_mod.load_documents(corpus_spec, base_dir))
    n_tokens, tokens_sha = _write_stream(
        out / "tokens.bin", tok_mod.encode_documents(tok, counter), dtype, vocab
    )
    t2 = time.perf_counter()

    meta = {
        "format": TOKENS_FORMAT,
        "tokens_file": "tokens.bin",
        "tokenizer_file": "tokenizer.json",
        "tokenizer_kind": tok_spec["kind"],
        "tokenizer": tok_spec,
        "vocab_size": vocab,
        "eot_id": tok_mod.eot_id(tok),
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_documents": counter.n_documents,
        "n_text_bytes": counter.n_bytes,
        "source": corpus_spec,
        "source_sha256": fingerprint,
        "tokenizer_sha256": _file_sha256(out / "tokenizer.json"),
        "tokens_sha256": tokens_sha,
        "tokenizers_version": tokenizers.__version__,
        "seconds": {"tokenizer": round(t1 - t0, 3), "encode": round(t2 - t1, 3)},
    }
    write_json(out / TOKENS_JSON, meta)
    return meta


class _Counter:
    """Pass documents through while counting them and their UTF-8 bytes."""

    def __init__(self, docs: Iterable[str]):
        self._docs = docs
        self.n_documents = 0
        self.n_bytes = 0

    def __iter__(self) -> Iterator[str]:
        for doc in self._docs:
            self.n_documents += 1
            self.n_bytes += len(doc.encode("utf-8"))
            yield doc


def _write_stream(path: Path, arrays: Iterable[np.ndarray], dtype: np.dtype, vocab: int):
    """Append id arrays to a temporary file, then move it to path; return (count, sha256)."""
    h = hashlib.sha256()
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for arr in arrays:
            if arr.size and (arr.min() < 0 or arr.max() >= vocab):
                raise ValueError(f"token id outside [0, {vocab}) while writing {path}")
            data = arr.astype(dtype.newbyteorder("<")).tobytes()
            f.write(data)
            h.update(data)
            n += arr.size
    return n, h.hexdigest()


# --- repetition measurement and control ------------------------------------------------------


def has_repeated_bigram(chunks: np.ndarray, vocab_size: int | None = None) -> np.ndarray:
    """Bool per row: does some bigram (x[i], x[i+1]) occur at least twice in the row?

    Each bigram becomes one integer ``x[i] * V + x[i+1]``; after sorting each row, a repeat is two
    equal neighbours. Rows are processed in blocks to bound memory.
    """
    chunks = np.asarray(chunks)
    n, c = chunks.shape
    if c < 3 or n == 0:
        return np.zeros(n, dtype=bool)
    v = int(vocab_size) if vocab_size is not None else int(chunks.max()) + 1
    block = max(1, (1 << 22) // c)
    out = np.empty(n, dtype=bool)
    for start in range(0, n, block):
        x = np.asarray(chunks[start : start + block], dtype=np.int64)
        codes = np.sort(x[:, :-1] * v + x[:, 1:], axis=1)
        out[start : start + block] = (codes[:, 1:] == codes[:, :-1]).any(axis=1)
    return out


def select_repeat_share(has_repeat: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of the largest subset whose share of repeat chunks is p (up to rounding)."""
    has_repeat = np.asarray(has_repeat, dtype=bool)
    rep, norep = np.flatnonzero(has_repeat), np.flatnonzero(~has_repeat)
    k_rep, k_norep = _subset_sizes(len(rep), len(norep), p)
    kept = np.concatenate(
        [rng.choice(rep, k_rep, replace=False), rng.choice(norep, k_norep, replace=False)]
    )
    return np.sort(kept)


def _subset_sizes(n_rep: int, n_norep: int, p: float) -> tuple[int, int]:
    if p >= 1.0:
        k_rep, k_norep = n_rep, 0
    elif p <= 0.0:
        k_rep, k_norep = 0, n_norep
    else:
        # The largest total K for which round(p*K) repeat chunks and the rest are available.
        # round(p*K) <= n_rep needs p*K < n_rep + 0.5 (likewise for the rest), which bounds K;
        # rounding leaves the bound at most a step or two above the answer, so step down.
        bound = min((n_rep + 0.5) / p, (n_norep + 0.5) / (1 - p))
        total = min(n_rep + n_norep, int(bound) + 1)
        k_rep = k_norep = 0
        for k in range(total, 0, -1):
            r = _round_half_up(p * k)
            if r <= n_rep and k - r <= n_norep:
                k_rep, k_norep = r, k - r
                break
    if k_rep + k_norep == 0 or (0 < p < 1 and (k_rep == 0 or k_norep == 0)):
        raise ValueError(
            f"repeated_bigram_fraction {p} is out of reach: {n_rep} chunks have a repeated "
            f"bigram and {n_norep} have none"
        )
    return k_rep, k_norep


def copy_length_range(copy_length, context: int) -> tuple[int, int]:
    """Integer [lo, hi] copy lengths for context C; raise ValueError if a copy cannot fit."""
    if copy_length is None or len(copy_length) != 2:
        raise ValueError(f"copy_length must be [lo, hi] fractions of C, got {copy_length!r}")
    lo_f, hi_f = (float(x) for x in copy_length)
    lo, hi = _round_half_up(lo_f * context), _round_half_up(hi_f * context)
    if not 0 < lo_f <= hi_f or lo < 1:
        raise ValueError(f"copy_length {copy_length} gives lengths [{lo}, {hi}] at C={context}")
    if 2 * hi > context:
        longest = math.floor(context // 2 / context * 1e4) / 1e4
        raise ValueError(
            f"hi = {hi_f} is too long for C = {context}: a copy of round(hi*C) = {hi} tokens "
            f"and its source need {2 * hi} > {context} positions; make hi <= {longest}"
        )
    return lo, hi


def draw_copies(
    n: int, context: int, fraction: float, copy_length, rng: np.random.Generator
) -> np.ndarray:
    """Draw copy parameters: int32 [n, 3] rows (L, a, b), (0, -1, -1) for chunks without one."""
    out = np.zeros((n, 3), dtype=np.int32)
    out[:, 1:] = -1
    if not fraction:
        return out
    lo, hi = copy_length_range(copy_length, context)
    m = _round_half_up(fraction * n)
    rows = rng.choice(n, m, replace=False)
    length = rng.integers(lo, hi, endpoint=True, size=m)
    gap = context - 2 * length  # free positions besides the two segments
    # A uniform (a, b) pair with b >= a + L and b + L <= C is a uniform pair u < v from
    # {0..gap+1}: a = u and b = v + L - 1. Draw an ordered distinct pair, then sort it.
    u = rng.integers(0, gap + 2)
    v = rng.integers(0, gap + 1)
    v = np.where(v >= u, v + 1, v)
    u, v = np.minimum(u, v), np.maximum(u, v)
    out[rows, 0] = length
    out[rows, 1] = u
    out[rows, 2] = v + length - 1
    return out


def apply_copies(chunks: np.ndarray, copies: np.ndarray) -> None:
    """In place: x[b:b+L] = x[a:a+L] for each row with L > 0 (one fancy-indexed assignment)."""
    rows = np.flatnonzero(copies[:, 0] > 0)
    if rows.size == 0:
        return
    length, a, b = (copies[rows, k].astype(np.int64)[:, None] for k in range(3))
    offset = np.arange(int(length.max()))[None, :]
    mask = offset < length
    r = np.broadcast_to(rows[:, None], mask.shape)[mask]
    # Source and destination never overlap (b >= a + L), so reading before writing is exact.
    chunks[r, (b + offset)[mask]] = chunks[r, (a + offset)[mask]]


# --- chunk -----------------------------------------------------------------------------------


def chunk_tokens(
    tokens_dir: str | os.PathLike, context: int, spec: dict, out_dir: str | os.PathLike
) -> dict:
    """Cut the token stream into train/val chunks with repetition control; return the sidecar.

    Every random choice (split streams, chunk order, injected copies) follows ``spec["seed"]``.
    """
    if context < 2:
        raise ValueError(f"context must be at least 2, got {context}")
    rep, seed = spec["repetition"], spec["seed"]
    val_fraction = float(spec["val_fraction"])
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if rep["copy_fraction"]:
        copy_length_range(rep["copy_length"], context)  # fail before any work

    tmeta = read_meta(tokens_dir, "tokens")
    stream = open_tokens(tokens_dir)
    n_chunks = stream.shape[0] // context
    grid = stream[: n_chunks * context].reshape(n_chunks, context)
    n_val = _round_half_up(val_fraction * n_chunks)
    n_val = max(n_val, 1) if val_fraction > 0 else 0
    n_train = n_chunks - n_val
    if n_train < 1:
        raise ValueError(
            f"{tmeta['n_tokens']} tokens give {n_chunks} chunks of {context}: too few to split"
        )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    streams = np.random.SeedSequence(seed).spawn(len(SPLITS))
    ranges = {"train": (0, n_train), "val": (n_train, n_chunks)}
    splits, files = {}, {}
    for split, seq in zip(SPLITS, streams, strict=True):
        lo, hi = ranges[split]
        splits[split] = _write_split(
            grid[lo:hi], out, split, rep, tmeta["vocab_size"], seq, shuffle=split == "train"
        )
        files[split] = {"chunks": f"{split}.bin", "copies": f"{split}_copies.npy"}

    meta = {
        "format": CHUNKS_FORMAT,
        "context": context,
        "n_train": splits["train"]["n_after"],
        "n_val": splits["val"]["n_after"],
        "dtype": tmeta["dtype"],
        "vocab_size": tmeta["vocab_size"],
        "eot_id": tmeta["eot_id"],
        "seed": seed,
        "val_fraction": val_fraction,
        "repetition": rep,
        "n_chunks": n_chunks,
        "n_tail_tokens_dropped": int(stream.shape[0] - n_chunks * context),
        "train_order": "shuffled",
        "splits": splits,
        "files": files,
        "tokens": {
            k: tmeta[k]
            for k in ("source_sha256", "tokenizer_sha256", "tokens_sha256", "tokenizer_kind")
        },
    }
    write_checksums(out, meta)
    write_json(out / CHUNKS_JSON, meta)
    return meta


def _write_split(
    chunks: np.ndarray,
    out: Path,
    split: str,
    rep: dict,
    vocab: int,
    seq: np.random.SeedSequence,
    shuffle: bool,
) -> dict:
    """Select, shuffle, inject copies and write one split; return its measurements."""
    select_rng, order_rng, copy_rng = (np.random.default_rng(s) for s in seq.spawn(3))
    n_before, context = chunks.shape
    before = has_repeated_bigram(chunks, vocab)
    if rep["repeated_bigram_fraction"] is not None and n_before:
        rows = select_repeat_share(before, float(rep["repeated_bigram_fraction"]), select_rng)
    else:
        rows = np.arange(n_before)
    if shuffle:
        rows = order_rng.permutation(rows)
    copies = draw_copies(
        len(rows), context, rep["copy_fraction"] or 0.0, rep["copy_length"], copy_rng
    )

    after = np.zeros(len(rows), dtype=bool)
    block = max(1, (1 << 22) // context)
    with atomic_path(out / f"{split}.bin") as tmp:
        dest = _create_memmap(tmp, (len(rows), context), chunks.dtype)
        for start in range(0, len(rows), block):
            x = np.asarray(chunks[rows[start : start + block]])
            apply_copies(x, copies[start : start + block])
            after[start : start + block] = has_repeated_bigram(x, vocab)
            dest[start : start + block] = x
        if isinstance(dest, np.memmap):
            dest.flush()
        del dest
    with atomic_path(out / f"{split}_copies.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, copies)

    lengths = copies[copies[:, 0] > 0, 0]
    return {
        "n_before": int(n_before),
        "n_after": int(len(rows)),
        "repeat_share_before": _share(before),
        "repeat_share_after": _share(after),
        "copy_share": _share(copies[:, 0] > 0),
        "copy_length_min": int(lengths.min()) if lengths.size else None,
        "copy_length_max": int(lengths.max()) if lengths.size else None,
        "copy_length_mean": round(float(lengths.mean()), 4) if lengths.size else None,
    }


# --- readers used by training ----------------------------------------------------------------


def read_meta(directory: str | os.PathLike, kind: str | None = None) -> dict:
    """Read a sidecar: kind 'chunks' (chunks.json), 'tokens' (tokens.json), or None for whichever
    exists (chunks first). The returned dict gets a 'dir' key, the directory it was read from.
    A damaged one raises ``DamagedFile`` with its fix."""
    directory = Path(directory)
    names = {"chunks": [CHUNKS_JSON], "tokens": [TOKENS_JSON], None: [CHUNKS_JSON, TOKENS_JSON]}
    if kind not in names:
        raise ValueError(f"kind must be 'chunks', 'tokens' or None, got {kind!r}")
    for name in names[kind]:
        path = directory / name
        if path.is_file():
            if name == TOKENS_JSON:
                remedy = RETOKENIZE.format(folder=directory)
                meta = read_json_file(path, "tokens JSON", ("tokens_file", "dtype"), remedy)
            else:
                meta = read_chunks_meta(directory)
            meta["dir"] = str(directory)
            return meta
    raise FileNotFoundError(f"no {' or '.join(names[kind])} in {directory} (step not finished?)")


def open_tokens(tokens_dir: str | os.PathLike) -> np.ndarray:
    """The flat token stream of a tokenize output, read-only memmap [n_tokens], checked against
    the sha256 its sidecar records."""
    meta = read_meta(tokens_dir, "tokens")
    path = Path(tokens_dir) / meta["tokens_file"]
    remedy = RETOKENIZE.format(folder=Path(tokens_dir))
    stream = open_array(path, meta["dtype"], (meta["n_tokens"],), remedy)
    recorded = meta.get("tokens_sha256")
    if recorded is not None and file_sha256(path) != recorded:
        problem = "sha256 mismatch (truncated or overwritten)"
        raise DamagedFile("tokens file", path, problem, remedy)
    return stream


def open_copies(out_dir: str | os.PathLike, split: str) -> np.ndarray:
    """Injected copies of a split: int32 [n, 3] rows (L, a, b); L = 0 means none."""
    meta = read_meta(out_dir, "chunks")
    return np.load(Path(out_dir) / meta["files"][split]["copies"])


# --- small helpers ---------------------------------------------------------------------------


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def _share(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 6) if len(flags) else None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _create_memmap(path: str, shape: tuple[int, int], dtype) -> np.ndarray:
    dt = np.dtype(dtype).newbyteorder("<")
    if shape[0] == 0:
        Path(path).write_bytes(b"")
        return np.zeros(shape, dtype=dt)
    return np.memmap(path, dtype=dt, mode="w+", shape=shape)
