"""Benchmark: what fingerprinting a suite's revision costs against loading and probing it
(``ihsweep.probing.fingerprints``; docs/checkpoints.md, "Revisions that are not what their names
say").

Two measurements, in one command, on one thread:

1. A local suite of tiny GPT-NeoX revisions (``--width``, 2 layers), saved to a temporary
   folder: per revision the seconds of ``load_revision``, of the probe (``probe_hf``) and of
   ``tensor_rows`` (hashing every trained parameter), medians over the revisions, and the
   hash's share of load + probe.
2. Hashing throughput on a larger random model (``--params`` millions of parameters, fp32 and
   bf16 copies of one GPT-NeoX): ``tensor_rows``'s bytes per second on 1 and on ``--threads``
   threads, hashlib's SHA-256 alone on the same bytes (the ceiling), and from them, by
   arithmetic, the seconds a pythia-2.8b revision's hash takes (2,775,208,960 parameters, bf16
   on a GPU as the probe step loads it; the copy from the GPU to the host is not counted).

    PYTHONPATH=workflow .venv/bin/python bench/fingerprint_cost.py
    PYTHONPATH=workflow .venv/bin/python bench/fingerprint_cost.py --params 400 --revisions 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

PYTHIA_2P8B_PARAMS = 2_775_208_960  # EleutherAI/pythia-2.8b-deduped, parameters
PROBE = {"n_sequences": 100, "max_half_length": 50, "seed": 0, "min_layer": 1}


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def tiny_suite(folder: Path, width: int, revisions: int) -> list[Path]:
    import torch
    import transformers

    config = transformers.GPTNeoXConfig(
        vocab_size=512, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256, eos_token_id=None,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    folders = []
    for i in range(revisions):
        torch.manual_seed(i)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.1)
        folders.append(folder / f"step{i}")
        model.save_pretrained(folders[-1])
    return folders


def suite_costs(width: int, revisions: int) -> None:
    from ihsweep.probing.fingerprints import tensor_rows
    from ihsweep.probing.hf import load_revision, probe_hf

    with tempfile.TemporaryDirectory() as tmp:
        costs = {"load": [], "probe": [], "hash": []}
        for i, folder in enumerate(tiny_suite(Path(tmp), width, revisions)):
            load, model = timed(load_revision, folder)
            costs["load"].append(load)
            costs["probe"].append(timed(probe_hf, model, 500, 256, PROBE)[0])
            costs["hash"].append(timed(tensor_rows, model, folder.name, i)[0])
    median = {k: statistics.median(v) for k, v in costs.items()}
    share = median["hash"] / (median["load"] + median["probe"])
    print(
        f"tiny suite (GPT-NeoX, width {width}, 2 layers, {revisions} revisions, medians): "
        f"load {median['load']:.4f} s, probe {median['probe']:.4f} s, "
        f"hash {median['hash']:.5f} s = {share:.2%} of load + probe"
    )


def throughput(millions: int, threads: int) -> None:
    import torch
    import transformers
    from ihsweep.probing.fingerprints import tensor_rows, tensor_sha256

    width = 1024
    layers = max(1, round((millions * 1e6 - 2 * 50304 * width) / (12 * width * width)))
    config = transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=width, intermediate_size=4 * width,
        num_hidden_layers=layers, num_attention_heads=16, eos_token_id=None,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        rates = {}
        for n in sorted({1, threads}):
            seconds = min(timed(tensor_rows, model, "step0", 0, n)[0] for _ in range(3))
            rates[n] = size / seconds
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        plain = size / min(timed(tensor_sha256, flat)[0] for _ in range(3))
        shown = ", ".join(f"{n} thread(s) {rate / 1e9:.2f} GB/s" for n, rate in rates.items())
        name = str(dtype).removeprefix("torch.")
        alone = f"sha256 alone {plain / 1e9:.2f} GB/s"
        print(f"hash of {size / 1e9:.2f} GB in {name}: {shown}; {alone}")
        if dtype == torch.bfloat16:
            pythia = PYTHIA_2P8B_PARAMS * 2
            print(
                f"pythia-2.8b revision (bf16, {pythia / 1e9:.2f} GB): "
                + ", ".join(f"{pythia / r:.1f} s on {n} thread(s)" for n, r in rates.items())
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=32, help="the tiny suite's width")
    p.add_argument("--revisions", type=int, default=6, help="the tiny suite's revisions")
    p.add_argument("--params", type=int, default=200, help="millions of parameters to hash")
    p.add_argument("--threads", type=int, default=2, help="hashing threads besides one")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    suite_costs(args.width, args.revisions)
    throughput(args.params, args.threads)


if __name__ == "__main__":
    main()
