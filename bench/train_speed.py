"""Training speed of the project's trainer, and the device profile the cost model needs.

    python bench/train_speed.py                                   # CUDA, the paper model
    python bench/train_speed.py --out results/bench/my-gpu.json   # then, in the study:
        execution: {device_profile: results/bench/my-gpu.json}
    python bench/train_speed.py --device cpu --threads 2 --cells 8x64 --steps 3 --quick
    python bench/train_speed.py --compile                         # each cell eager and compiled
    python bench/train_speed.py --compare [--quick] [--compile]   # trainer vs a minimal loop

For each (B, C) cell it times ``ihsweep.training.loop.train_step``, the very function the
trainer runs (micro-batches, chunked loss, AdamW, clipping, bf16 autocast on CUDA), on random
tokens, with no host synchronisation between steps (only before and after the timed stretch;
on the CPU with the allocator tuned as a training job tunes it, ``loop.keep_freed_memory``),
and prints tokens/s, seconds per step, model FLOP utilisation against the device's measured
matmul peak (bf16 on CUDA, fp32 on the CPU) and peak memory. It then fits
``seconds per step = passes * step_overhead + tokens * flops_per_token / (peak * mfu)`` over
the cells (least squares) and writes the profile ``{peak_tflops, mfu, step_overhead_ms,
memory_gb}`` with every measured cell. ``--compile`` also times each cell with
``execution.compile``'s compiled loss (compiled afresh per cell; the warm-up steps' wall time,
compiling included, is printed); the profile stays eager's, the default setting.

The default model is the paper's (2 layers, 8 heads, width 768, MLP, GPT-2's vocabulary of
50,257); ``--vocab 50304`` measures the vocabulary padded to a multiple of 64.

``--compare`` times the whole trainer, ``ihsweep.training.loop.train()`` itself (on a chunk
folder of random tokens in a temporary directory, the default study's hyperparameters, one
checkpoint at the end), against a minimal nanoGPT-style loop on the same GPT, the same batches
(read from the same memmap in the trainer's order), fused AdamW with the same settings and
schedule, clipping at 1.0, for the default study's models and vocabularies (``--cells``:
``model:BxC:vocabulary``, models w32, w48, w64 of config.yaml). Each runs in a process of its
own, started afresh for each cell as a training job starts (the trainer tunes its process's
allocator, the minimal loop keeps glibc's defaults). The two take turns a block of ~0.1 s of
steps at a time, so that both see the same load of a busy machine, for ``--rounds`` rounds
(after an untimed run each); it prints tokens/s of both after the first ``--warmup`` steps,
their ratio (trainer / minimal) per round and the median, the page faults a step, and whether
both ended with the same weights (on the CPU they must, bit for bit; CUDA's kernels need not be
deterministic). On the CPU with one thread the clock is the process's CPU time, which a loaded
machine disturbs less than wall time (a worker waiting for its turn uses none); on this 2-core
machine under load, two workers running the same loop measured ratios of 0.98-1.01.
``--compile`` adds the trainer with ``execution.compile: true`` (its first round compiles into
an empty inductor cache, the later ones from the warm cache), its compile warm-up (the wall time
of its first steps) and what each would take for a 4M-token run. ``--quick``: 2 short rounds,
under a minute for the three default cells.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import platform
import queue
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from ihsweep import cost  # noqa: E402
from ihsweep.steps._args import micro_batch_arg  # noqa: E402
from ihsweep.training import loop  # noqa: E402
from ihsweep.training.execution import pick_device, resolve_micro_batch  # noqa: E402
from ihsweep.training.step import train_step  # noqa: E402
from ihsweep.training.model import GPT, GPTConfig  # noqa: E402

PAPER_CELLS = "8x64,32x256,256x1024"
# --compare: the default study's models at its Markov cell (vocabulary 256) and its natural-text
# middle cell (BPE vocabulary 2,048), trained with its training settings (config.yaml).
COMPARE_CELLS = "w64:8x32:256,w64:16x32:2048,w32:16x32:2048"
DEFAULT_STUDY = Path(__file__).resolve().parents[1] / "config.yaml"


def default_study() -> dict:
    """config.yaml as written (its models and training: the one home of those settings)."""
    from ihsweep.config import load_configfiles

    return load_configfiles([DEFAULT_STUDY])


def measured_peak_tflops(device: torch.device) -> float:
    """Sustained matmul TFLOP/s: bf16 on CUDA (what autocast runs), fp32 on the CPU."""
    n = 8192 if device.type == "cuda" else 1024
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    repeats = 20 if device.type == "cuda" else 5
    for _ in range(2):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # the process's


def time_cell(
    cfg: GPTConfig, B: int, C: int, args, device: torch.device, peak: float, compiled=False
) -> dict:
    """One cell's step, eager or with ``execution.compile``'s compiled loss (``compiled``: the
    warm-up steps compile it; their wall time is the row's ``warmup_seconds``)."""
    torch.manual_seed(0)
    if compiled:
        torch._dynamo.reset()  # each cell compiles afresh, as a training job does
    loss_fn = loop.compiled_loss() if compiled else loop.next_token_loss
    model = GPT(cfg).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=2.5e-4, fused=True)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )
    micro_batch = resolve_micro_batch(args.micro_batch, cfg, B, C, device, args.memory_mb)
    passes = len(cost.micro_batch_sizes(B, micro_batch))
    generator = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg.vocab_size, (B, C), generator=generator).to(device)
        for _ in range(min(4, args.steps))
    ]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i in range(args.warmup):
        train_step(model, optim, batches[i % len(batches)], micro_batch, autocast, 1.0, loss_fn)
    synchronize(device)
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(args.steps):
        train_step(model, optim, batches[i % len(batches)], micro_batch, autocast, 1.0, loss_fn)
    synchronize(device)
    seconds = (time.perf_counter() - start) / args.steps
    fpt = cost.flops_per_token(cfg.to_dict(), cfg.vocab_size, C)
    tokens_per_second = B * C / seconds
    row = {
        "batch_size": B,
        "context_size": C,
        "micro_batch": micro_batch,
        "passes": passes,
        "seconds_per_step": round(seconds, 6),
        "tokens_per_second": round(tokens_per_second, 1),
        "flops_per_token": fpt,
        "mfu": round(tokens_per_second * fpt / (peak * 1e12), 4),
        "peak_memory_gb": round(peak_memory_gb(device), 3),
        "compiled": compiled,
        "warmup_seconds": round(warmup_seconds, 2),
        "estimated_memory_gb": round(
            cost.peak_memory(cfg.to_dict(), cfg.vocab_size, micro_batch, C, device.type)["total"]
            / 1e9,
            3,
        ),
    }
    del model, optim, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def fit_profile(cells: list[dict], peak: float, device: torch.device) -> dict:
    """Least squares of seconds = passes * overhead + work / throughput over the cells."""
    design = np.array([[c["passes"], c["batch_size"] * c["context_size"] * c["flops_per_token"]]
                       for c in cells], dtype=float)  # fmt: skip
    seconds = np.array([c["seconds_per_step"] for c in cells])
    if len(cells) >= 2:
        (overhead, inverse_throughput), *_ = np.linalg.lstsq(design, seconds, rcond=None)
        overhead = max(float(overhead), 0.0)
        if inverse_throughput <= 0:  # overhead alone explains it: use the largest cell
            inverse_throughput = seconds[-1] / design[-1, 1]
    else:  # one cell: no overhead can be told apart
        overhead, inverse_throughput = 0.0, seconds[0] / design[0, 1]
    throughput = 1 / float(inverse_throughput)  # FLOP/s sustained
    memory = None
    if device.type == "cuda":
        memory = round(torch.cuda.get_device_properties(device).total_memory / 1e9, 1)
    return {
        "peak_tflops": round(peak, 2),
        "mfu": round(throughput / (peak * 1e12), 4),
        "step_overhead_ms": round(overhead * 1e3, 3),
        "memory_gb": memory,
    }


# --------------------------------------------------------------------------------------------
# --compare: the trainer against a minimal loop


def compare_cells(text: str) -> list[dict]:
    cells = []
    for item in text.split(","):
        model, shape, vocab = item.split(":")
        B, C = (int(v) for v in shape.split("x"))
        cells.append({"name": item, "model": model, "B": B, "C": C, "vocab": int(vocab)})
    return cells


def write_random_chunks(root: Path, vocab: int, context: int, n_train: int, seed: int) -> Path:
    """A chunk folder of uniformly random tokens."""
    from ihsweep.data.chunks import write_chunks

    rng = np.random.default_rng(seed)
    splits = {split: rng.integers(0, vocab, (n, context)) for split, n in
              (("train", n_train), ("val", 64))}  # fmt: skip
    return write_chunks(root, splits, vocab)


def study_spec(cell: dict, steps: int) -> dict:
    """The trainer's spec of a one-run study of ``cell``, ``steps`` updates, one checkpoint.
    (The trainer takes the vocabulary from the chunk folder; the dataset entry only validates.)"""
    from ihsweep.config import prepare

    tokens = steps * cell["B"] * cell["C"]
    study_config = default_study()
    config = {
        "models": {cell["model"]: study_config["models"][cell["model"]]},
        "datasets": {
            "bench": {
                "family": "natural",
                "corpus": {"source": "kjv"},
                "tokenizer": {"kind": "bpe", "vocab_size": max(258, cell["vocab"])},
            }
        },
        "runs": [
            {
                "data": "bench",
                "model": cell["model"],
                "batch_size": cell["B"],
                "context_size": cell["C"],
                "seed": 0,
            }
        ],
        "training": {**study_config["training"], "val_batches": 1, "tokens": tokens},
        "checkpoints": {"tokens": [tokens]},
    }
    study = prepare(config)
    return study.train_spec(study.runs[0])


def weights_digest(tensors: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Clock:
    """Seconds by ``kind``: wall, or the process's CPU time (one thread on a loaded machine);
    on CUDA each mark waits for the device first."""

    def __init__(self, kind: str, device: torch.device):
        self.kind, self.device = kind, device

    def __call__(self) -> float:
        return time.process_time() if self.kind == "cpu" else time.perf_counter()

    def marks(self) -> tuple[float, float, int]:
        """Wall time, this clock's time, page faults (minor: memory the process touched anew)."""
        synchronize(self.device)
        return time.perf_counter(), self(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# The worker processes take turns: each runs `block` steps when handed the baton, then hands it
# back (and waits), so the runs compared see the same load of a busy machine within a fraction
# of a second; a worker waiting for its turn uses no CPU time.
BATON: dict = {}


def init_worker(go, done, kind: str) -> None:
    BATON.update(go=go, done=done, kind=kind)


class Turns:
    """A worker's side of the baton: wait for the first turn, hand it back every ``block``
    steps (once its device has finished them), and at the end."""

    def __init__(self, block: int, device: torch.device):
        self.block, self.device = block, device
        BATON["go"].acquire()

    def after(self, step: int) -> None:
        if step % self.block == 0:
            synchronize(self.device)
            BATON["done"].put((BATON["kind"], "block"))
            BATON["go"].acquire()

    def last(self) -> None:
        BATON["done"].put((BATON["kind"], "last"))


def timing(marks: dict, steps: int, warmup: int, tokens_per_step: int) -> dict:
    """Tokens/s and page faults a step after the first ``warmup`` steps, and the wall seconds of
    those steps."""
    (_, start, faults), (_, end, end_faults) = marks[warmup], marks["end"]
    return {
        "tokens_per_second": (steps - warmup) * tokens_per_step / (end - start),
        "faults_per_step": (end_faults - faults) / (steps - warmup),
        "warmup_seconds": marks[warmup][0] - marks[0][0],
        "steps": steps,
    }


def run_trainer(
    spec: dict, data_dir: str, run_dir: str, warmup: int, block: int, clock: str, device: str,
    threads: int, compile: bool, cache_dir: str,
) -> dict:  # fmt: skip
    """``loop.train()`` on the chunk folder, timed by the marks its ``Progress`` sees: the loop
    calls ``due()`` after every update and ``line()`` at the last one."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    if compile:
        torch._dynamo.reset()  # compile this run afresh (from the inductor cache, if warm)
    tick = Clock(clock, pick_device(device))
    marks: dict = {}

    class Timed(loop.Progress):
        def __init__(self, seconds, step, *args, **kwargs):
            super().__init__(seconds, step, *args, **kwargs)
            self.turns = Turns(block, tick.device)
            marks[0] = tick.marks()

        def due(self, step, total_steps):
            if step - self.start_step == warmup:
                marks[warmup] = tick.marks()
            if step < total_steps:
                self.turns.after(step)
            return super().due(step, total_steps)

        def line(self, step, *args):  # at the last step, once the losses reached the host
            marks["end"] = tick.marks()
            self.turns.last()
            return super().line(step, *args)

    original, loop.Progress = loop.Progress, Timed
    # compile only when asked, so that the trainer of a commit before the setting runs too
    compile_setting = {"compile": True} if compile else {}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            execution = (device, threads, 10**9, "auto", 16000)  # one progress line
            loop.train(spec, Path(data_dir), Path(run_dir), *execution, **compile_setting)
    finally:
        loop.Progress = original
    from ihsweep.training.checkpoints import list_checkpoints
    from safetensors.torch import load_file

    weights = load_file(list_checkpoints(Path(run_dir))[-1]["weights"])
    shutil.rmtree(run_dir, ignore_errors=True)
    B, C = spec["batch_size"], spec["context_size"]
    return {**timing(marks, spec["total_steps"], warmup, B * C), "digest": weights_digest(weights)}


def run_minimal(
    spec: dict, data_dir: str, warmup: int, block: int, clock: str, device: str, threads: int
) -> dict:
    """A minimal nanoGPT-style loop: the same model, batches, optimiser, schedule and clipping
    as the trainer's spec (and on CUDA its bf16 autocast and TF32), nothing else: no
    checkpoints, the losses read at the end."""
    import torch.nn.functional as F
    from ihsweep.data.chunks import open_chunks, read_chunks_meta

    torch.set_num_threads(threads)
    dev = pick_device(device)
    autocast = contextlib.nullcontext()
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    B, C, steps, seed, t = (spec["batch_size"], spec["context_size"], spec["total_steps"],
                            spec["seed"], spec["training"])  # fmt: skip
    data = open_chunks(data_dir, "train")
    # The trainer's order of chunks, drawn before the clock starts; each step reads its batch.
    sampler = loop.ChunkSampler(np.arange(len(data))[:, None], B, seed)
    order = [sampler.batch(step)[:, 0].numpy() for step in range(steps)]
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=read_chunks_meta(data_dir)["vocab_size"], **spec["model_config"])
    model = GPT(cfg).to(dev)
    optim = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                              eps=t["eps"], weight_decay=t["weight_decay"], fused=True)  # fmt: skip
    tick = Clock(clock, dev)
    turns = Turns(block, dev)
    marks, losses = {0: tick.marks()}, []
    for step in range(steps):
        lr = loop.lr_at(step, steps, t["lr"], t["warmup_fraction"])
        for group in optim.param_groups:
            group["lr"] = lr
        x = torch.from_numpy(data[order[step]].astype(np.int64)).to(dev)
        with autocast:
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step + 1 == warmup:
            marks[warmup] = tick.marks()
        if step + 1 < steps:
            turns.after(step + 1)
    torch.stack(losses).tolist()
    marks["end"] = tick.marks()
    turns.last()
    return {**timing(marks, steps, warmup, B * C), "digest": weights_digest(model.state_dict())}


def kilo(tps: float) -> str:
    return f"{tps / 1e3:.1f}k"


class Workers:
    """One worker process per kind of run (spawned: a fresh interpreter with glibc's default
    allocator, as a job starts), taking turns by the baton."""

    def __init__(self, kinds: list[str], stack: contextlib.ExitStack):
        spawn = multiprocessing.get_context("spawn")
        self.done = spawn.Queue()
        self.go = {kind: spawn.Semaphore(0) for kind in kinds}
        self.pools = {
            kind: stack.enter_context(concurrent.futures.ProcessPoolExecutor(
                1, mp_context=spawn, initializer=init_worker,
                initargs=(self.go[kind], self.done, kind)))
            for kind in kinds
        }  # fmt: skip

    def run(self, tasks: dict) -> dict:
        """Run ``{kind: (function, *args)}`` at once, a block of steps at a time in turn, in the
        order given; their results by kind."""
        futures = {kind: self.pools[kind].submit(*task) for kind, task in tasks.items()}
        running, results = list(tasks), {}
        while running:
            for kind in list(running):
                self.go[kind].release()
                while True:
                    try:
                        who, what = self.done.get(timeout=1)
                        break
                    except queue.Empty:
                        if futures[kind].done():
                            futures[kind].result()  # raises the worker's error
                            raise RuntimeError(
                                f"the {kind} worker ended before its last turn"
                            ) from None
                assert who == kind, (who, kind)
                if what == "last":
                    results[kind] = futures[kind].result()  # its checkpoint, before the next
                    running.remove(kind)
        return results


def compare(args) -> int:
    """The trainer against the minimal loop (and the compiled trainer), cell by cell."""
    device = args.device or "auto"
    clock = "cpu" if pick_device(device).type == "cpu" and args.threads == 1 else "wall"
    run = {
        "device": device,
        "threads": args.threads,
        "clock": clock,
        "warmup": 5 if args.warmup is None else args.warmup,
        "rounds": args.rounds or (2 if args.quick else 5),
        "seconds": args.seconds or (0.4 if args.quick else 1.5),  # per timed run
        "kinds": ["trainer", "minimal"] + (["compiled"] if args.compile else []),
    }
    print(f"the trainer (loop.train) and a minimal loop, {device}, {args.threads} thread(s), "
          f"{run['rounds']} rounds taking turns every ~0.1 s; tokens/s of {clock} time after "
          f"{run['warmup']} steps; torch {torch.__version__}", flush=True)  # fmt: skip
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for cell in compare_cells(args.cells or COMPARE_CELLS):
            with contextlib.ExitStack() as stack:  # fresh workers for each cell, as jobs start
                workers = Workers(run["kinds"], stack)
                records.append(compare_cell(cell, run, workers, Path(tmp)))
    print()
    for record in records:
        print(record["line"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"torch": torch.__version__, "clock": clock, "cells": records}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def compare_cell(cell: dict, run: dict, workers: Workers, tmp: Path, turn: float = 0.1):
    """The rounds of one cell; each worker takes turns of ~``turn`` seconds of steps. The
    compiled trainer's first round compiles into an empty inductor cache (of this cell)."""
    warmup, kinds, tag = run["warmup"], run["kinds"], cell["name"].replace(":", "-")
    data = write_random_chunks(tmp / tag, cell["vocab"], cell["C"], 4096, seed=0)

    def task(kind: str, spec: dict, block: int, name: str) -> tuple:
        common = (warmup, block, run["clock"], run["device"], run["threads"])
        if kind == "minimal":
            return (run_minimal, spec, str(data), *common)
        run_dir = str(tmp / f"run-{tag}-{kind}-{name}")
        return (run_trainer, spec, str(data), run_dir, *common, kind == "compiled",
                str(tmp / f"inductor-{tag}"))  # fmt: skip

    # Untimed: the eager workers' first run of this shape, which sizes the timed runs.
    probe = study_spec(cell, warmup + 20)
    first = workers.run({kind: task(kind, probe, 10**9, "probe") for kind in kinds[:2]})
    step_rate = first["minimal"]["tokens_per_second"] / (cell["B"] * cell["C"])
    block = max(1, round(turn * step_rate))
    spec = study_spec(cell, max(warmup + 10, round(run["seconds"] * step_rate)))
    rows = {kind: [] for kind in kinds}
    for r in range(run["rounds"]):
        order = kinds if r % 2 == 0 else kinds[::-1]
        results = workers.run({kind: task(kind, spec, block, str(r)) for kind in order})
        for kind in kinds:
            rows[kind].append(results[kind])
        trainer, minimal = results["trainer"], results["minimal"]
        ratio = trainer["tokens_per_second"] / minimal["tokens_per_second"]
        extra = ""
        if "compiled" in results:
            c = results["compiled"]
            extra = (f" | compiled {kilo(c['tokens_per_second'])}"
                     f" (first {warmup} steps {c['warmup_seconds']:.1f} s)")  # fmt: skip
        print(f"  {cell['name']:16s} round {r + 1}: trainer {kilo(trainer['tokens_per_second'])}"
              f" minimal {kilo(minimal['tokens_per_second'])} tok/s, ratio {ratio:.3f}{extra}",
              flush=True)  # fmt: skip
    return summarise(cell, spec, rows, warmup, "compiled" in kinds)


def summarise(cell: dict, spec: dict, rows: dict, warmup: int, compiled: bool) -> dict:
    median = {
        kind: statistics.median(r["tokens_per_second"] for r in runs) for kind, runs in rows.items()
    }
    ratios = [
        a["tokens_per_second"] / b["tokens_per_second"]
        for a, b in zip(rows["trainer"], rows["minimal"], strict=True)
    ]
    digests = {r["digest"] for runs in (rows["trainer"], rows["minimal"]) for r in runs}
    faults = {
        kind: statistics.median(r["faults_per_step"] for r in runs) for kind, runs in rows.items()
    }
    record = {
        "cell": cell["name"],
        "steps": spec["total_steps"],
        "trainer_tokens_per_second": round(median["trainer"], 1),
        "minimal_tokens_per_second": round(median["minimal"], 1),
        "ratio_median": round(statistics.median(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "same_weights": len(digests) == 1,
        "faults_per_step": {kind: round(n, 1) for kind, n in faults.items()},
    }
    record["line"] = (
        f"{cell['name']:18s} trainer {kilo(median['trainer'])} tok/s, minimal "
        f"{kilo(median['minimal'])}: ratio {record['ratio_median']:.3f} (median of "
        f"{len(ratios)}; {min(ratios):.3f}-{max(ratios):.3f}); same final weights: "
        f"{'yes' if record['same_weights'] else 'NO'}; page faults a step: trainer "
        f"{faults['trainer']:.0f}, minimal {faults['minimal']:.0f}"
    )
    if compiled:
        runs = rows["compiled"]
        tps = median["compiled"]
        cold = runs[0]["warmup_seconds"]
        warm = statistics.median(r["warmup_seconds"] for r in runs[1:]) if len(runs) > 1 else cold
        eager_warm = statistics.median(r["warmup_seconds"] for r in rows["trainer"])
        run_tokens = default_study()["training"]["tokens"]  # a default-study run's budget
        steps = run_tokens // (cell["B"] * cell["C"])
        eager_total = eager_warm + (steps - warmup) * cell["B"] * cell["C"] / median["trainer"]
        rest = (steps - warmup) * cell["B"] * cell["C"] / tps
        record.update(
            compiled_tokens_per_second=round(tps, 1),
            compiled_speedup=round(tps / median["trainer"], 4),
            compile_warmup_cold_seconds=round(cold, 2),
            compile_warmup_warm_seconds=round(warm, 2),
            run_seconds_eager=round(eager_total, 1),
            run_seconds_compiled_cold=round(cold + rest, 1),
            run_seconds_compiled_warm=round(warm + rest, 1),
        )
        record["line"] += (
            f"\n{'':18s} compiled {kilo(tps)} tok/s ({tps / median['trainer']:.2f}x eager), "
            f"first {warmup} steps {cold:.1f} s (empty cache) / {warm:.1f} s (warm cache);"
            f" a {run_tokens / 1e6:.0f}M-token run: eager {eager_total:.0f} s, compiled "
            f"{cold + rest:.0f} s (empty cache) / {warm + rest:.0f} s (warm cache)"
        )
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/train_speed.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", help="cuda, cuda:N, cpu or auto (default: cuda; --compare: auto)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument(
        "--cells",
        help=f"BxC,BxC,... (default: {PAPER_CELLS}); with --compare "
        f"model:BxC:vocabulary,... (default: {COMPARE_CELLS})",
    )
    p.add_argument("--model", default="2,8,768,1", help="n_layer,n_head,d_model,mlp")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--steps", type=int, default=20, help="timed steps per cell (not --compare)")
    p.add_argument(
        "--warmup",
        type=int,
        help="untimed steps per cell first (default: 3; "
        "--compare: 5, the steps before the clock of the steady speed starts)",
    )
    p.add_argument("--micro-batch", default="auto", type=micro_batch_arg,
                   help="a number, or auto (as in execution)")  # fmt: skip
    p.add_argument("--memory-mb", type=int, default=16000, help="a CPU job's memory for auto")
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 warm-up step: a smoke test (--compare: 2 short rounds, under a minute)",
    )
    p.add_argument("--out", type=Path, help="write the profile and the cells as JSON")
    p.add_argument(
        "--compare", action="store_true", help="the trainer against a minimal loop (see above)"
    )
    p.add_argument("--rounds", type=int, help="--compare: rounds (default 5; --quick 2)")
    p.add_argument(
        "--seconds", type=float, help="--compare: seconds per timed run (default 1.5; --quick 0.4)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time each cell with execution.compile's compiled loss (--compare: also the "
        "trainer with execution.compile: true)",
    )
    args = p.parse_args(argv)
    if args.compare:
        return compare(args)
    if args.quick:
        args.warmup = 1
    elif args.warmup is None:
        args.warmup = 3
    args.cells = args.cells or PAPER_CELLS
    device = pick_device(args.device or "cuda")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        loop.keep_freed_memory()  # as a training job does
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    n_layer, n_head, d_model, mlp = (int(v) for v in args.model.split(","))
    cells = [tuple(int(v) for v in cell.split("x")) for cell in args.cells.split(",")]
    peak = measured_peak_tflops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device {device} ({name or 'cpu'}), matmul peak {peak:.2f} TFLOP/s, torch "
          f"{torch.__version__}, model {args.model} vocab {args.vocab}", flush=True)  # fmt: skip
    rows, compiled_rows = [], []
    for B, C in cells:
        cfg = GPTConfig(vocab_size=args.vocab, n_ctx=max(C for _, C in cells), n_layer=n_layer,
                        n_head=n_head, d_model=d_model, mlp=bool(mlp))  # fmt: skip
        row = time_cell(cfg, B, C, args, device, peak)
        rows.append(row)
        print(
            f"B {B:4d} C {C:5d} | micro-batch {row['micro_batch']:4d} x {row['passes']}"
            f" | {row['seconds_per_step'] * 1e3:9.2f} ms/step | {row['tokens_per_second']:11,.0f}"
            f" tok/s | MFU {row['mfu']:.3f} | peak {row['peak_memory_gb']:.2f} GB"
            f" (estimate {row['estimated_memory_gb']:.2f})",
            flush=True,
        )
        if args.compile:
            compiled = time_cell(cfg, B, C, args, device, peak, compiled=True)
            compiled_rows.append(compiled)
            print(
                f"{'compiled':>13s} | {compiled['seconds_per_step'] * 1e3:9.2f} ms/step"
                f" | {compiled['tokens_per_second']:11,.0f} tok/s | MFU {compiled['mfu']:.3f}"
                f" | {row['seconds_per_step'] / compiled['seconds_per_step']:.2f}x eager"
                f" | {args.warmup} warm-up steps {compiled['warmup_seconds']:.1f} s",
                flush=True,
            )
    # The profile is eager's: execution.compile is false unless a study sets it.
    profile = fit_profile(rows, peak, device)
    print("profile:", json.dumps(profile))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"profile": profile, "device": name, "torch": torch.__version__,
                  "model": args.model, "vocab": args.vocab, "cells": rows,
                  "compiled_cells": compiled_rows}  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}: set execution.device_profile to this path")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
