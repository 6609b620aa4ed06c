"""Markov datasets: draw train and validation sequences from a chain, in the shared chunk format.

``make_chunks(spec, chain_dir, context, out_dir)`` (the command is ``python -m
ihsweep.steps.chunk``) loads the chain folder written by :mod:`ihsweep.data.chains`, draws
``n_train_sequences`` and ``n_val_sequences`` length-C sequences with
:func:`ihsweep.data.markov_generator.generate` (each split its own seed, derived from the
dataset seed and C, so splits and context sizes never share a stream), and writes
``train.bin``, ``val.bin``, ``checksums.json`` and, last, ``chunks.json``
(:mod:`ihsweep.data.chunks`) with the requested and measured statistics (:data:`CHUNKS_KEYS`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ihsweep.data import markov, markov_generator, markov_measure
from ihsweep.data.chains import load_chain
from ihsweep.data.chunks import CHUNKS_JSON, SPLITS, token_dtype, write_checksums
from ihsweep.files.io import atomic_path, write_json

CHUNKS_FORMAT = "ihsweep.markov.chunks/1"

CHUNKS_KEYS = {
    "format": "format tag, " + CHUNKS_FORMAT,
    "context": "C, tokens per sequence",
    "vocab_size": "V, number of chain states (token ids)",
    "dtype": "numpy dtype name of train.bin/val.bin",
    "n_train": "rows of train.bin",
    "n_val": "rows of val.bin",
    "files": "file names per split: {'train': {'chunks'}, 'val': {'chunks'}}",
    "seed": "the dataset seed",
    "split_seeds": "per split: the generator seed, derived from (seed, C)",
    "requested": "frequency, reliability, calibration and the context-start probability e",
    "measured": "per split: f, r, contexts, copies, second_half_positions, first_half_repeats, "
    "entropy_rate_bits (markov_measure.measure)",
    "entropy_rate_estimator": "how entropy_rate_bits is estimated",
    "chain": "provenance of the chain: kind, vocab_size, spec, entropy_rate_bits",
    "seconds": "wall time per split (generate and measure)",
}


def split_seeds(seed: int, context: int) -> dict[str, int]:
    """One generator seed per split, distinct across splits and context sizes."""
    states = np.random.SeedSequence([seed, context]).generate_state(len(SPLITS))
    return {split: int(s) for split, s in zip(SPLITS, states, strict=True)}


def make_chunks(spec: dict, chain_dir, context: int, out_dir) -> dict:
    """Draw both splits from the chain in chain_dir, write them to out_dir; return the sidecar."""
    f, r = float(spec["frequency"]), float(spec["reliability"])
    calibration = spec["calibration"]
    e = markov.context_start_probability(f, r, context, calibration)  # fail before any work
    P, pi, chain_meta = load_chain(chain_dir)
    V = int(P.shape[0])
    seed = int(spec["seed"])
    seeds = split_seeds(seed, context)
    counts = {"train": int(spec["n_train_sequences"]), "val": int(spec["n_val_sequences"])}

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(V).newbyteorder("<")
    # The alias tables are built once for both splits.
    prepared = markov_generator.PreparedChain(P, pi)
    measured, seconds, files = {}, {}, {}
    for split in SPLITS:
        t0 = time.perf_counter()
        x = prepared.generate(counts[split], context, f, r, seeds[split], calibration)
        stats = markov_measure.measure(x, V)
        stats.pop("unigram_counts")
        stats.pop("entropy_rate_estimator")
        measured[split] = stats
        with atomic_path(out / f"{split}.bin") as tmp:
            np.ascontiguousarray(x, dtype=dtype).tofile(tmp)
        files[split] = {"chunks": f"{split}.bin"}
        seconds[split] = round(time.perf_counter() - t0, 3)

    meta = {
        "format": CHUNKS_FORMAT,
        "context": context,
        "vocab_size": V,
        "dtype": np.dtype(token_dtype(V)).name,
        "n_train": counts["train"],
        "n_val": counts["val"],
        "files": files,
        "seed": seed,
        "split_seeds": seeds,
        "requested": {"frequency": f, "reliability": r, "calibration": calibration, "e": e},
        "measured": measured,
        "entropy_rate_estimator": markov_measure.ENTROPY_ESTIMATOR,
        "chain": {
            "kind": chain_meta.get("kind"),
            "vocab_size": chain_meta.get("vocab_size"),
            "spec": chain_meta.get("spec"),
            "entropy_rate_bits": chain_meta.get("measured", {}).get("entropy_rate_bits"),
        },
        "seconds": seconds,
    }
    write_checksums(out, meta)
    write_json(out / CHUNKS_JSON, meta)
    return meta
