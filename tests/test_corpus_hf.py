"""The ``huggingface`` corpus source on local data, through the real ``datasets`` library.

The dev extra installs ``datasets``; nothing here is mocked, and the network is cut off for
every test (local data must never reach for the hub).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO, study_text
from ihsweep.config import ConfigError, complete
from ihsweep.data import corpus, natural
from ihsweep.data import tokenizer as tk
from ihsweep.data.chunks import open_chunks
from ihsweep.data.corpus import CorpusError
from ihsweep.steps import chunk as chunk_step
from ihsweep.steps import tokenize as tokenize_step
from ihsweep.steps.prepare import prepare

datasets = pytest.importorskip("datasets")  # in the dev extra: pip install -e ".[dev]"

WORDS = "the and of to in that shall he unto for his a lord they be is him not them it".split()
N_DOCS = 50


def _texts(n: int = N_DOCS, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"Doc {i}: " + " ".join(rng.choice(WORDS, rng.integers(8, 20))) for i in range(n)]


def _records(texts: list[str]) -> list[dict]:
    """Documents in a custom text column, ``body``, beside another column."""
    return [{"id": i, "body": t, "title": f"title {i}"} for i, t in enumerate(texts)]


def _corpus(**spec) -> dict:
    return complete("corpus", {"source": "huggingface", **spec})


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Local data must be read without the network: any connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:] or args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def local_data(tmp_path):
    """The same 50 documents as a jsonl file, a folder holding a parquet file, and a folder
    written by Dataset.save_to_disk; paths relative to tmp_path."""
    texts = _texts()
    records = _records(texts)
    with open(tmp_path / "docs.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    (tmp_path / "pq").mkdir()
    pd.DataFrame(records).to_parquet(tmp_path / "pq" / "train.parquet", index=False)
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"))
    return tmp_path, texts


# --- reading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 17, N_DOCS, 80])
def test_data_files_give_the_first_documents_of_the_chosen_column(local_data, n):
    base, texts = local_data
    spec = _corpus(name="json", data_files="docs.jsonl", text_field="body", max_documents=n)
    docs = list(corpus.load_documents(spec, base_dir=base))
    assert docs == texts[: min(n, N_DOCS)]


@pytest.mark.parametrize(
    "name", ["./pq", "{base}/pq", "saved"], ids=["folder", "absolute", "save_to_disk"]
)
def test_local_folders_read_through_datasets(local_data, name):
    base, texts = local_data
    spec = _corpus(name=name.format(base=base), text_field="body", max_documents=30)
    assert list(corpus.load_documents(spec, base_dir=base)) == texts[:30]
    whole = _corpus(name=name.format(base=base), text_field="body")
    assert list(corpus.load_documents(whole, base_dir=base)) == texts


def test_empty_texts_are_skipped_not_counted(tmp_path):
    records = [{"body": t} for t in ["one", "", None, "two", "three"]]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = _corpus(name="json", data_files=["*.jsonl"], text_field="body", max_documents=2)
    assert list(corpus.load_documents(spec, base_dir=tmp_path)) == ["one", "two"]


def test_folder_data_files_and_dataset_dict_splits(tmp_path):
    texts = _texts(20)
    (tmp_path / "f").mkdir()
    pd.DataFrame(_records(texts[:10])).to_parquet(tmp_path / "f" / "a.parquet")
    pd.DataFrame(_records(texts[10:])).to_parquet(tmp_path / "f" / "b.parquet")
    spec = _corpus(name="./f", data_files=["b.parquet"], text_field="body")  # folder-relative
    assert list(corpus.load_documents(spec, base_dir=tmp_path)) == texts[10:]
    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_list(_records(texts[:10])),
        validation=datasets.Dataset.from_list(_records(texts[10:])),
    )
    splits.save_to_disk(str(tmp_path / "dd"))
    spec = _corpus(name="./dd", split="validation", text_field="body", max_documents=4)
    assert list(corpus.load_documents(spec, base_dir=tmp_path)) == texts[10:14]


def test_text_builder_makes_each_line_a_document(tmp_path):
    texts = _texts(12)
    (tmp_path / "lines.txt").write_text("\n".join(texts) + "\n")
    spec = _corpus(name="text", data_files="lines.txt", max_documents=5)
    assert list(corpus.load_documents(spec, base_dir=tmp_path)) == texts[:5]


def test_fingerprint_follows_the_local_files(local_data, tmp_path_factory):
    base, _ = local_data
    for spec in (
        _corpus(name="json", data_files="docs.jsonl", text_field="body"),
        _corpus(name="./pq", text_field="body"),
    ):
        fp = corpus.corpus_fingerprint(spec, base)
        assert fp == corpus.corpus_fingerprint(dict(spec), base)
        moved = tmp_path_factory.mktemp("moved")
        (moved / "pq").mkdir()
        for name in ("docs.jsonl", "pq/train.parquet"):
            (moved / name).write_bytes((base / name).read_bytes())
        assert corpus.corpus_fingerprint(spec, moved) == fp  # location does not count
        with open(moved / "docs.jsonl", "a") as f:
            f.write(json.dumps({"body": "one more"}) + "\n")
        pd.DataFrame([{"body": "other"}]).to_parquet(moved / "pq" / "train.parquet")
        assert corpus.corpus_fingerprint(spec, moved) != fp


# --- the tokenize and chunk steps ------------------------------------------------------------


def test_tokenize_step_reads_a_local_dataset_into_the_shards(local_data):
    base, texts = local_data
    n = 40
    spec = {
        "family": "natural",
        "corpus": {
            "source": "huggingface",
            "name": "json",
            "data_files": ["docs.jsonl"],
            "text_field": "body",
            "max_documents": n,
        },
        "tokenizer": {"kind": "gpt2"},
        "val_fraction": 0.1,
    }
    tok_dir, chunk_dir = base / "results" / "hf-local", base / "results" / "hf-local" / "C16"
    argv = ["--spec", json.dumps(spec), "--out-dir", str(tok_dir), "--base-dir", str(base)]
    assert tokenize_step.main(argv) == 0
    meta = natural.read_meta(tok_dir, "tokens")
    assert meta["n_documents"] == n
    assert meta["n_text_bytes"] == sum(len(t.encode()) for t in texts[:n])
    assert meta["source"]["text_field"] == "body" and meta["source"]["max_documents"] == n
    stream = natural.open_tokens(tok_dir)
    tok = tk.load_tokenizer(meta)
    assert tok.decode(stream.tolist(), skip_special_tokens=False) == tk.EOT.join(texts[:n])
    expected = np.concatenate(list(tk.encode_documents(tok, texts[:n])))
    assert np.array_equal(stream, expected)

    argv = ["--source-dir", str(tok_dir), "--context", "16", "--spec", json.dumps(spec)]
    assert chunk_step.main([*argv, "--out-dir", str(chunk_dir)]) == 0
    cmeta = natural.read_meta(chunk_dir)
    n_chunks = meta["n_tokens"] // 16
    grid = np.asarray(stream[: n_chunks * 16]).reshape(n_chunks, 16)
    train, val = open_chunks(chunk_dir, "train"), open_chunks(chunk_dir, "val")
    assert len(train) + len(val) == n_chunks == cmeta["n_chunks"]
    assert np.array_equal(val, grid[n_chunks - len(val) :])  # no repetition: text unchanged
    rows = sorted(r.tobytes() for r in train)
    assert rows == sorted(r.tobytes() for r in grid[: n_chunks - len(val)])


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "json", "data_files": "docs.jsonl"},  # columns known on opening
        {"name": "./pq"},
        {"name": "saved"},
    ],
    ids=["jsonl", "parquet-folder", "save_to_disk"],
)
def test_missing_text_column_names_the_key_and_the_columns(local_data, spec):
    base, _ = local_data
    with pytest.raises(CorpusError) as raised:
        list(corpus.load_documents(_corpus(**spec, text_field="content"), base_dir=base))
    message = str(raised.value)
    assert message.startswith("corpus.text_field: no column 'content'")
    assert "body" in message and "title" in message and "set text_field" in message


def test_missing_text_column_found_at_the_first_record_of_an_untyped_stream(tmp_path):
    (tmp_path / "lines.txt").write_text("a\nb\n")
    spec = _corpus(name="text", data_files="lines.txt", text_field="body")
    with pytest.raises(CorpusError, match=r"corpus.text_field: no column 'body'.*columns: text"):
        list(corpus.load_documents(spec, base_dir=tmp_path))


def test_tokenize_step_error_names_the_dataset(local_data):
    base, _ = local_data
    spec = {
        "family": "natural",
        "corpus": {"source": "huggingface", "name": "./pq", "text_field": "content"},
    }
    out = base / "results" / "data" / "my-corpus"
    argv = ["--spec", json.dumps(spec), "--out-dir", str(out), "--base-dir", str(base)]
    with pytest.raises(CorpusError, match=r"^datasets\.my-corpus\.corpus\.text_field: "):
        tokenize_step.main(argv)


@pytest.mark.parametrize(
    "spec, key, fragment",
    [
        ({"name": "./nope"}, "name", "local dataset folder './nope' not found"),
        ({"name": "data/corpora/nope"}, "name", "not found"),
        ({"name": "json", "data_files": "nope.jsonl"}, "data_files", "'nope.jsonl' matches no"),
        ({"name": "json", "data_files": ["docs.jsonl", "*.csv"]}, "data_files[1]", "'*.csv'"),
        ({"name": "json"}, "data_files", "list them"),
        ({"name": "./pq", "data_files": ["x.parquet"]}, "data_files[0]", "folder './pq'"),
        ({"name": "docs.jsonl"}, "name", "name: json and data_files: ['docs.jsonl']"),
        ({"name": "saved", "data_files": "x"}, "data_files", "set data_files to null"),
        ({"name": "./pq", "revision": "main"}, "revision", "hub datasets only"),
    ],
)
def test_local_problems_are_found_before_reading(local_data, spec, key, fragment):
    base, _ = local_data
    with pytest.raises(CorpusError) as raised:
        corpus.check_huggingface(_corpus(**spec), base)
    assert raised.value.key == key
    assert str(raised.value).startswith(f"corpus.{key}: ") and fragment in str(raised.value)
    with pytest.raises(CorpusError):  # and reading stops at the same check
        corpus.load_documents(_corpus(**spec), base)


def _study(corpus_spec: dict) -> dict:
    config = yaml.safe_load(study_text("base"))
    config["datasets"]["kjv-copy"]["corpus"] = corpus_spec
    return config


def test_config_check_finds_a_missing_local_path_before_any_job(local_data, monkeypatch):
    base, _ = local_data
    monkeypatch.chdir(base)  # local paths are relative to the working directory
    cases = {
        "./corpora/mine": "datasets.kjv-copy.corpus.name: local dataset folder './corpora/mine'",
        "json": "datasets.kjv-copy.corpus.data_files[0]: 'corpora/*.jsonl' matches no file",
    }
    for name, fragment in cases.items():
        spec = {"source": "huggingface", "name": name, "text_field": "body"}
        if name == "json":
            spec["data_files"] = ["corpora/*.jsonl"]
        with pytest.raises(ConfigError) as raised:
            prepare(_study(spec))
        assert str(raised.value).startswith(fragment), raised.value
        assert "\n" not in str(raised.value)
    # The same study passes once the data are there.
    prepare(_study({"source": "huggingface", "name": "./pq", "text_field": "body"}))
    prepare(_study({"source": "huggingface", "name": "json", "data_files": "docs.jsonl"}))


def test_offline_hub_dataset_not_in_the_cache_is_a_clear_error(tmp_path):
    """With HF_HUB_OFFLINE set, a hub id is looked up in the cache only (a fresh process:
    ``datasets`` reads the variable on import)."""
    spec = {
        "family": "natural",
        "corpus": {"source": "huggingface", "name": "no-such-owner/no-such-dataset"},
    }
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),  # an empty cache
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / "results" / "data" / "hub-corpus"
    proc = subprocess.run(
        [sys.executable, "-m", "ihsweep.steps.tokenize", "--spec", json.dumps(spec)]
        + ["--out-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "datasets.hub-corpus.corpus.name: cannot open hub dataset" in last, proc.stderr
    assert "HF_HUB_OFFLINE is set" in last, proc.stderr
