"""Checkpoint suites: other people's training runs, probed like ours (``suites`` in a study).

A suite is one Hugging Face causal LM saved at many revisions of one training run, e.g. Pythia
(every size trained with B = 1024 sequences of C = 2048 tokens, 154 revisions ``step0`` ...
``step143000``)::

    suites:
      pythia-160m:
        model: EleutherAI/pythia-160m-deduped   # a hub id, or a local folder of revision folders
        revisions: pythia                       # or a list: [step0, step1000, ...]
        batch_size: 1024
        context_size: 2048

Each revision is one checkpoint at ``step = the last number in its name`` (``step1000``,
``checkpoint-1000``) and ``tokens = step * B * C``. ``probe_suite`` writes the probe step's two
tables (``ihsweep.probing.run``'s ``HEAD_COLUMNS`` and ``MODEL_COLUMNS`` + ``RECORD_COLUMNS``),
with the suite's name as ``model`` and run id ``<data>/<name>/B<B>-C<C>-s<seed>``; so the
emergence table, the law fit's size term and the figures take suites with no special case.
Losses are NaN (the probe does not evaluate the suite's training data).

Where the weights come from (``revision_source``): a hub id is loaded at each revision (a git
branch, tag or commit); a local folder holds one folder per revision, named as the revision
(``<model>/step1000/config.json``), which is how a suite is used offline. ``local_files_only``
(or ``HF_HUB_OFFLINE``) reads the local Hugging Face cache only. Revisions load one at a time,
in bf16 on a GPU (fp32 on the CPU), and each revision's probe result is cached
(``<cache_dir>/<revision>.parquet``, keyed by the source, revision and probe settings), so a
revision already probed is not loaded again.

``check_suite`` is the config check: revision names without a step, a local revision folder
that is not there, and an architecture without a probe adapter (``ihsweep.probing.hf``) fail
before any job starts, naming the suite.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from ihsweep.io import set_flags

# Pythia's published revisions: step0, log-spaced steps 1 ... 512, then every 1000 steps.
PYTHIA_REVISIONS = tuple(
    [f"step{s}" for s in (0, *(2**i for i in range(10)))]
    + [f"step{s}" for s in range(1000, 143001, 1000)]
)
REVISION_LISTS = {"pythia": PYTHIA_REVISIONS}
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_LAST_NUMBER = re.compile(r"(\d+)\D*$")


class SuiteError(ValueError):
    """A suite that cannot be probed as configured; the message names ``suites.<name>``."""


def revision_names(suite: dict) -> list[str]:
    """The suite's revisions in its order: a named list (``pythia``) or the given list."""
    revisions = suite["revisions"]
    return list(REVISION_LISTS[revisions]) if isinstance(revisions, str) else list(revisions)


def revision_step(name: str) -> int:
    """The training step of a revision: the last number in its name (``step1000`` -> 1000)."""
    match = _LAST_NUMBER.search(name)
    if match is None:
        raise ValueError(f"revision {name!r} has no step number in its name")
    return int(match.group(1))


def data_name(name: str, suite: dict) -> str:
    """The suite's training data in the tables: its ``data``, else the suite's name."""
    return suite["data"] or name


def run_id(name: str, suite: dict) -> str:
    b, c, seed = suite["batch_size"], suite["context_size"], suite["seed"]
    return f"{data_name(name, suite)}/{name}/B{b}-C{c}-s{seed}"


def is_local(suite: dict, base_dir: str | os.PathLike = ".") -> bool:
    return Path(base_dir, os.path.expanduser(suite["model"])).is_dir()


def offline(suite: dict) -> bool:
    return bool(suite["local_files_only"]) or bool(set_flags(*OFFLINE_VARIABLES))


def revision_source(
    suite: dict, revision: str, base_dir: str | os.PathLike = "."
) -> tuple[str, str | None]:
    """``(what to load, git revision)``: a local revision folder and None, or the hub id and
    the revision."""
    if is_local(suite, base_dir):
        return str(Path(base_dir, os.path.expanduser(suite["model"]), revision)), None
    return suite["model"], revision


def check_suite(name: str, suite: dict, base_dir: str | os.PathLike = ".") -> None:
    """What can be checked before any job: step numbers, local revision folders, adapters."""
    where = f"suites.{name}"
    revisions = revision_names(suite)
    for revision in revisions:
        try:
            revision_step(revision)
        except ValueError as err:
            raise SuiteError(
                f"{where}.revisions: {err}; name revisions by step (step1000)"
            ) from None
    if len(set(revisions)) != len(revisions):
        raise SuiteError(f"{where}.revisions: a revision is listed twice")
    expected = suite["batch_size"] * suite["context_size"]
    if suite["tokens_per_step"] not in (None, expected):
        raise SuiteError(
            f"{where}.tokens_per_step: {suite['tokens_per_step']} is not batch_size * "
            f"context_size = {expected}; updates are tokens / (B * C) downstream, so fix B or C"
        )
    if is_local(suite, base_dir):
        configs = []
        for revision in revisions:
            folder = Path(revision_source(suite, revision, base_dir)[0])
            if not (folder / "config.json").is_file():
                raise SuiteError(
                    f"{where}: revision {revision!r} is not there ({folder}/config.json is "
                    f"missing); a local suite holds one model folder per revision"
                )
            configs.append(folder / "config.json")
    else:
        configs = [_cached_config(suite, r) for r in revisions[:1]] if offline(suite) else []
        if configs and configs[0] is None:
            raise SuiteError(
                f"{where}: revision {revisions[0]!r} of {suite['model']!r} is not in the local "
                f"Hugging Face cache and the hub is off (local_files_only or HF_HUB_OFFLINE); "
                f"download it once, or point model at a local folder of revision folders"
            )
    from ihsweep.probing.hf import ARCHITECTURES  # imports torch: only for studies with suites

    for path in configs[:1]:  # one training run: one architecture
        model_type = json.loads(Path(path).read_text()).get("model_type")
        if model_type not in ARCHITECTURES:
            raise SuiteError(
                f"{where}: model type {model_type!r} has no probe adapter; supported model "
                f"types: {', '.join(sorted(ARCHITECTURES))}"
            )


def _cached_config(suite: dict, revision: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(suite["model"], "config.json", revision=revision)
    return found if isinstance(found, str) else None


def cache_key(suite: dict, revision: str, vocab_size: int, probe: dict) -> str:
    keys = ("model", "batch_size", "context_size", "data", "seed")
    blob = json.dumps(
        {"suite": {k: suite[k] for k in keys}, "revision": revision, "vocab": vocab_size,
         "probe": probe},
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def probe_suite(
    name: str,
    suite: dict,
    probe: dict,
    device,
    cache_dir: str | os.PathLike,
    base_dir: str | os.PathLike = ".",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The heads and model tables of every revision of the suite (see the module docstring)."""
    import torch
    from safetensors import SafetensorError

    from ihsweep.io import read_cached, write_parquet
    from ihsweep.probing.hf import load_revision, probe_hf
    from ihsweep.probing.run import probe_tables

    revisions = revision_names(suite)
    vocab_size = suite["vocab_size"] or _tokenizer_size(name, suite, revisions[0], base_dir)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    budget = max(revision_step(r) for r in revisions) * suite["batch_size"] * suite["context_size"]
    frames = []
    for revision in revisions:
        cache = Path(cache_dir) / f"{revision}.parquet"
        key = cache_key(suite, revision, vocab_size, probe)
        cached = read_cached(cache, key)  # a damaged cache is named and recomputed
        if cached is not None:
            frames.append(cached)
            continue
        source, git_revision = revision_source(suite, revision, base_dir)
        try:
            model = load_revision(
                source, git_revision or "main", offline(suite), device=device, dtype=dtype
            )
        except (OSError, ValueError, SafetensorError) as err:  # missing, or a damaged file
            raise SuiteError(f"suites.{name}: cannot load revision {revision!r}: {err}") from err
        heads, summary = probe_hf(model, vocab_size, suite["context_size"], probe)
        step = revision_step(revision)
        heads = heads.assign(
            run_id=run_id(name, suite),
            data=data_name(name, suite),
            model=name,
            batch_size=suite["batch_size"],
            context_size=suite["context_size"],
            seed=suite["seed"],
            step=step,
            tokens=step * suite["batch_size"] * suite["context_size"],
            n_params=sum(p.numel() for p in model.parameters()),
            train_loss=math.nan,
            val_loss=math.nan,
            **summary,
        )
        del model  # one revision in memory at a time
        write_parquet(heads, cache, key=key)
        print(f"probed {name} {revision}: ps_max {summary['ps_max']:.3f}", flush=True)
        frames.append(heads)
    heads, model = probe_tables(frames)
    model = model.assign(budget=budget, outcome="completed", outcome_detail="",
                         predicted_tokens=math.nan)  # fmt: skip
    return heads, model


def _tokenizer_size(name: str, suite: dict, revision: str, base_dir) -> int:
    """The real vocabulary: the tokenizer's size, not the (padded) embedding's rows."""
    from transformers import AutoTokenizer

    source, git_revision = revision_source(suite, revision, base_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=git_revision or "main", local_files_only=offline(suite)
        )
    except (OSError, ValueError) as err:
        raise SuiteError(
            f"suites.{name}.vocab_size: not set, and no tokenizer at revision {revision!r} to "
            f"read it from ({err}); set vocab_size to the tokenizer's size"
        ) from err
    return len(tokenizer)
