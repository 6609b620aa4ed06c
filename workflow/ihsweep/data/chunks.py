"""The on-disk format every dataset family shares: chunks of C tokens, ready to train on.

A chunked dataset folder holds ``train.bin`` and ``val.bin``, raw little-endian arrays of shape
[n_chunks, C] (uint16 when the vocabulary fits, else uint32), and ``chunks.json`` with at least
``context``, ``vocab_size``, ``dtype``, ``n_train``, ``n_val`` and ``files`` ({split: {"chunks":
file name}}); each family adds its own measured statistics. The sidecar is written last: a
folder without it is incomplete.

Just before it, ``checksums.json`` records each split file's sha256 ({file name: sha256};
``write_checksums``). It is no declared output of the chunk rule, so adding it to an existing
folder does not make Snakemake replan the runs trained on it. ``open_chunks`` checks a split
against it before training reads one token (``verify_split``): a file truncated or overwritten,
even with zeros, fails with one line that names it and the fix. A folder made before the
checksums is trusted on first use: its ids are checked against the vocabulary, and its
checksums are written, with one line saying so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ihsweep.files.io import DamagedFile, file_sha256, read_json_file, write_json

CHUNKS_JSON = "chunks.json"
CHECKSUMS_JSON = "checksums.json"
SPLITS = ("train", "val")
CHUNKS_KEYS = ("context", "vocab_size", "dtype", "n_train", "n_val", "files")
# The chunk step rewrites a dataset folder bit for bit; Snakemake rebuilds it only as a target
# (or below an out-of-date output), and then reruns the runs trained on it (their input
# chunks.json is newer): a finished run resumes at its end and only rewrites run.json. The
# command that failed runs again as it was: a forced job's output is gone, and Snakemake
# remakes a missing file below present outputs only when asked for it.
REGENERATE = (
    "remove the folder {folder} and run `snakemake {folder}/chunks.json`, then the snakemake"
    " command that failed again: the chunk step rewrites the folder with the same bits, and the"
    " runs trained on it rerun (a finished run resumes at its end and only rewrites run.json)"
)


def damaged_data(kind: str, path: Path, problem: str) -> DamagedFile:
    """A damaged file of a chunk folder: the fix is to regenerate the folder."""
    return DamagedFile(kind, path, problem, REGENERATE.format(folder=Path(path).parent))


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id 0 .. vocab_size - 1 (uint16 up to a
    vocabulary of exactly 65,536), for every family's token files."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def read_chunks_meta(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / CHUNKS_JSON
    if not path.is_file():
        raise FileNotFoundError(f"no {CHUNKS_JSON} in {data_dir} (dataset step not finished?)")
    return read_chunks_json(path)


def read_chunks_json(path: Path, required: tuple[str, ...] = CHUNKS_KEYS) -> dict:
    """A chunk folder's ``chunks.json``, checked (``DamagedFile`` with the folder's fix)."""
    remedy = REGENERATE.format(folder=Path(path).parent)
    return read_json_file(path, "chunks JSON", required, remedy)


def open_chunks(data_dir: str | os.PathLike, split: str, verify: bool = True) -> np.ndarray:
    """Chunks of a split ('train' or 'val'), read-only memmap [n, C]; with ``verify``, checked
    against the folder's checksums first (``verify_split``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    meta = read_chunks_meta(data_dir)
    shape = (meta[f"n_{split}"], meta["context"])
    path = Path(data_dir) / meta["files"][split]["chunks"]
    array = open_array(path, meta["dtype"], shape)
    if verify:
        verify_split(Path(data_dir), meta, split, array)
    return array


def verify_split(data_dir: Path, meta: dict, split: str, array: np.ndarray) -> None:
    """Raise ``DamagedFile`` unless the split's file has the sha256 its folder's checksums
    record. A folder without checksums (made before them) gets them now, once its ids are
    checked against the vocabulary: trust on first use."""
    name = meta["files"][split]["chunks"]
    path = data_dir / name
    recorded = read_checksums(data_dir)
    if recorded is None:
        write_checksums(data_dir, meta)
        print(f"{data_dir}/{CHECKSUMS_JSON}: none yet; written from the files as they are "
              "(ids checked against the vocabulary)", flush=True)  # fmt: skip
        return
    if name not in recorded:
        raise damaged_data("dataset checksums", data_dir / CHECKSUMS_JSON, f"no entry for {name}")
    if file_sha256(path) != recorded[name]:
        raise damaged_data("dataset shard", path, "sha256 mismatch (truncated or overwritten)")


def read_checksums(data_dir: Path) -> dict | None:
    """The folder's ``checksums.json``, None when it has none."""
    path = Path(data_dir) / CHECKSUMS_JSON
    if not path.exists():
        return None
    remedy = REGENERATE.format(folder=Path(data_dir))
    return read_json_file(path, "dataset checksums", remedy=remedy)


def write_checksums(data_dir: str | os.PathLike, meta: dict) -> None:
    """Record each split file's sha256 in ``checksums.json``: every writer of a chunk folder
    calls it after the split files and before ``chunks.json``. The ids are checked against the
    vocabulary first, so that a file damaged before its checksums (0xFF bytes) is refused."""
    data_dir = Path(data_dir)
    sums = {}
    for split in SPLITS:
        if split not in meta["files"]:
            continue
        name = meta["files"][split]["chunks"]
        shape = (meta[f"n_{split}"], meta["context"])
        array = open_array(data_dir / name, meta["dtype"], shape)
        if array.size and int(array.max()) >= meta["vocab_size"]:
            problem = f"token id {int(array.max())} >= the vocabulary {meta['vocab_size']}"
            raise damaged_data("dataset shard", data_dir / name, problem)
        sums[name] = file_sha256(data_dir / name)
    write_json(data_dir / CHECKSUMS_JSON, sums)


def open_array(
    path: Path, dtype: str, shape: tuple[int, ...], remedy: str | None = None
) -> np.ndarray:
    """A read-only memmap, checked against the size its sidecar implies (``DamagedFile`` with
    ``remedy``, by default a chunk folder's fix, when it is not that)."""
    dt = np.dtype(dtype).newbyteorder("<")
    expected = int(np.prod(shape)) * dt.itemsize
    size = path.stat().st_size
    if size != expected:
        problem = f"{size} bytes, its sidecar implies {expected} for {shape}"
        remedy = remedy or REGENERATE.format(folder=Path(path).parent)
        raise DamagedFile("dataset shard", path, problem, remedy)
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
    write_checksums(root, meta)
    (root / CHUNKS_JSON).write_text(json.dumps(meta))  # last: it marks the folder complete
    return root
