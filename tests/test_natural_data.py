"""Natural-text data: corpora, tokenizers, the tokenize/chunk steps and the repetition controls.

Specs are completed by the schema (``ihsweep.config.complete``), as ``prepare`` does for a
study: the science functions fill in no defaults of their own.
"""

from __future__ import annotations

import json
import re
import shutil
import sys

import numpy as np
import pytest
from ihsweep.config import ConfigError, complete
from ihsweep.data import chunks, corpus, markov_chunks, markov_generator, natural
from ihsweep.data import tokenizer as tk
from ihsweep.data.chunks import open_chunks
from ihsweep.files.io import DamagedFile
from ihsweep.steps import chunk as chunk_step
from ihsweep.steps import tokenize as tokenize_step

WORDS = (
    "the and of to in that shall he unto for his a lord they be is him not them it with all "
    "thou thy was which my me said but ye their have will thee from as are when this out were"
).split()


def _paragraphs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(15, 40))).capitalize() + "." for _ in range(n)]


def _natural_spec(corpus_spec: dict, tokenizer_spec: dict, **extra) -> dict:
    """A natural dataset entry as given in a study file (partial: the schema fills the rest)."""
    return {"family": "natural", "corpus": corpus_spec, "tokenizer": tokenizer_spec, **extra}


def _dataset(corpus_spec: dict, tokenizer_spec: dict, **extra) -> dict:
    """The same entry completed by the schema, as the science functions take it."""
    return complete("dataset", _natural_spec(corpus_spec, tokenizer_spec, **extra))


def _corpus(spec: dict) -> dict:
    return complete("corpus", spec)


@pytest.fixture(scope="module")
def kjv_docs() -> list[str]:
    return list(corpus.load_documents(_corpus({"source": "kjv"})))


@pytest.fixture
def small_corpus(tmp_path):
    """A local corpus: one .txt file (blank-line separated) and one .jsonl file."""
    paras = _paragraphs(60)
    (tmp_path / "a.txt").write_text("\n\n".join(paras[:40]) + "\n")
    with open(tmp_path / "b.jsonl", "w") as f:
        for p in paras[40:]:
            f.write(json.dumps({"text": p, "id": 1}) + "\n")
    return tmp_path, paras


# --- corpora ---------------------------------------------------------------------------------


def test_kjv_is_the_whole_bible_as_chapters(kjv_docs):
    assert len(kjv_docs) == 1189
    size = sum(len(d.encode()) for d in kjv_docs)
    assert 4.0e6 < size < 4.3e6
    assert kjv_docs[0].startswith("In the beginning God created")
    assert kjv_docs[-1].endswith("Amen.")
    text = " ".join(kjv_docs)
    assert not re.search(r"\d+:\d+", text), "verse markers must be stripped"
    assert "  " not in text and text.isascii()
    assert text.count(" the ") > 50_000  # English prose, not a table of references


def test_files_corpus_reads_txt_paragraphs_and_jsonl_records(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("First para\nline two.\n\n  \n\nSecond para.\n\n\n")
    (tmp_path / "y.jsonl").write_text('{"body": "Doc one."}\n\n{"body": "Doc two."}\n')
    spec = _corpus({"source": "files", "paths": ["sub/*.txt", "y.jsonl"], "text_field": "body"})
    docs = list(corpus.load_documents(spec, base_dir=tmp_path))
    assert docs == ["First para\nline two.", "Second para.", "Doc one.", "Doc two."]


def test_missing_corpus_file_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        corpus.load_documents(_corpus({"source": "files", "paths": ["nope.txt"]}), tmp_path)
    with pytest.raises(FileNotFoundError, match=r"none\*\.jsonl"):
        corpus.load_documents(_corpus({"source": "files", "paths": ["none*.jsonl"]}), tmp_path)


def test_jsonl_without_text_field_names_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        list(corpus.load_documents(_corpus({"source": "files", "paths": ["bad.jsonl"]}), tmp_path))


def test_fingerprint_is_stable_and_tracks_content_not_location(small_corpus, tmp_path_factory):
    base, _ = small_corpus
    spec = _corpus({"source": "files", "paths": ["*.txt", "b.jsonl"]})
    fp = corpus.corpus_fingerprint(spec, base)
    assert fp == corpus.corpus_fingerprint(dict(spec), base)
    moved = tmp_path_factory.mktemp("moved")
    for name in ("a.txt", "b.jsonl"):
        shutil.copy(base / name, moved / name)
    assert corpus.corpus_fingerprint(spec, moved) == fp
    (moved / "a.txt").write_text("changed\n")
    assert corpus.corpus_fingerprint(spec, moved) != fp
    kjv = _corpus({"source": "kjv"})
    assert corpus.corpus_fingerprint(kjv) == corpus.corpus_fingerprint(dict(kjv))


def test_huggingface_without_datasets_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match=r"ihsweep\[hf\]"):
        corpus.load_documents(_corpus({"source": "huggingface", "name": "cc100", "config": "en"}))


def test_huggingface_streaming_takes_the_first_documents(small_corpus):
    pytest.importorskip("datasets")
    base, paras = small_corpus
    spec = _corpus(
        {
            "source": "huggingface",
            "name": "json",
            "data_files": str(base / "b.jsonl"),
            "split": "train",
            "max_documents": 3,
        }
    )
    assert list(corpus.load_documents(spec)) == paras[40:43]


# --- tokenizers ------------------------------------------------------------------------------


def test_gpt2_tokenizer_gives_the_known_ids(tmp_path):
    tok = tk.build_tokenizer({"kind": "gpt2"}, None, tmp_path / "tokenizer.json")
    assert tok.encode("Hello world", add_special_tokens=False).ids == [15496, 995]
    assert tok.encode(" the", add_special_tokens=False).ids == [262]
    assert tok.get_vocab_size() == 50257 and tk.eot_id(tok) == 50256
    stream = np.concatenate(list(tk.encode_documents(tok, ["Hello world", "Hello world"])))
    assert stream.tolist() == [15496, 995, 50256, 15496, 995]
    reloaded = tk.load_tokenizer(tmp_path)
    assert reloaded.encode("Hello world").ids == [15496, 995]


def test_trained_bpe_is_deterministic_and_round_trips(kjv_docs, tmp_path):
    docs = kjv_docs[:40]
    spec = {"kind": "bpe", "vocab_size": 600}
    one = tk.build_tokenizer(spec, iter(docs), tmp_path / "one.json")
    two = tk.build_tokenizer(spec, iter(docs), tmp_path / "two.json")
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()
    assert one.get_vocab() == two.get_vocab()
    assert one.get_vocab_size() == 600 and tk.eot_id(one) == 0
    for text in (docs[5], "Zebra 123 — naïve café ✓"):  # unseen bytes still encode
        ids = one.encode(text, add_special_tokens=False).ids
        assert one.decode(ids) == text
    # A trained vocabulary compresses its own corpus well below one token per byte.
    n_ids = sum(len(e.ids) for e in one.encode_batch(docs))
    assert n_ids < 0.5 * sum(len(d) for d in docs)


# --- tokenize + chunk steps ------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer_spec", [{"kind": "bpe", "vocab_size": 320}, {"kind": "gpt2"}])
def test_tokenize_and_chunk_cli_end_to_end(small_corpus, tokenizer_spec):
    base, paras = small_corpus
    spec = _natural_spec(
        {"source": "files", "paths": ["a.txt", "b.jsonl"]},
        tokenizer_spec,
        repetition={"copy_fraction": 0.5, "copy_length": [0.25, 0.5]},
        val_fraction=0.1,
        seed=3,
    )
    tok_dir, out_dir = base / "tok", base / "c16"
    # The steps take the entry as a study file gives it; they complete it from the schema.
    rc = tokenize_step.main(
        ["--spec", json.dumps(spec), "--out-dir", str(tok_dir), "--base-dir", str(base)]
    )
    assert rc == 0
    meta = natural.read_meta(tok_dir, "tokens")
    vocab = 320 if tokenizer_spec["kind"] == "bpe" else 50257
    assert meta["vocab_size"] == vocab and meta["dtype"] == "uint16"
    assert meta["eot_id"] == (0 if tokenizer_spec["kind"] == "bpe" else 50256)
    assert meta["n_documents"] == 60
    assert meta["n_text_bytes"] == sum(len(p.encode()) for p in paras)
    assert (tok_dir / "tokens.bin").stat().st_size == 2 * meta["n_tokens"]
    assert meta["source_sha256"] == corpus.corpus_fingerprint(_corpus(spec["corpus"]), base)
    stream = natural.open_tokens(tok_dir)
    assert int((stream == meta["eot_id"]).sum()) == 59  # separators between 60 documents
    tok = tk.load_tokenizer(meta)
    assert tok.decode(stream.tolist(), skip_special_tokens=False) == tk.EOT.join(paras)

    rc = chunk_step.main(
        ["--source-dir", str(tok_dir), "--context", "16", "--spec", json.dumps(spec)]
        + ["--out-dir", str(out_dir)]
    )
    assert rc == 0
    cmeta = natural.read_meta(out_dir)
    n_chunks = meta["n_tokens"] // 16
    n_val = int(np.floor(0.1 * n_chunks + 0.5))
    assert cmeta["n_chunks"] == n_chunks and cmeta["n_val"] == n_val
    assert cmeta["n_train"] == n_chunks - n_val
    assert cmeta["n_tail_tokens_dropped"] == meta["n_tokens"] - 16 * n_chunks
    assert cmeta["context"] == 16 and cmeta["seed"] == 3 and cmeta["vocab_size"] == vocab
    train, val = open_chunks(out_dir, "train"), open_chunks(out_dir, "val")
    assert train.shape == (cmeta["n_train"], 16) and val.shape == (n_val, 16)
    assert train.dtype == np.uint16 and val.dtype == np.uint16
    assert (out_dir / "train.bin").stat().st_size == train.size * 2
    # Held-out chunks are the contiguous end of the stream; copies aside, the text is unchanged.
    grid = np.asarray(stream[: n_chunks * 16]).reshape(n_chunks, 16)
    val_copies = natural.open_copies(out_dir, "val")
    plain = val_copies[:, 0] == 0
    assert np.array_equal(val[plain], grid[n_chunks - n_val :][plain])
    # Training chunks are the remaining chunks, shuffled.
    position = {r.tobytes(): i for i, r in enumerate(grid[: n_chunks - n_val])}
    train_copies = natural.open_copies(out_dir, "train")
    order = [position[r.tobytes()] for r in train[train_copies[:, 0] == 0]]
    assert len(order) > 10 and order != sorted(order)
    for split in ("train", "val"):
        s = cmeta["splits"][split]
        assert s["n_after"] == s["n_before"] == cmeta[f"n_{split}"]
        assert abs(s["copy_share"] - 0.5) <= 1 / s["n_after"]
    assert not [p.name for p in out_dir.iterdir() if p.name.startswith(".")]  # no temp files


def test_chunk_is_deterministic_for_a_seed(small_corpus):
    base, _ = small_corpus
    spec = _dataset(
        {"source": "files", "paths": ["a.txt"]},
        {"kind": "bpe", "vocab_size": 300},
        repetition={
            "repeated_bigram_fraction": 0.5,
            "copy_fraction": 0.3,
            "copy_length": [0.2, 0.4],
        },
        val_fraction=0.2,
    )
    natural.tokenize_corpus(spec, base / "tok", base)
    outs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        natural.chunk_tokens(base / "tok", 24, {**spec, "seed": seed}, base / name)
        outs[name] = [
            (base / name / f).read_bytes()
            for f in ("train.bin", "train_copies.npy", "val.bin", "chunks.json")
        ]
    assert outs["a"] == outs["b"]
    assert outs["a"] != outs["c"]


def _train_order(out_dir, grid: np.ndarray) -> list[int]:
    """The stream position of each written training chunk (no copies injected)."""
    position = {r.tobytes(): i for i, r in enumerate(grid)}
    return [position[r.tobytes()] for r in open_chunks(out_dir, "train")]


def test_chunk_follows_the_dataset_seed(small_corpus):
    # The dataset's `seed` is documented as the seed of the chunk order; the chunk step used to
    # ignore it and always shuffle with seed 0.
    base, _ = small_corpus
    entry = _natural_spec(
        {"source": "files", "paths": ["a.txt", "b.jsonl"]},
        {"kind": "bpe", "vocab_size": 300},
        val_fraction=0.2,
    )
    natural.tokenize_corpus(complete("dataset", entry), base / "tok", base)
    stream = natural.open_tokens(base / "tok")
    files = ("train.bin", "train_copies.npy", "val.bin", "val_copies.npy", "chunks.json")
    outs, orders = {}, {}
    for name, seed in (("s0", 0), ("s1", 1), ("s1-again", 1)):
        # Through the chunk step, as the rule runs it: the seed comes from the entry alone.
        argv = ["--spec", json.dumps({**entry, "seed": seed}), "--source-dir", str(base / "tok")]
        assert chunk_step.main(argv + ["--context", "16", "--out-dir", str(base / name)]) == 0
        meta = natural.read_meta(base / name, "chunks")
        assert meta["seed"] == seed
        outs[name] = [(base / name / f).read_bytes() for f in files]
        n, n_train = meta["n_chunks"], meta["n_train"]
        grid = np.asarray(stream[: n * 16]).reshape(n, 16)
        orders[name] = _train_order(base / name, grid[:n_train])
        assert sorted(orders[name]) == list(range(n_train))  # every training chunk, once
    assert n_train > 20
    assert orders["s0"] != orders["s1"]  # another seed, another training order
    assert outs["s1"] == outs["s1-again"]  # the same seed, the same files
    assert outs["s0"][2] == outs["s1"][2]  # val keeps text order whatever the seed
    # The function and the step agree: chunk_tokens reads the seed from the completed spec.
    natural.chunk_tokens(base / "tok", 16, complete("dataset", {**entry, "seed": 1}), base / "fn")
    assert [(base / "fn" / f).read_bytes() for f in files] == outs["s1"]


def test_open_chunks_rejects_a_file_that_disagrees_with_its_sidecar(small_corpus):
    base, _ = small_corpus
    spec = _dataset({"source": "files", "paths": ["a.txt"]}, {"kind": "bpe", "vocab_size": 300})
    natural.tokenize_corpus(spec, base / "tok", base)
    natural.chunk_tokens(base / "tok", 8, spec, base / "out")
    with open(base / "out" / "train.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DamagedFile, match="train.bin"):
        open_chunks(base / "out", "train")


# --- token dtype -----------------------------------------------------------------------------


def test_token_dtype_holds_every_id_up_to_a_vocabulary_of_65536():
    # One function for every family: the tokenizer's copy used to switch to uint32 at exactly
    # 65,536 while the Markov one stayed uint16, so the two families disagreed there.
    assert chunks.token_dtype(2) == np.uint16
    assert chunks.token_dtype(65_535) == np.uint16
    assert chunks.token_dtype(65_536) == np.uint16
    assert chunks.token_dtype(65_537) == np.uint32
    assert chunks.token_dtype(50_257) == np.uint16  # GPT-2
    ids = np.array([0, 65_535], dtype=np.int64)  # the largest id of V = 65,536
    assert ids.astype(chunks.token_dtype(65_536)).tolist() == [0, 65_535]
    # The natural tokenize path and both Markov paths use that very function.
    assert natural.token_dtype is chunks.token_dtype
    assert markov_generator.token_dtype is chunks.token_dtype
    assert markov_chunks.token_dtype is chunks.token_dtype
    assert not hasattr(tk, "token_dtype")


def test_tokenize_writes_uint16_at_a_vocabulary_of_65536(tmp_path, monkeypatch):
    # A stand-in tokenizer of exactly 65,536 ids (training a real one would take minutes).
    class Tokenizer:
        def get_vocab_size(self):
            return 65_536

    def build_tokenizer(spec, docs, out_path):
        out_path.write_text("{}")
        return Tokenizer()

    monkeypatch.setattr(tk, "build_tokenizer", build_tokenizer)
    monkeypatch.setattr(tk, "eot_id", lambda tok: 0)
    monkeypatch.setattr(tk, "encode_documents", lambda tok, docs: iter([np.array([65_535, 0, 7])]))
    (tmp_path / "a.txt").write_text("one\n\ntwo\n")
    spec = _dataset({"source": "files", "paths": ["a.txt"]}, {"kind": "bpe", "vocab_size": 300})
    meta = natural.tokenize_corpus(spec, tmp_path / "tok", tmp_path)
    assert meta["vocab_size"] == 65_536 and meta["dtype"] == "uint16"
    assert (tmp_path / "tok" / "tokens.bin").stat().st_size == 2 * 3
    assert natural.open_tokens(tmp_path / "tok").tolist() == [65_535, 0, 7]


# --- repeated-bigram detection and selection -------------------------------------------------


def _has_repeat_brute_force(row) -> bool:
    seen = set()
    for pair in zip(row[:-1], row[1:], strict=True):
        if pair in seen:
            return True
        seen.add(pair)
    return False


def test_repeated_bigram_detection_matches_a_brute_force_loop():
    rng = np.random.default_rng(0)
    chunks = rng.integers(0, 9, size=(400, 10))
    expected = np.array([_has_repeat_brute_force(r.tolist()) for r in chunks])
    assert 0.2 < expected.mean() < 0.8  # both kinds occur, so the test can tell them apart
    assert np.array_equal(natural.has_repeated_bigram(chunks, 9), expected)
    hand = np.array([[1, 2, 3, 1, 2], [1, 2, 2, 1, 3], [5, 5, 5, 0, 1], [1, 2, 1, 2, 1]])
    assert natural.has_repeated_bigram(hand, 6).tolist() == [True, False, True, True]


@pytest.mark.parametrize("p", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_selection_hits_the_requested_share_with_as_many_chunks_as_possible(p):
    rng = np.random.default_rng(1)
    has = rng.random(1000) < 0.3
    kept = natural.select_repeat_share(has, p, np.random.default_rng(2))
    assert np.array_equal(kept, np.unique(kept))
    k, share = len(kept), has[kept].mean()
    assert abs(share - p) <= 0.5 / k + 1e-12
    n1, n0 = int(has.sum()), int((~has).sum())
    feasible = [
        m for m in range(1, 1001) if np.floor(p * m + 0.5) <= n1 and m - np.floor(p * m + 0.5) <= n0
    ]
    assert k == max(feasible)


def test_selection_that_cannot_be_met_raises():
    with pytest.raises(ValueError, match="out of reach"):
        natural.select_repeat_share(np.zeros(50, bool), 0.5, np.random.default_rng(0))


def test_chunk_reports_the_measured_repeat_shares(small_corpus):
    base, _ = small_corpus
    spec = _dataset(
        {"source": "files", "paths": ["a.txt", "b.jsonl"]},
        {"kind": "bpe", "vocab_size": 300},
        repetition={"repeated_bigram_fraction": 0.25},
        val_fraction=0.2,
    )
    natural.tokenize_corpus(spec, base / "tok", base)
    assert spec["seed"] == 0  # the schema's default
    meta = natural.chunk_tokens(base / "tok", 24, spec, base / "out")
    assert meta["seed"] == 0
    stream = natural.open_tokens(base / "tok")
    n = meta["n_chunks"]
    grid = np.asarray(stream[: n * 24]).reshape(n, 24)
    n_train_before = n - meta["splits"]["val"]["n_before"]
    for split, rows in (("train", grid[:n_train_before]), ("val", grid[n_train_before:])):
        s = meta["splits"][split]
        written = open_chunks(base / "out", split)
        measured = natural.has_repeated_bigram(written, meta["vocab_size"]).mean()
        assert s["repeat_share_after"] == pytest.approx(measured, abs=1e-6)
        assert abs(measured - 0.25) <= 0.5 / len(written) + 1e-12
        assert s["repeat_share_before"] == pytest.approx(
            natural.has_repeated_bigram(rows, meta["vocab_size"]).mean(), abs=1e-6
        )
        assert s["copy_share"] == 0.0
    assert meta["splits"]["train"]["repeat_share_before"] > 0.4  # so reaching 0.25 drops chunks


# --- copy injection --------------------------------------------------------------------------


def test_copy_injection_places_varied_copies_in_the_requested_share():
    rng = np.random.default_rng(0)
    n, c = 2000, 64
    original = rng.integers(0, 50_000, size=(n, c)).astype(np.uint16)
    x = original.copy()
    copies = natural.draw_copies(n, c, 0.3, [0.25, 0.5], np.random.default_rng(5))
    natural.apply_copies(x, copies)
    selected = copies[:, 0] > 0
    assert selected.sum() == 600
    assert np.array_equal(x[~selected], original[~selected])
    assert (copies[~selected] == [0, -1, -1]).all()
    for row, (length, a, b) in zip(x[selected], copies[selected], strict=True):
        assert 16 <= length <= 32 and b >= a + length and b + length <= c and a >= 0
        assert np.array_equal(row[b : b + length], row[a : a + length])
    lengths = copies[selected, 0]
    assert lengths.min() == 16 and lengths.max() == 32  # the full range, not one fixed length
    assert len(np.unique(copies[selected, 2] - copies[selected, 1])) > 10  # varied offsets


def test_copy_positions_are_uniform_over_valid_pairs():
    copies = natural.draw_copies(15_000, 10, 1.0, [0.3, 0.3], np.random.default_rng(0))
    assert (copies[:, 0] == 3).all()
    pairs, counts = np.unique(copies[:, 1:], axis=0, return_counts=True)
    expected = {(a, b) for a in range(5) for b in range(a + 3, 8)}
    assert {tuple(p) for p in pairs.tolist()} == expected  # 15 valid pairs, all drawn
    assert counts.min() > 800 and counts.max() < 1200  # ~1000 each


def test_copy_length_that_cannot_fit_is_rejected():
    with pytest.raises(ValueError, match=r"hi = 0.6 is too long for C = 64.*make hi <= 0.5"):
        natural.copy_length_range([0.3, 0.6], 64)
    with pytest.raises(ValueError, match="C=64"):
        natural.copy_length_range([0.5, 0.25], 64)  # lo > hi
    assert natural.copy_length_range([0.25, 0.5], 64) == (16, 32)


def test_repetition_spec_is_checked_and_completed_by_the_schema():
    # copy_length has a default now, so a bare copy_fraction is complete; unknown keys and
    # out-of-range shares are the schema's to reject.
    rep = complete("repetition", {"copy_fraction": 0.5})
    assert rep == {
        "copy_fraction": 0.5,
        "copy_length": [0.25, 0.5],
        "repeated_bigram_fraction": None,
    }
    typo = r"copy_fractoin: unknown key.*did you mean 'copy_fraction'"
    with pytest.raises(ConfigError, match=typo):
        complete("repetition", {"copy_fractoin": 0.5})
    with pytest.raises(ConfigError, match="repeated_bigram_fraction"):
        complete("repetition", {"repeated_bigram_fraction": 1.5})
    with pytest.raises(ConfigError, match="copy_length"):
        complete("repetition", {"copy_length": [0.25]})
