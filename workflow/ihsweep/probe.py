"""Probe every checkpoint of one run and write its two long tables.

    python -m ihsweep.probe --run-dir results/runs/<run id> --probe '<json>' \
        --heads results/runs/<run id>/probes/heads.parquet \
        --model-table results/runs/<run id>/probes/model.parquet

Columns (one row per checkpoint and head / per checkpoint):
- heads: run_id, data, model, batch_size, context_size, seed, step, tokens, layer, head, ps, la
- model: run_id, data, model, n_params, batch_size, context_size, seed, step, tokens, ar_acc,
  ar_rank, ps_max, la_max, ps_la_corr, train_loss, val_loss

Each checkpoint's result is cached in ``probes/cache/step_XXXXXX.parquet`` (outside the declared
outputs, which Snakemake deletes before a rerun), keyed by the run spec and probe settings, so a
run that gains checkpoints only probes the new ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pandas as pd
import torch

from ihsweep.checkpoints import list_checkpoints, load_weights
from ihsweep.io import read_parquet_key, write_parquet
from ihsweep.model import GPT, GPTConfig
from ihsweep.probes import make_probe_batch, probe_model
from ihsweep.train import pick_device

RUN_COLUMNS = ["run_id", "data", "model", "batch_size", "context_size", "seed"]
HEAD_COLUMNS = [*RUN_COLUMNS, "step", "tokens", "layer", "head", "ps", "la"]
MODEL_COLUMNS = [
    "run_id",
    "data",
    "model",
    "n_params",
    "batch_size",
    "context_size",
    "seed",
    "step",
    "tokens",
    "ar_acc",
    "ar_rank",
    "ps_max",
    "la_max",
    "ps_la_corr",
    "train_loss",
    "val_loss",
]


def cache_key(ckpt: dict, probe: dict) -> str:
    blob = json.dumps({"spec": ckpt["spec"], "step": ckpt["step"], "probe": probe}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def probe_checkpoint(ckpt: dict, probe: dict, device: torch.device) -> pd.DataFrame:
    """Heads table of one checkpoint, with the model-level numbers repeated on every row."""
    spec = ckpt["spec"]
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(load_weights(ckpt["weights"]))
    model.to(device)
    batch = make_probe_batch(
        model.cfg.vocab_size,
        spec["context_size"],
        probe["n_sequences"],
        probe["max_half_length"],
        probe["seed"],
    )
    heads, summary = probe_model(model, batch)
    heads = heads.assign(
        **{c: spec[c] for c in RUN_COLUMNS if c != "run_id"},
        run_id=spec["run_id"],
        step=ckpt["step"],
        tokens=ckpt["tokens"],
        n_params=ckpt["n_params"],
        train_loss=ckpt["train_loss"],
        val_loss=ckpt["val_loss"],
        **summary,
    )
    return heads


def probe_run(run_dir: Path, probe: dict, device: torch.device) -> tuple[pd.DataFrame, ...]:
    frames = []
    for ckpt in list_checkpoints(run_dir):
        cache = Path(run_dir) / "probes" / "cache" / f"step_{ckpt['step']:06d}.parquet"
        key = cache_key(ckpt, probe)
        if cache.exists() and read_parquet_key(cache) == key:
            frames.append(pd.read_parquet(cache))
            continue
        df = probe_checkpoint(ckpt, probe, device)
        write_parquet(df, cache, key=key)
        print(
            f"probed step {ckpt['step']}: ps_max {df['ps_max'].iat[0]:.3f}"
            f" ar_acc {df['ar_acc'].iat[0]:.3f}",
            flush=True,
        )
        frames.append(df)
    if not frames:
        raise FileNotFoundError(f"no checkpoints under {run_dir}/ckpt")
    full = pd.concat(frames, ignore_index=True)
    heads = full[HEAD_COLUMNS].sort_values(["step", "layer", "head"], ignore_index=True)
    model = full.drop_duplicates("step")[MODEL_COLUMNS].sort_values("step", ignore_index=True)
    return heads, model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, type=Path, help="run folder with ckpt/")
    p.add_argument("--probe", required=True, help="probe settings as JSON (config 'probe')")
    p.add_argument("--heads", required=True, type=Path, help="output: per-head table (Parquet)")
    p.add_argument(
        "--model-table",
        required=True,
        type=Path,
        help="output: per-checkpoint model-level table (Parquet)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    heads, model = probe_run(args.run_dir, json.loads(args.probe), pick_device(args.device))
    write_parquet(heads, args.heads)
    write_parquet(model, args.model_table)


if __name__ == "__main__":
    main()
