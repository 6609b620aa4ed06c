"""The on-disk format every dataset family shares: chunks of C tokens, ready to train on.

A chunked dataset folder holds ``train.bin`` and ``val.bin``, raw little-endian arrays of shape
[n_chunks, C] (uint16 when the vocabulary fits, else uint32), and ``chunks.json`` with at least
``context``, ``vocab_size``, ``dtype``, ``n_train``, ``n_val`` and ``files`` ({split: {"chunks":
file name}}); each family adds its own measured statistics. The sidecar is written last: a
folder without it is incomplete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

CHUNKS_JSON = "chunks.json"
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id 0 .. vocab_size - 1 (uint16 up to a
    vocabulary of exactly 65,536), for every family's token files."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def read_chunks_meta(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / CHUNKS_JSON
    if not path.is_file():
        raise FileNotFoundError(f"no {CHUNKS_JSON} in {data_dir} (dataset step not finished?)")
    return json.loads(path.read_text())


def open_chunks(data_dir: str | os.PathLike, split: str) -> np.ndarray:
    """Chunks of a split ('train' or 'val'), read-only memmap [n, C]."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    meta = read_chunks_meta(data_dir)
    shape = (meta[f"n_{split}"], meta["context"])
    return open_array(Path(data_dir) / meta["files"][split]["chunks"], meta["dtype"], shape)


def open_array(path: Path, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only memmap, checked against the size its sidecar implies."""
    dt = np.dtype(dtype).newbyteorder("<")
    expected = int(np.prod(shape)) * dt.itemsize
    size = path.stat().st_size
    if size != expected:
        raise ValueError(f"{path} has {size} bytes, its sidecar implies {expected} for {shape}")
    if expected == 0:
        return np.zeros(shape, dtype=dt)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dt, mode="r", shape=shape)


def write_chunks(root: str | os.PathLike, splits: dict, vocab_size: int) -> Path:
    """A chunked dataset folder in this format from ``{split: token array [n, C]}`` and nothing
    else (no family statistics): for tests and benchmarks that bring their own tokens."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab_size)
    for split, chunks in splits.items():
        chunks.astype(dtype.newbyteorder("<")).tofile(root / f"{split}.bin")
    some = next(iter(splits.values()))
    meta = {"context": some.shape[1], "vocab_size": vocab_size, "dtype": dtype.name,
            **{f"n_{split}": len(chunks) for split, chunks in splits.items()},
            "files": {split: {"chunks": f"{split}.bin"} for split in splits}}  # fmt: skip
    (root / CHUNKS_JSON).write_text(json.dumps(meta))  # last: it marks the folder complete
    return root
