"""The project's trainer against a minimal nanoGPT-style loop: tokens/s, their ratio, same weights.

    python bench/trainer_vs_minimal.py                       # the default study's three cells
    python bench/trainer_vs_minimal.py --quick               # 2 short rounds, under a minute
    python bench/trainer_vs_minimal.py --compile             # also the compiled trainer
    python bench/trainer_vs_minimal.py --cells w32:4x16:64 --rounds 2 --seconds 0.1   # a smoke run
    python bench/trainer_vs_minimal.py --family llama        # the same cells as llama models

It times the whole trainer, ``ihsweep.training.loop.train()`` itself (on a chunk folder of random
tokens in a temporary directory, the default study's hyperparameters, one checkpoint at the end),
against a minimal nanoGPT-style loop on the same GPT, the same batches (read from the same memmap in
the trainer's order), fused AdamW with the same settings and schedule, clipping at 1.0, for the
default study's models and vocabularies (``--cells``: ``model:BxC:vocabulary``, models w32, w48, w64
of config.yaml; ``--family llama`` makes them llama models, with RoPE, RMSNorm and, where they have
an MLP, SwiGLU, in both loops). Each runs in a process of its own, started afresh for each cell as a
training job starts (the trainer tunes its process's allocator, the minimal loop keeps glibc's
defaults). The two take turns a block of ~0.1 s of steps at a time, so that both see the same load
of a busy machine, for ``--rounds`` rounds (after an untimed run each); it prints tokens/s of both
after the first ``--warmup`` steps, their ratio (trainer / minimal) per round and the median, the
page faults a step, and whether both ended with the same weights (on the CPU they must, bit for bit;
CUDA's kernels need not be deterministic). On the CPU with one thread the clock is the process's CPU
time, which a loaded machine disturbs less than wall time (a worker waiting for its turn uses none);
on this 2-core machine under load, two workers running the same loop measured ratios of 0.98-1.01.
``--compile`` adds the trainer with ``execution.compile: true`` (its first round compiles into an
empty inductor cache, the later ones from the warm cache), its compile warm-up (the wall time of its
first steps) and what each would take for a 4M-token run. ``--quick``: 2 short rounds, under a
minute for the three default cells. ``bench/device_profile.py`` times the trainer's step alone, cell
by cell, for the cost model's device profile.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import inspect
import io
import json
import multiprocessing
import os
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

from _common import synchronize  # noqa: E402
from ihsweep.training import loop  # noqa: E402
from ihsweep.training.execution import pick_device  # noqa: E402
from ihsweep.training.model import GPT, GPTConfig  # noqa: E402
from ihsweep.training.progress import Progress  # noqa: E402
from ihsweep.training.sampler import ChunkSampler  # noqa: E402
from ihsweep.training.schedule import lr_at  # noqa: E402

# The default study's models at its Markov cell (vocabulary 256) and its natural-text middle
# cell (BPE vocabulary 2,048), trained with its training settings (config.yaml).
COMPARE_CELLS = "w64:8x32:256,w64:16x32:2048,w32:16x32:2048"
DEFAULT_STUDY = Path(__file__).resolve().parents[1] / "config.yaml"


def default_study() -> dict:
    """config.yaml as written (its models and training: the one home of those settings)."""
    from ihsweep.config import load_configfiles

    return load_configfiles([DEFAULT_STUDY])


def compare_cells(text: str, family: str = "gpt2") -> list[dict]:
    cells = []
    for item in text.split(","):
        model, shape, vocab = item.split(":")
        B, C = (int(v) for v in shape.split("x"))
        name = item if family == "gpt2" else f"{item}:{family}"
        cells.append({"name": name, "model": model, "B": B, "C": C, "vocab": int(vocab),
                      "family": family})  # fmt: skip
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
    from ihsweep.steps.prepare import prepare

    tokens = steps * cell["B"] * cell["C"]
    study_config = default_study()
    config = {
        "models": {
            cell["model"]: {**study_config["models"][cell["model"]], "family": cell["family"]}
        },  # fmt: skip
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

    class Timed(Progress):
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

    # train() makes its Progress through a name in its own module: swap that one for the run
    # (progress_of, which picks a terminal's bar or the log's lines; Progress before it).
    name = "progress_of" if hasattr(loop, "progress_of") else "Progress"
    original = getattr(loop, name)
    setattr(loop, name, Timed if name == "Progress" else lambda s, step, *_: Timed(s, step))
    # compile only when asked, so that the trainer of a commit before the setting runs too
    settings: dict = {"compile": True} if compile else {}
    if spec.get("early_stop") is not None:  # the train step's rule: it probes each checkpoint,
        from ihsweep.steps.stop_rule import stop_rule_of  # here the last one, after the clock stops

        settings["stop_rule"] = stop_rule_of(spec)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            one_line = {"device": device, "threads": threads, "progress_seconds": 10**9}
            if "execution" in inspect.signature(loop.train).parameters:  # one Execution
                from ihsweep.config import execution_of

                execution = execution_of({**one_line, "compile": bool(compile)})
                stop_rule = settings.get("stop_rule")
                loop.train(spec, Path(data_dir), Path(run_dir), execution, stop_rule)
            else:  # a commit before it: the settings one by one
                execution = (device, threads, 10**9, "auto", 16000)
                loop.train(spec, Path(data_dir), Path(run_dir), *execution, **settings)
    finally:
        setattr(loop, name, original)
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
    sampler = ChunkSampler(np.arange(len(data))[:, None], B, seed)
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
        lr = lr_at(step, steps, t["lr"], t["warmup_fraction"])
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
        for cell in compare_cells(args.cells or COMPARE_CELLS, args.family):
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


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/trainer_vs_minimal.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", help="cuda, cuda:N, cpu or auto (default: auto)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--cells", help=f"model:BxC:vocabulary,... (default: {COMPARE_CELLS})")
    p.add_argument("--family", choices=["gpt2", "llama"], default="gpt2",
                   help="the cells' model family (models.<name>.family; default gpt2)")  # fmt: skip
    p.add_argument(
        "--warmup",
        type=int,
        help="the steps before the clock of the steady speed starts (default: 5)",
    )
    p.add_argument("--quick", action="store_true", help="2 short rounds, under a minute")
    p.add_argument("--out", type=Path, help="write the cells as JSON")
    p.add_argument("--rounds", type=int, help="rounds (default 5; --quick 2)")
    p.add_argument("--seconds", type=float, help="seconds per timed run (default 1.5; --quick 0.4)")
    p.add_argument(
        "--compile", action="store_true", help="also the trainer with execution.compile: true"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    return compare(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
