"""Every GPU measurement the paper study needs, in one command of about 8 minutes.

    python3 bench/gpu_plan.py --out $OUT/gpu_plan.json   # one H100 or H200, the machine's python
    python bench/gpu_plan.py --smoke --out /tmp/plan.json  # the same code on the CPU, in seconds
    python bench/gpu_plan.py --project bench/results/gpu_plan-h100.json   # phase 6 again, here

GPU time is rare and short, so the plan measures everything at once and writes its JSON after
every measurement (by default bench/results/gpu_plan-<device>.json): a run cut off still returns
what it measured. Each measurement runs in a child process with a time limit (a compile that
does not finish, or memory that runs out, costs one row, not the run). Phases:

1. **environment**: device, torch, triton, and the bf16 matmul rate the card reaches (8192^3).
2. **correctness**: each variant against the eager baseline on one fixed batch at (32, 256):
   the loss difference and the relative difference of all gradients (the model has V rows on
   every path: padding lives inside the loss). A variant outside the tolerance is not timed.
3. **baseline**: the paper model (2 layers, 8 heads, width 768, GPT-2's vocabulary of 50,257)
   at (B, C) = (8, 64), (32, 256), (256, 1024) with today's eager trainer step
   (``ihsweep.training.step.train_step``: micro-batches, chunked loss, fused AdamW, clipping,
   bf16 autocast).
4. **packing**: 1, 2, 4 and 8 training processes sharing the GPU at (8, 64) (time-sliced, no
   MPS): tokens/s in all, against one process.
5. **variants**: the trainer's step paths at each cell (``variant_path``, the words of a name):
   ``compiled`` (``execution.compile``), ``padded`` (``execution.vocab_padding``: the lm-head
   GEMM on 50,304 rows, the loss over the first 50,257 logits), ``fused``
   (``execution.fused_loss``: lm head and cross-entropy a slice at a time, gradients in the
   forward pass), and their combinations.
6. **profile, paths and projection**: per variant, ``seconds per step = passes * overhead +
   tokens * flops_per_token / (peak * mfu)`` fitted over its cells (``bench/device_profile.py``'s
   fit); the eager fit is the file's ``profile``, which ``execution.device_profile`` accepts; the
   file's ``paths`` record each variant's settings, whether it passed its check and its
   speed-up over eager per cell, from which a training job on this GPU resolves its ``auto``
   settings (``ihsweep.training.execution.resolve_step_path``); and paper.yaml's device-hours
   with and without early stop on each fit (``ihsweep.cost``). Where
   ihsweep's config cannot be read (the GPU machine has no jsonschema), ``--project`` redoes
   this phase from the JSON on a machine that has it.

Every row gives tokens/s, ms per step, and MFU against the vendor's dense bf16 peak (989
TFLOP/s for the H100 SXM and the H200) and against the measured matmul rate. Later speed work
adds its variants to ``VARIANTS``; each is checked against the baseline before it is timed.
``--smoke`` runs every phase on the CPU with a tiny model (vocabulary 257 padded to 320, cells
(4, 16) and (8, 32), variants at (4, 16) only, 1 and 2 processes) and compiles with TorchDynamo's
eager backend, so that the tests run the plan's code in about half a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "workflow"))

from _common import synchronize  # noqa: E402  (bench/, the script's own folder)

PAPER_STUDY = HERE.parents[1] / "workflow" / "studies" / "paper.yaml"
RESULTS = HERE.parent / "results"
# The trainer's step paths (execution: compile, vocab_padding, fused_loss; ``variant_path``)
VARIANTS = ("eager", "compiled", "padded", "padded-compiled", "fused", "padded-fused")
# Dense bf16 peaks in TFLOP/s, by the device name's model (the first that matches).
VENDOR_PEAK = {"H200": 989, "H100": 989, "A100": 312, "L40S": 362, "A10": 125}
PLANS = {
    "gpu": {
        "model": {"n_layer": 2, "n_head": 8, "d_model": 768, "mlp": True},
        "vocab": 50257,
        "pad_to": 64,
        "cells": [(8, 64), (32, 256), (256, 1024)],
        "variant_cells": [(8, 64), (32, 256), (256, 1024)],
        "check_cell": (32, 256),
        "pack": [1, 2, 4, 8],
        "pack_cell": (8, 64),
        "pack_seconds": 6.0,
        "matmul_n": 8192,
        "seconds_per_cell": 2.0,
        "backend": "inductor",
        "tolerance": {"loss": 1e-2, "grad": 5e-2},  # bf16 autocast
        "limits": {"env": 90, "check": 150, "eager": 90, "pack": 90, "variant": 150},
    },
    "smoke": {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "mlp": True},
        "vocab": 257,
        "pad_to": 64,
        "cells": [(4, 16), (8, 32)],
        "variant_cells": [(4, 16)],
        "check_cell": (8, 32),
        "pack": [1, 2],
        "pack_cell": (4, 16),
        "pack_seconds": 0.3,
        "matmul_n": 256,
        "seconds_per_cell": 0.1,
        "backend": "eager",
        "tolerance": {"loss": 1e-5, "grad": 1e-4},  # fp32
        "limits": {"env": 60, "check": 60, "eager": 60, "pack": 60, "variant": 60},
    },
}


# --------------------------------------------------------------------------------------------
# Child processes: one measurement each


def variant_path(variant: str, plan: dict):
    """The trainer's ``StepPath`` of a variant: its name's words say compiled, padded, fused."""
    from ihsweep.training.lm_head import HeadPath
    from ihsweep.training.step import StepPath

    words = variant.split("-")
    pad_to = plan["pad_to"] if "padded" in words else 1
    return StepPath(compile="compiled" in words, head=HeadPath(pad_to, "fused" in words))


def variant_setup(variant: str, plan: dict, C: int, device):
    """(model config, loss function) of a variant: the trainer's own (``StepPath.loss_fn``)."""
    from ihsweep.training.model import GPTConfig

    cfg = GPTConfig(
        vocab_size=plan["vocab"], n_ctx=max(c for _, c in plan["cells"]), **plan["model"]
    )
    return cfg, variant_path(variant, plan).loss_fn(plan["backend"], device.type)


def build_model(cfg, device, seed: int = 0):
    import torch
    from ihsweep.training.model import GPT

    torch.manual_seed(seed)
    return GPT(cfg).to(device)


def autocast_for(device):
    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def worker_device(plan: dict):
    from ihsweep.training.execution import prepare_device

    # As a training job sets itself up; one thread per CPU worker.
    return prepare_device("cuda" if plan["name"] == "gpu" else "cpu", threads=1)


def task_env(plan: dict, task: dict) -> dict:
    """The device and its bf16 (CPU: fp32) matmul rate."""
    import platform

    import torch

    device = worker_device(plan)
    n, dtype = plan["matmul_n"], torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    repeats, start = 20, time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    rate = 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12
    cuda = device.type == "cuda"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "memory_gb": round(torch.cuda.get_device_properties(device).total_memory / 1e9, 1)
        if cuda
        else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "matmul_tflops": round(rate, 2),
    }


def loss_and_grads(model, loss_fn, x, device):

    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, x, autocast_for(device))
    loss.backward()
    grads = {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}
    return float(loss.detach()), grads


def compare_to_eager(variant: str, plan: dict, device, loss_fn=None) -> dict:
    """A variant's loss and gradients against the eager baseline's on one fixed batch, from
    the same weights (``loss_fn`` replaces the variant's own, for the tests)."""
    import torch

    vocab = plan["vocab"]
    B, C = plan["check_cell"]
    x = torch.randint(0, vocab, (B, C), generator=torch.Generator().manual_seed(1)).to(device)
    eager_cfg, eager_loss = variant_setup("eager", plan, C, device)
    eager = build_model(eager_cfg, device)
    loss_e, grads_e = loss_and_grads(eager, eager_loss, x, device)
    cfg, own_loss = variant_setup(variant, plan, C, device)
    model = build_model(cfg, device)
    model.load_state_dict(eager.state_dict())
    loss_v, grads_v = loss_and_grads(model, loss_fn or own_loss, x, device)
    diff = sum(float((grads_v[k] - g).pow(2).sum()) for k, g in grads_e.items())
    norm = sum(float(g.pow(2).sum()) for g in grads_e.values())
    row = {
        "variant": variant,
        "cell": [B, C],
        "loss_eager": loss_e,
        "loss": loss_v,
        "loss_abs_diff": abs(loss_v - loss_e),
        "grad_rel_diff": math.sqrt(diff / norm),
    }
    tol = plan["tolerance"]
    row["passed"] = bool(
        row["loss_abs_diff"] <= tol["loss"] and row["grad_rel_diff"] <= tol["grad"]
    )
    return row


def task_check(plan: dict, task: dict) -> dict:
    return compare_to_eager(task["variant"], plan, worker_device(plan))


def timed_steps(step, device, seconds: float, min_steps: int = 3) -> tuple[int, float]:
    """Steps and wall seconds of a stretch of about ``seconds`` (at least ``min_steps``)."""
    start = time.perf_counter()
    step()
    synchronize(device)
    per_step = time.perf_counter() - start
    n = max(min_steps, min(500, int(seconds / max(per_step, 1e-6))))
    start = time.perf_counter()
    for _ in range(n):
        step()
    synchronize(device)
    return n, time.perf_counter() - start


def prepared_step(plan: dict, task: dict, device):
    """The trainer's step for one (variant, cell), its micro-batch and its passes."""
    import torch
    from ihsweep import cost
    from ihsweep.training.execution import resolve_micro_batch
    from ihsweep.training.step import train_step

    B, C = task["cell"]
    cfg, loss_fn = variant_setup(task["variant"], plan, C, device)
    model = build_model(cfg, device)
    # As the trainer builds it (training/loop.py, Job.build), at the paper's learning rate.
    optim = torch.optim.AdamW(model.parameters(), lr=2.5e-4, weight_decay=0.0, fused=True)
    micro_batch = resolve_micro_batch("auto", cfg, B, C, device, 16000)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, plan["vocab"], (B, C), generator=generator).to(device)]
    batches.append(torch.randint(0, plan["vocab"], (B, C), generator=generator).to(device))
    autocast, count = autocast_for(device), iter(range(10**9))

    def step():
        x = batches[next(count) % 2]
        train_step(model, optim, x, micro_batch, autocast, 1.0, loss_fn)

    return step, micro_batch, len(cost.micro_batch_sizes(B, micro_batch))


def task_time(plan: dict, task: dict) -> dict:
    """ms per step and tokens/s of one (variant, cell) after its warm-up (compiling included)."""
    import torch

    device = worker_device(plan)
    B, C = task["cell"]
    step, micro_batch, passes = prepared_step(plan, task, device)
    start = time.perf_counter()
    for _ in range(2):  # compiles a compiled variant
        step()
    synchronize(device)
    warmup = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, seconds = timed_steps(step, device, plan["seconds_per_cell"])
    return {
        "variant": task["variant"],
        "cell": [B, C],
        "micro_batch": micro_batch,
        "passes": passes,
        "steps": steps,
        "ms_per_step": 1e3 * seconds / steps,
        "tokens_per_second": B * C * steps / seconds,
        "warmup_seconds": warmup,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9
        if device.type == "cuda"
        else None,
    }


def task_pack(plan: dict, task: dict) -> dict:
    """One of ``n`` processes training at once: warm up, wait for the others, then train for
    ``pack_seconds``; its steps and tokens/s."""
    device = worker_device(plan)
    step, _, _ = prepared_step(plan, {**task, "variant": "eager"}, device)
    for _ in range(3):
        step()
    synchronize(device)
    barrier = Path(task["barrier"])
    (barrier / f"ready-{task['index']}").touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.glob("ready-*"))) < task["n"] and time.monotonic() < deadline:
        time.sleep(0.005)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < plan["pack_seconds"]:
        for _ in range(10):
            step()
        synchronize(device)
        steps += 10
    seconds = time.perf_counter() - start
    B, C = task["cell"]
    return {"steps": steps, "seconds": seconds, "tokens_per_second": B * C * steps / seconds}


TASKS = {"env": task_env, "check": task_check, "time": task_time, "pack": task_pack}


def worker(text: str) -> int:
    task = json.loads(text)
    plan = {**PLANS[task["plan"]], "name": task["plan"]}
    plan["cells"] = [tuple(c) for c in plan["cells"]]
    result = TASKS[task["kind"]](plan, task)
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------
# The parent: phases, limits, the JSON and the table


class Plan:
    """The running plan: its record (written after every measurement) and its deadline."""

    def __init__(self, name: str, out: Path | None, minutes: float):
        self.name, self.settings = name, PLANS[name]
        self.out, self.deadline = out, time.monotonic() + 60 * minutes
        self.record = {"plan": name, "environment": None, "checks": [], "cells": [],
                       "packing": [], "errors": []}  # fmt: skip

    def limit(self, kind: str) -> float:
        return max(1.0, min(self.settings["limits"][kind], self.deadline - time.monotonic()))

    def command(self, task: dict) -> list[str]:
        return [sys.executable, str(HERE), "--worker", json.dumps({**task, "plan": self.name})]

    def run(self, task: dict, kind: str) -> dict | None:
        """One measurement in a child process; None (and an error row) when it fails."""
        if self.deadline - time.monotonic() < 1:
            return self.error(task, "skipped: the plan's time ran out")
        limit = self.limit(kind)
        finished = wait_for([start(self.command(task))], limit)
        if finished is None:
            return self.error(task, f"timed out after {limit:.0f} s")
        (code, out, err), *_ = finished
        if code != 0:
            return self.error(task, (err.strip().splitlines() or [f"exit code {code}"])[-1])
        return json.loads(out.strip().splitlines()[-1])

    def error(self, task: dict, why) -> None:
        self.record["errors"].append({"task": task, "error": str(why)})
        print(f"  {task.get('kind')} {task.get('variant', '')} {task.get('cell', '')}: {why}")
        self.write()
        return None

    def write(self) -> None:
        summarise(self.record)
        if self.out is None:
            env = self.record["environment"] or {"device": "unknown"}
            slug = re.sub(r"[^a-z0-9]+", "-", env["device"].lower()).strip("-")
            self.out = RESULTS / f"gpu_plan-{slug}.json"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n")
        os.replace(tmp, self.out)


def vendor_peak(device_name: str) -> float | None:
    return next((peak for key, peak in VENDOR_PEAK.items() if key in device_name.upper()), None)


def phase_environment(plan: Plan) -> bool:
    env = plan.run({"kind": "env"}, "env")
    if env is None:
        return False
    env["vendor_peak_tflops"] = vendor_peak(env["device"]) if plan.name == "gpu" else None
    plan.record["environment"] = env
    plan.write()
    print(f"{env['device']}: torch {env['torch']}, CUDA {env['cuda']}, triton {env['triton']};"
          f" matmul {env['matmul_tflops']:.1f} TFLOP/s"
          f" (vendor peak {env['vendor_peak_tflops'] or 'unknown'})", flush=True)  # fmt: skip
    return True


def phase_correctness(plan: Plan) -> list[str]:
    """The variants that match the baseline (``eager`` first)."""
    passed = ["eager"]
    for variant in VARIANTS[1:]:
        row = plan.run({"kind": "check", "variant": variant}, "check")
        if row is None:
            continue
        plan.record["checks"].append(row)
        plan.write()
        verdict = "ok" if row["passed"] else "FAILED: not timed"
        print(f"check {variant:16s} loss {row['loss']:.6f} vs {row['loss_eager']:.6f}"
              f" (|diff| {row['loss_abs_diff']:.2e}), grad rel diff {row['grad_rel_diff']:.2e}:"
              f" {verdict}", flush=True)  # fmt: skip
        if row["passed"]:
            passed.append(variant)
    return passed


def with_mfu(row: dict, plan: Plan) -> dict:
    from ihsweep import cost

    env = plan.record["environment"]
    B, C = row["cell"]
    fpt = cost.flops_per_token({**plan.settings["model"], "n_ctx": C}, plan.settings["vocab"], C)
    achieved = row["tokens_per_second"] * fpt / 1e12
    row["flops_per_token"] = fpt
    row["mfu_measured"] = achieved / env["matmul_tflops"]
    peak = env["vendor_peak_tflops"]
    row["mfu_vendor"] = achieved / peak if peak else None
    return row


def phase_cells(plan: Plan, variants: list[str]) -> None:
    """Time each variant at each cell: the cheap ones first, compiling the largest cell last
    (it may not finish in its time)."""
    cells = plan.settings["cells" if variants == ["eager"] else "variant_cells"]

    def order(task):
        variant, cell = task
        compiled = variant.endswith("compiled")
        return (compiled * (1 + (cell == cells[-1])), cells.index(cell), VARIANTS.index(variant))

    for variant, cell in sorted(((v, c) for v in variants for c in cells), key=order):
        kind = "eager" if variant == "eager" else "variant"
        row = plan.run({"kind": "time", "variant": variant, "cell": list(cell)}, kind)
        if row is not None:
            plan.record["cells"].append(with_mfu(row, plan))
            plan.write()
            print_cell(row)


def print_cell(row: dict) -> None:
    vendor = f"{row['mfu_vendor']:.3f}" if row["mfu_vendor"] is not None else "  -  "
    memory = f"{row['peak_memory_gb']:6.2f}" if row["peak_memory_gb"] is not None else "     -"
    print(f"{str(tuple(row['cell'])):12s} {row['variant']:16s} {row['ms_per_step']:9.2f} ms"
          f" {row['tokens_per_second']:12,.0f} tok/s  MFU {vendor} (vendor) "
          f"{row['mfu_measured']:.3f} (matmul)  {memory} GB  warm-up {row['warmup_seconds']:.1f} s",
          flush=True)  # fmt: skip


def start(command: list[str]) -> subprocess.Popen:
    """A child in a session of its own (its compile workers with it), stderr to a file so that
    no pipe fills while another child is waited for."""
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                            start_new_session=True)  # fmt: skip
    proc.err_file = err
    return proc


def wait_for(procs: list[subprocess.Popen], timeout: float) -> list[tuple] | None:
    """(exit code, stdout, stderr) of every child; None, with all of them and their process
    groups killed, when they are not done within ``timeout`` seconds in all."""
    end, results = time.monotonic() + timeout, []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(0.1, end - time.monotonic()))
            proc.err_file.seek(0)
            results.append((proc.returncode, out, proc.err_file.read()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return None
    return results


def phase_packing(plan: Plan) -> None:
    cell = list(plan.settings["pack_cell"])
    for n in plan.settings["pack"]:
        with tempfile.TemporaryDirectory() as barrier:
            tasks = [{"kind": "pack", "cell": cell, "n": n, "index": i, "barrier": barrier,
                      "plan": plan.name} for i in range(n)]  # fmt: skip
            finished = wait_for([start(plan.command(t)) for t in tasks], plan.limit("pack"))
        if finished is None:
            plan.error({"kind": "pack", "n": n}, "timed out")
            continue
        failed = [err.strip().splitlines()[-1:] for code, _, err in finished if code]
        if failed:
            plan.error({"kind": "pack", "n": n}, f"a process failed: {failed[0]}")
            continue
        outputs = [out for _, out, _ in finished]
        rows = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
        total = sum(r["tokens_per_second"] for r in rows)
        per_process = [r["tokens_per_second"] for r in rows]
        plan.record["packing"].append(
            {"processes": n, "cell": cell, "tokens_per_second": total, "per_process": per_process}
        )
        one = plan.record["packing"][0]["tokens_per_second"]
        print(f"packing {n} processes at {tuple(cell)}: {total:12,.0f} tok/s in all,"
              f" {total / one:.2f}x one process", flush=True)  # fmt: skip
        plan.write()


# --------------------------------------------------------------------------------------------
# Phase 6: profiles and the projection of paper.yaml (arithmetic: also --project)


def fit_profile(rows: list[dict], matmul_tflops: float, memory_gb) -> dict:
    """Least squares of seconds = passes * overhead + FLOPs / throughput (device_profile's fit)."""
    import numpy as np

    design = np.array([[r["passes"], r["cell"][0] * r["cell"][1] * r["flops_per_token"]]
                       for r in rows], dtype=float)  # fmt: skip
    seconds = np.array([r["ms_per_step"] / 1e3 for r in rows])
    if len(rows) >= 2:
        (overhead, inverse), *_ = np.linalg.lstsq(design, seconds, rcond=None)
        overhead = max(float(overhead), 0.0)
        if inverse <= 0:  # the overhead alone explains it: the largest cell's throughput
            inverse = seconds[-1] / design[-1, 1]
    else:
        overhead, inverse = 0.0, seconds[0] / design[0, 1]
    return {
        "peak_tflops": round(matmul_tflops, 2),
        "mfu": round(1 / float(inverse) / (matmul_tflops * 1e12), 4),
        "step_overhead_ms": round(overhead * 1e3, 3),
        "memory_gb": memory_gb,
    }


def project(profile: dict, name: str) -> dict:
    """paper.yaml's totals on a profile: tokens and device-hours, full and with early stop."""
    import yaml
    from ihsweep.config import SCHEMA
    from ihsweep.cost.report import cost_table
    from ihsweep.cost.study import StudyCost
    from ihsweep.validate import prepare

    study = prepare(yaml.safe_load(PAPER_STUDY.read_text()), SCHEMA)
    table = cost_table(StudyCost(study, {**profile, "name": name, "source": "bench/gpu_plan.py"}))
    return {
        "tokens": int(table.tokens.sum()),
        "early_stop_tokens": int(table.early_stop_tokens.sum()),
        "device_hours": round(float(table.device_hours.sum()), 2),
        "early_stop_device_hours": round(float(table.early_stop_device_hours.sum()), 2),
    }


def summarise(record: dict) -> None:
    """Phase 6 on what the record holds so far: profiles per variant, the projection."""
    env = record["environment"]
    if env is None or not record["cells"]:
        return
    profiles = {}
    for variant in VARIANTS:
        rows = [r for r in record["cells"] if r["variant"] == variant]
        if rows:
            profiles[variant] = fit_profile(rows, env["matmul_tflops"], env["memory_gb"])
    record["profiles"] = profiles
    record["paths"] = measured_paths(record)
    if "eager" in profiles:
        record["profile"] = profiles["eager"]  # today's trainer: what the cost model reads
    try:
        record["projection"] = {v: project(p, v) for v, p in profiles.items()}
    except ImportError as err:  # the GPU machine's python has no jsonschema, no snakemake
        record["projection"] = {
            "skipped": f"{err}: run python bench/gpu_plan.py --project <this file> in the venv"
        }


def measured_paths(record: dict) -> dict:
    """What a training job's ``auto`` reads (``execution.resolve_step_path``): per variant its
    settings, whether it matched eager, and its speed-up over eager at each cell ("BxC")."""
    checks = {row["variant"]: row["passed"] for row in record["checks"]}
    ms = {(row["variant"], tuple(row["cell"])): row["ms_per_step"] for row in record["cells"]}
    plan = PLANS[record["plan"]]
    variants = {}
    for variant in VARIANTS[1:]:
        speedup = {
            f"{b}x{c}": round(ms["eager", (b, c)] / ms[variant, (b, c)], 3)
            for v, (b, c) in ms
            if v == variant and ("eager", (b, c)) in ms
        }
        variants[variant] = {
            "settings": variant_path(variant, plan).settings(),
            "correct": checks.get(variant, False),
            "speedup": speedup,
        }
    return {"device": record["environment"]["device"], "variants": variants}


def print_table(record: dict) -> None:
    """ms per step of every timed (cell, variant), and each variant's speed-up over eager."""
    cells = sorted({tuple(r["cell"]) for r in record["cells"]}, key=lambda c: c[0] * c[1])
    ms = {(tuple(r["cell"]), r["variant"]): r["ms_per_step"] for r in record["cells"]}
    print(f"{'(B, C)':12s}" + "".join(f"{v:>24s}" for v in VARIANTS))
    for cell in cells:
        eager = ms.get((cell, "eager"))
        entries = []
        for variant in VARIANTS:
            value = ms.get((cell, variant))
            speedup = f" ({eager / value:.2f}x)" if value and eager else ""
            entries.append(f"{value:.2f} ms{speedup}" if value else "-")
        print(f"{str(cell):12s}" + "".join(f"{e:>24s}" for e in entries))


def print_summary(record: dict) -> None:
    if record["cells"]:
        print_table(record)
    for row in record["packing"]:
        total, one = row["tokens_per_second"], record["packing"][0]["tokens_per_second"]
        print(f"{row['processes']} processes at {tuple(row['cell'])}: "
              f"{total:,.0f} tok/s in all, {total / one:.2f}x one")  # fmt: skip
    projection = record.get("projection") or {}
    if "skipped" in projection:
        print(f"projection {projection['skipped']}")
        return
    for variant, row in projection.items():
        profile = record["profiles"][variant]
        print(f"paper.yaml on {variant:16s} (mfu {profile['mfu']:.3f} of {profile['peak_tflops']}"
              f" TFLOP/s, {profile['step_overhead_ms']:.2f} ms a pass): "
              f"{row['device_hours']:.1f} device-hours at 1B tokens a run, "
              f"{row['early_stop_device_hours']:.1f} with early stop "
              f"({row['early_stop_tokens'] / row['tokens']:.0%} of the tokens)")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/gpu_plan.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="the CPU plan of the tests")
    parser.add_argument("--out", type=Path, help="the JSON (default bench/results/...)")
    parser.add_argument("--minutes", type=float, default=8.0, help="the plan's deadline")
    parser.add_argument("--project", type=Path, help="redo phase 6 on this JSON, and print")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.project:
        record = json.loads(args.project.read_text())
        summarise(record)
        args.project.write_text(json.dumps(record, indent=1) + "\n")
        print_summary(record)
        return 0
    plan = Plan("smoke" if args.smoke else "gpu", args.out, args.minutes)
    if not phase_environment(plan):
        return 1
    variants = phase_correctness(plan)
    phase_cells(plan, ["eager"])
    phase_packing(plan)
    phase_cells(plan, variants[1:])
    plan.write()
    print_summary(plan.record)
    usable = (
        "its profile is what execution.device_profile takes"
        if "profile" in plan.record
        else ("no eager cell was timed, so it holds no profile")
    )
    print(f"wrote {plan.out}; {usable}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
