"""The training step: one AdamW update of (model, optimizer, batch), and the loss it descends.

``make_update`` binds a job's execution choices (micro-batch, autocast, gradient clipping,
compiled or eager loss) and returns ``update(model, optim, batch) -> loss``, the one function
the trainer calls per step, and the one place a GPU fast path (CUDA graphs, a fused loss)
wraps. A step of B sequences runs as micro-batches (``batch_loss``) whose losses are weighted
by their share of the batch, so their gradients add up to the full batch's; the loss computes
the logits a slice of positions at a time when they are large (``next_token_loss``), so memory
does not grow with B * C * vocabulary. The loss stays on the device: on a GPU a per-step
``.item()`` stalls the queue of kernels.

``execution.compile`` runs the loss (forward, loss and their backward) through
``torch.compile`` with the explicit attention path (``compiled_loss``); evaluation stays eager.
Both are the same computation within float rounding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ihsweep import cost
from ihsweep.training.lm_head import (
    PLAIN_HEAD,
    HeadPath,
    fused_cross_entropy,
    padded_unembedding,
    real_logits,
)
from ihsweep.training.model import GPT


def next_token_loss(
    model: GPT, x: torch.Tensor, autocast, explicit: bool = False, head: HeadPath = PLAIN_HEAD
):
    """Mean cross-entropy of predicting x[:, 1:] from x[:, :-1], in fp32 (``explicit``: with
    the model's explicit attention path; ``head``: how the lm head and its loss run, padded or
    fused, ``ihsweep.training.lm_head``).

    When the logits would exceed the device's ``cost.LOSS_CHUNK_LOGITS``, they are computed a
    slice of positions at a time (chunked: recomputed in the backward pass; or fused: their
    gradients made at once), so only one slice's logits exist at once; the mean is the same
    within float rounding."""
    inputs, targets = x[:, :-1], x[:, 1:].flatten()
    vocab_size = model.cfg.vocab_size
    rows = cost.loss_chunk_rows(head.rows(vocab_size), x.device.type)
    if targets.numel() <= rows and head == PLAIN_HEAD:
        with autocast:
            logits = model(inputs, explicit=explicit)
        return F.cross_entropy(logits.float().flatten(0, 1), targets)
    with autocast:
        features = model.features(inputs, explicit=explicit).flatten(0, 1)
        W_U = padded_unembedding(model.W_U, head.pad_to)
        if head.fused:
            dtype = gemm_dtype(features)  # cast once, not once per slice
            return fused_cross_entropy(features.to(dtype), W_U.to(dtype), targets, vocab_size, rows)
        if targets.numel() <= rows:
            return F.cross_entropy(real_logits(features @ W_U.T, vocab_size).float(), targets)
        total = sum(
            checkpoint(
                _summed_loss,
                features[i : i + rows],
                W_U,
                targets[i : i + rows],
                vocab_size,
                use_reentrant=False,
                preserve_rng_state=False,  # no random numbers drawn; saving them blocks capture
            )
            for i in range(0, targets.numel(), rows)
        )
    return total / targets.numel()


def gemm_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``t`` runs in here: autocast's, where it is on."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else t.dtype


def _summed_loss(features: torch.Tensor, W_U: torch.Tensor, targets: torch.Tensor, vocab_size: int):
    logits = real_logits(features @ W_U.T, vocab_size)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


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
    loss_fn=next_token_loss, capturable: bool = False,
):  # fmt: skip
    """One AdamW update on the batch ``x`` [B, C]; returns its loss, still on the device.
    ``capturable``: no value is read on the host inside the update (the clipping always
    scales), as a CUDA graph's capture needs."""
    optim.zero_grad(set_to_none=True)
    loss = batch_loss(model, x, micro_batch, autocast, backward=True, loss_fn=loss_fn)
    if grad_clip is not None and capturable:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # returns a tensor
    elif grad_clip is not None:
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


def compiled_loss(
    head: HeadPath = PLAIN_HEAD, backend: str = "inductor", fused_attention: bool = False
):
    """``next_token_loss`` through ``torch.compile``: one graph of forward, loss and
    (AOTAutograd) backward per shape, compiled at the first step (a micro-batch of another size
    compiles once more). The model stays the plain module, so its state dict keeps its keys; a
    new model of the same shapes reuses the compiled graph. Attention runs on the explicit path
    (on the CPU the compiler fuses it better than it runs SDPA), or with ``fused_attention``
    (on CUDA) on SDPA's fused kernel, which never holds the [B, H, C, C] weights in memory
    (8.6 GB of fp32 per layer for the paper model at B 256, C 1024)."""
    loss = functools.partial(next_token_loss, explicit=not fused_attention, head=head)
    return torch.compile(loss, dynamic=False, backend=backend)


@dataclass(frozen=True)
class StepPath:
    """How a job's update computes its loss: compiled or eager, and its lm head (padded to a
    multiple of ``head.pad_to``, fused or chunked). ``execution.resolve_step_path`` picks it
    from the ``execution`` settings (compile, vocab_padding, fused_loss); every path computes
    the same update within float rounding, and the plain one is today's bit for bit."""

    compile: bool = False
    head: HeadPath = PLAIN_HEAD

    @classmethod
    def of(cls, settings: dict) -> StepPath:
        """The path of concrete settings {compile, vocab_padding, fused_loss} (no auto)."""
        return cls(settings["compile"], HeadPath(settings["vocab_padding"], settings["fused_loss"]))

    def settings(self) -> dict:
        return {"compile": self.compile, "vocab_padding": self.head.pad_to,
                "fused_loss": self.head.fused}  # fmt: skip

    def loss_fn(self, backend: str = "inductor", device_type: str = "cpu"):
        """The loss of this path on a device of ``device_type`` (compiled: SDPA's fused
        attention kept on CUDA, the explicit path on the CPU)."""
        if self.compile:
            return compiled_loss(self.head, backend, fused_attention=device_type == "cuda")
        return next_token_loss if self.head == PLAIN_HEAD else functools.partial(
            next_token_loss, head=self.head
        )  # fmt: skip

    def describe(self) -> str:
        """What a job's log says of its path: '' for the plain one."""
        parts = ["loss compiled"] if self.compile else []
        if self.head.pad_to > 1:
            parts.append(f"lm head padded to a multiple of {self.head.pad_to}")
        if self.head.fused:
            parts.append("fused loss")
        return ", ".join(parts)


def make_update(
    micro_batch: int, autocast, grad_clip: float | None, loss_fn=next_token_loss,
    capturable: bool = False,
):  # fmt: skip
    """``update(model, optim, batch) -> loss``: ``train_step`` with this job's settings."""
    return functools.partial(
        train_step, micro_batch=micro_batch, autocast=autocast, grad_clip=grad_clip,
        loss_fn=loss_fn, capturable=capturable,
    )  # fmt: skip


def held_learning_rate(device: torch.device) -> torch.Tensor:
    """The one learning-rate tensor of a capturable update (``set_learning_rate``), on the
    parameters' device: fp64 on the CPU, where the fused AdamW then computes with the value of
    the Python float it replaces, bit for bit; fp32 on a GPU, as the fused kernel's math."""
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    return torch.zeros((), dtype=dtype, device=device)


def set_learning_rate(optim: torch.optim.Optimizer, lr: float, held: torch.Tensor | None):
    """Give the next update its learning rate: a float in each group, or, ``held``, written in
    place into the one tensor every group holds (a captured graph reads that tensor's memory).
    The groups are bound to it again each time: loading a saved state replaces their values."""
    if held is not None:
        held.fill_(lr)
    for group in optim.param_groups:
        group["lr"] = lr if held is None else held
