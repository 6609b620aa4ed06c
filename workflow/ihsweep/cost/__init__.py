"""What a study costs before it runs: FLOPs, peak memory, micro-batch, walltime, storage.

    python -m ihsweep.cost                              # the study in config.yaml
    python -m ihsweep.cost --configfile workflow/studies/paper.yaml --csv cost.csv

One row per training run (cell): updates, tokens, the micro-batch the job will use, its
estimated peak memory against the device's, estimated device-hours at the full budget and with
early stop, the walltime it asks a cluster for, and the disk its checkpoints take; then the
totals of both budgets. A study that trains on the CPU is shown in core-hours and host memory.
Everything here is arithmetic (no torch, no config): the trainer uses it to pick its
micro-batch and loss chunks; ``ihsweep.cost.study`` applies it to a study's runs, which
``ihsweep.steps.prepare`` uses to refuse, before any job starts, a cell that does not fit in memory
even one sequence at a time, and the rules for each job's runtime and memory;
``ihsweep.cost.report`` is the table (``python -m ihsweep.cost``).

**Time.** A training job's seconds are
``updates * micro_batches * step_overhead + tokens * flops_per_token / (peak_flops * mfu)``:
a fixed cost per forward/backward pass (kernel launches, Python, the optimiser), which dominates
small (B, C) cells, plus the FLOPs at a sustained fraction of the device's peak. The constants
are a *device profile*: built-in ones for common GPUs (the H200's measured, the others the
vendor's bf16 dense peak at the H200's measured ``mfu``, ``step_overhead_ms`` assumed) and one
measured on the development CPU; ``bench/gpu_plan.py`` measures them on the user's own
device and writes a profile file that ``execution.device_profile`` accepts. The walltime asked
for is ``attempt * ceil(overhead_minutes + safety * seconds / 60)``, always for the full budget:
a run may form no induction heads and then trains to its end.

**Early stop.** With ``training.stop_after_emergence``, a run is expected to stop at the first
of its checkpoints at or past the transition the study's law predicts (``checkpoints.densify``)
plus ``margin_decades`` (``early_stop_tokens``), capped at its budget; the table prints those
tokens and hours beside the full budget's. The trainer stops ``margin_decades`` past the *upper
end* of the observed point's interval, once two checkpoints in a row confirm it, so a run whose
transition comes where the law says stops at or a little after this estimate; a run that forms
none trains its budget. Without a law (or on Markov data, which the law does not predict) the
expected tokens are the budget.

**Memory.** Peak bytes of a training step at micro-batch m: the runtime (CUDA context or the
CPU process), fp32 weights, gradients and AdamW's two moments (16 bytes per parameter, plus a
bf16 copy under autocast on CUDA), the activations the backward pass keeps (per token, per
layer: 8 d-vectors in attention, 10 in the MLP, counted at 4 bytes; llama's rotated queries
and keys add 2, its SwiGLU keeps 2 + 4 x 8/3 instead of 10), and the logits of one loss
chunk (``LOSS_CHUNK_LOGITS``: the trainer computes the loss a slice of positions at a time, so
the logits never exist for the whole micro-batch). ``tests/test_cost.py`` checks the estimate
against measured peaks.
"""

from __future__ import annotations

import glob
import json
import math
import os
from pathlib import Path

GB = 1e9
MB = 1e6

# The trainer's loss computes at most this many logits at once (training/step.py): on the CPU
# 16M (64 MB in fp32), on a GPU 64M, small next to its memory and large enough for full-speed
# matmuls (1,335 positions of GPT-2's vocabulary).
LOSS_CHUNK_LOGITS = {"cpu": 2**24, "cuda": 2**26}
# Bytes per logit alive during the loss of one chunk: fp32 logits, the log-softmax saved for
# backward, its gradient, the logits' gradient (the measured factor was 3.9x the fp32 logits: one
# CPU training step at vocabulary 50,257, width 64, B 16, C 256 raised peak resident memory by
# 3.23 GB over 0.82 GB of fp32 logits); plus the bf16 logits on CUDA.
LOGIT_BYTES = {"cpu": 16, "cuda": 18}
ACTIVATION_BYTES = 4  # fp32 on CPU; on CUDA bf16 for matmul inputs: an upper bound there
# What the process holds beside the state, activations and logits that peak_memory counts: on
# the CPU the imported libraries (0.29 GB) plus allocator and BLAS workspace, which varies with
# the machine. The analog cell of tests/test_cost.py, at micro-batches 1 to 32, peaked 0.39-0.54
# GB above the counted parts on the development machine and 0.62 GB above them on CI's (1.30 GB
# at micro-batch 16, over an estimate of 1.27 GB when this was 0.6 GB). On CUDA: the context.
RUNTIME_BYTES = {"cpu": 0.75 * GB, "cuda": 1.0 * GB}
MEMORY_MARGIN = 0.85  # auto picks a micro-batch whose estimate is within this share of the limit

# Device profiles: peak_tflops is the vendor's dense bf16 peak (on the CPU: the measured fp32
# matmul peak, bf16 being slower there); mfu, the sustained fraction of it on this model;
# step_overhead_ms, the fixed cost of one forward/backward pass; memory_gb, what the job can use
# (null: the job's host memory, execution.train_mem_mb). `source` says where numbers come from.
# The GPU profiles other than h200 are not measured: the vendor's peak, and the mfu that the
# paper model sustained against that peak on an H200 (eager bf16, vocabulary 50,257: 67 TFLOP/s
# of 989; the unpadded vocabulary sends its output matmul to slow kernels), where 0.3 was
# assumed before and proved 4.4x too fast. Measure yours with bench/gpu_plan.py.
GPU_ASSUMED = (
    "vendor peak; mfu taken from the H200's measurement, step overhead assumed: "
    "run bench/gpu_plan.py"
)
GPU_MFU = 0.07
DEVICE_PROFILES = {
    "cpu": {
        # One thread: fp32 matmul peak ~160 GFLOP/s; the default-study model trains at 15-23k
        # tokens/s, ~1 MFLOP a token (bench/device_profile.py --device cpu; shared notes).
        "peak_tflops": 0.16,
        "mfu": 0.14,
        "step_overhead_ms": 0.5,
        "memory_gb": None,
        "source": "one thread of the 2-core development machine, measured (docs/results.md)",
    },
    "a10": {"peak_tflops": 125, "mfu": GPU_MFU, "step_overhead_ms": 3.0, "memory_gb": 24},
    "l40s": {"peak_tflops": 362, "mfu": GPU_MFU, "step_overhead_ms": 3.0, "memory_gb": 48},
    "a100-40gb": {"peak_tflops": 312, "mfu": GPU_MFU, "step_overhead_ms": 3.0, "memory_gb": 40},
    "a100-80gb": {"peak_tflops": 312, "mfu": GPU_MFU, "step_overhead_ms": 3.0, "memory_gb": 80},
    "h100": {"peak_tflops": 989, "mfu": GPU_MFU, "step_overhead_ms": 3.0, "memory_gb": 80},
    "h200": {
        # bench/device_profile.py on one H200 (torch 2.11, CUDA 13.0, eager bf16): the measured
        # bf16 matmul peak, and the fit over (B, C) = (8, 64), (32, 256), (256, 1024)
        # (docs/clusters.md).
        "peak_tflops": 807,
        "mfu": 0.083,
        "step_overhead_ms": 1.0,
        "memory_gb": 141,
        "source": "one H200, measured, eager (docs/clusters.md)",
    },
}
for _name, _profile in DEVICE_PROFILES.items():
    _profile.setdefault("source", GPU_ASSUMED)
    _profile["name"] = _name
DEFAULT_GPU_PROFILE = "a100-80gb"  # a GPU job whose gpu_model names no profile
# Under execution.gpu: auto a run's jobs ask for a GPU only where its profile predicts the run
# at least this many times as fast as on one CPU thread: the default study's models measured
# about 2x on an H200 (docs/clusters.md), a GPU-hour that buys little a CPU-hour would not.
GPU_MIN_SPEEDUP = 3.0
PROFILE_KEYS = ("peak_tflops", "mfu", "step_overhead_ms", "memory_gb")

# Dataset jobs. Measured here: GPT-2's tokenizer encodes 2.0 MB of text per second (the KJV,
# 4.1 MB in 2.04 s, 2 cores). A hub corpus's size is unknown before it is streamed: counted at
# HUB_BYTES_PER_DOCUMENT (CC100 documents are paragraphs; an upper estimate).
TOKENIZE_BYTES_PER_SECOND = 2.0e6
KJV_BYTES = 4_136_544
HUB_BYTES_PER_DOCUMENT = 1000
HUB_UNBOUNDED_MINUTES = 24 * 60  # a hub corpus read whole (max_documents: null)
CHUNK_TOKENS_PER_SECOND = 5.0e6  # cutting and selecting chunks (numpy on a memory map)
DATA_JOB_MEM_MB = 4000  # tokenize and chunk stream their input: memory does not grow with it


# --------------------------------------------------------------------------------------------
# Model arithmetic


def mlp_width(model: dict) -> int:
    """The MLP's hidden width: 4 d (gpt2's GELU MLP) or, for llama's SwiGLU, 8/3 d rounded up to
    a multiple of 8, so that its three matrices hold about gpt2's two's parameters."""
    d = model["d_model"]
    return 4 * d if family(model) == "gpt2" else -(-8 * d // 3 // 8) * 8


def family(model: dict) -> str:
    """A model's family; a model dict without one is gpt2 (run specs leave gpt2's out)."""
    return model.get("family", "gpt2")


def parameter_count(model: dict, vocab_size: int) -> int:
    """Parameters of ``ihsweep.training.model.GPT`` (tied embeddings, no attention-output bias;
    llama: no biases, RMSNorm, no position embeddings, a SwiGLU MLP)."""
    d, L, f = model["d_model"], model["n_layer"], mlp_width(model)
    if family(model) == "llama":
        attention = d + 4 * d * d  # ln_1, qkv, out
        mlp = d + 3 * d * f if model["mlp"] else 0  # ln_2, gate, up, down
        return vocab_size * d + L * (attention + mlp) + d
    attention = 2 * d + (3 * d * d + 3 * d) + d * d  # ln_1, qkv, out
    mlp = 2 * d + (d * f + f) + (f * d + d) if model["mlp"] else 0
    return vocab_size * d + model["n_ctx"] * d + L * (attention + mlp) + 2 * d


def flops_per_token(model: dict, vocab_size: int, context: int) -> float:
    """Training FLOPs per token (forward + backward), the PaLM appendix-B estimate: 6 per
    matmul weight (gpt2's MLP has 2 matrices, llama's SwiGLU 3) and 12 L d C for attention; for
    llama also RoPE's 6 d multiply-adds per layer forward (q and k), 18 d with the backward."""
    d, L = model["d_model"], model["n_layer"]
    mlp_matrices = 2 if family(model) == "gpt2" else 3
    per_layer = 4 * d * d + (mlp_matrices * d * mlp_width(model) if model["mlp"] else 0)
    matmul_params = L * per_layer + vocab_size * d
    rope = 18 * L * d if family(model) == "llama" else 0
    return 6 * matmul_params + 12 * L * d * context + rope


def loss_chunk_rows(vocab_size: int, device_type: str) -> int:
    """Positions whose logits the loss computes at once (the trainer's and the estimate's)."""
    return max(1, LOSS_CHUNK_LOGITS[device_type] // vocab_size)


def peak_memory(
    model: dict, vocab_size: int, micro_batch: int, context: int, device_type: str
) -> dict[str, float]:
    """Estimated peak bytes of one training step, by part, and their ``total``."""
    n_params = parameter_count(model, vocab_size)
    d, L, f = model["d_model"], model["n_layer"], mlp_width(model)
    per_layer = 8 * d + (2 * d + f + f if model["mlp"] else 0)  # gpt2: f = 4 d, 10 d in the MLP
    if family(model) == "llama":  # the rotated queries and keys; SwiGLU's up and product
        per_layer += 2 * d + (2 * f if model["mlp"] else 0)
    tokens = micro_batch * context
    rows = min(micro_batch * (context - 1), loss_chunk_rows(vocab_size, device_type))
    parts = {
        "runtime": RUNTIME_BYTES[device_type],
        "state": n_params * (16 + (2 if device_type == "cuda" else 0)),
        # + embeddings, the final LayerNorm and the residual gradients in flight
        "activations": tokens * (L * per_layer + 6 * d) * ACTIVATION_BYTES,
        "logits": rows * vocab_size * LOGIT_BYTES[device_type],
    }
    return {**parts, "total": sum(parts.values())}


def pick_micro_batch(
    model: dict, vocab_size: int, batch_size: int, context: int, device_type: str, limit: float
) -> int | None:
    """The largest micro-batch m <= B whose estimated peak is within MEMORY_MARGIN of ``limit``
    bytes; None when not even m = 1 fits. The batch is then split into ceil(B / m) near-equal
    parts (``micro_batch_sizes``), none larger than m."""

    def fits(m: int) -> bool:
        estimate = peak_memory(model, vocab_size, m, context, device_type)["total"]
        return estimate <= MEMORY_MARGIN * limit

    if not fits(1):
        return None
    lo, hi = 1, batch_size  # the estimate grows with m: bisect for the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def choose_micro_batch(
    setting: int | str, model: dict, vocab_size: int, batch_size: int, context: int,
    device_type: str, limit: float,
) -> int | None:  # fmt: skip
    """``execution.micro_batch`` resolved: a number means at most B; ``auto``, the largest that
    fits ``limit`` (``pick_micro_batch``; None when not even one sequence does)."""
    if setting != "auto":
        return min(int(setting), batch_size)
    return pick_micro_batch(model, vocab_size, batch_size, context, device_type, limit)


def micro_batch_sizes(batch_size: int, micro_batch: int) -> list[int]:
    """Sizes of the parts a batch of B runs as: ceil(B / m) parts, differing by at most one."""
    parts = math.ceil(batch_size / micro_batch)
    return [batch_size // parts + (1 if i < batch_size % parts else 0) for i in range(parts)]


# --------------------------------------------------------------------------------------------
# Devices and time


def device_profile(execution: dict) -> dict:
    """The cost model's constants for the study's `execution` section: a built-in profile, or
    a profile file written by bench/gpu_plan.py or bench/device_profile.py. Raises ValueError
    naming the problem."""
    choice = execution["device_profile"]
    if choice == "auto":
        on_cpu = execution["device"] == "cpu" or execution["gpu"] == 0
        gpu_model = (execution["gpu_model"] or "").lower()
        if on_cpu:
            choice = "cpu"
        else:
            choice = gpu_model if gpu_model in DEVICE_PROFILES else DEFAULT_GPU_PROFILE
    if choice in DEVICE_PROFILES:
        return dict(DEVICE_PROFILES[choice])
    path = Path(choice)
    if not path.is_file():
        raise ValueError(
            f"{choice!r} is neither a built-in profile ({', '.join(DEVICE_PROFILES)}) nor a "
            f"file; give one of those, auto, or the JSON that bench/gpu_plan.py writes"
        )
    try:
        profile = json.loads(path.read_text())["profile"]
        for key in PROFILE_KEYS:
            profile[key]  # noqa: B018 - every key must be there
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{choice}: not a device profile (expected {{'profile': {{{', '.join(PROFILE_KEYS)}}}}}"
            f" as bench/gpu_plan.py writes it): {type(err).__name__}: {err}"
        ) from None
    return {"name": str(path), "source": str(path), **profile}


def profile_device_type(profile: dict) -> str:
    return "cpu" if profile["memory_gb"] is None else "cuda"


def memory_limit(profile: dict, execution: dict) -> float:
    """Bytes a training job may use: the GPU's memory, or on the CPU the job's memory."""
    if profile["memory_gb"] is None:
        return execution["train_mem_mb"] * MB
    return profile["memory_gb"] * GB


def train_seconds(updates: int, passes_per_update: int, tokens: int, fpt: float, profile: dict):
    """Estimated seconds of training: the formula in the module's docstring."""
    overhead = updates * passes_per_update * profile["step_overhead_ms"] / 1e3
    compute = tokens * fpt / (profile["peak_tflops"] * 1e12 * profile["mfu"])
    return overhead + compute


def early_stop_tokens(
    predicted_tokens: float, margin_decades: float, checkpoint_tokens: list[int],
    tokens_per_step: int,
) -> int:  # fmt: skip
    """Tokens a run trains when its transition comes at ``predicted_tokens`` and it stops
    ``margin_decades`` past it: the first checkpoint (tokens seen, ascending; the last is the
    budget) at or past the step nearest ``predicted_tokens * 10^margin_decades``, or the last
    checkpoint when the target lies beyond it."""
    target = predicted_tokens * 10.0**margin_decades
    target_step = (2 * target + tokens_per_step) // (2 * tokens_per_step)  # as checkpoint_steps
    return next(
        (t for t in checkpoint_tokens if t // tokens_per_step >= target_step),
        checkpoint_tokens[-1],
    )


def gpu_visible() -> bool:
    """Whether this machine shows its processes an NVIDIA GPU (``execution.device: auto`` would
    train on it), read from the device files so that the cost model needs no torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def job_minutes(seconds: float, execution: dict, attempt: int) -> int:
    """The walltime a cluster job asks for; a retry asks for proportionally more."""
    return attempt * math.ceil(execution["overhead_minutes"] + execution["safety"] * seconds / 60)


def corpus_bytes(corpus: dict) -> float | None:
    """Size of a natural corpus's text before it is read; None when unknown (a whole hub
    dataset)."""
    if corpus["source"] == "kjv":
        return KJV_BYTES
    if corpus["source"] == "files":
        files = {f for pattern in corpus["paths"] for f in glob.glob(pattern, recursive=True)}
        # A folder stands for its .txt files (ihsweep.data.corpus.folder_files).
        files = {t for f in files for t in (Path(f).rglob("*.txt") if Path(f).is_dir() else [f])}
        return sum(Path(f).stat().st_size for f in files)
    if corpus["max_documents"] is None:
        return None
    return corpus["max_documents"] * HUB_BYTES_PER_DOCUMENT


def tokenize_minutes(corpus: dict, execution: dict, attempt: int) -> int:
    size = corpus_bytes(corpus)
    if size is None:
        return attempt * HUB_UNBOUNDED_MINUTES
    return job_minutes(size / TOKENIZE_BYTES_PER_SECOND, execution, attempt)


def chunk_minutes(tokens: float | None, execution: dict, attempt: int) -> int:
    if tokens is None:
        return attempt * HUB_UNBOUNDED_MINUTES
    return job_minutes(tokens / CHUNK_TOKENS_PER_SECOND, execution, attempt)
