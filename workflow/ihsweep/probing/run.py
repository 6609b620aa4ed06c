"""Probe every checkpoint of one run into its two long tables (``probe_run``; the command is
``python -m ihsweep.steps.probe``).

Columns (one row per checkpoint and head / per checkpoint):
- heads: run_id, data, model, batch_size, context_size, seed, step, tokens, layer, head, and one
  column per score of ``ihsweep.probing.metrics.HEAD_SCORES`` (ps, la, ps_content)
- model: run_id, data, model, n_params, batch_size, context_size, seed, step, tokens, ar_acc,
  ar_rank, ps_max, la_max, ps_content_max, ps_la_corr, train_loss, val_loss, and from the
  run's run.json (the same on every row): budget (tokens), outcome (completed |
  stopped_early | diverged), outcome_detail (why it stopped or diverged; "" when completed),
  predicted_tokens (the emergence point the study's ``checkpoints.densify`` law predicted; NaN
  without one)

Each checkpoint's result is cached in ``probes/<probe key>/cache/step_XXXXXX.parquet`` beside
the tables (outside the declared outputs, which Snakemake deletes before a rerun), keyed by the
run spec, the probe settings and the checkpoint's weights hash, so a run that gains checkpoints
only probes the new ones, the training job's early-stop probes are the probe step's, and a
cache never stands in for other weights. Before any cache is used, the checkpoint's weights are
verified against their recorded sha256, so a cache never hides a damaged checkpoint; a cache
file that cannot be read is named in one line and recomputed.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pandas as pd
import torch

from ihsweep.config import probe_key
from ihsweep.files import layout
from ihsweep.files.io import (
    RERUN,
    DamagedFile,
    file_sha256,
    read_cached,
    read_json_file,
    write_parquet,
)
from ihsweep.probing.metrics import EMERGENCE_METRICS, HEAD_MAXIMA, HEAD_SCORES
from ihsweep.probing.scores import make_probe_batches, probe_model
from ihsweep.training.checkpoints import list_checkpoints, verify_checkpoint
from ihsweep.training.events import write_probe_events
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.weights import load_checkpoint_weights

RUN_COLUMNS = ["run_id", "data", "model", "batch_size", "context_size", "seed"]
HEAD_COLUMNS = [*RUN_COLUMNS, "step", "tokens", "layer", "head", *HEAD_SCORES]
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
    *HEAD_MAXIMA,
    "ps_la_corr",
    "train_loss",
    "val_loss",
]
# Added by ``with_run_record`` from the run's run.json: the same on every row of a run.
RECORD_COLUMNS = ["budget", "outcome", "outcome_detail", "predicted_tokens"]


def cache_key(ckpt: dict, probe: dict) -> str:
    """The key of a checkpoint's cached probe: its run spec, step, weights and the probe
    settings. A checkpoint from before the weights' checksums (no ``weights_sha256``) is keyed
    by its weights file as it is now."""
    weights = ckpt.get("weights_sha256") or file_sha256(ckpt["weights"])
    blob = {"spec": ckpt["spec"], "step": ckpt["step"], "probe": probe, "weights": weights}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def settings_key(ckpt: dict, probe: dict) -> str:
    """The key a cached probe had before the weights joined it: run spec, step and probe
    settings. A results/ laid out by names holds such caches; ``ihsweep.upgrade`` accepts it
    as agreement, and the first probe run afterwards rewrites the cache under ``cache_key``."""
    blob = {"spec": ckpt["spec"], "step": ckpt["step"], "probe": probe}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def probe_checkpoint(ckpt: dict, probe: dict, device: torch.device) -> pd.DataFrame:
    """Heads table of one checkpoint, with the model-level numbers repeated on every row."""
    spec = ckpt["spec"]
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(load_checkpoint_weights(ckpt))  # verified: DamagedFile if damaged
    model.to(device)
    batch, control = make_probe_batches(model.cfg.vocab_size, spec["context_size"], probe)
    heads, summary = probe_model(model, batch, control=control, min_layer=probe["min_layer"])
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


def probe_run(
    run_dir: Path,
    probe: dict,
    device: torch.device,
    allow_empty: bool = False,
    memo: dict[str, pd.DataFrame] | None = None,
    verify: bool = True,
) -> tuple[pd.DataFrame, ...]:
    """The heads and model tables of every checkpoint of the run (the cache's where it holds
    them); with ``allow_empty``, a run without checkpoints gives two empty tables. ``memo``
    (cache key -> frame) keeps the frames between calls of one process: training probes after
    every checkpoint, and rereading every earlier cache file each time cost ~5% of a run.

    ``verify`` checks the weights' sha256 of every checkpoint not in ``memo`` before anything
    is read or written, so that a cache never hides a damaged checkpoint (a checkpoint in the
    memo was verified when it entered it). ``verify=False`` leaves it to the checkpoints that
    are probed (their weights are verified as they load)."""
    memo = {} if memo is None else memo
    damaged = []
    checkpoints = list_checkpoints(run_dir, damaged, verify=False)
    keys = [cache_key(ckpt, probe) for ckpt in checkpoints]
    for ckpt, key in zip(checkpoints, keys, strict=True):
        if verify and key not in memo and not damaged:
            try:
                verify_checkpoint(ckpt)
            except DamagedFile as err:
                damaged.append(err)
    if damaged:  # probing around a damaged checkpoint would leave a gap in the tables
        raise damaged[0]
    cache_dir = Path(layout.probe_dir(run_dir, probe_key(probe))) / "cache"
    frames = []
    for ckpt, key in zip(checkpoints, keys, strict=True):
        if key not in memo:
            cache = cache_dir / f"step_{ckpt['step']:06d}.parquet"
            cached = read_cached(cache, key)  # a damaged cache is named and recomputed
            if holds_every_score(cached):
                memo[key] = cached
            else:
                memo[key] = df = probe_checkpoint(ckpt, probe, device)
                write_parquet(df, cache, key=key)
                print(
                    f"probed step {ckpt['step']}: ps_max {df['ps_max'].iat[0]:.3f}"
                    f" ar_acc {df['ar_acc'].iat[0]:.3f}",
                    flush=True,
                )
        frames.append(memo[key])
    if not frames:
        if not allow_empty:
            raise FileNotFoundError(f"no checkpoints under {run_dir}/ckpt")
        return pd.DataFrame(columns=HEAD_COLUMNS), pd.DataFrame(columns=MODEL_COLUMNS)
    return probe_tables(frames)


def holds_every_score(cached: pd.DataFrame | None) -> bool:
    """Whether a cached per-checkpoint frame has every column of the two tables. A cache key
    covers the probe settings, not which scores exist: a cache written before a score was added
    lacks its column and is recomputed."""
    return cached is not None and {*HEAD_COLUMNS, *MODEL_COLUMNS} <= set(cached.columns)


def probe_tables(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The heads and model tables from per-checkpoint frames (``probe_checkpoint``'s: one row
    per head, the model-level numbers repeated on each), sorted by step."""
    full = pd.concat(frames, ignore_index=True)
    heads = full[HEAD_COLUMNS].sort_values(["step", "layer", "head"], ignore_index=True)
    model = full.drop_duplicates("step")[MODEL_COLUMNS].sort_values("step", ignore_index=True)
    return heads, model


def read_run_record(run_dir: Path) -> dict:
    """The run's completion record (``run.json``), checked: the train step rewrites it."""
    path = Path(run_dir) / layout.RUN_JSON
    return read_json_file(path, "run record", ("spec",), RERUN.format(path=path, step="train"))


def with_run_record(model: pd.DataFrame, record: dict) -> pd.DataFrame:
    """The model table with the run's completion record (``run.json``) on every row: its
    ``RECORD_COLUMNS``, so that later steps see how the run ended from its table alone. A run
    that diverged before its first checkpoint gets one row at step 0 with NaN metrics, so that
    it is listed (as diverged) rather than missing."""
    spec = record["spec"]
    if model.empty:
        row = {c: spec[c] for c in RUN_COLUMNS}
        row.update(n_params=record["n_params"], step=0, tokens=0)
        model = pd.DataFrame([row], columns=MODEL_COLUMNS)
        for column in MODEL_COLUMNS[MODEL_COLUMNS.index("ar_acc") :]:
            model[column] = model[column].astype(float)
    prediction = spec.get("prediction") or {}
    return model.assign(
        budget=spec["total_steps"] * spec["batch_size"] * spec["context_size"],
        outcome=record.get("outcome", "completed"),
        outcome_detail=record.get("outcome_detail", ""),
        predicted_tokens=float(prediction.get("tokens", math.nan)),
    )


def write_events(run_dir: Path, probe: dict, model: pd.DataFrame) -> None:
    """The model table's emergence metrics (every ``<score>_max`` and ``ar_acc``) as the run's
    TensorBoard scalars ``probe/<metric>`` at each checkpoint's step, beside its training curves
    (``layout.probe_events_dir``); rewritten whole, so a rerun never shows a step twice."""
    folder = layout.probe_events_dir(run_dir, probe_key(probe))
    write_probe_events(folder, model, list(EMERGENCE_METRICS))
