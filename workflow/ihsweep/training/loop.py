"""Train one run: one (dataset, model, batch size B, context size C, seed) configuration.

``train(spec, data_dir, run_dir, ...)`` takes a spec from ``ihsweep.config.Study.train_spec``;
the command is ``python -m ihsweep.steps.train``. Reads top to bottom: data, model, optimiser,
loop, evaluation, checkpoints. Checkpoints are saved at the token counts of the spec (converted
to steps), each with the resume state, so a killed job restarts at its last checkpoint and ends
with the same weights, bit for bit on CPU, as an uninterrupted run: the batch at step i is a
pure function of (seed, i), and the model, optimiser and RNG states are restored exactly.
SIGTERM or SIGUSR1 (sent by SLURM before a walltime kill or on preemption) saves the resume
state at the next step and exits non-zero.

A step of B sequences runs as micro-batches (``train_step``) whose losses are weighted by their
share of the batch, so their gradients add up to the full batch's; the loss computes the logits
a slice of positions at a time when they are large (``next_token_loss``), so memory does not
grow with B * C * vocabulary. The loss reaches the host only when it is logged, never every
step: on a GPU a per-step ``.item()`` stalls the queue of kernels.

A CPU job tunes glibc's allocator first (``keep_freed_memory``: no page faults every step).
``execution.compile`` runs the loss (forward, loss and their backward) through
``torch.compile`` with the explicit attention path (``compiled_loss``); evaluation stays eager.
Both are the same computation within float rounding, and a compiled run resumes bit for bit as
an eager one does. ``bench/train_speed.py --compare`` times this trainer against a minimal
nanoGPT-style loop (they end with the same weights), and compiled against eager.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ihsweep import cost
from ihsweep.data.chunks import open_chunks, read_chunks_meta
from ihsweep.io import write_json
from ihsweep.layout import LOSS_CSV, PROGRESS_JSON, RUN_JSON
from ihsweep.training.checkpoints import (
    DamagedFile,
    list_checkpoints,
    load_resume_state,
    save_checkpoint,
    save_resume_state,
)
from ihsweep.training.model import GPT, GPTConfig

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again", the retry resumes from the saved state
SAVED_WITH_CHECKPOINT = "with its checkpoint"  # why a resume state was saved, in its "saved_on"


class ChunkSampler:
    """Batches of whole chunks in a seeded random order, one fresh permutation per epoch.

    The batch of step i depends only on (seed, i), so resuming needs nothing but the step.
    """

    def __init__(self, chunks: np.ndarray, batch_size: int, seed: int):
        self.chunks, self.batch_size, self.seed = chunks, batch_size, seed
        # The same memory as a plain array: indexing a np.memmap goes through its subclass hooks.
        self._array = np.asarray(chunks)
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._perm = epoch, rng.permutation(len(self.chunks))
        return self._perm

    def batch(self, step: int) -> torch.Tensor:
        """Chunks ``step * B`` to ``(step + 1) * B - 1`` of the endless sequence of epochs."""
        n, size = len(self.chunks), self.batch_size
        epoch, offset = divmod(step * size, n)
        if offset + size <= n:  # within one epoch (most steps): a slice of its permutation
            rows = self._permutation(epoch)[offset : offset + size]
        else:  # across epochs
            flat = np.arange(step * size, (step + 1) * size)
            rows = np.empty(size, dtype=np.int64)
            for epoch in np.unique(flat // n):
                sel = flat // n == epoch
                rows[sel] = self._permutation(int(epoch))[flat[sel] % n]
        return torch.from_numpy(self._array[rows].astype(np.int64))


def lr_at(step: int, total_steps: int, lr: float, warmup_fraction: float) -> float:
    """Linear warmup over the first ``warmup_fraction`` of the run, then cosine decay to 0."""
    warmup = max(1, round(warmup_fraction * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# Logging cadence changes what is written, not what is computed: changing it keeps the state.
# (Device, threads and the progress interval are not in the spec at all: execution settings.)
EXECUTION_KEYS = ("log_every",)
# When a run stops (early once emergence is confirmed, or on divergence) decides how far it
# trains, not what any step computes: a run stopped early is the prefix of the full run, and
# changing these settings resumes it from its saved state instead of retraining it.
STOPPING_KEYS = ("stop_after_emergence", "divergence_tokens")


def spec_hash(spec: dict) -> str:
    ignored = (*EXECUTION_KEYS, *STOPPING_KEYS)
    training = {k: v for k, v in spec["training"].items() if k not in ignored}
    kept = {k: v for k, v in spec.items() if k != "early_stop"}
    blob = json.dumps({**kept, "training": training}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class StopRequested:
    """Turns SIGTERM/SIGUSR1 into a flag checked between steps, so state is saved consistently."""

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame):
        self.signum = signum


class Progress:
    """When to print a progress line: once ``seconds`` of wall time have passed since the last
    one, and at the last step, so a log reads at a steady pace whatever the run's speed (a
    fixed step interval floods the log of a small model and starves that of a large one)."""

    def __init__(self, seconds: float, step: int, clock=time.perf_counter):
        self.seconds, self.clock = seconds, clock
        self.start_time = self.last_time = clock()
        self.start_step = self.last_step = step
        self.losses: list[float] = []
        self.tokens_per_second: float | None = None  # of the last line's window

    def add(self, loss: float) -> None:
        self.losses.append(loss)

    def due(self, step: int, total_steps: int) -> bool:
        return step == total_steps or self.clock() - self.last_time >= self.seconds

    def line(self, step: int, total_steps: int, tokens_per_step: int, flops_per_token: float):
        """The line for ``step`` (losses and speed since the previous line); starts a new one."""
        now = self.clock()
        window = max(now - self.last_time, 1e-9)
        tps = (step - self.last_step) * tokens_per_step / window
        self.tokens_per_second = tps
        mean_tps = (step - self.start_step) * tokens_per_step / max(now - self.start_time, 1e-9)
        eta = (total_steps - step) * tokens_per_step / mean_tps if mean_tps > 0 else 0.0
        loss = float(np.mean(self.losses)) if self.losses else float("nan")
        self.last_time, self.last_step, self.losses = now, step, []
        return (
            f"step {step}/{total_steps} | tokens {step * tokens_per_step / 1e6:.2f}M"
            f" | loss {loss:.4f} | {tps / 1e3:.1f}k tok/s"
            f" | {tps * flops_per_token / 1e9:.1f} GFLOP/s | ETA {format_eta(eta)}"
        )


def write_progress(
    run_dir: Path,
    state: str,
    step: int,
    total_steps: int,
    tokens_per_step: int,
    tokens_per_second: float | None,
    **extra,
) -> None:
    """The run's ``progress.json``, the one record ``ihsweep.status`` reads while it trains::

        {"state": "running" | "interrupted" | "failed" | "done", "step", "total_steps",
         "tokens", "budget", "tokens_per_second" (since the last record), "updated" (Unix time)}

    plus ``signal`` (interrupted) or ``error`` (failed). A record that says running but has not
    been updated for minutes belongs to a job that died without a word (killed, node lost).
    """
    record = {
        "state": state,
        "step": step,
        "total_steps": total_steps,
        "tokens": step * tokens_per_step,
        "budget": total_steps * tokens_per_step,
        "tokens_per_second": None if tokens_per_second is None else round(tokens_per_second, 1),
        "updated": round(time.time(), 3),
        **extra,
    }
    write_json(run_dir / PROGRESS_JSON, record)


def read_progress(run_dir: Path) -> dict:
    """The run's ``progress.json`` ({} when training never started or the file is damaged)."""
    try:
        return json.loads((Path(run_dir) / PROGRESS_JSON).read_text())
    except (OSError, ValueError):
        return {}


def format_eta(seconds: float) -> str:
    s = int(max(0, seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def next_token_loss(
    model: GPT, x: torch.Tensor, autocast, explicit: bool = False, vocab_size: int | None = None
):
    """Mean cross-entropy of predicting x[:, 1:] from x[:, :-1], in fp32 (``explicit``: with
    the model's explicit attention path; ``vocab_size``: over the first ``vocab_size`` logits
    only, for a model whose vocabulary is padded past it; None: over all of them).

    When the logits would exceed the device's ``cost.LOSS_CHUNK_LOGITS``, they are computed a
    slice of positions at a time and recomputed in the backward pass (activation
    checkpointing), so only one slice's logits exist at once; the mean is the same within float
    rounding."""
    inputs, targets = x[:, :-1], x[:, 1:].flatten()
    rows = cost.loss_chunk_rows(model.cfg.vocab_size, x.device.type)
    if targets.numel() <= rows:
        with autocast:
            logits = _first_logits(model(inputs, explicit=explicit), vocab_size)
        return F.cross_entropy(logits.float().flatten(0, 1), targets)
    with autocast:
        features = model.features(inputs, explicit=explicit).flatten(0, 1)
        total = sum(
            checkpoint(
                _summed_loss,
                features[i : i + rows],
                model.W_U,
                targets[i : i + rows],
                vocab_size,
                use_reentrant=False,
            )
            for i in range(0, targets.numel(), rows)
        )
    return total / targets.numel()


def _summed_loss(
    features: torch.Tensor, W_U: torch.Tensor, targets: torch.Tensor, vocab_size: int | None
):
    logits = _first_logits(features @ W_U.T, vocab_size)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def _first_logits(logits: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    return logits if vocab_size is None else logits[..., :vocab_size]


def batch_loss(
    model: GPT, x: torch.Tensor, micro_batch: int, autocast, backward: bool,
    loss_fn=next_token_loss,
):  # fmt: skip
    """The batch's mean loss, computed ``micro_batch`` sequences at a time (on the device; with
    ``backward``, each part's gradients are accumulated). Each part's mean is weighted by its
    share of the batch, so the gradients add up to the full batch's; one part is the plain
    full-batch loss, bit for bit. ``loss_fn``: ``next_token_loss`` or ``compiled_loss()``."""
    parts = torch.split(x, cost.micro_batch_sizes(len(x), micro_batch))
    total = None
    for part in parts:
        loss = loss_fn(model, part, autocast)
        if len(parts) > 1:
            loss = loss * (len(part) / len(x))
        if backward:
            loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


def train_step(
    model, optim, x, micro_batch: int, autocast, grad_clip: float | None,
    loss_fn=next_token_loss,
):  # fmt: skip
    """One AdamW update on the batch ``x`` [B, C]; returns its loss, still on the device."""
    optim.zero_grad(set_to_none=True)
    loss = batch_loss(model, x, micro_batch, autocast, backward=True, loss_fn=loss_fn)
    if grad_clip is not None:
        clip_gradients(model, grad_clip)
    optim.step()
    return loss


def clip_gradients(model: GPT, max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``, bit for bit, without
    its multiplications when they change nothing: it scales every gradient by
    min(1, max_norm / (norm + 1e-6)), and a scale of exactly 1 leaves each value as it is. On
    the CPU that scale is read (no device to wait for) and the scaling skipped when it is 1:
    ~1% of a small model's step. On a GPU reading it would stall the queue, so it scales."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if total.device.type == "cpu" and (max_norm / (total + 1e-6)).item() >= 1.0:
        return  # not NaN, and clamped to exactly 1.0
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total)


@torch.no_grad()
def evaluate(model: GPT, batches: list[torch.Tensor], micro_batch: int, device, autocast):
    model.eval()
    losses = [
        batch_loss(model, x.to(device), micro_batch, autocast, backward=False).item()
        for x in batches
    ]
    model.train()
    return float(np.mean(losses))


def compiled_loss():
    """``next_token_loss`` through ``torch.compile``, on the explicit attention path: one graph
    of forward, loss and (AOTAutograd) backward per shape, compiled at the first step (a
    micro-batch of another size compiles once more). The model stays the plain module, so its
    state dict keeps its keys; a new model of the same shapes reuses the compiled graph."""
    return torch.compile(functools.partial(next_token_loss, explicit=True), dynamic=False)


def resolve_compile(setting: bool | str, device: torch.device) -> bool:
    """Whether a job compiles its loss: ``execution.compile`` (true, false, or auto: on CUDA
    only) on the device it got. The default is false, by measurement on this project's CPU
    (``bench/train_speed.py --compare --compile``, the schema has the numbers): the compiled
    loss is 1.1x as fast at vocabulary 256 and no faster at 2,048, and compiling takes ~35 s,
    which a default-study run of 4M tokens does not win back."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Tune glibc's allocator for a CPU training loop; returns whether it applied (glibc only).

    A step allocates and frees the same tensors every time. By default glibc serves those of
    128 kB and more with fresh mmap()s (raising that threshold only as far as the sizes it has
    seen freed) and returns the top of its heap to the system once 128 kB are free there, so
    every step faults its larger tensors in again, page by page: ~1,000-3,000 page faults a step
    at vocabulary 2,048 (B 16, C 32), ~25% of its time. Serving everything below 32 MB (glibc's
    largest threshold) from the heap and keeping up to 1 GB of it free brings that to ~10 and
    changes no result; the peak memory stays the step's (``tests/test_cost.py`` measures it)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS) or no libc found
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def resolve_micro_batch(
    setting: int | str, cfg: GPTConfig, batch_size: int, context: int, device, memory_mb: int
) -> int:
    """The micro-batch of ``execution.micro_batch`` on the device this job got: a number (at
    most B), or for ``auto`` the largest the memory estimate fits (``ihsweep.cost``) into the
    GPU's memory, or on the CPU into the job's ``memory_mb``."""
    if device.type == "cuda":
        limit = torch.cuda.get_device_properties(device).total_memory
    else:
        limit = memory_mb * cost.MB
    model = cfg.to_dict()
    picked = cost.choose_micro_batch(
        setting, model, cfg.vocab_size, batch_size, context, device.type, limit
    )
    if picked is None:
        need = cost.peak_memory(model, cfg.vocab_size, 1, context, device.type)["total"]
        raise MemoryError(
            f"even one sequence needs ~{need / cost.GB:.1f} GB, more than "
            f"{cost.MEMORY_MARGIN:.0%} of this {device.type} job's {limit / cost.GB:.1f} GB"
        )
    return picked


def train(
    spec: dict,
    data_dir: Path,
    run_dir: Path,
    device: str,
    threads: int,
    progress_seconds: float,
    micro_batch: int | str,
    memory_mb: int,
    stop_after_step: int | None = None,
    compile: bool | str = False,
) -> dict:
    """Run (or resume) one training run; returns the summary written to ``run.json``.

    The execution settings are ``execution``'s (the schema documents them); ``memory_mb`` is the
    job's host memory, which ``micro_batch: auto`` fits a CPU job into; ``compile`` is
    ``execution.compile`` (``resolve_compile``).
    ``progress.json`` follows the run (``write_progress``): running while it trains, then done,
    interrupted (a signal: the state is saved and the retry resumes) or failed (any error)."""
    run_dir = Path(run_dir)
    tokens_per_step = spec["batch_size"] * spec["context_size"]
    execution = (device, threads, progress_seconds, micro_batch, memory_mb, compile)
    try:
        return _train(spec, data_dir, run_dir, *execution, stop_after_step)
    except Exception as err:
        step = read_progress(run_dir).get("step", 0)  # the last step recorded before the error
        error = f"{type(err).__name__}: {err}"
        write_progress(run_dir, "failed", step, spec["total_steps"], tokens_per_step, None,
                       error=error)  # fmt: skip
        raise


def _train(
    spec, data_dir, run_dir, device, threads, progress_seconds, micro_batch, memory_mb,
    compile, stop_after_step,
):  # fmt: skip
    run_dir, tcfg = Path(run_dir), spec["training"]
    B, C, seed = spec["batch_size"], spec["context_size"], spec["seed"]
    total_steps, ckpt_steps = spec["total_steps"], set(spec["checkpoint_steps"])
    device = pick_device(device)
    if device.type == "cpu":
        torch.set_num_threads(threads)
        keep_freed_memory()
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # --- data: chunks of C tokens; the model sees C-1 inputs and predicts C-1 targets per chunk
    meta = read_chunks_meta(data_dir)
    sampler = ChunkSampler(open_chunks(data_dir, "train"), B, seed)
    val = open_chunks(data_dir, "val")
    n_val = min(len(val), tcfg["val_batches"] * B)
    val_batches = [torch.from_numpy(val[i : i + B].astype(np.int64)) for i in range(0, n_val, B)]

    # --- model and optimiser; built on the CPU so the initial weights do not depend on the device
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=meta["vocab_size"], **spec["model_config"])
    model = GPT(cfg).to(device)
    optim = torch.optim.AdamW(
        model.parameters(),
        lr=tcfg["lr"],
        betas=tuple(tcfg["betas"]),
        eps=tcfg["eps"],
        weight_decay=tcfg["weight_decay"],
        fused=True,  # one kernel per step on CUDA and CPU: ~10% of a small CPU model's step
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    micro_batch = resolve_micro_batch(micro_batch, cfg, B, C, device, memory_mb)
    compiled = resolve_compile(compile, device)
    loss_fn = compiled_loss() if compiled else next_token_loss
    print(
        f"[{spec['run_id']}] {len(cost.micro_batch_sizes(B, micro_batch))} micro-batch(es) of "
        f"at most {micro_batch} per update of B = {B} on {device}"
        + (", loss compiled" if compiled else ""),
        flush=True,
    )

    # --- resume, unless the saved state belongs to a different spec (then start afresh)
    # A damaged checkpoint is rewritten by training through its step again, so the run resumes
    # from the newest good state no later than the earliest damaged checkpoint (from step 0 if
    # there is none). Each damaged file is named in the log.
    step, fingerprint, run_id = 0, spec_hash(spec), spec["run_id"]
    loss_log = run_dir / LOSS_CSV
    damaged: list[DamagedFile] = []
    list_checkpoints(run_dir, damaged)
    redo = min((d.step for d in damaged if d.step in ckpt_steps), default=None)
    state, damaged_states = load_resume_state(run_dir, max_step=redo)
    for err in damaged + damaged_states:
        print(f"[{run_id}] {err}", flush=True)
        for path in err.files:  # useless now; a damaged state must not become resume.prev
            path.unlink(missing_ok=True)
    if state is not None and state["spec_hash"] != fingerprint:
        print(f"[{run_id}] spec changed since the saved state: starting afresh", flush=True)
        for sub in ("ckpt", "state", "probes"):
            shutil.rmtree(run_dir / sub, ignore_errors=True)
        loss_log.unlink(missing_ok=True)
        state = None
    # Train losses of the last log window, kept in the state so that a resumed run logs the
    # same windowed means as an uninterrupted one.
    recent: list[float] = []
    if state is not None:
        recent = state["recent_losses"].tolist()
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng_cpu"])
        step = int(state["step"])
        why = f" (state saved {state['saved_on']})" if "saved_on" in state else ""
        print(f"[{run_id}] resuming at step {step}/{total_steps}{why}", flush=True)
    _truncate_loss_log(loss_log, step)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_progress(run_dir, "running", step, total_steps, B * C, None)
    if not loss_log.exists():
        loss_log.write_text("step,tokens,split,loss,lr\n")

    def write_checkpoint(step: int, train_loss: float) -> float:
        """Save the model as the checkpoint of ``step``; returns its val loss."""
        val_loss = evaluate(model, val_batches, micro_batch, device, autocast)
        if not math.isfinite(val_loss):  # the last update broke the weights: not a checkpoint
            raise Diverged(step, f"validation loss {val_loss}")
        ckpt_meta = {
            "run_id": run_id,
            "tokens": step * B * C,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "model_config": cfg.to_dict(),
            "n_params": model.n_params(),
            "spec": spec,
        }
        save_checkpoint(run_dir, step, model, ckpt_meta)
        return val_loss

    def save(step: int, train_loss: float, with_checkpoint: bool, saved_on: str) -> None:
        """The checkpoint of ``step`` (``with_checkpoint``) and the resume state, which records
        why it was saved (``saved_on``: with its checkpoint, the stop's reason, or both), so that
        the log of the run that resumes from it says so."""
        if with_checkpoint:
            val_loss = write_checkpoint(step, train_loss)
            with open(loss_log, "a") as f:
                f.write(f"{step},{step * B * C},val,{val_loss:.6f},\n")
        save_resume_state(
            run_dir,
            {
                "step": step,
                "spec_hash": fingerprint,
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "rng_cpu": torch.get_rng_state(),
                "recent_losses": torch.tensor(recent[-tcfg["log_every"] :], dtype=torch.float64),
                "saved_on": saved_on,
            },
        )

    if state is not None and 0 < step == redo:
        # The state saved with the damaged checkpoint: the same weights give the same file, its
        # train loss is the mean of the state's window (as when it was saved), and the val loss
        # is computed again (evaluation draws no random numbers). loss.csv still has its row.
        write_checkpoint(step, float(np.mean(state["recent_losses"].tolist())))
        print(f"[{run_id}] rewrote the checkpoint of step {step} from the saved state", flush=True)

    if step == 0 and 0 in ckpt_steps:
        save(0, float("nan"), True, SAVED_WITH_CHECKPOINT)

    # --- the loop
    stop = StopRequested()
    flops_per_token = cost.flops_per_token(cfg.to_dict(), cfg.vocab_size, C)
    model.train()
    progress = Progress(progress_seconds, step)  # also times the session for the summary
    unread: list[torch.Tensor] = []  # losses still on the device, read when a line needs them
    watch = DivergenceWatch(
        cfg.vocab_size, tcfg["divergence_tokens"], B * C, _logged_train_losses(loss_log)
    )
    rule = spec.get("early_stop")

    def read_losses() -> tuple[int, str] | None:
        """Move the unread losses to the host; (step, why) if one of them is not finite."""
        if not unread:
            return None
        values = torch.stack(unread).tolist()
        unread.clear()
        recent.extend(values)
        for value in values:
            progress.add(value)
        return watch.check_finite(step - len(values) + 1, values)

    def finish(outcome: str, detail: str = "") -> dict:
        return _finish(spec, run_dir, model, device, micro_batch, step, recent, progress,
                       fingerprint, outcome, detail)  # fmt: skip

    def finish_diverged(bad_step: int, why: str) -> dict:
        # The lr of the update whose weights gave the loss at bad_step.
        bad_lr = lr_at(bad_step - 1, total_steps, tcfg["lr"], tcfg["warmup_fraction"])
        detail = f"{why} at step {bad_step} (lr {bad_lr:.4g})"
        print(f"[{spec['run_id']}] diverged: {detail}; stopped at step {step}", flush=True)
        return finish("diverged", detail)

    probed: dict = {}  # probe_run's memo: each checkpoint is probed or read once per process

    def emergence_confirmed() -> str | None:
        """Probe the checkpoints so far (the probe step's code and cache) and apply the rule."""
        # Imported here: pandas and scipy add ~60 MB to every training job's resident memory,
        # which the memory estimate (ihsweep.cost) does not count, and only this rule needs them.
        from ihsweep.analysis.emergence import confirmed_emergence
        from ihsweep.probing.run import probe_run

        _, series = probe_run(run_dir, rule["probe"], device, memo=probed)
        model.train()
        return confirmed_emergence(series, rule["emergence"], rule["margin_decades"])

    def stops_early() -> str | None:
        """Why the run stops at this checkpoint before its budget (None: it goes on). Every
        checkpoint is probed, the last one too, so the probe step finds them all cached."""
        if rule is None:
            return None
        reason = emergence_confirmed()
        return reason if step < total_steps else None

    if step in ckpt_steps and (reason := stops_early()):
        return finish("stopped_early", reason)  # resumed where it had stopped: it stops again

    while step < total_steps:
        lr = lr_at(step, total_steps, tcfg["lr"], tcfg["warmup_fraction"])
        for group in optim.param_groups:
            group["lr"] = lr
        x = sampler.batch(step).to(device, non_blocking=True)
        loss = train_step(model, optim, x, micro_batch, autocast, tcfg["grad_clip"], loss_fn)
        unread.append(loss)
        step += 1

        log_row = step % tcfg["log_every"] == 0 or step == total_steps
        line_due = progress.due(step, total_steps)
        # Why the loop stops after this step (None: it goes on).
        stopping = (
            f"on signal {int(stop.signum)}" if stop.signum is not None
            else "at stop_after_step" if step == stop_after_step else None
        )  # fmt: skip
        diverged = None
        if log_row or line_due or step in ckpt_steps or stopping:
            diverged = read_losses()
        if log_row and not diverged:
            train_loss = float(np.mean(recent[-tcfg["log_every"] :]))
            with open(loss_log, "a") as f:
                f.write(f"{step},{step * B * C},train,{train_loss:.6f},{lr:.6g}\n")
            diverged = watch.check_logged(step, train_loss)
        if diverged:
            return finish_diverged(*diverged)
        if line_due:
            line = progress.line(step, total_steps, B * C, flops_per_token)
            print(f"[{spec['run_id']}] {line}", flush=True)
            write_progress(run_dir, "running", step, total_steps, B * C, progress.tokens_per_second)
        if step in ckpt_steps:
            try:
                saved_on = SAVED_WITH_CHECKPOINT + (f", {stopping}" if stopping else "")
                save(step, float(np.mean(recent[-tcfg["log_every"] :])), True, saved_on)
            except Diverged as err:
                return finish_diverged(err.step, err.why)
            del recent[: -tcfg["log_every"]]
            if reason := stops_early():
                print(f"[{spec['run_id']}] {reason}", flush=True)
                return finish("stopped_early", reason)
        if stopping:
            if step not in ckpt_steps:
                save(step, float("nan"), False, stopping)
            signal_number = None if stop.signum is None else int(stop.signum)
            write_progress(run_dir, "interrupted", step, total_steps, B * C,
                           progress.tokens_per_second, signal=signal_number)  # fmt: skip
            if stop.signum is not None:
                print(
                    f"[{spec['run_id']}] signal {stop.signum}: state saved at step {step}",
                    flush=True,
                )
                sys.exit(EXIT_INTERRUPTED)
            return {}
    return finish("completed")


class Diverged(Exception):
    """Raised when a checkpoint would hold diverged weights (a non-finite validation loss)."""

    def __init__(self, step: int, why: str):
        super().__init__(f"{why} at step {step}")
        self.step, self.why = step, why


class DivergenceWatch:
    """Whether a run has diverged: a non-finite train loss (checked on every loss the moment
    it reaches the host, at most ``log_every`` updates after it was computed), or, with
    ``training.divergence_tokens``, logged train losses above ln(vocabulary size) for that many
    tokens. ln V is the loss of the uniform prediction an initialised model makes; a model that
    stays worse than that is not learning. It counts from the last logged loss at or below it,
    which ``loss.csv`` keeps, so a resumed run decides the same."""

    def __init__(self, vocab_size: int, patience_tokens, tokens_per_step, logged):
        self.ceiling = math.log(vocab_size)
        self.patience = None if patience_tokens is None else patience_tokens / tokens_per_step
        self.tokens_per_step = tokens_per_step
        self.last_good = max((s for s, loss in logged if loss <= self.ceiling), default=0)

    def check_finite(self, first_step: int, losses: list[float]) -> tuple[int, str] | None:
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                return first_step + i, f"train loss {loss}"
        return None

    def check_logged(self, step: int, loss: float) -> tuple[int, str] | None:
        if loss <= self.ceiling:
            self.last_good = step
            return None
        if self.patience is not None and step - self.last_good >= self.patience:
            tokens = (step - self.last_good) * self.tokens_per_step
            return step, (
                f"train loss {loss:.4f}, above ln(vocabulary) = {self.ceiling:.4f} (the uniform"
                f" prediction) for {tokens} tokens,"
            )
        return None


def _logged_train_losses(loss_log: Path) -> list[tuple[int, float]]:
    rows = [line.split(",") for line in loss_log.read_text().splitlines()[1:]]
    return [(int(r[0]), float(r[3])) for r in rows if r[2] == "train"]


def _finish(spec, run_dir, model, device, micro_batch, step, recent, progress, fingerprint,
            outcome, detail):  # fmt: skip
    """Write the completion record ``run.json`` of a run that ended (``outcome``: completed,
    stopped_early or diverged, ``outcome_detail`` says why) and its last progress record."""
    B, C = spec["batch_size"], spec["context_size"]
    log_every = spec["training"]["log_every"]
    elapsed = time.perf_counter() - progress.start_time
    # Their steps and losses: the start of the job checked the weights' checksums already.
    step0, checkpoints = progress.start_step, list_checkpoints(run_dir, verify=False)
    final_loss = float(np.mean(recent[-log_every:])) if recent else math.nan
    summary = {
        "run_id": spec["run_id"],
        "outcome": outcome,
        "outcome_detail": detail,
        "steps": step,
        "tokens": step * B * C,
        "total_steps": spec["total_steps"],
        "budget": spec["total_steps"] * B * C,
        "prediction": spec.get("prediction"),
        "n_params": model.n_params(),
        "device": str(device),
        "micro_batch": micro_batch,
        "checkpoints": [m["step"] for m in checkpoints],
        "final_train_loss": final_loss if math.isfinite(final_loss) else None,
        "seconds_this_session": round(elapsed, 1),
        "tokens_per_second_this_session": round((step - step0) * B * C / elapsed, 1)
        if step > step0
        else None,
        "spec_hash": fingerprint,
        "spec": spec,
    }
    speed = summary["tokens_per_second_this_session"]
    if outcome == "diverged":
        write_progress(run_dir, "diverged", step, spec["total_steps"], B * C, speed, error=detail)
    else:
        write_progress(run_dir, "done", step, spec["total_steps"], B * C, speed, outcome=outcome)
    write_json(run_dir / RUN_JSON, summary)
    print(f"[{spec['run_id']}] {summary_line(summary, checkpoints)}", flush=True)
    return summary


def summary_line(summary: dict, checkpoints: list[dict]) -> str:
    """The log's last line: how the run ended, what it reached (of its budget), its final
    losses and this session's speed."""
    train_loss, speed = summary["final_train_loss"], summary["tokens_per_second_this_session"]
    val_loss = f"{checkpoints[-1]['val_loss']:.4f}" if checkpoints else "n/a"
    ending = {"completed": "done", "stopped_early": "stopped early", "diverged": "diverged"}
    return (
        f"{ending[summary['outcome']]}: {summary['steps']} of {summary['total_steps']} steps,"
        f" {summary['tokens'] / 1e6:.2f}M of {summary['budget'] / 1e6:.2f}M tokens"
        f" | final train loss {'n/a' if train_loss is None else f'{train_loss:.4f}'}"
        f", val loss {val_loss}"
        f" | {summary['seconds_this_session']:.0f} s this session"
        + ("" if speed is None else f" at {speed / 1e3:.1f}k tok/s")
    )


def _truncate_loss_log(path: Path, step: int) -> None:
    """Drop log lines written after the state we resume from (they will be written again)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = lines[:1] + [ln for ln in lines[1:] if int(ln.split(",", 1)[0]) <= step]
    if len(kept) != len(lines):
        path.write_text("".join(kept))
