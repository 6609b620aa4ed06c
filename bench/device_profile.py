"""The device profile the cost model needs: the speed of the trainer's step per (B, C) cell.

    python bench/device_profile.py                                   # CUDA, the paper model
    python bench/device_profile.py --out results/bench/my-gpu.json   # then, in the study:
        execution: {device_profile: results/bench/my-gpu.json}
    python bench/device_profile.py --device cpu --threads 2 --cells 8x64 --steps 3 --quick
    python bench/device_profile.py --compile                         # each cell eager and compiled

For each (B, C) cell it times ``ihsweep.training.step.train_step``, the very function the
trainer runs (micro-batches, chunked loss, AdamW, clipping, bf16 autocast on CUDA), on random
tokens, with no host synchronisation between steps (only before and after the timed stretch;
on the CPU with the allocator tuned as a training job tunes it,
``ihsweep.training.execution.keep_freed_memory``), and prints tokens/s, seconds per step, model
FLOP utilisation against the device's measured matmul peak (bf16 on CUDA, fp32 on the CPU) and
peak memory. It then fits
``seconds per step = passes * step_overhead + tokens * flops_per_token / (peak * mfu)`` over
the cells (least squares) and writes the profile ``{peak_tflops, mfu, step_overhead_ms,
memory_gb}`` with every measured cell. ``--compile`` also times each cell with
``execution.compile``'s compiled loss (compiled afresh per cell; the warm-up steps' wall time,
compiling included, is printed); the profile stays eager's, the default setting.

The default model is the paper's (2 layers, 8 heads, width 768, MLP, GPT-2's vocabulary of
50,257); ``--vocab 50304`` measures the vocabulary padded to a multiple of 64.
``bench/trainer_vs_minimal.py`` times the whole trainer against a minimal loop instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from _common import synchronize  # noqa: E402
from ihsweep import cost  # noqa: E402
from ihsweep.config.execution import setting_value  # noqa: E402
from ihsweep.training.execution import (  # noqa: E402
    keep_freed_memory,
    pick_device,
    resolve_micro_batch,
)
from ihsweep.training.model import GPT, GPTConfig  # noqa: E402
from ihsweep.training.step import compiled_loss, next_token_loss, train_step  # noqa: E402

PAPER_CELLS = "8x64,32x256,256x1024"


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
    loss_fn = compiled_loss() if compiled else next_token_loss
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


def micro_batch(text: str) -> int | str:
    """``--micro-batch`` read as the schema's ``execution.micro_batch``: a number, or auto."""
    return setting_value("micro_batch", text)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/device_profile.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or auto (default: cuda)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--cells", default=PAPER_CELLS, help=f"BxC,BxC,... (default: {PAPER_CELLS})")
    p.add_argument("--model", default="2,8,768,1", help="n_layer,n_head,d_model,mlp")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--steps", type=int, default=20, help="timed steps per cell")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per cell first")
    p.add_argument("--micro-batch", default="auto", type=micro_batch,
                   help="a number, or auto (as in execution)")  # fmt: skip
    p.add_argument("--memory-mb", type=int, default=16000, help="a CPU job's memory for auto")
    p.add_argument("--quick", action="store_true", help="1 warm-up step: a smoke test")
    p.add_argument("--out", type=Path, help="write the profile and the cells as JSON")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time each cell with execution.compile's compiled loss",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.warmup = 1
    return args


def print_row(B: int, C: int, row: dict) -> None:
    print(
        f"B {B:4d} C {C:5d} | micro-batch {row['micro_batch']:4d} x {row['passes']}"
        f" | {row['seconds_per_step'] * 1e3:9.2f} ms/step | {row['tokens_per_second']:11,.0f}"
        f" tok/s | MFU {row['mfu']:.3f} | peak {row['peak_memory_gb']:.2f} GB"
        f" (estimate {row['estimated_memory_gb']:.2f})",
        flush=True,
    )


def print_compiled_row(row: dict, compiled: dict, warmup: int) -> None:
    print(
        f"{'compiled':>13s} | {compiled['seconds_per_step'] * 1e3:9.2f} ms/step"
        f" | {compiled['tokens_per_second']:11,.0f} tok/s | MFU {compiled['mfu']:.3f}"
        f" | {row['seconds_per_step'] / compiled['seconds_per_step']:.2f}x eager"
        f" | {warmup} warm-up steps {compiled['warmup_seconds']:.1f} s",
        flush=True,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        keep_freed_memory()  # as a training job does
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
        print_row(B, C, row)
        if args.compile:
            compiled = time_cell(cfg, B, C, args, device, peak, compiled=True)
            compiled_rows.append(compiled)
            print_compiled_row(row, compiled, args.warmup)
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
