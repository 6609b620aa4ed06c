"""Atomic file writes, and checked reads: a file under its final name is complete, and a file
damaged after it was written is named, never tripped over.

Every writer in the package goes through ``atomic_path``: it writes a temporary file in the same
folder and renames it into place only on success, so a killed job never leaves a half-written
file that a rerun (or Snakemake) would take as finished. A disk that fills, a copy that stops
short or a stray write can still damage a file after the fact: every reader of a file another
step wrote goes through ``read_table`` or ``read_json_file`` (or checks a recorded sha256), which
raise ``DamagedFile`` with one line, ``damaged <kind> <path>: <problem>; <fix>``, instead of a
library's traceback; the steps print that line and exit 1 (``ihsweep.steps._args``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

# The fix of a file that its own step recomputes. Snakemake rebuilds a missing file only when it
# is needed: as a target, or below an output that is out of date; so the fix names it as the
# target, and the second run brings what was made from it up to date.
RERUN = "remove it and run `snakemake {path}`, then `snakemake`: the {step} step rewrites it"


class DamagedFile(Exception):
    """A file that cannot be trusted: ``path`` (the file at fault), ``problem`` (what is wrong),
    ``remedy`` (the fix), ``step`` (whose step it was, for a checkpoint or resume state) and
    ``files`` (every file of that checkpoint or state, which a rewrite replaces). Its message
    is the one line a step prints."""

    def __init__(self, kind: str, path: Path, problem: str, remedy: str,
                 step: int | None = None, files: tuple[Path, ...] = ()):  # fmt: skip
        self.kind, self.path, self.problem, self.step = kind, Path(path), problem, step
        self.remedy = remedy
        self.files = tuple(Path(f) for f in files)
        super().__init__(f"damaged {kind} {path}: {problem}; {remedy}")


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_table(
    path: str | os.PathLike, kind: str, columns: tuple[str, ...] = (), remedy: str = ""
) -> pd.DataFrame:
    """A Parquet table that parses and has ``columns``, else ``DamagedFile`` (a missing file is
    FileNotFoundError: Snakemake's business, not damage)."""
    import pyarrow as pa

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {kind} {path}")
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise DamagedFile(kind, path, f"not a readable Parquet table ({_one_line(err)})",
                          remedy) from err  # fmt: skip
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DamagedFile(kind, path, f"missing columns {', '.join(missing)}", remedy)
    return df


def read_probe_table(path: str | os.PathLike, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A run's heads or model table (``ihsweep.probing.run``), checked: the steps downstream of
    the probe step read it through here."""
    return read_table(path, "probe table", columns, RERUN.format(path=path, step="probe"))


def read_json_file(
    path: str | os.PathLike, kind: str, required: tuple[str, ...] = (), remedy: str = ""
) -> dict:
    """A JSON object with the keys ``required``, else ``DamagedFile`` (a missing file is
    FileNotFoundError)."""
    path = Path(path)
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DamagedFile(kind, path, f"unreadable JSON ({_one_line(err)})", remedy) from err
    if not isinstance(value, dict):
        raise DamagedFile(kind, path, "not a JSON object", remedy)
    missing = [k for k in required if k not in value]
    if missing:
        raise DamagedFile(kind, path, f"missing keys {', '.join(missing)}", remedy)
    return value


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 160 else text[:157] + "..."


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
    """Whether ``path`` is a table written with ``key`` (``write_parquet``): a cache hit. An
    unreadable file holds nothing."""
    import pyarrow as pa

    try:
        return Path(path).is_file() and read_parquet_key(path) == key
    except (OSError, ValueError, pa.ArrowException):
        return False


def read_cached(path: str | os.PathLike, key: str) -> pd.DataFrame | None:
    """The table a cache file holds for ``key``; None when there is none or it was made for
    another key. A damaged one is None too, named in one line: a cache is recomputed, never
    trusted, and its damage is no error."""
    import pyarrow as pa

    path = Path(path)
    if not path.is_file():
        return None
    try:
        if read_parquet_key(path) != key:
            return None
        return pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as err:
        problem = f"not a readable Parquet table ({_one_line(err)})"
        print(f"damaged probe cache {path}: {problem}; recomputing it", flush=True)
        return None


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
