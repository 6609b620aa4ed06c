"""Every file a step reads is checked before use (ihsweep.files.io.read_table / read_json_file, the
chunk folders' checksums, the probe cache's key): each kind of file, truncated to half or
overwritten with random bytes or zeros of the same length, makes the step that reads it print
one line naming the file and its fix and exit 1 (no traceback), or, for a cache, is named and
recomputed; removing the file and rerunning its step recovers.

The run is test_train's toy run, 60 updates with a checkpoint every 30, in process on one CPU
thread (a few seconds); the steps run through their real ``main``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from ihsweep.config import complete
from ihsweep.data import natural
from ihsweep.data.chunks import CHECKSUMS_JSON, open_chunks, read_chunks_meta
from ihsweep.files.io import DamagedFile, read_probe_table
from ihsweep.probing.run import probe_run
from ihsweep.status import damaged_records
from ihsweep.steps import aggregate_natural, chunk, probe, run_figure
from ihsweep.training.checkpoints import checkpoint_paths
from ihsweep.training.loop import train
from test_train import CPU, make_dataset, make_spec

DAMAGES = ("truncated", "random", "zeros")


def damage(path: Path, how: str) -> None:
    """Truncate ``path`` to half, or overwrite it with random bytes or zeros of its length."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":
        path.write_bytes(np.random.default_rng(len(data)).bytes(len(data)))
    else:
        path.write_bytes(bytes(len(data)))


def one_line(text: str, path: Path) -> str:
    """The one line of a failing step's stderr, checked to name ``path`` and no traceback."""
    assert text.count("\n") == 1 and "Traceback" not in text, text
    assert text.startswith("damaged ") and f" {path}: " in text, text
    return text


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


@pytest.fixture(scope="module")
def probed(tmp_path_factory, data_dir) -> Path:
    """A trained and probed toy run: ``run/`` and its two tables, ``heads/model.parquet``."""
    root = tmp_path_factory.mktemp("probed")
    train(make_spec(steps=60, every=30), data_dir, root / "run", CPU)
    assert probe.main(probe_argv(root)) == 0
    return root


def probe_argv(root: Path) -> list[str]:
    return ["--run-dir", str(root / "run"), "--heads", str(root / "heads.parquet"),
            "--model-table", str(root / "model.parquet"), "--probe", "{}",
            "--device", "cpu", "--threads", "1"]  # fmt: skip


def copy_of(probed: Path, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(probed, root)
    return root


def probe_cache(root: Path) -> list[Path]:
    return sorted((root / "run" / "probes").glob("*/cache/step_*.parquet"))


# --------------------------------------------------------------------------------------------
# dataset shards and chunks.json: checksums, verified before training reads them


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_shard_is_named_before_training_and_regenerated(how, tmp_path, capsys):
    data = make_dataset(tmp_path / "C32")
    assert json.loads((data / CHECKSUMS_JSON).read_text()).keys() == {"train.bin", "val.bin"}
    good = (data / "train.bin").read_bytes()
    damage(data / "train.bin", how)
    with pytest.raises(DamagedFile) as err:
        open_chunks(data, "train")
    line = one_line(f"{err.value}\n", data / "train.bin")
    assert f"remove the folder {data} and run `snakemake {data}/chunks.json`" in line
    with pytest.raises(DamagedFile):  # the trainer refuses it before any update
        train(make_spec(steps=4, every=2), data, tmp_path / "run", CPU)
    assert not (tmp_path / "run" / "ckpt").exists()
    shutil.rmtree(data)
    make_dataset(data)  # what the chunk step does again: the same bits
    assert (data / "train.bin").read_bytes() == good
    assert open_chunks(data, "train").shape == (96, 32)


def test_a_folder_without_checksums_gets_them_on_first_use(tmp_path, capsys):
    data = make_dataset(tmp_path / "C32")
    recorded = (data / CHECKSUMS_JSON).read_text()
    (data / CHECKSUMS_JSON).unlink()  # a folder made before the checksums
    open_chunks(data, "val")
    assert f"{data}/{CHECKSUMS_JSON}: none yet" in capsys.readouterr().out
    assert (data / CHECKSUMS_JSON).read_text() == recorded
    open_chunks(data, "train")  # verified now, silently
    assert capsys.readouterr().out == ""


def test_an_old_folder_with_ids_beyond_the_vocabulary_is_refused(tmp_path):
    data = make_dataset(tmp_path / "C32")
    (data / CHECKSUMS_JSON).unlink()
    damage(data / "train.bin", "random")  # 0xFF-like bytes: ids far above V = 64
    with pytest.raises(DamagedFile, match="token id .* >= the vocabulary 64"):
        open_chunks(data, "val")
    assert not (data / CHECKSUMS_JSON).exists()


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_chunks_json_is_named(how, tmp_path):
    data = make_dataset(tmp_path / "C32")
    damage(data / "chunks.json", how)
    with pytest.raises(DamagedFile) as err:
        read_chunks_meta(data)
    one_line(f"{err.value}\n", data / "chunks.json")


@pytest.mark.parametrize("how", DAMAGES)
def test_the_chunk_step_names_a_damaged_tokens_file(how, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("the cat sat on the mat. " * 400)
    spec = complete("dataset", {"family": "natural", "val_fraction": 0.1,
                                "corpus": {"source": "files", "paths": ["a.txt"]},
                                "tokenizer": {"kind": "bpe", "vocab_size": 260}})  # fmt: skip
    natural.tokenize_corpus(spec, tmp_path / "tok", tmp_path)
    argv = ["--spec", json.dumps(spec), "--source-dir", str(tmp_path / "tok"), "--context", "8",
            "--out-dir", str(tmp_path / "C8")]  # fmt: skip
    for name in ("tokens.json", "tokens.bin"):
        good = (tmp_path / "tok" / name).read_bytes()
        damage(tmp_path / "tok" / name, how)
        capsys.readouterr()
        assert chunk.main(argv) == 1
        line = one_line(capsys.readouterr().err, tmp_path / "tok" / name)
        assert "the tokenize step rewrites the folder" in line
        assert not (tmp_path / "C8").exists()
        (tmp_path / "tok" / name).write_bytes(good)  # what the tokenize step writes again
    assert chunk.main(argv) == 0


# --------------------------------------------------------------------------------------------
# the probe step: its cache, the checkpoints behind it and run.json


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_probe_cache_is_named_and_recomputed(how, probed, tmp_path, capsys):
    root = copy_of(probed, tmp_path)
    cache = probe_cache(root)
    good = [c.read_bytes() for c in cache]
    damage(cache[0], how)
    capsys.readouterr()
    assert probe.main(probe_argv(root)) == 0
    out = capsys.readouterr().out
    assert f"damaged probe cache {cache[0]}: " in out and "; recomputing it\n" in out
    assert "probed step 30" in out and "probed step 60" not in out  # only that one
    assert [c.read_bytes() for c in cache] == good
    for name in ("heads", "model"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(root / f"{name}.parquet"), pd.read_parquet(probed / f"{name}.parquet")
        )


@pytest.mark.parametrize("part", ["weights", "json"])
@pytest.mark.parametrize("how", DAMAGES)
def test_a_cache_never_hides_a_damaged_checkpoint(part, how, probed, tmp_path, capsys):
    root = copy_of(probed, tmp_path)
    (root / "heads.parquet").unlink()
    (root / "model.parquet").unlink()
    before = {c: c.read_bytes() for c in probe_cache(root)}
    weights, meta = checkpoint_paths(root / "run", 30)
    path = weights if part == "weights" else meta
    damage(path, how)
    capsys.readouterr()
    assert probe.main(probe_argv(root)) == 1
    line = one_line(capsys.readouterr().err, path)
    assert "rerun the run's train job to rewrite it" in line
    assert not (root / "heads.parquet").exists() and not (root / "model.parquet").exists()
    assert {c: c.read_bytes() for c in probe_cache(root)} == before  # nothing else touched


def test_training_probes_may_skip_the_checksums(probed, tmp_path):
    """verify=False (a caller that verifies otherwise) reads the caches without hashing."""
    root = copy_of(probed, tmp_path)
    damage(checkpoint_paths(root / "run", 30)[0], "zeros")
    heads, model = probe_run(root / "run", complete("probe", {}), torch.device("cpu"), verify=False)
    assert list(model["step"]) == [30, 60]
    with pytest.raises(DamagedFile):
        probe_run(root / "run", complete("probe", {}), torch.device("cpu"))


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_run_record_is_named_by_the_probe_step(how, probed, tmp_path, capsys):
    root = copy_of(probed, tmp_path)
    (root / "model.parquet").unlink()
    record = root / "run" / "run.json"
    damage(record, how)
    capsys.readouterr()
    assert probe.main(probe_argv(root)) == 1
    line = one_line(capsys.readouterr().err, record)
    assert f"remove it and run `snakemake {record}`, then `snakemake`: the train step" in line
    assert not (root / "model.parquet").exists()
    assert damaged_records(root / "run", {}, None)[0] == "damaged"  # status shows it


def test_status_shows_a_damaged_progress_record(tmp_path):
    (tmp_path / "progress.json").write_bytes(bytes(100))
    state, error = damaged_records(tmp_path, {}, None)
    assert state == "unknown" and f"damaged progress record {tmp_path}/progress.json" in error


# --------------------------------------------------------------------------------------------
# the probe tables, read by the run figure and the aggregates


@pytest.mark.parametrize("name", ["model", "heads"])
@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_probe_table_fails_its_readers_in_one_line(name, how, probed, tmp_path, capsys):
    root = copy_of(probed, tmp_path)
    probes = root / "run" / "probes" / "p"
    probes.mkdir()
    for table in ("heads", "model"):
        shutil.copy(root / f"{table}.parquet", probes / f"{table}.parquet")
    table = probes / f"{name}.parquet"
    damage(table, how)
    capsys.readouterr()
    figure = ["--probes", str(probes), "--out", str(root / "figures" / "run")]
    assert run_figure.main(figure) == 1
    line = one_line(capsys.readouterr().err, table)
    assert f"remove it and run `snakemake {table}`, then `snakemake`: the probe step" in line
    assert not (root / "figures").exists()
    if name == "model":
        out = root / "natural"
        assert aggregate_natural.main(["--model-tables", str(table), "--out-dir", str(out)]) == 1
        one_line(capsys.readouterr().err, table)
        assert not out.exists()
    table.unlink()  # the fix: the probe step rewrites it from its cache
    assert probe.main(probe_argv(root)) == 0
    shutil.copy(root / f"{name}.parquet", table)
    assert run_figure.main(figure) == 0
    assert read_probe_table(table).equals(pd.read_parquet(probed / f"{name}.parquet"))
