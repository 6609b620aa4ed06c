"""The lm head's paths (``ihsweep.training.lm_head``) and how a job picks one (``execution``).

A padded vocabulary and the fused loss are GPU speed paths; on the CPU they must compute the
plain path's loss and gradients within float rounding, at a cell large enough to be sliced,
keep the model at V rows, and use less memory (the fused loss); ``auto`` must be the plain
path on the CPU and wherever no measurement says otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ihsweep import cost
from ihsweep.config import execution_of
from ihsweep.training.execution import measured_paths, resolve_step_path, step_path
from ihsweep.training.lm_head import PLAIN_HEAD, HeadPath, fused_cross_entropy, padded_size
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.step import StepPath, next_token_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import lm_head_memory  # noqa: E402

V, B, C = 8001, 32, 256  # 8,160 positions x 8,064 padded logits: 4 slices on the CPU
NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def model_and_batch_of(family: str, vocab: int, batch: int, context: int):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, n_ctx=context, n_layer=1, n_head=2, d_model=32,
                          mlp=True, family=family))  # fmt: skip
    x = torch.randint(0, vocab, (batch, context), generator=torch.Generator().manual_seed(1))
    return model, x


@pytest.fixture(scope="module")
def model_and_batch():
    return model_and_batch_of("gpt2", V, B, C)


def loss_and_grads(model: GPT, loss_fn, share: float = 1.0):
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    (loss * share).backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_the_large_cell_is_sliced_on_every_path():
    for head in (PLAIN_HEAD, HeadPath(64), HeadPath(128, True)):
        assert B * (C - 1) > 3 * cost.loss_chunk_rows(head.rows(V), "cpu")
    assert padded_size(V, 64) == 8064 and padded_size(V, 128) == 8064 and padded_size(64, 64) == 64


@pytest.mark.parametrize(
    "head", [PLAIN_HEAD, HeadPath(64), HeadPath(1, fused=True), HeadPath(128, fused=True)]
)
def test_each_head_path_gives_the_whole_logits_loss_and_gradients(model_and_batch, head):
    """Against the loss of the whole logits, written out here: the loss to 1e-6 and every
    gradient to 1e-5 relative, also for a micro-batch's share of a batch (the backward pass
    scaled by 0.25); the model's unembedding and its gradient keep V rows."""
    assert_head_path_is_the_whole_loss(*model_and_batch, head, V)


@pytest.mark.parametrize(
    "head", [PLAIN_HEAD, HeadPath(64), HeadPath(1, fused=True), HeadPath(128, fused=True)]
)
def test_a_llama_model_takes_every_head_path_alike(head):
    # The family changes what computes the final features, not the head: a small cell (one
    # slice) is enough to show a llama model's features and W_U go through every path.
    # Its gradients are float rounding apart by up to 1.3e-8, as a gpt2 model's of the same size.
    model, x = model_and_batch_of("llama", 1001, 4, 32)
    assert_head_path_is_the_whole_loss(model, x, head, 1001, atol=1e-7)


def assert_head_path_is_the_whole_loss(model, x, head, vocab, atol=1e-9):
    inputs, targets = x[:, :-1], x[:, 1:].flatten()

    def whole():
        return F.cross_entropy(model(inputs).flatten(0, 1), targets)

    def path():
        return next_token_loss(model, x, NO_AUTOCAST, head=head)

    for share in (1.0, 0.25):
        want, want_grads = loss_and_grads(model, whole, share)
        got, got_grads = loss_and_grads(model, path, share)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        for name, grad in want_grads.items():
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=atol, msg=name)
    assert model.W_U.shape[0] == vocab and got_grads["wte.weight"].shape[0] == vocab


def test_the_fused_loss_without_gradients_is_the_same_loss(model_and_batch):
    """Evaluation (no_grad) takes the fused loss's forward slices only."""
    model, x = model_and_batch
    with torch.no_grad():
        fused = next_token_loss(model, x, NO_AUTOCAST, head=HeadPath(64, fused=True))
        plain = next_token_loss(model, x, NO_AUTOCAST)
    assert not fused.requires_grad
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=0)


def test_the_fused_loss_takes_what_autocast_gives_the_gemm():
    """Under bf16 autocast the fused loss runs its GEMMs in bf16 and stays within bf16 rounding
    of the chunked loss (on the CPU's autocast, as a GPU's runs)."""
    torch.manual_seed(2)
    features = torch.randn(600, 32, requires_grad=True)
    W_U = (0.02 * torch.randn(1000, 32)).requires_grad_()
    targets = torch.randint(0, 1000, (600,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fused_cross_entropy(features.bfloat16(), W_U.bfloat16(), targets, 1000, 128)
    got.backward()
    want = F.cross_entropy(features @ W_U.T, targets)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0)
    assert features.grad.dtype == torch.float32 and W_U.grad.dtype == torch.float32


def test_the_fused_loss_peaks_far_below_the_whole_logits():
    """Peak resident memory above the inputs, each path in a process of its own
    (``bench/lm_head_memory.py``), at 4,096 positions of GPT-2's vocabulary: the whole logits
    and their gradient take ~1.6 GB (a peak of 2.5 GB), a fused slice of 333 positions ~70 MB
    (a peak of 225-238 MB; the chunked loss 368 MB). The peaks are the children's own, whatever
    this process holds (the script resets the high-water mark before the loss)."""
    rows = lm_head_memory.compare(4096, 50257, 32)
    whole, chunked, fused = rows["whole"], rows["chunked"], rows["fused"]
    assert whole["peak_bytes"] > 2 * 4096 * 50257 * 4 * 0.9
    assert fused["peak_bytes"] < 0.5 * whole["peak_bytes"]  # measured: 0.09-0.10x
    assert lm_head_memory.agrees(fused, whole) and lm_head_memory.agrees(chunked, whole)


# --------------------------------------------------------------------------------------------
# auto: the plain path unless a measurement of this GPU says otherwise


def measured(**variants) -> dict:
    cells = sorted({cell for v in variants.values() for cell in v["speedup"]})
    return {"device": "NVIDIA H100 80GB HBM3", "cells": cells, "variants": variants}


def variant(compile=False, pad=1, fused=False, correct=True, **speedup) -> dict:
    settings = {"compile": compile, "vocab_padding": pad, "fused_loss": fused}
    return {"settings": settings, "correct": correct, "speedup": speedup}


AUTO = {"compile": "auto", "vocab_padding": "auto", "fused_loss": "auto"}


def test_auto_is_the_plain_path_on_the_cpu_and_without_a_measurement(tmp_path):
    cpu = torch.device("cpu")
    assert step_path(execution_of(), cpu, 8, 64) == StepPath()
    assert step_path(execution_of({"device_profile": "h100"}), cpu, 256, 1024) == StepPath()
    assert resolve_step_path(AUTO, 256, 1024, None) == StepPath()
    profile = tmp_path / "gpu_plan.json"
    profile.write_text('{"profile": {}, "paths": {"device": "cpu", "variants": {}}}')
    assert measured_paths(str(profile), cpu) is None  # measurements are of GPUs only
    assert StepPath().loss_fn() is next_token_loss  # the plain path: today's loss, bit for bit


def test_auto_takes_the_fastest_path_measured_correct_at_the_nearest_cell():
    paths = measured(
        compiled=variant(compile=True, **{"8x64": 3.0, "256x1024": 0.9}),
        padded=variant(pad=64, **{"8x64": 1.1, "256x1024": 1.3}),
        fused=variant(fused=True, correct=False, **{"8x64": 9.0, "256x1024": 9.0}),
        **{"padded-fused": variant(pad=64, fused=True, **{"8x64": 0.8, "256x1024": 1.6})},
    )
    assert resolve_step_path(AUTO, 8, 64, paths) == StepPath(compile=True)
    assert resolve_step_path(AUTO, 16, 64, paths) == StepPath(compile=True)  # nearest: 8x64
    assert resolve_step_path(AUTO, 128, 1024, paths) == StepPath(head=HeadPath(64, True))
    # A set value stays; the autos take the fastest path that agrees with it.
    fixed = {**AUTO, "fused_loss": False}
    assert resolve_step_path(fixed, 256, 1024, paths) == StepPath(head=HeadPath(64))
    assert resolve_step_path({**fixed, "compile": False, "vocab_padding": 1}, 8, 64, paths) == (
        StepPath()
    )
    # None faster than eager: the plain path.
    slow = measured(compiled=variant(compile=True, **{"8x64": 0.7}))
    assert resolve_step_path(AUTO, 8, 64, slow) == StepPath()
    assert resolve_step_path({**AUTO, "vocab_padding": 128}, 8, 64, slow) == StepPath(
        head=HeadPath(128)
    )


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("device_type, explicit", [("cpu", True), ("cuda", False)])
def test_the_compiled_loss_keeps_sdpa_on_cuda_and_equals_the_eager_loss(
    device_type, explicit, family
):
    """Compiled, the loss takes the explicit attention path on the CPU and SDPA's fused kernel
    on CUDA (the [B, H, C, C] weights never in memory); each traces (TorchDynamo, eager backend)
    and equals the eager loss within rounding, run here on CPU tensors."""
    loss = StepPath(compile=True).loss_fn(backend="eager", device_type=device_type)
    assert loss._torchdynamo_orig_callable.__wrapped__.keywords["explicit"] is explicit
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=64, n_ctx=32, n_layer=2, n_head=2, d_model=16, mlp=True,
                          family=family))  # fmt: skip
    x = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        loss(model, x, NO_AUTOCAST), next_token_loss(model, x, NO_AUTOCAST), rtol=1e-6, atol=0
    )
