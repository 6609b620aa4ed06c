"""Peak memory and time of the lm head's loss paths (``ihsweep.training.lm_head``).

    python bench/lm_head_memory.py                     # 8,192 positions, GPT-2's vocabulary
    python bench/lm_head_memory.py --positions 2048 --d-model 64

Each path computes the mean cross-entropy of ``features @ W_U.T`` and its gradients (forward and
backward) for the same random features [positions, d_model], W_U [vocabulary, d_model] and
targets, in fp32 on the CPU:
- ``whole``: ``F.cross_entropy`` of the full logits (what a small cell does);
- ``chunked``: the trainer's chunked loss, each slice's logits recomputed in the backward pass;
- ``fused``: gradients made in the forward pass, a slice at a time, nothing recomputed.
Each runs in a fresh process, which reports its peak resident memory above what it held before
the loss and the wall seconds of one forward and backward. The peak is the kernel's high-water
mark ``VmHWM``, reset to the current size just before the loss (``/proc/self/clear_refs``): a
process's ``ru_maxrss`` starts at its parent's size when it was forked, so a large parent (a
test run) would show as the child's peak. It prints each path's figures and their ratios to
``whole``, and checks that all three give the same loss and gradients (to 1e-5 relative).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _common import package_env  # noqa: E402  (bench/, the script's own folder)

PATHS = ("whole", "chunked", "fused")


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Set the process's high-water mark of resident memory to its current size (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_bytes() -> int:
    """The high-water mark of resident memory since ``reset_peak``."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024


def measure(path: str, positions: int, vocab: int, d_model: int) -> dict:
    """One path's peak memory above the inputs, seconds, loss and gradient norms."""
    import torch
    import torch.nn.functional as F
    from ihsweep import cost
    from ihsweep.training.lm_head import HeadPath, fused_cross_entropy
    from ihsweep.training.step import _summed_loss
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(positions, d_model, generator=generator).requires_grad_()
    W_U = (0.02 * torch.randn(vocab, d_model, generator=generator)).requires_grad_()
    targets = torch.randint(0, vocab, (positions,), generator=generator)
    rows = cost.loss_chunk_rows(HeadPath().rows(vocab), "cpu")
    reset_peak()
    before, start = rss_bytes(), time.perf_counter()
    if path == "whole":
        loss = F.cross_entropy(features @ W_U.T, targets)
    elif path == "chunked":
        parts = range(0, positions, rows)
        loss = sum(checkpoint(_summed_loss, features[i : i + rows], W_U, targets[i : i + rows],
                              vocab, use_reentrant=False) for i in parts) / positions  # fmt: skip
    else:
        loss = fused_cross_entropy(features, W_U, targets, vocab, rows)
    loss.backward()
    seconds = time.perf_counter() - start
    return {
        "path": path,
        "peak_bytes": peak_bytes() - before,
        "seconds": seconds,
        "loss": float(loss),
        "grad_norms": [float(features.grad.norm()), float(W_U.grad.norm())],
        "slices": -(-positions // rows),
    }


def measure_in_child(path: str, positions: int, vocab: int, d_model: int) -> dict:
    argv = [sys.executable, str(HERE), "--child", path, "--positions", str(positions),
            "--vocab", str(vocab), "--d-model", str(d_model)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True,
                         env=package_env()).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def agrees(row: dict, reference: dict, rtol: float = 1e-5) -> bool:
    """Whether a path's loss and gradient norms equal the reference's within ``rtol``."""
    pairs = [(row["loss"], reference["loss"]),
             *zip(row["grad_norms"], reference["grad_norms"], strict=True)]  # fmt: skip
    return all(abs(a - b) <= rtol * abs(b) for a, b in pairs)


def compare(positions: int, vocab: int, d_model: int) -> dict[str, dict]:
    """Every path measured in its own process, by name."""
    return {path: measure_in_child(path, positions, vocab, d_model) for path in PATHS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.positions, args.vocab, args.d_model)))
        return 0
    rows = compare(args.positions, args.vocab, args.d_model)
    whole = rows["whole"]
    print(f"{args.positions} positions, vocabulary {args.vocab}, d_model {args.d_model}, fp32,"
          f" one CPU thread")  # fmt: skip
    for path, row in rows.items():
        print(f"{path:8s} peak {row['peak_bytes'] / 1e6:8.1f} MB"
              f" ({row['peak_bytes'] / whole['peak_bytes']:.2f}x whole)  {row['seconds']:6.2f} s"
              f" ({row['seconds'] / whole['seconds']:.2f}x)  {row['slices']} slice(s),"
              f" loss {row['loss']:.6f}")  # fmt: skip
    same = all(agrees(row, whole) for row in rows.values())
    print("the same loss and gradient norms on every path" if same else "PATHS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
