"""The language-model head's loss: logits ``features @ W_U.T`` and their cross-entropy.

Three ways of computing the same mean next-token cross-entropy from the final LayerNorm's
features, which ``step.next_token_loss`` chooses between (``HeadPath``):
- **whole**: the logits of every position at once, cast to fp32 (small batches);
- **chunked**: a slice of ``rows`` positions at a time, each slice's logits recomputed in the
  backward pass (activation checkpointing), so one slice's logits exist at once, for one more
  lm-head GEMM per slice;
- **fused** (``fused_cross_entropy``): a slice at a time, each slice's gradients computed in
  the forward pass while its logits exist, as Liger-Kernel's fused linear cross-entropy does;
  nothing is recomputed and the backward pass only scales what the forward pass kept (the
  features' gradient, [positions, d_model], and W_U's, [V, d_model], in fp32).

**A padded vocabulary** (``pad_to``): tensor cores run a GEMM fastest when its sizes are
multiples of 64, which GPT-2's 50,257 is not. The lm-head GEMM then runs on W_U with zero rows
appended up to a multiple of ``pad_to`` (``padded_unembedding``), and the loss reads the first
V logits only. The padding exists inside the loss alone: the model, its initialisation, the
optimizer, checkpoints, probes and exports all have exactly V rows, and the padding rows get
no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class HeadPath:
    """How the loss computes the lm head: its GEMM's rows a multiple of ``pad_to`` (1: V
    rows), and whether the sliced loss is ``fused`` (else chunked, with recomputation)."""

    pad_to: int = 1
    fused: bool = False

    def rows(self, vocab_size: int) -> int:
        return padded_size(vocab_size, self.pad_to)


PLAIN_HEAD = HeadPath()  # V rows, chunked: the CPU's path, and every path's reference


def padded_size(vocab_size: int, multiple: int) -> int:
    return -(-vocab_size // multiple) * multiple


def padded_unembedding(W_U: torch.Tensor, multiple: int) -> torch.Tensor:
    """``W_U`` [V, d] with zero rows appended up to a multiple of ``multiple`` (itself when V is
    one). The gradient reaching the padding rows is dropped by ``F.pad``'s backward."""
    extra = padded_size(len(W_U), multiple) - len(W_U)
    return F.pad(W_U, (0, 0, 0, extra)) if extra else W_U


def real_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The first ``vocab_size`` logits: those of the real vocabulary."""
    return logits if logits.shape[-1] == vocab_size else logits[..., :vocab_size]


def fused_cross_entropy(
    features: torch.Tensor, W_U: torch.Tensor, targets: torch.Tensor, vocab_size: int, rows: int
) -> torch.Tensor:
    """Mean cross-entropy of ``features @ W_U.T`` (its first ``vocab_size`` columns) against
    ``targets``, ``rows`` positions at a time, with the gradients made in the forward pass when
    the caller will need them. ``features`` [N, d] and ``W_U`` [Vp, d] as the autocast context
    gives them to the GEMM (bf16 on a GPU); the logits and their softmax are fp32."""
    wanted = torch.is_grad_enabled() and (features.requires_grad or W_U.requires_grad)
    if not wanted:
        with torch.no_grad():
            return _FusedLinearCrossEntropy.loss_and_grads(
                features, W_U, targets, vocab_size, rows, False
            )[0]
    return _FusedLinearCrossEntropy.apply(features, W_U, targets, vocab_size, rows)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, W_U, targets, vocab_size, rows):
        loss, grad_features, grad_W = _FusedLinearCrossEntropy.loss_and_grads(
            features, W_U, targets, vocab_size, rows, True
        )
        ctx.save_for_backward(grad_features, grad_W)
        ctx.W_dtype = W_U.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # grad_loss is 1, or a micro-batch's share of its batch; a product by 1 keeps the bits
        grad_features, grad_W = ctx.saved_tensors
        grad_W = (grad_W * grad_loss).to(ctx.W_dtype)
        return grad_features * grad_loss, grad_W, None, None, None

    @staticmethod
    def loss_and_grads(features, W_U, targets, vocab_size, rows, with_grads):
        """(mean loss, d loss / d features, d loss / d W_U in fp32); the gradients are None
        without ``with_grads``. The GEMMs run on all of W_U's rows, padding included (their
        logits are left out of the softmax, their gradient columns are zero)."""
        n, padding = len(targets), len(W_U) - vocab_size
        total = torch.zeros((), dtype=torch.float32, device=features.device)
        grad_features = grad_W = None
        if with_grads:
            grad_features = torch.empty_like(features)
            grad_W = torch.zeros(W_U.shape, dtype=torch.float32, device=W_U.device)
        for start in range(0, n, rows):
            part, target = features[start : start + rows], targets[start : start + rows]
            logits = real_logits(part @ W_U.T, vocab_size).float()
            log_z = torch.logsumexp(logits, dim=-1)
            total += (log_z - logits.gather(1, target[:, None]).squeeze(1)).sum()
            if not with_grads:
                continue
            # d(mean loss) / d logits = (softmax - one_hot(target)) / n
            grad_logits = torch.exp_(logits.sub_(log_z[:, None]))
            grad_logits[torch.arange(len(target), device=target.device), target] -= 1.0
            grad_logits = F.pad(grad_logits.div_(n), (0, padding)).to(part.dtype)
            grad_features[start : start + rows] = grad_logits @ W_U
            grad_W += (grad_logits.T @ part).float()
        return total / n, grad_features, grad_W
