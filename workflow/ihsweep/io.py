"""Atomic file writes: a file under its final name is always complete.

Every writer in the package goes through ``atomic_path``: it writes a temporary file in the same
folder and renames it into place only on success, so a killed job never leaves a half-written
file that a rerun (or Snakemake) would take as finished.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path beside ``path``; move it onto ``path`` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; outputs should be readable like any other file
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj: dict) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, key: str | None = None) -> None:
    """Write a table; ``key`` (if given) is stored in the file's schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    if key is not None:
        table = table.replace_schema_metadata({**table.schema.metadata, b"key": key.encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_key(path: str | os.PathLike) -> str | None:
    import pyarrow.parquet as pq

    key = (pq.read_schema(path).metadata or {}).get(b"key")
    return key.decode() if key is not None else None


def holds_key(path: str | os.PathLike, key: str) -> bool:
    """Whether ``path`` is a table written with ``key`` (``write_parquet``): a cache hit."""
    return Path(path).is_file() and read_parquet_key(path) == key


def set_flags(*names: str) -> list[str]:
    """The environment variables among ``names`` set to a true value (1, on, yes, true), as
    the Hugging Face libraries read their offline switches."""
    return [n for n in names if os.environ.get(n, "").upper() in ("1", "ON", "YES", "TRUE")]


def json_arg(text: str) -> dict:
    """An argparse type: a JSON object, given inline or as @path to a file holding it."""
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("the spec must be a JSON object")
    return value
