"""Training (ihsweep.training.loop): exact resumption, schedule, sampler, checkpoint files.

The runs here are tiny (a 2-layer, d=32 model on a random 64-token chunked dataset of C = 32), so
a few hundred updates take seconds on one CPU thread. The central promise of the training loop
is that a run killed at any moment and restarted ends with the same weights, bit for bit on the
CPU, as an uninterrupted run; the resume tests check it through the real command line
(``python -m ihsweep.steps.train``), with SIGKILL (resume from the last checkpoint) and SIGTERM
(state saved at the next step, exit code 75). Every run also leaves ``progress.json``, the
record ``ihsweep.status`` reads: done, interrupted, or failed with the error that stopped it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, SCHEMA, write_chunks
from ihsweep import cost
from ihsweep.analysis.emergence import run_point
from ihsweep.config import ConfigError, execution_of, probe_key
from ihsweep.data.chunks import open_chunks
from ihsweep.files import layout
from ihsweep.files import records as run_records
from ihsweep.files.io import DamagedFile, read_parquet_key, write_parquet
from ihsweep.files.layout import PROGRESS_JSON
from ihsweep.files.records import read_progress, read_run
from ihsweep.probing.run import probe_run
from ihsweep.steps import train as train_command
from ihsweep.steps.prepare import prepare
from ihsweep.steps.train import EXIT_INTERRUPTED
from ihsweep.training import loop
from ihsweep.training.checkpoints import list_checkpoints
from ihsweep.training.execution import keep_freed_memory
from ihsweep.training.loop import Job, Outcome, train
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.progress import Progress
from ihsweep.training.resume import load_resume_state, save_resume_state, spec_hash
from ihsweep.training.sampler import ChunkSampler
from ihsweep.training.schedule import lr_at
from ihsweep.training.step import batch_loss, clip_gradients, next_token_loss, train_step
from ihsweep.training.weights import save_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file

# Execution settings of the in-process runs: one CPU thread, the schema's defaults for the rest.
# The command-line runs pass --device cpu --threads 1.
CPU = execution_of({"device": "cpu", "threads": 1})
V, C = 64, 32  # vocabulary and context size of the toy dataset
B = 4
STEPS, EVERY = 300, 30  # the resume runs: 300 updates, a checkpoint every 30
TIMEOUT = 300  # seconds any one training subprocess may take on a loaded machine


# --------------------------------------------------------------------------------------------
# Helpers: a chunked dataset on disk and a training spec built the way the workflow builds it


def make_dataset(root: Path, n_train: int = 96, n_val: int = 8, seed: int = 0) -> Path:
    """A chunked dataset in ihsweep.data.chunks' format: random tokens with a copied segment."""
    rng = np.random.default_rng(seed)
    seg = C // 4
    splits = {}
    for split, n in {"train": n_train, "val": n_val}.items():
        x = rng.integers(0, V, size=(n, C))
        x[:, C - seg :] = x[:, 2 : 2 + seg]  # an induction-friendly repeat in every chunk
        splits[split] = x
    return write_chunks(root, splits, V)


def toy_config(
    batch: int, checkpoint_tokens: list[int], mlp: bool, seed: int = 0, model=None, **training
):
    """A one-run study of the toy model (``model`` overrides its keys) on the toy dataset (its
    `training` section given). The probes count every head (``probe.min_layer: 0``): these
    tests are about training, and the toy models include a one-layer one."""
    toy = {"n_layer": 2, "n_head": 2, "d_model": 32, "mlp": mlp, "n_ctx": C, **(model or {})}
    return {
        "models": {"toy": toy},
        "datasets": {
            "toy": {
                "family": "natural",
                "corpus": {"source": "kjv"},
                "tokenizer": {"kind": "bpe", "vocab_size": 258},
            }
        },
        "runs": [
            {"data": "toy", "model": "toy", "batch_size": batch, "context_size": C, "seed": seed}
        ],
        "training": training,
        "checkpoints": {"tokens": checkpoint_tokens},
        "probe": {"min_layer": 0},
    }


def make_spec(
    steps: int = STEPS,
    every: int = EVERY,
    lr: float = 3e-3,
    log_every: int = 1,
    seed: int = 0,
    model: dict | None = None,
    **training,
) -> dict:
    """Study.train_spec of a one-run study, through ihsweep.steps.prepare.prepare (defaults
    filled)."""
    config = toy_config(
        batch=B,
        checkpoint_tokens=[k * B * C for k in range(every, steps + 1, every)],
        mlp=True,
        seed=seed,
        model=model,
        tokens=steps * B * C,
        lr=lr,
        log_every=log_every,
        val_batches=2,
        **training,
    )
    study = prepare(config, SCHEMA)
    (run,) = study.runs
    spec = study.train_spec(run)
    assert spec["checkpoint_steps"] == sorted({*range(every, steps + 1, every), steps})
    assert spec["total_steps"] == steps
    return spec


def train_cmd(spec: dict, data_dir: Path, run_dir: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ihsweep.steps.train",
        "--spec",
        json.dumps(spec),
        "--data-dir",
        str(data_dir),
        "--run-dir",
        str(run_dir),
        "--device",
        "cpu",
        "--threads",
        "1",
        *flags,
    ]


def subprocess_env() -> dict:
    path = os.pathsep.join(filter(None, [str(REPO / "workflow"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run_to_end(spec: dict, data_dir: Path, run_dir: Path, *flags: str) -> str:
    """Run (or resume) training in a subprocess to completion; return its output."""
    proc = subprocess.run(
        train_cmd(spec, data_dir, run_dir, *flags),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = list_checkpoints(run_dir)[-1]
    return load_file(last["weights"])


def assert_same_tensors(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, f"tensors differ from the uninterrupted run: {different}"


def loss_rows(run_dir: Path) -> list[list[str]]:
    """Complete rows of loss.csv (a half-written last line, if any, is skipped)."""
    path = run_dir / "loss.csv"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[1:-1]  # header, and the text after the last newline
    return [row for row in (line.split(",") for line in lines) if len(row) == 5]


def last_train_step(run_dir: Path) -> int:
    steps = [int(row[0]) for row in loss_rows(run_dir) if row[2] == "train"]
    return max(steps, default=0)


def saved_checkpoint_steps(run_dir: Path) -> list[int]:
    return [m["step"] for m in list_checkpoints(run_dir)]


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path) -> None:
    """Poll loss.csv until training has logged ``step``; fail if the process ends first."""
    deadline = time.monotonic() + TIMEOUT
    while last_train_step(run_dir) < step:
        if proc.poll() is not None:
            pytest.fail(
                f"training ended (rc {proc.returncode}) before step {step}: " + log.read_text()
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"training did not reach step {step} in {TIMEOUT} s")
        time.sleep(0.002)


def assert_loss_log_clean(run_dir: Path, spec: dict) -> None:
    """One train row per step (log_every = 1), one val row per checkpoint, nothing twice."""
    rows = loss_rows(run_dir)
    keys = [(int(row[0]), row[2]) for row in rows]
    assert len(keys) == len(set(keys)), "loss.csv has duplicated steps"
    train_steps = [step for step, split in keys if split == "train"]
    val_steps = [step for step, split in keys if split == "val"]
    assert train_steps == list(range(1, spec["total_steps"] + 1))
    assert val_steps == spec["checkpoint_steps"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir) -> dict:
    """The uninterrupted run of make_spec(), through the command line: B = 4 in one pass."""
    return uninterrupted(tmp_path_factory, data_dir, "--micro-batch", "auto")


@pytest.fixture(scope="module")
def reference_micro(tmp_path_factory, data_dir) -> dict:
    """The same run with each update as four micro-batches of one sequence."""
    return uninterrupted(tmp_path_factory, data_dir, "--micro-batch", "1")


def uninterrupted(tmp_path_factory, data_dir: Path, *flags: str) -> dict:
    spec = make_spec()
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    out = run_to_end(spec, data_dir, run_dir, *flags)
    assert "resuming" not in out
    parts = 1 if flags[-1] == "auto" else B // int(flags[-1])
    assert f"{parts} micro-batch(es) of at most {B // parts} per update of B = {B}" in out
    progress = read_progress(run_dir)
    assert progress["state"] == "done" and progress["tokens"] == progress["budget"] == STEPS * B * C
    return {
        "spec": spec,
        "flags": flags,
        "run_dir": run_dir,
        "weights": final_weights(run_dir),
        "loss_csv": (run_dir / "loss.csv").read_text(),
    }


# --------------------------------------------------------------------------------------------
# Kill and resume


@pytest.mark.slow
@pytest.mark.parametrize("which", ["reference", "reference_micro"])
def test_sigkill_then_rerun_resumes_from_last_checkpoint_bit_for_bit(
    which, request, data_dir, tmp_path
):
    reference = request.getfixturevalue(which)
    spec, flags = reference["spec"], reference["flags"]
    ckpts = spec["checkpoint_steps"]
    kill_after = random.Random(20240611).randrange(ckpts[1], ckpts[-2])
    run_dir, log = tmp_path / "run", tmp_path / "first.log"

    with open(log, "w") as out:
        proc = subprocess.Popen(
            train_cmd(spec, data_dir, run_dir, *flags),
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_step(proc, run_dir, kill_after, log)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    assert not (run_dir / "run.json").exists(), "a killed run must not look finished"
    saved = saved_checkpoint_steps(run_dir)
    logged = last_train_step(run_dir)
    # Killed without a word: the record still says running (status calls it failed once stale).
    progress = read_progress(run_dir)
    assert progress["state"] == "running" and progress["step"] <= logged
    assert kill_after <= logged < spec["total_steps"]
    assert saved and saved == [s for s in ckpts if s <= saved[-1]]
    assert saved[-1] >= ckpts[1]
    for meta in list_checkpoints(run_dir):  # a checkpoint's JSON is written after its weights
        assert load_file(meta["weights"]).keys() == reference["weights"].keys()

    out = run_to_end(spec, data_dir, run_dir, *flags)
    resumed = re.findall(r"resuming at step (\d+)/(\d+)", out)
    assert len(resumed) == 1, out
    step, total = map(int, resumed[0])
    assert total == spec["total_steps"]
    if logged > saved[-1]:
        # Training went on past the last checkpoint, so its resume state was complete.
        assert step == saved[-1]
    else:
        # Killed right after the checkpoint's files and before its resume state: the one
        # checkpoint before it is the last complete state.
        assert step in saved[-2:]

    assert (run_dir / "run.json").exists()
    assert read_progress(run_dir)["state"] == "done"
    assert saved_checkpoint_steps(run_dir) == ckpts
    assert_same_tensors(final_weights(run_dir), reference["weights"])
    assert_loss_log_clean(run_dir, spec)
    assert (run_dir / "loss.csv").read_text() == reference["loss_csv"]


def ten_updates(micro_batch: int, batches: list[torch.Tensor], lr: float) -> dict:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, n_ctx=C, n_layer=2, n_head=2, d_model=32, mlp=True))
    optim = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    for x in batches:
        train_step(model, optim, x, micro_batch, contextlib.nullcontext(), 1.0)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_micro_batches_make_the_full_batch_update_within_float_rounding():
    """B = 8 as 4 micro-batches of 2: the gradients agree to ~1e-7 relative (next tests), and
    AdamW turns that into weights within 0.02 * lr after 10 updates (measured 0.01 * lr: its
    eps of 1e-8 magnifies the rounding of gradient entries near zero). Reordering the batches,
    a different update, moves the weights 100 times as far."""
    lr = 3e-3
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, V, (8, C), generator=generator) for _ in range(10)]
    full, micro = ten_updates(8, batches, lr), ten_updates(2, batches, lr)
    other = ten_updates(8, batches[::-1], lr)
    gap = max((micro[n] - full[n]).abs().max().item() for n in full)
    different = max((other[n] - full[n]).abs().max().item() for n in full)
    assert 0 < gap <= 0.02 * lr
    assert different > 100 * gap


def test_micro_batched_run_follows_the_full_batch_run(reference, reference_micro):
    """300 updates through the command line: the same loss curve to 3 digits, though the
    weights drift apart a little (AdamW magnifies rounding, above)."""
    losses = [
        [float(row[3]) for row in loss_rows(ref["run_dir"])] for ref in (reference, reference_micro)
    ]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
    assert losses[1] != losses[0]


def make_periodic_dataset(root: Path, n_train: int = 4000, n_val: int = 64) -> Path:
    """Random tokens that repeat with a random period of C/4..C/2: associative recall rises
    within ~1.5M tokens on the toy model (an emergence point the sigmoid rule finds)."""
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        x = rng.integers(0, V, size=(n, C))
        period = rng.integers(C // 4, C // 2 + 1, size=n)
        for row, p in zip(x, period, strict=True):
            for t in range(p, C):
                row[t] = row[t - p]
        splits[split] = x
    return write_chunks(root, splits, V)


@pytest.mark.slow
def test_micro_batched_run_emerges_at_the_same_point(tmp_path):
    """The same tiny study (B 16, 3,000 updates) trained whole and as 4 micro-batches of 4:
    probed with the probe step's code, the emergence rule finds the same point (measured: equal
    to 7 digits; allowed: 1%)."""
    batch, steps = 16, 3000
    budget = steps * batch * C
    data = make_periodic_dataset(tmp_path / "data")
    config = toy_config(
        batch=batch,
        checkpoint_tokens=[round(budget * f) for f in np.geomspace(0.02, 1, 16)],
        mlp=False,
        tokens=budget,
        lr=3e-3,
        val_batches=1,
    )
    config["probe"] = {"n_sequences": 50}
    config["emergence"] = {"metric": "ar_acc", "method": "sigmoid", "min_rise": 0.1}
    study = prepare(config, SCHEMA)
    (run,) = study.runs
    points, series = [], []
    for micro_batch in ("auto", 4):
        run_dir = tmp_path / f"run-{micro_batch}"
        train(study.train_spec(run), data, run_dir, replace(CPU, micro_batch=micro_batch))
        _, model = probe_run(run_dir, study.config["probe"], torch.device("cpu"))
        model["run_id"] = run.id
        points.append(run_point(model, study.config["emergence"]))
        series.append(model.sort_values("tokens")["ar_acc"].to_numpy())
    assert all(point["emerged"] for point in points), points
    assert 0.1 * budget < points[0]["tokens_pt"] < 0.9 * budget
    assert points[1]["tokens_pt"] == pytest.approx(points[0]["tokens_pt"], rel=0.01)
    np.testing.assert_allclose(series[1], series[0], atol=0.02)


def test_probe_run_memo_probes_each_checkpoint_once(tmp_path, data_dir, capsys):
    """The memo that training keeps between its early-stopping checks: a second call takes
    every checkpoint from it (the cache files deleted, none is probed or written again), and
    its tables equal those of a fresh probe without it."""
    run_dir = tmp_path / "run"
    train(make_spec(steps=60, every=20), data_dir, run_dir, CPU)
    probe = {"n_sequences": 20, "max_half_length": 50, "seed": 0, "min_layer": 0}
    cpu = torch.device("cpu")
    memo = {}
    first = probe_run(run_dir, probe, cpu, memo=memo)
    assert len(memo) == 3 and capsys.readouterr().out.count("probed step") == 3
    cache = Path(layout.probe_dir(run_dir, probe_key(probe))) / "cache"
    assert len(list(cache.glob("step_*.parquet"))) == 3  # beside the tables of these settings
    shutil.rmtree(cache)
    second = probe_run(run_dir, probe, cpu, memo=memo)
    assert not cache.exists()
    assert "probed step" not in capsys.readouterr().out
    fresh = probe_run(run_dir, probe, cpu)
    assert capsys.readouterr().out.count("probed step") == 3
    for a, b, c in zip(first, second, fresh, strict=True):
        pd.testing.assert_frame_equal(a, b)
        pd.testing.assert_frame_equal(a, c)


def test_a_probe_cache_from_before_a_score_existed_is_recomputed(tmp_path, data_dir, capsys):
    """The cache's key covers the probe settings, not which scores exist: a cached checkpoint
    without a score's columns (as written before that score was added, under the same key) is
    probed again, not read, so adding a probe score needs no --forcerun."""
    run_dir = tmp_path / "run"
    train(make_spec(steps=40, every=20), data_dir, run_dir, CPU)
    probe = {"n_sequences": 20, "max_half_length": 50, "seed": 0, "min_layer": 0}
    cpu = torch.device("cpu")
    first = probe_run(run_dir, probe, cpu)
    assert capsys.readouterr().out.count("probed step") == 2
    cache = Path(layout.probe_dir(run_dir, probe_key(probe))) / "cache"
    for path in cache.glob("step_*.parquet"):
        older = pd.read_parquet(path).drop(columns=["la", "la_max"])
        write_parquet(older, path, key=read_parquet_key(path))
    again = probe_run(run_dir, probe, cpu)
    assert capsys.readouterr().out.count("probed step") == 2
    for a, b in zip(first, again, strict=True):
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("mlp", [False, True])
def test_loss_in_chunks_of_positions_equals_the_whole_loss(monkeypatch, mlp):
    """The chunked loss (logits a slice of positions at a time, recomputed for the backward
    pass) gives the plain loss and its gradients, within float rounding."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, n_ctx=C, n_layer=2, n_head=2, d_model=32, mlp=mlp))
    x = torch.randint(0, V, (6, C))
    autocast = contextlib.nullcontext()

    def loss_and_grads():
        model.zero_grad()
        loss = next_token_loss(model, x, autocast)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    whole, whole_grads = loss_and_grads()
    assert cost.loss_chunk_rows(V, "cpu") >= 6 * (C - 1)  # one piece at this size
    monkeypatch.setitem(cost.LOSS_CHUNK_LOGITS, "cpu", 7 * V)  # 7 positions a chunk: 27 chunks
    chunked, chunked_grads = loss_and_grads()
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-7)


def test_micro_batch_losses_weigh_parts_by_their_sequences():
    """Uneven parts (B = 5 as 2 + 2 + 1) still give the full batch's mean loss and gradient."""
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=V, n_ctx=C, n_layer=1, n_head=2, d_model=16, mlp=False))
    x = torch.randint(0, V, (5, C))
    autocast = contextlib.nullcontext()
    grads = []
    for micro_batch in (5, 2):
        model.zero_grad()
        loss = batch_loss(model, x, micro_batch, autocast, backward=True)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    assert cost.micro_batch_sizes(5, 2) == [2, 2, 1]
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=0)
    for got, want in zip(grads[1][1], grads[0][1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------
# The trainer computes the update and nothing else; the compiled loss (execution.compile)


def test_trainer_ends_with_the_weights_of_a_plain_loop(tmp_path, data_dir):
    """train() ends bit for bit where a plain loop of the same model, batches (as the sampler
    first drew them), fused AdamW, schedule and torch's clip_grad_norm_ ends, through updates
    that were clipped and updates that were not (bench/trainer_vs_minimal.py times the two)."""
    spec = make_spec(steps=30, every=30)
    train(spec, data_dir, tmp_path / "run", CPU)
    t, steps = spec["training"], spec["total_steps"]
    chunks = open_chunks(data_dir, "train")
    torch.manual_seed(spec["seed"])
    model = GPT(GPTConfig(vocab_size=V, **spec["model_config"]))
    optim = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                              eps=t["eps"], weight_decay=t["weight_decay"], fused=True)  # fmt: skip
    norms = []
    for step in range(steps):
        for group in optim.param_groups:
            group["lr"] = lr_at(step, steps, t["lr"], t["warmup_fraction"])
        rows = first_sampler_rows(len(chunks), B, spec["seed"], step)
        x = torch.from_numpy(chunks[rows].astype(np.int64))
        logits = model(x[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"]).item())
        optim.step()
        optim.zero_grad(set_to_none=True)
    assert min(norms) < t["grad_clip"] < max(norms)  # both kinds of update happened
    assert_same_tensors(final_weights(tmp_path / "run"), model.state_dict())


@pytest.mark.parametrize("max_norm", [1e-3, 1e3, "non-finite"])
def test_clip_gradients_is_torchs_clipping_bit_for_bit(max_norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, n_ctx=C, n_layer=1, n_head=2, d_model=16, mlp=True))
    next_token_loss(model, torch.randint(0, V, (3, C)), contextlib.nullcontext()).backward()
    if max_norm == "non-finite":
        max_norm = 1.0
        model.wte.weight.grad[3, 5] = math.inf
    grads = [p.grad.clone() for p in model.parameters()]
    clip_gradients(model, max_norm)
    ours = [p.grad.clone() for p in model.parameters()]
    for p, grad in zip(model.parameters(), grads, strict=True):
        p.grad = grad
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for p, clipped, grad in zip(model.parameters(), ours, grads, strict=True):
        assert p.grad is grad  # clipped in place
        torch.testing.assert_close(clipped, p.grad, rtol=0, atol=0, equal_nan=True)


def test_cpu_jobs_tune_the_allocator_on_glibc():
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's mallopt only")
    assert keep_freed_memory()


def needs_a_compiler():
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("torch.compile on the CPU needs a C++ compiler")


TINY = {"n_layer": 1, "d_model": 16, "mlp": False}  # compiles in the least time


@pytest.mark.slow
def test_compiled_run_agrees_with_the_eager_run_within_rounding(tmp_path, data_dir, capsys):
    """Compiled (explicit attention, inductor's kernels) and eager differ only in float
    rounding: the logged losses agree to 1e-5 relative over 20 updates, the weights to a
    fraction of the learning rate (AdamW's eps magnifies the rounding of near-zero
    gradients), and the state dict keeps the plain module's names."""
    needs_a_compiler()
    spec = make_spec(steps=20, every=10, model=TINY)
    runs = {}
    for compiled in (False, True):
        run_dir = tmp_path / str(compiled)
        train(spec, data_dir, run_dir, replace(CPU, compile=compiled))
        summary = read_run(run_dir)
        assert summary["checkpoints"] == [10, 20]
        rows = [r for r in loss_rows(run_dir) if r[2] == "train"]
        runs[compiled] = (np.array([float(r[3]) for r in rows]), final_weights(run_dir))
    assert "loss compiled" in capsys.readouterr().out
    (eager_losses, eager), (compiled_losses, compiled) = runs[False], runs[True]
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-5)
    assert compiled.keys() == eager.keys()
    lr = spec["training"]["lr"]
    for name, weight in eager.items():
        assert (compiled[name] - weight).abs().max() < 0.05 * lr, name
    different = [name for name in eager if not torch.equal(compiled[name], eager[name])]
    assert different, "the compiled run is not compiled (it is bit for bit the eager one)"


def test_a_padded_fused_run_keeps_v_rows_and_follows_the_plain_run(tmp_path, data_dir, capsys):
    """The GPU's lm-head paths forced on the CPU (``vocab_padding: 128``, ``fused_loss: true``):
    the model starts from the plain run's weights bit for bit, its checkpoints hold V rows, and
    its losses and weights stay within float rounding of the plain run's."""
    spec = make_spec(steps=20, every=10)
    paths = {"compile": False, "vocab_padding": 128, "fused_loss": True}  # V = 64: 128 rows
    starts = [Job.build(spec, data_dir, replace(CPU, **step)).model.state_dict()
              for step in ({}, paths)]  # fmt: skip
    assert_same_tensors(*starts)
    runs = {}
    for name, step in (("plain", {}), ("padded-fused", paths)):
        train(spec, data_dir, tmp_path / name, replace(CPU, **step))
        rows = [r for r in loss_rows(tmp_path / name) if r[2] == "train"]
        runs[name] = (np.array([float(r[3]) for r in rows]), final_weights(tmp_path / name))
    assert "lm head padded to a multiple of 128, fused loss" in capsys.readouterr().out
    (plain_losses, plain), (losses, weights) = runs["plain"], runs["padded-fused"]
    assert weights["wte.weight"].shape == (V, spec["model_config"]["d_model"])
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    lr = spec["training"]["lr"]
    for name, weight in plain.items():
        assert (weights[name] - weight).abs().max() < 0.05 * lr, name


@pytest.mark.slow
def test_compiled_run_stopped_then_resumed_by_the_command_matches_bit_for_bit(tmp_path, data_dir):
    """A compiled run stopped mid-way (not at a checkpoint) and resumed by a new process, which
    compiles again (from the inductor cache this one filled), ends bit for bit where an
    uninterrupted compiled run ends."""
    needs_a_compiler()
    spec = make_spec(steps=20, every=10, model=TINY)
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    compiled = {"compile": True}
    train(spec, data_dir, ref_dir, replace(CPU, **compiled))
    assert (
        train(spec, data_dir, run_dir, replace(CPU, **compiled), stop_after_step=13)
        is Outcome.INTERRUPTED
    )
    assert read_progress(run_dir)["state"] == "interrupted"
    assert saved_checkpoint_steps(run_dir) == [10]
    out = run_to_end(spec, data_dir, run_dir, "--compile", "true")
    assert "resuming at step 13/20" in out and "loss compiled" in out
    assert saved_checkpoint_steps(run_dir) == [10, 20]
    for step in (10, 20):
        name = f"step_{step:06d}.safetensors"
        assert_same_tensors(load_file(run_dir / "ckpt" / name), load_file(ref_dir / "ckpt" / name))
    assert (run_dir / "loss.csv").read_text() == (ref_dir / "loss.csv").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_state_exits_75_and_rerun_resumes_there(reference, data_dir, tmp_path, sig):
    """SIGTERM (SLURM, kill) and SIGINT (Ctrl-C) alike: state saved at the next step, one line
    and no traceback, progress.json interrupted, no temporary file left."""
    spec = reference["spec"]
    ckpts = spec["checkpoint_steps"]
    # A step that is no checkpoint: the state must then be saved at whatever step was reached.
    rng = random.Random(7)
    target = rng.choice([s for s in range(ckpts[0] + 1, ckpts[-2]) if s not in ckpts])
    run_dir, log = tmp_path / "run", tmp_path / "first.log"

    with open(log, "w") as out:
        proc = subprocess.Popen(
            train_cmd(spec, data_dir, run_dir),
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_step(proc, run_dir, target, log)
            proc.send_signal(sig)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert rc == EXIT_INTERRUPTED == 75 and "Traceback" not in text, text
    saved_at = re.findall(rf"signal {int(sig)}: state saved at step (\d+)", text)
    assert len(saved_at) == 1, text
    stopped = int(saved_at[0])
    assert target <= stopped < spec["total_steps"]
    assert not (run_dir / "run.json").exists()
    state = load_resume_state(run_dir)[0]
    assert int(state["step"]) == stopped
    saved_on = f"with its checkpoint, on signal {int(sig)}" if stopped in ckpts else ""
    saved_on = saved_on or f"on signal {int(sig)}"
    assert state["saved_on"] == saved_on
    assert last_train_step(run_dir) == stopped
    assert saved_checkpoint_steps(run_dir) == [s for s in ckpts if s <= stopped]
    progress = read_progress(run_dir)
    assert progress["state"] == "interrupted" and progress["signal"] == sig
    assert not list(run_dir.rglob("*.tmp"))
    assert progress["step"] == stopped and progress["tokens"] == stopped * B * C

    out = run_to_end(spec, data_dir, run_dir)
    assert re.findall(r"resuming at step (\d+)/\d+ \(state saved (.*)\)", out) == [
        (str(stopped), saved_on)
    ]
    assert read_progress(run_dir)["state"] == "done"
    assert_same_tensors(final_weights(run_dir), reference["weights"])
    assert_loss_log_clean(run_dir, spec)
    assert (run_dir / "loss.csv").read_text() == reference["loss_csv"]


def test_stop_after_step_then_resume_in_process_matches(reference, data_dir, tmp_path, capsys):
    spec = reference["spec"]
    stop = 77  # not a checkpoint step
    assert stop not in spec["checkpoint_steps"]
    run_dir = tmp_path / "run"

    assert train(spec, data_dir, run_dir, CPU, stop_after_step=stop) is Outcome.INTERRUPTED
    assert not (run_dir / "run.json").exists()
    state = load_resume_state(run_dir)[0]
    assert int(state["step"]) == stop and state["saved_on"] == "at stop_after_step"
    assert saved_checkpoint_steps(run_dir) == [30, 60]
    progress = read_progress(run_dir)
    assert progress["state"] == "interrupted" and progress["step"] == stop

    train(spec, data_dir, run_dir, CPU)
    summary = read_run(run_dir)
    out = capsys.readouterr().out
    assert f"resuming at step {stop}/{spec['total_steps']} (state saved at stop_after_step)" in out
    assert summary["checkpoints"] == spec["checkpoint_steps"]
    assert json.loads((run_dir / "run.json").read_text()) == summary
    # The in-process run also matches the command-line run, every checkpoint of it.
    for meta in list_checkpoints(run_dir):
        want = load_file(reference["run_dir"] / "ckpt" / Path(meta["weights"]).name)
        assert_same_tensors(load_file(meta["weights"]), want)
    assert (run_dir / "loss.csv").read_text() == reference["loss_csv"]


def test_resume_state_says_why_it_was_saved(tmp_path, data_dir, capsys):
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU, stop_after_step=20)  # a checkpoint step
    assert load_resume_state(run_dir)[0]["saved_on"] == "with its checkpoint, at stop_after_step"
    train(spec, data_dir, run_dir, CPU, stop_after_step=30)
    assert load_resume_state(run_dir)[0]["saved_on"] == "at stop_after_step"
    train(spec, data_dir, run_dir, CPU)
    assert load_resume_state(run_dir)[0]["saved_on"] == "with its checkpoint"
    out = capsys.readouterr().out
    assert re.findall(r"resuming at step (\d+)/40 \(state saved (.*)\)", out) == [
        ("20", "with its checkpoint, at stop_after_step"),
        ("30", "at stop_after_step"),
    ]


def test_rerun_of_a_finished_run_changes_nothing(tmp_path, data_dir, capsys):
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU)
    weights = final_weights(run_dir)
    loss_csv = (run_dir / "loss.csv").read_text()
    capsys.readouterr()
    train(spec, data_dir, run_dir, CPU)
    summary = read_run(run_dir)
    assert "resuming at step 40/40" in capsys.readouterr().out
    assert summary["checkpoints"] == [20, 40]
    assert_same_tensors(final_weights(run_dir), weights)
    assert (run_dir / "loss.csv").read_text() == loss_csv


def test_resume_between_log_lines_records_the_same_train_loss(tmp_path, data_dir):
    spec = make_spec(steps=60, every=30, log_every=10)
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    train(spec, data_dir, ref_dir, CPU)
    train(spec, data_dir, run_dir, CPU, stop_after_step=25)
    train(spec, data_dir, run_dir, CPU)
    assert_same_tensors(final_weights(run_dir), final_weights(ref_dir))  # the weights do agree
    for got, want in zip(list_checkpoints(run_dir), list_checkpoints(ref_dir), strict=True):
        assert got["train_loss"] == want["train_loss"], got["step"]
    assert (run_dir / "loss.csv").read_text() == (ref_dir / "loss.csv").read_text()


def test_changed_spec_starts_afresh(tmp_path, data_dir, capsys):
    spec = make_spec(steps=60, every=20)
    changed = make_spec(steps=60, every=20, lr=1e-3)
    assert spec_hash(changed) != spec_hash(spec)
    run_dir, fresh_dir = tmp_path / "run", tmp_path / "fresh"

    train(spec, data_dir, run_dir, CPU, stop_after_step=45)
    assert saved_checkpoint_steps(run_dir) == [20, 40]
    old_weights = load_file(run_dir / "ckpt" / "step_000020.safetensors")
    (run_dir / "probes").mkdir()
    (run_dir / "probes" / "heads.parquet").write_text("stale")
    capsys.readouterr()

    train(changed, data_dir, run_dir, CPU, stop_after_step=10)
    out = capsys.readouterr().out
    assert "spec changed since the saved state: starting afresh" in out
    assert "resuming" not in out
    assert saved_checkpoint_steps(run_dir) == []  # the old run's checkpoints are gone
    assert not (run_dir / "probes").exists()
    assert int(load_resume_state(run_dir)[0]["step"]) == 10
    assert last_train_step(run_dir) == 10

    train(changed, data_dir, run_dir, CPU)
    assert "resuming at step 10/60" in capsys.readouterr().out
    train(changed, data_dir, fresh_dir, CPU)
    assert_same_tensors(final_weights(run_dir), final_weights(fresh_dir))
    assert (run_dir / "loss.csv").read_text() == (fresh_dir / "loss.csv").read_text()
    first = load_file(run_dir / "ckpt" / "step_000020.safetensors")
    assert not all(torch.equal(first[k], old_weights[k]) for k in first)
    meta = json.loads((run_dir / "ckpt" / "step_000060.json").read_text())
    assert meta["spec"] == changed


def test_changed_execution_settings_keep_the_state(tmp_path, data_dir, capsys):
    spec = make_spec(steps=60, every=20)
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    train(spec, data_dir, run_dir, CPU, stop_after_step=30)
    capsys.readouterr()
    # device, threads and the progress interval say how a run executes, not what it is: they
    # are arguments of train(), not part of the spec; log_every is in it but not in the hash.
    assert not {"device", "threads", "progress_seconds"} & set(spec["training"])
    moved = copy.deepcopy(spec)
    moved["training"].update(log_every=7)
    assert spec_hash(moved) == spec_hash(spec)
    new_interval = replace(CPU, progress_seconds=0)
    train(moved, data_dir, run_dir, new_interval, stop_after_step=40)
    out = capsys.readouterr().out
    assert "resuming at step 30/60" in out and "starting afresh" not in out
    train(spec, data_dir, run_dir, CPU)
    train(spec, data_dir, ref_dir, CPU)
    assert_same_tensors(final_weights(run_dir), final_weights(ref_dir))


class Clock:
    """A wall clock that the test advances: the cadence of progress lines is a function of time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_keep_a_steady_time_interval_when_the_step_time_changes():
    clock = Clock()
    progress = Progress(seconds=1.0, step=0, clock=clock)
    lines = {}
    for step in range(1, 31):
        clock.now += 0.125 if step <= 20 else 0.5  # eight steps a second, then two a second
        progress.add(float(step))
        if progress.due(step, total_steps=30):
            lines[step] = progress.line(step, 30, tokens_per_step=1000, flops_per_token=1e6)
    assert list(lines) == [8, 16, 21, 23, 25, 27, 29, 30]  # once a second, and the last step
    assert lines[8] == (
        "step 8/30 | tokens 0.01M | loss 4.5000 | 8.0k tok/s | 8.0 GFLOP/s | ETA 0m02s"
    )  # ETA: 22 steps left at the run's mean speed so far (8 steps/s)
    assert lines[23].startswith("step 23/30 | tokens 0.02M | loss 22.5000 | 2.0k tok/s")


def test_training_log_has_progress_lines_and_ends_with_a_summary(tmp_path, data_dir, capsys):
    line = re.compile(
        r"\[(?P<run>[^\]]+)\] step (?P<step>\d+)/30 \| tokens [0-9.]+M \| loss [0-9.]+"
        r" \| [0-9.]+k tok/s \| [0-9.]+ GFLOP/s \| ETA \d+m\d\ds"
    )
    logs = {}
    for seconds in (0, 1e9):
        spec = make_spec(steps=30, every=10)
        train(spec, data_dir, tmp_path / str(seconds), replace(CPU, progress_seconds=seconds))
        out = capsys.readouterr().out.splitlines()
        steps = [int(m["step"]) for m in map(line.fullmatch, out) if m]
        assert steps == (list(range(1, 31)) if seconds == 0 else [30])
        assert re.fullmatch(
            r"\[.+\] done: 30 of 30 steps, 0\.00M of 0\.00M tokens \| final train loss [0-9.]+,"
            r" val loss [0-9.]+"
            r" \| \d+ s this session at [0-9.]+k tok/s",
            out[-1],
        ), out[-1]
        logs[seconds] = (tmp_path / str(seconds) / "loss.csv").read_text()
    assert logs[0] == logs[1e9]  # the console's cadence does not change the loss log


def test_grad_clip_null_turns_clipping_off(tmp_path, data_dir):
    spec = make_spec(steps=4, every=4, grad_clip=None)
    assert spec["training"]["grad_clip"] is None
    train(spec, data_dir, tmp_path / "run", CPU)
    summary = read_run(tmp_path / "run")
    assert summary["checkpoints"] == [4]


# --------------------------------------------------------------------------------------------
# progress.json: the record ihsweep.status reads


PROGRESS_KEYS = {"state", "step", "total_steps", "tokens", "budget", "tokens_per_second", "updated"}


def test_finished_run_records_done_with_the_whole_budget(tmp_path, data_dir):
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    before = time.time()
    train(spec, data_dir, run_dir, CPU)
    summary = read_run(run_dir)
    progress = json.loads((run_dir / PROGRESS_JSON).read_text())
    assert set(progress) == PROGRESS_KEYS | {"outcome"}  # no signal, no error
    assert progress["outcome"] == "completed"
    assert progress["state"] == "done"
    assert progress["tokens"] == progress["budget"] == 40 * B * C == summary["tokens"]
    assert progress["step"] == progress["total_steps"] == 40
    assert progress["tokens_per_second"] == summary["tokens_per_second_this_session"] > 0
    assert before <= progress["updated"] <= time.time()


def test_progress_says_running_at_every_record_while_training(tmp_path, data_dir, monkeypatch):
    records = []
    write = run_records.write_progress

    def spy(run_dir, state, step, *args, **extra):
        write(run_dir, state, step, *args, **extra)
        records.append((state, step, read_progress(run_dir)["tokens"]))

    monkeypatch.setattr(run_records, "write_progress", spy)
    spec = make_spec(steps=12, every=6)
    every_update = replace(CPU, progress_seconds=0)  # a record after every update
    train(spec, data_dir, tmp_path / "run", every_update)
    running = [("running", step, step * B * C) for step in range(13)]  # from step 0 on
    assert records == [*running, ("done", 12, 12 * B * C)]


def test_stopped_run_records_interrupted_then_done_on_resume(tmp_path, data_dir):
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    assert train(spec, data_dir, run_dir, CPU, stop_after_step=25) is Outcome.INTERRUPTED
    progress = read_progress(run_dir)
    assert set(progress) == PROGRESS_KEYS | {"signal"}
    assert progress["state"] == "interrupted" and progress["signal"] is None  # not a signal
    assert progress["step"] == 25 and progress["tokens"] == 25 * B * C
    assert progress["budget"] == 40 * B * C and progress["total_steps"] == 40
    train(spec, data_dir, run_dir, CPU)
    progress = read_progress(run_dir)
    assert progress["state"] == "done" and set(progress) == PROGRESS_KEYS | {"outcome"}


@pytest.mark.parametrize("damage", ["chunks.json missing", "train.bin truncated"])
def test_broken_data_raises_and_records_failed_with_the_cause(tmp_path, damage):
    data = make_dataset(tmp_path / "data")
    if damage == "chunks.json missing":
        (data / "chunks.json").unlink()
        error, cause = FileNotFoundError, "no chunks.json in"
    else:
        size = (data / "train.bin").stat().st_size
        os.truncate(data / "train.bin", size - 10)  # a kill mid-write: part of a chunk gone
        error, cause = DamagedFile, f"train.bin: {size - 10} bytes, its sidecar implies"
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    with pytest.raises(error, match=cause):
        train(spec, data, run_dir, CPU)
    progress = read_progress(run_dir)
    assert set(progress) == PROGRESS_KEYS | {"error"}
    assert progress["state"] == "failed"
    assert progress["error"].startswith(f"{error.__name__}: ") and cause in progress["error"]
    assert progress["step"] == progress["tokens"] == 0 and progress["budget"] == 40 * B * C
    assert not (run_dir / "run.json").exists() and not (run_dir / "ckpt").exists()


def test_error_mid_run_records_failed_at_the_last_recorded_step(tmp_path, data_dir, monkeypatch):
    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loop, "save_checkpoint", disk_full)  # the first checkpoint fails
    spec = make_spec(steps=40, every=20)
    run_dir = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        train(spec, data_dir, run_dir, replace(CPU, progress_seconds=0))
    progress = read_progress(run_dir)
    assert progress["state"] == "failed"
    assert progress["error"] == "OSError: [Errno 28] No space left on device"
    assert progress["step"] == 20 and progress["tokens"] == 20 * B * C
    assert not (run_dir / "run.json").exists()


# --------------------------------------------------------------------------------------------
# The command line: python -m ihsweep.steps.train


def cli_args(spec: dict, data_dir: Path, run_dir: Path) -> list[str]:
    return ["--spec", json.dumps(spec), "--data-dir", str(data_dir), "--run-dir", str(run_dir)]


def test_command_takes_missing_execution_flags_from_the_schema(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        train_command, "train", lambda *args, **kwargs: calls.append((args, kwargs))
    )
    spec = make_spec(steps=4, every=4)
    data, run = tmp_path / "data", tmp_path / "run"
    assert train_command.main(cli_args(spec, data, run)) == 0
    defaults = execution_of()
    assert defaults.device == "auto" and defaults.threads == 1 and defaults.progress_seconds == 15
    assert defaults.micro_batch == "auto" and defaults.train_mem_mb == 16000
    assert (defaults.compile, defaults.vocab_padding, defaults.fused_loss) == ("auto",) * 3
    assert defaults.device_profile == "auto"
    options = {"stop_after_step": None, "lease_seconds": 180.0}
    assert calls[-1] == ((spec, data, run, defaults, None), options)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    argv = ["--spec", f"@{tmp_path / 'spec.json'}", "--data-dir", str(data), "--run-dir", str(run)]
    flags = ["--device", "cpu", "--threads", "3", "--stop-after-step", "2"]
    assert train_command.main([*argv, *flags]) == 0
    cpu = replace(defaults, device="cpu", threads=3)
    assert calls[-1] == ((spec, data, run, cpu, None), {**options, "stop_after_step": 2})
    memory = ["--micro-batch", "2", "--train-mem-mb", "900"]
    assert train_command.main([*argv, *memory]) == 0
    assert calls[-1][0][3] == replace(defaults, micro_batch=2, train_mem_mb=900)
    for flag, setting in (("true", True), ("False", False), ("auto", "auto")):
        assert train_command.main([*argv, "--compile", flag, "--fused-loss", flag]) == 0
        assert calls[-1][0][3] == replace(defaults, compile=setting, fused_loss=setting)
    paths = ["--vocab-padding", "64", "--device-profile", "h100.json"]
    assert train_command.main([*argv, *paths]) == 0
    assert calls[-1][0][3] == replace(defaults, vocab_padding=64, device_profile="h100.json")
    with pytest.raises(ConfigError, match="execution.compile"):
        train_command.main([*argv, "--compile", "maybe"])


def test_command_passes_the_progress_interval(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(train_command, "train", lambda *args, **kwargs: calls.append(args))
    argv = cli_args(make_spec(steps=4, every=4), tmp_path / "data", tmp_path / "run")
    assert train_command.main([*argv, "--progress-seconds", "0"]) == 0
    assert calls[-1][3] == execution_of({"progress_seconds": 0})


def test_command_trains_stops_and_resumes(tmp_path, data_dir, capsys):
    spec = make_spec(steps=20, every=10)
    run_dir = tmp_path / "run"
    argv = [*cli_args(spec, data_dir, run_dir), "--device", "cpu", "--threads", "1"]
    assert train_command.main([*argv, "--stop-after-step", "5"]) == 0
    assert read_progress(run_dir)["state"] == "interrupted"
    assert not (run_dir / "run.json").exists()
    assert train_command.main(argv) == 0
    assert "resuming at step 5/20" in capsys.readouterr().out
    summary = json.loads((run_dir / "run.json").read_text())
    assert summary["device"] == "cpu" and summary["checkpoints"] == [10, 20]
    progress = read_progress(run_dir)
    assert progress["state"] == "done" and progress["tokens"] == progress["budget"] == 20 * B * C


def test_command_on_broken_data_fails_and_says_why(tmp_path):
    data = make_dataset(tmp_path / "data")
    (data / "chunks.json").unlink()
    run_dir = tmp_path / "run"
    argv = [*cli_args(make_spec(steps=4, every=4), data, run_dir), "--device", "cpu"]
    with pytest.raises(FileNotFoundError, match="chunks.json"):
        train_command.main(argv)
    progress = read_progress(run_dir)
    assert progress["state"] == "failed" and "chunks.json" in progress["error"]


# --------------------------------------------------------------------------------------------
# Learning-rate schedule


def test_lr_at_warmup_then_cosine_to_zero():
    lr, total = 0.01, 100  # warmup: round(0.1 * 100) = 10 steps
    assert lr_at(0, total, lr, 0.1) == pytest.approx(0.001)
    assert lr_at(4, total, lr, 0.1) == pytest.approx(0.005)
    assert lr_at(9, total, lr, 0.1) == pytest.approx(0.01)
    # Cosine over the remaining 90 steps: progress (step - 10) / 90.
    assert lr_at(10, total, lr, 0.1) == pytest.approx(0.01)
    assert lr_at(40, total, lr, 0.1) == pytest.approx(0.01 * 0.5 * (1 + math.cos(math.pi / 3)))
    assert lr_at(40, total, lr, 0.1) == pytest.approx(0.0075)
    assert lr_at(55, total, lr, 0.1) == pytest.approx(0.005)
    assert lr_at(70, total, lr, 0.1) == pytest.approx(0.0025)
    assert lr_at(99, total, lr, 0.1) == pytest.approx(
        0.01 * 0.5 * (1 + math.cos(math.pi * 89 / 90))
    )
    assert lr_at(99, total, lr, 0.1) < 1e-5
    assert lr_at(100, total, lr, 0.1) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(150, total, lr, 0.1) == pytest.approx(0.0, abs=1e-15)  # clamped, not rising
    values = [lr_at(s, total, lr, 0.1) for s in range(total)]
    assert max(values) == pytest.approx(lr)
    assert all(a < b for a, b in itertools.pairwise(values[:10]))
    assert all(a > b for a, b in itertools.pairwise(values[10:]))


def test_lr_at_without_warmup_and_short_runs():
    # No warmup: warmup = max(1, 0) = 1 step at the peak, then cosine over the other 9.
    assert lr_at(0, 10, 0.5, 0.0) == pytest.approx(0.5)
    assert lr_at(1, 10, 0.5, 0.0) == pytest.approx(0.5)
    assert lr_at(2, 10, 0.5, 0.0) == pytest.approx(0.5 * 0.5 * (1 + math.cos(math.pi / 9)))
    # The default 1% warmup of a 300-step run: round(3.0) = 3 steps.
    assert [lr_at(s, 300, 3e-3, 0.01) for s in range(3)] == pytest.approx([1e-3, 2e-3, 3e-3])
    # A one-step run trains at the peak.
    assert lr_at(0, 1, 0.5, 0.01) == pytest.approx(0.5)


# --------------------------------------------------------------------------------------------
# ChunkSampler


def identity_chunks(n: int, context: int = 4) -> np.ndarray:
    """Chunk i is [i, i, ..., i], so a batch tells which chunks it holds."""
    return np.repeat(np.arange(n, dtype=np.uint16)[:, None], context, axis=1)


def rows_of(batch: torch.Tensor) -> list[int]:
    assert (batch == batch[:, :1]).all()
    return batch[:, 0].tolist()


def flat_order(sampler: ChunkSampler, steps: int) -> list[int]:
    return [row for step in range(steps) for row in rows_of(sampler.batch(step))]


@pytest.mark.parametrize(("n", "batch_size"), [(10, 4), (12, 4), (3, 8), (7, 1)])
def test_sampler_covers_every_chunk_once_per_epoch(n, batch_size):
    sampler = ChunkSampler(identity_chunks(n), batch_size, seed=3)
    epochs = 4
    order = flat_order(sampler, math.ceil(epochs * n / batch_size))
    for e in range(epochs):
        assert sorted(order[e * n : (e + 1) * n]) == list(range(n)), f"epoch {e}"


def test_sampler_batch_is_a_pure_function_of_seed_and_step():
    chunks = identity_chunks(10)
    ahead = ChunkSampler(chunks, 4, seed=5)
    forward = {step: ahead.batch(step) for step in range(12)}
    # A fresh sampler asked in another order (epochs revisited, as after a resume) agrees.
    jumping = ChunkSampler(chunks, 4, seed=5)
    for step in [11, 0, 7, 2, 2, 9, 5, 1, 10, 3, 8, 6, 4]:
        assert torch.equal(jumping.batch(step), forward[step]), step
    batch = forward[0]
    assert batch.dtype == torch.int64 and batch.shape == (4, 4)


def test_sampler_seeds_and_epochs_differ():
    n = 50
    chunks = identity_chunks(n)
    orders = {seed: flat_order(ChunkSampler(chunks, 5, seed), 2 * n // 5) for seed in (0, 1)}
    assert orders[0][:n] != orders[1][:n]
    assert orders[0][:n] != orders[0][n:], "each epoch needs a fresh permutation"
    assert orders[0][:n] != list(range(n)), "chunks must be shuffled"


def test_sampler_batch_across_an_epoch_boundary():
    n, batch_size = 10, 4  # batch 2 holds flat positions 8..11: 2 rows of epoch 0, 2 of epoch 1
    sampler = ChunkSampler(identity_chunks(n), batch_size, seed=11)
    b = [rows_of(sampler.batch(step)) for step in range(5)]  # flat 0..19: epochs 0 and 1
    epoch0 = b[0] + b[1] + b[2][:2]
    epoch1 = b[2][2:] + b[3] + b[4]
    assert sorted(epoch0) == list(range(n)) == sorted(epoch1)
    assert epoch0 != epoch1
    # Asked first, before any other batch of either epoch, the boundary batch is the same.
    assert rows_of(ChunkSampler(identity_chunks(n), batch_size, seed=11).batch(2)) == b[2]


def first_sampler_rows(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The rows of step ``step`` as ChunkSampler first drew them (for every position of the
    batch, its epoch's permutation); it was made faster since, but its batches must never
    change: a resumed run of an existing study would no longer match its first part."""
    flat = np.arange(step * batch_size, (step + 1) * batch_size)
    rows = np.empty(batch_size, dtype=np.int64)
    for epoch in np.unique(flat // n):
        sel = flat // n == epoch
        rows[sel] = np.random.default_rng([seed, int(epoch)]).permutation(n)[flat[sel] % n]
    return rows.tolist()


@pytest.mark.parametrize(("n", "batch_size"), [(10, 4), (12, 4), (3, 8), (7, 1), (96, 4), (50, 16)])
def test_sampler_batches_are_those_of_the_first_implementation(n, batch_size, tmp_path):
    path = tmp_path / "chunks.bin"
    identity_chunks(n).tofile(path)
    memmap = np.memmap(path, dtype=np.uint16, mode="r", shape=(n, 4))  # as open_chunks gives
    steps = [*range(4 * n // batch_size + 2), 12345, 10**6]
    for seed in (0, 5):
        samplers = [
            ChunkSampler(chunks, batch_size, seed) for chunks in (identity_chunks(n), memmap)
        ]
        for sampler in samplers:
            for step in steps:
                want = first_sampler_rows(n, batch_size, seed, step)
                assert rows_of(sampler.batch(step)) == want, (seed, step)


# --------------------------------------------------------------------------------------------
# Checkpoint files


def test_checkpoint_files(tmp_path, data_dir):
    spec = make_spec(steps=50, every=20, log_every=5)
    assert spec["checkpoint_steps"] == [20, 40, 50]
    run_dir = tmp_path / "run"
    train(spec, data_dir, run_dir, CPU)
    summary = read_run(run_dir)

    cfg = GPTConfig(vocab_size=V, **spec["model_config"])
    model = GPT(cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    metas = list_checkpoints(run_dir)
    assert [m["step"] for m in metas] == spec["checkpoint_steps"] == summary["checkpoints"]
    for meta in metas:
        step = meta["step"]
        weights = Path(meta["weights"])
        assert weights.name == f"step_{step:06d}.safetensors"
        tensors = load_file(weights)
        assert {name: tuple(t.shape) for name, t in tensors.items()} == shapes
        assert all(t.dtype == torch.float32 for t in tensors.values())
        model.load_state_dict(tensors)  # strict: the names are the model's own
        with safe_open(weights, "pt") as f:
            assert f.metadata() == {"step": str(step)}

        assert meta["tokens"] == step * B * C
        assert meta["n_params"] == model.n_params()
        assert meta["model_config"] == cfg.to_dict() == {"vocab_size": V, **spec["model_config"]}
        assert meta["spec"] == spec
        assert meta["run_id"] == spec["run_id"]
        assert math.isfinite(meta["train_loss"]) and math.isfinite(meta["val_loss"])
        assert 0 < meta["val_loss"] < 2 * math.log(V)
    # The val loss of each checkpoint is also in loss.csv.
    val = {int(r[0]): float(r[3]) for r in loss_rows(run_dir) if r[2] == "val"}
    assert val == {m["step"]: pytest.approx(m["val_loss"], abs=1e-6) for m in metas}

    # The final checkpoint is the model of the resume state.
    state = load_resume_state(run_dir)[0]
    assert int(state["step"]) == 50
    assert_same_tensors(load_file(metas[-1]["weights"]), state["model"])

    assert summary["steps"] == 50 and summary["tokens"] == 50 * B * C
    assert summary["n_params"] == model.n_params()
    leftovers = [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


def test_failed_writes_keep_the_old_files_and_leave_no_temporary(tmp_path):
    """A write that fails half-way (as a kill would) never replaces a complete file."""
    model = GPT(GPTConfig(vocab_size=V, n_ctx=C, n_layer=1, n_head=2, d_model=8, mlp=True))
    save_checkpoint(tmp_path, 5, model, {"tokens": 5 * B * C})
    save_resume_state(tmp_path, {"step": 5, "model": model.state_dict()})
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    names = [p.name for p in files]
    assert names == ["step_000005.json", "step_000005.safetensors", "resume.json", "resume.pt"]
    before = {p: p.read_bytes() for p in files}

    shared = torch.nn.Module()  # safetensors refuses tensors that share memory
    weight = torch.zeros(3)
    shared.register_buffer("a", weight)
    shared.register_buffer("b", weight)
    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 5, shared, {"tokens": 5 * B * C})
    with pytest.raises(TypeError):  # fails after the JSON's first lines are out
        save_checkpoint(tmp_path, 5, model, {"tokens": object()})
    with pytest.raises(Exception, match="pickle"):
        save_resume_state(tmp_path, {"step": 6, "model": lambda: None})

    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files  # no *.tmp left
    assert {p: p.read_bytes() for p in files} == before
    assert int(load_resume_state(tmp_path)[0]["step"]) == 5
    assert [m["step"] for m in list_checkpoints(tmp_path)] == [5]


def test_capturable_update_follows_todays_update_for_200_steps(tmp_path, data_dir, capsys):
    """``execution.capturable_update: true`` forced on the CPU (its ``auto`` is today's update
    there): the learning rate is one fp64 tensor written in place and bound to every group,
    the clipping never reads the norm on the host, and the loss curve of 200 updates equals
    today's to float rounding. The tolerance is that of loss.csv's six decimals: on the CPU
    both updates do the same arithmetic (a scale of exactly 1 multiplies nothing away; the
    fp64 tensor holds the float it replaces), so any difference is a rounding of the print."""
    spec = make_spec(steps=200, every=100, grad_clip=0.5)  # a clip that acts on some updates
    assert Job.build(spec, data_dir, CPU).held_lr is None  # auto: today's update
    job = Job.build(spec, data_dir, replace(CPU, capturable_update=True))
    held = job.held_lr
    job.set_lr(1e-3)
    assert all(group["lr"] is held for group in job.optim.param_groups) and held.item() == 1e-3
    job.set_lr(2e-3)
    assert held.item() == 2e-3 and job.held_lr is held  # the same tensor, written in place
    runs = {}
    for name, capturable in (("today", "auto"), ("capturable", True)):
        train(spec, data_dir, tmp_path / name, replace(CPU, capturable_update=capturable))
        rows = [r for r in loss_rows(tmp_path / name) if r[2] == "train"]
        runs[name] = np.array([float(r[3]) for r in rows]), final_weights(tmp_path / name)
    assert "capturable update" in capsys.readouterr().out
    (today, today_weights), (capturable, weights) = runs["today"], runs["capturable"]
    assert len(today) == 200
    np.testing.assert_allclose(capturable, today, rtol=0, atol=1.5e-6)
    for name, weight in today_weights.items():
        torch.testing.assert_close(weights[name], weight, rtol=1e-6, atol=1e-7)
