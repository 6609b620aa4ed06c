"""Every GPU measurement the paper study needs, in one command of about 6 minutes.

    python3 bench/gpu_plan.py --out $OUT/gpu_plan.json   # one H100 or H200, the machine's python
    python3 bench/gpu_plan.py --resume gpu_plan.json     # the next GPU loan: only what it lacks
    python bench/gpu_plan.py --smoke --out /tmp/plan.json  # the same code on the CPU
    python bench/gpu_plan.py --project bench/results/gpu_plan-h100.json   # phase 5 again, here

GPU time is rare and short (loans of about 15 minutes, start-up included), so the plan measures
everything at once within ``--minutes`` (default 6) and writes its JSON after every measurement
(by default bench/results/gpu_plan-<device>.json): a run cut off still returns what it measured,
and the file holds a row for every (variant, cell), measured or why not ("not attempted: out
of time"); ``--resume`` measures only the rows a file lacks. Each measurement runs in a child
process with a time limit (a compile that does not finish, memory that runs out, or output
without a well-formed result line costs one row, not the run). Phases, what the others are
measured against first and the dearest last:

1. **environment**: device, torch, triton, and the bf16 matmul rate the card reaches (8192^3).
2. **baseline**: the paper model (2 layers, 8 heads, width 768, GPT-2's vocabulary of 50,257)
   at (B, C) = (8, 64), (32, 256), (256, 1024) with today's eager trainer step
   (``ihsweep.training.step.train_step``: micro-batches, chunked loss, fused AdamW, clipping,
   bf16 autocast).
3. **packing**: 1, 2, 4 and 8 training processes sharing the GPU at (8, 64) (time-sliced, no
   MPS): tokens/s in all, against one process.
4. **variants**, those in eager mode before those that compile, each from the smallest cell up:
   the trainer's step paths (``variant_path``, the words of a name): ``compiled``
   (``execution.compile``), ``padded`` (``execution.vocab_padding``: the lm-head GEMM on 50,304
   rows, the loss over the first 50,257 logits), ``fused`` (``execution.fused_loss``: lm head
   and cross-entropy a slice at a time, gradients in the forward pass), and their combinations.
   Before its first row each is checked against eager on one fixed batch at (32, 256): the
   loss difference, the relative difference of all gradients (the model has V rows on every
   path: padding lives inside the loss), and the slices its lm head ran in; a variant outside
   the tolerance is not timed.
5. **profile, paths and projection**: per variant, ``seconds per step = passes * overhead +
   tokens * flops_per_token / (peak * mfu)`` fitted over its cells (``bench/device_profile.py``'s
   fit); the eager fit is the file's ``profile``, which ``execution.device_profile`` accepts; the
   file's ``paths`` record the cells eager was measured at and each variant's settings, whether
   it passed its check and its speed-up over eager per cell, from which a training job on this
   GPU resolves its ``auto`` settings (``ihsweep.training.execution.resolve_step_path``); and
   paper.yaml's device-hours with and without early stop on each fit (``ihsweep.cost``). Where
   ihsweep's config cannot be read (the GPU machine has no jsonschema), ``--project`` redoes
   this phase from the JSON on a machine that has it.

Every row gives tokens/s, ms per step, and MFU against the vendor's dense bf16 peak (989
TFLOP/s for the H100 SXM and the H200) and against the measured matmul rate. Later speed work
adds its variants to ``VARIANTS``; each is checked against the baseline before it is timed.
``--smoke`` runs every phase on the CPU with a small model at GPT-2's vocabulary (cells (2, 32)
and (4, 168), where the loss runs in three slices; variants at (4, 168); 1 and 2 processes) and
compiles ``compiled`` through inductor (``padded-compiled`` left out: a second compile).
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
        "variants": VARIANTS,
        "cells": [(8, 64), (32, 256), (256, 1024)],
        "variant_cells": [(8, 64), (32, 256), (256, 1024)],
        "check_cell": (32, 256),
        "pack": [1, 2, 4, 8],
        "pack_cell": (8, 64),
        "pack_seconds": 6.0,
        "matmul_n": 8192,
        "seconds_per_cell": 2.0,
        "warmup_steps": 2,
        "min_steps": 3,
        "backend": "inductor",
        "tolerance": {"loss": 1e-2, "grad": 5e-2},  # bf16 autocast
        "limits": {"env": 90, "check": 150, "eager": 90, "pack": 90, "variant": 150},
    },
    # GPT-2's vocabulary at a cell whose loss runs in three slices on the CPU (333, 333 and 2
    # positions: cost.loss_chunk_rows), and one compiled variant, through inductor.
    "smoke": {
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "mlp": True},
        "vocab": 50257,
        "pad_to": 64,
        "variants": ("eager", "compiled", "padded", "fused", "padded-fused"),
        "cells": [(2, 32), (4, 168)],
        "variant_cells": [(4, 168)],
        "check_cell": (4, 168),
        "pack": [1, 2],
        "pack_cell": (2, 32),
        "pack_seconds": 0.3,
        "matmul_n": 256,
        "seconds_per_cell": 0.1,
        "warmup_steps": 1,
        "min_steps": 1,
        "backend": "inductor",
        "tolerance": {"loss": 1e-5, "grad": 1e-4},  # fp32
        # inductor's first compile on two busy CPU cores: 100-140 s
        "limits": {"env": 60, "check": 300, "eager": 60, "pack": 60, "variant": 300},
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


def logit_slices(model, loss_fn, x, device) -> list[int]:
    """Positions of each lm-head GEMM (features [n, d] @ W_U.T [d, V or padded]) in a forward
    pass of the loss, as the profiler saw them run: the slices the loss ran in. Call it after a
    first call of ``loss_fn``: a compile's own tracing would count too."""
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        loss_fn(model, x, autocast_for(device))
    d, vocab = model.cfg.d_model, model.cfg.vocab_size
    return [
        e.input_shapes[0][0]
        for e in prof.events()
        if e.name == "aten::mm" and len(e.input_shapes[1]) == 2
        and e.input_shapes[1][0] == d and e.input_shapes[1][1] >= vocab
    ]  # fmt: skip


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
    loss_fn = loss_fn or own_loss
    loss_v, grads_v = loss_and_grads(model, loss_fn, x, device)
    diff = sum(float((grads_v[k] - g).pow(2).sum()) for k, g in grads_e.items())
    norm = sum(float(g.pow(2).sum()) for g in grads_e.values())
    row = {
        "variant": variant,
        "cell": [B, C],
        "loss_eager": loss_e,
        "loss": loss_v,
        "loss_abs_diff": abs(loss_v - loss_e),
        "grad_rel_diff": math.sqrt(diff / norm),
        "logit_slices": logit_slices(model, loss_fn, x, device),
    }
    tol = plan["tolerance"]
    row["passed"] = bool(
        row["loss_abs_diff"] <= tol["loss"] and row["grad_rel_diff"] <= tol["grad"]
    )
    return row


def task_check(plan: dict, task: dict) -> dict:
    return compare_to_eager(task["variant"], plan, worker_device(plan))


def timed_steps(step, device, seconds: float, min_steps: int) -> tuple[int, float]:
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
    from torch._dynamo.utils import counters

    device = worker_device(plan)
    B, C = task["cell"]
    step, micro_batch, passes = prepared_step(plan, task, device)
    start = time.perf_counter()
    for _ in range(plan["warmup_steps"]):  # compiles a compiled variant
        step()
    synchronize(device)
    warmup = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, seconds = timed_steps(step, device, plan["seconds_per_cell"], plan["min_steps"])
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
        # graphs inductor compiled or found in its cache; 0: not compiled by inductor
        "inductor_graphs": sum(counters["inductor"][k] for k in INDUCTOR_GRAPHS),
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
INDUCTOR_GRAPHS = ("fxgraph_cache_miss", "fxgraph_cache_hit", "fxgraph_cache_bypass")
# A child's result is its stdout's last line that starts so; whatever else it prints is noise.
RESULT = "gpu_plan result: "


def worker(text: str) -> int:
    task = json.loads(text)
    plan = {**PLANS[task["plan"]], "name": task["plan"]}
    plan["cells"] = [tuple(c) for c in plan["cells"]]
    result = TASKS[task["kind"]](plan, task)
    print(RESULT + json.dumps(result), flush=True)
    return 0


def parse_result(out: str) -> tuple[dict | None, str | None]:
    """(a child's result, None), or (None, why there is none) for malformed output."""
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    if not lines:
        last = (out.strip().splitlines() or ["nothing"])[-1]
        return None, f"malformed output: no result line; its last line: {last[:200]!r}"
    try:
        result = json.loads(lines[-1][len(RESULT) :])
    except json.JSONDecodeError as err:
        return None, f"malformed output: {err}: {lines[-1][:200]!r}"
    if not isinstance(result, dict):
        return None, f"malformed output: not a JSON object: {lines[-1][:200]!r}"
    return result, None


# --------------------------------------------------------------------------------------------
# The parent: phases, limits, the JSON and the table

OUT_OF_TIME = "not attempted: out of time"


class Plan:
    """The running plan: its record (written after every measurement) and its deadline. The
    record's ``cells`` hold a row for every (variant, cell) from the start, each ``status``
    "measured" or why not; ``previous``, a record of the same plan, keeps its measurements."""

    def __init__(self, name: str, out: Path | None, minutes: float, previous: dict | None = None):
        self.name, self.settings = name, PLANS[name]
        self.out, self.deadline = out, time.monotonic() + 60 * minutes
        self.record = previous or {"plan": name, "environment": None, "checks": [],
                                   "cells": [], "packing": [], "errors": []}  # fmt: skip
        kept = {row_key(r): r for r in measured_rows(self.record)}
        self.record["cells"] = [
            kept.get((v, tuple(c)), {"variant": v, "cell": list(c), "status": OUT_OF_TIME})
            for v in self.settings["variants"]
            for c in self.settings["cells" if v == "eager" else "variant_cells"]
        ]

    def row(self, variant: str, cell) -> dict:
        return next(r for r in self.record["cells"] if row_key(r) == (variant, tuple(cell)))

    def set_row(self, row: dict) -> None:
        self.record["cells"][self.record["cells"].index(self.row(*row_key(row)))] = row
        self.write()

    def out_of_time(self) -> bool:
        return self.deadline - time.monotonic() < 1

    def limit(self, kind: str) -> float:
        return max(1.0, min(self.settings["limits"][kind], self.deadline - time.monotonic()))

    def command(self, task: dict) -> list[str]:
        return [sys.executable, str(HERE), "--worker", json.dumps({**task, "plan": self.name})]

    def run(self, task: dict, kind: str) -> tuple[dict | None, str | None]:
        """One measurement in a child process: (its result, None), or (None, why not), the
        reason also in ``errors`` unless the plan's time had run out before it."""
        if self.out_of_time():
            return None, OUT_OF_TIME
        limit = self.limit(kind)
        finished = wait_for([start(self.command(task))], limit)
        if finished is None:
            return None, self.error(task, f"timed out after {limit:.0f} s")
        (code, out, err), *_ = finished
        if code != 0:
            return None, self.error(task, (err.strip().splitlines() or [f"exit code {code}"])[-1])
        result, why = parse_result(out)
        return result, why and self.error(task, why)

    def error(self, task: dict, why: str) -> str:
        self.record["errors"].append({"task": task, "error": why})
        print(f"  {task.get('kind')} {task.get('variant', '')} {task.get('cell', '')}: {why}")
        self.write()
        return why

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


def row_key(row: dict) -> tuple[str, tuple]:
    return row["variant"], tuple(row["cell"])


def measured_rows(record: dict) -> list[dict]:
    return [r for r in record["cells"] if r["status"] == "measured"]


def vendor_peak(device_name: str) -> float | None:
    return next((peak for key, peak in VENDOR_PEAK.items() if key in device_name.upper()), None)


def phase_environment(plan: Plan) -> bool:
    """The device and its matmul rate; on ``--resume``, only that the device is the file's."""
    env, why = plan.run({"kind": "env"}, "env")
    if env is None:
        return False
    previous = plan.record["environment"]
    if previous is not None and previous["device"] != env["device"]:
        print(f"error: {plan.out} was measured on {previous['device']}, this is {env['device']}:"
              f" resume it on the same GPU, or give --out a new file", file=sys.stderr)  # fmt: skip
        return False
    env["vendor_peak_tflops"] = vendor_peak(env["device"]) if plan.name == "gpu" else None
    plan.record["environment"] = previous or env
    plan.write()
    print(f"{env['device']}: torch {env['torch']}, CUDA {env['cuda']}, triton {env['triton']};"
          f" matmul {env['matmul_tflops']:.1f} TFLOP/s"
          f" (vendor peak {env['vendor_peak_tflops'] or 'unknown'})", flush=True)  # fmt: skip
    return True


def check(plan: Plan, variant: str) -> str | None:
    """A variant's correctness check against eager; None when it passed, else why not."""
    done = {row["variant"]: row for row in plan.record["checks"]}
    row = done.get(variant)
    if row is None:
        row, why = plan.run({"kind": "check", "variant": variant}, "check")
        if row is None:
            return why if why == OUT_OF_TIME else f"not timed: its check failed to run: {why}"
        plan.record["checks"].append(row)
        plan.write()
        verdict = "ok" if row["passed"] else "FAILED: not timed"
        print(f"check {variant:16s} loss {row['loss']:.6f} vs {row['loss_eager']:.6f}"
              f" (|diff| {row['loss_abs_diff']:.2e}), grad rel diff {row['grad_rel_diff']:.2e},"
              f" lm head in {len(row['logit_slices'])} slices: {verdict}", flush=True)  # fmt: skip
    return None if row["passed"] else "not timed: it failed its check against eager"


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


def variant_order(plan: Plan) -> list[tuple[str, tuple]]:
    """Every (variant, cell) to time after the baseline, cheapest first: the eager-mode ones
    before those that compile, each from the smallest cell up."""
    settings = plan.settings
    rows = [(v, tuple(c)) for v in settings["variants"][1:] for c in settings["variant_cells"]]

    def cost(row):
        variant, (B, C) = row
        return "compiled" in variant.split("-"), B * C, VARIANTS.index(variant)

    return sorted(rows, key=cost)


def phase_baseline(plan: Plan) -> None:
    """The eager step at every cell, smallest first: what every other row is measured against."""
    for cell in sorted(plan.settings["cells"], key=lambda c: c[0] * c[1]):
        measure(plan, "eager", cell, "eager")


def phase_variants(plan: Plan) -> None:
    """Each variant, checked against eager before its first row, at each cell, cheapest first."""
    verdicts = {}  # variant: None (passed its check) or why not, once per run
    for variant, cell in variant_order(plan):
        if plan.row(variant, cell)["status"] == "measured":
            continue
        if verdicts.get(variant, OUT_OF_TIME) == OUT_OF_TIME:
            verdicts[variant] = check(plan, variant)
        why = verdicts[variant]
        if why is None:
            measure(plan, variant, cell, "variant")
        elif why != OUT_OF_TIME:
            plan.set_row({"variant": variant, "cell": list(cell), "status": why})


def measure(plan: Plan, variant: str, cell, kind: str) -> None:
    """One (variant, cell) timed, unless a previous run measured it: its row, measured or why
    not."""
    if plan.row(variant, cell)["status"] == "measured":
        return
    row, why = plan.run({"kind": "time", "variant": variant, "cell": list(cell)}, kind)
    if row is None:
        status = why if why == OUT_OF_TIME else f"failed: {why}"
        plan.set_row({"variant": variant, "cell": list(cell), "status": status})
        return
    row = with_mfu({**row, "status": "measured"}, plan)
    plan.set_row(row)
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
    """n processes training at once, for each n a previous run did not measure."""
    done = {row["processes"] for row in plan.record["packing"]}
    for n in plan.settings["pack"]:
        if n in done:
            continue
        task = {"kind": "pack", "n": n}
        if plan.out_of_time():
            plan.error(task, OUT_OF_TIME)
            continue
        rows, why = packed_run(plan, n)
        if rows is None:
            plan.error(task, why)
            continue
        total = sum(r["tokens_per_second"] for r in rows)
        per_process = [r["tokens_per_second"] for r in rows]
        cell = list(plan.settings["pack_cell"])
        plan.record["packing"].append(
            {"processes": n, "cell": cell, "tokens_per_second": total, "per_process": per_process}
        )
        plan.record["packing"].sort(key=lambda row: row["processes"])
        print(f"packing {n} processes at {tuple(plan.settings['pack_cell'])}:"
              f" {total:12,.0f} tok/s in all", flush=True)  # fmt: skip
        plan.write()


def packed_run(plan: Plan, n: int) -> tuple[list[dict] | None, str | None]:
    """The results of ``n`` processes training at once, or (None, why not)."""
    cell = list(plan.settings["pack_cell"])
    with tempfile.TemporaryDirectory() as barrier:
        tasks = [{"kind": "pack", "cell": cell, "n": n, "index": i, "barrier": barrier,
                  "plan": plan.name} for i in range(n)]  # fmt: skip
        finished = wait_for([start(plan.command(t)) for t in tasks], plan.limit("pack"))
    if finished is None:
        return None, "timed out"
    failed = [err.strip().splitlines()[-1:] for code, _, err in finished if code]
    if failed:
        return None, f"a process failed: {failed[0]}"
    rows = [parse_result(out) for _, out, _ in finished]
    bad = [why for row, why in rows if row is None]
    return (None, bad[0]) if bad else ([row for row, _ in rows], None)


# --------------------------------------------------------------------------------------------
# Phase 5: profiles and the projection of paper.yaml (arithmetic: also --project)


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
    """Phase 5 on what the record holds so far: profiles per variant, the projection."""
    env = record["environment"]
    if env is None or not measured_rows(record):
        return
    profiles = {}
    for variant in VARIANTS:
        rows = [r for r in measured_rows(record) if r["variant"] == variant]
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
    """What a training job's ``auto`` reads (``execution.resolve_step_path``): the ``cells``
    ("BxC") where eager was measured, and per variant its settings, whether it matched eager,
    and its speed-up over eager at each of those cells where it was measured too."""
    checks = {row["variant"]: row["passed"] for row in record["checks"]}
    ms = {row_key(row): row["ms_per_step"] for row in measured_rows(record)}
    plan = PLANS[record["plan"]]
    variants = {}
    for variant in plan["variants"][1:]:
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
    cells = [f"{b}x{c}" for v, (b, c) in ms if v == "eager"]
    return {"device": record["environment"]["device"], "cells": cells, "variants": variants}


def print_table(record: dict) -> None:
    """ms per step of every timed (cell, variant), and each variant's speed-up over eager."""
    rows = measured_rows(record)
    cells = sorted({tuple(r["cell"]) for r in rows}, key=lambda c: c[0] * c[1])
    ms = {(tuple(r["cell"]), r["variant"]): r["ms_per_step"] for r in rows}
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
    if measured_rows(record):
        print_table(record)
    missing = [r for r in record["cells"] if r["status"] != "measured"]
    for row in missing:
        print(f"{str(tuple(row['cell'])):12s} {row['variant']:16s} {row['status']}")
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
    parser.add_argument(
        "--minutes",
        type=float,
        default=6.0,
        help="the plan's deadline (6: a 15-minute GPU loan, start-up included)",
    )
    parser.add_argument(
        "--resume", type=Path, help="a plan's JSON: measure only what it lacks, into it (or --out)"
    )
    parser.add_argument("--project", type=Path, help="redo phase 5 on this JSON, and print")
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
    plan = new_plan(args)
    if not phase_environment(plan):
        return 1
    phase_baseline(plan)
    phase_packing(plan)
    phase_variants(plan)
    plan.write()
    print_summary(plan.record)
    usable = (
        "its profile is what execution.device_profile takes"
        if "profile" in plan.record
        else ("no eager cell was timed, so it holds no profile")
    )
    print(f"wrote {plan.out}; {usable}")
    return 0


def new_plan(args) -> Plan:
    """The plan of the command line: a fresh one, or on ``--resume`` the file's, continued."""
    if args.resume is None:
        return Plan("smoke" if args.smoke else "gpu", args.out, args.minutes)
    try:
        previous = json.loads(args.resume.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(
            f"error: --resume {args.resume}: {err}; give the JSON a plan wrote"
        ) from None
    return Plan(previous["plan"], args.out or args.resume, args.minutes, previous)


if __name__ == "__main__":
    raise SystemExit(main())
