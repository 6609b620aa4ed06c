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

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ihsweep import cost
from ihsweep.training.model import GPT


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
    (``bench/trainer_vs_minimal.py --compile``, the schema has the numbers): the compiled
    loss is 1.1x as fast at vocabulary 256 and no faster at 2,048, and compiling takes ~35 s,
    which a default-study run of 4M tokens does not win back."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


def make_update(micro_batch: int, autocast, grad_clip: float | None, loss_fn=next_token_loss):
    """``update(model, optim, batch) -> loss``: ``train_step`` with this job's settings."""
    return functools.partial(
        train_step, micro_batch=micro_batch, autocast=autocast, grad_clip=grad_clip,
        loss_fn=loss_fn,
    )  # fmt: skip
