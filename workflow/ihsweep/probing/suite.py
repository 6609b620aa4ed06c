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
that is not there, an architecture without a probe adapter (``ihsweep.probing.hf``), revisions
of different architectures, a context beyond their positions and a vocabulary the probe cannot
draw from fail before any job starts, naming the suite (a hub suite: what is on this machine).
``hub_note`` is the planning line that a suite will be downloaded. A suite of our exports
records the parameter count our model has (``parameter_count``), not transformers' count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from ihsweep.config.revisions import revision_names
from ihsweep.files.io import set_flags
from ihsweep.files.layout import EXPORT_SPEC

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_LAST_NUMBER = re.compile(r"(\d+)\D*$")


# Each revision's fingerprints are cached in <cache_dir>/fingerprints/<revision>.parquet.
FINGERPRINT_CACHE = "fingerprints"


class SuiteError(ValueError):
    """A suite that cannot be probed as configured; the message names ``suites.<name>``."""


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


def check_suite(
    name: str, suite: dict, base_dir: str | os.PathLike = ".", probe: dict | None = None
) -> None:
    """What can be checked before any job: step numbers, local revision folders, adapters, one
    architecture across the revisions and a context that fits it (every revision whose
    config.json is here: all of a local suite's, a hub suite's in the Hugging Face cache), and
    the vocabulary the probe draws from (``probe``: its settings; a hub suite's tokenizer is
    only known here when the hub is off)."""
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
    configs = _local_configs(where, suite, revisions, base_dir)
    _check_architecture(where, suite, configs)
    if probe is not None and (is_local(suite, base_dir) or offline(suite)):
        _check_vocabulary(name, suite, probe, revisions[0], base_dir)


def hub_note(suites: dict, base_dir: str | os.PathLike = ".") -> str | None:
    """One line for the planning output when probe jobs will download suites from the hub (a
    study of Pythia asks for gigabytes of weights); None when every suite is read locally."""
    hub = [name for name, suite in suites.items()
           if not is_local(suite, base_dir) and not offline(suite)]  # fmt: skip
    if not hub:
        return None
    return (
        f"note: suites {', '.join(hub)} download their revisions from the Hugging Face hub in "
        f"the probe jobs; to use local copies, set suites.<name>.model to a folder of revision "
        f"folders (<folder>/step1000/config.json), or local_files_only: true (or "
        f"HF_HUB_OFFLINE=1) to read the Hugging Face cache"
    )


def _local_configs(
    where: str, suite: dict, revisions: list[str], base_dir: str | os.PathLike
) -> dict[str, Path]:
    """``{revision: its config.json}`` for every revision whose config is on this machine."""
    if is_local(suite, base_dir):
        configs = {}
        for revision in revisions:
            folder = Path(revision_source(suite, revision, base_dir)[0])
            if not (folder / "config.json").is_file():
                raise SuiteError(
                    f"{where}: revision {revision!r} is not there ({folder}/config.json is "
                    f"missing); a local suite holds one model folder per revision"
                )
            configs[revision] = folder / "config.json"
        return configs
    cached = {r: _cached_config(suite, r) for r in revisions}
    if offline(suite) and cached[revisions[0]] is None:
        raise SuiteError(
            f"{where}: revision {revisions[0]!r} of {suite['model']!r} is not in the local "
            f"Hugging Face cache and the hub is off (local_files_only or HF_HUB_OFFLINE); "
            f"download it once, or point model at a local folder of revision folders"
        )
    return {r: Path(path) for r, path in cached.items() if path is not None}


def _check_architecture(where: str, suite: dict, configs: dict[str, Path]) -> None:
    """One training run is one architecture: every revision's model type has an adapter, and
    its layers, heads and width are the first revision's; the probe's context fits its
    positions. A probe job would otherwise fail on the odd revision, hours in."""
    if not configs:  # a hub suite not in the cache: its jobs check what they download
        return
    from transformers import AutoConfig

    from ihsweep.probing.hf import ARCHITECTURES  # imports torch: only for studies with suites

    first = None
    for revision, path in configs.items():
        settings = json.loads(Path(path).read_text())
        model_type = settings.get("model_type")
        if model_type not in ARCHITECTURES:
            raise SuiteError(
                f"{where}: model type {model_type!r} has no probe adapter; supported model "
                f"types: {', '.join(sorted(ARCHITECTURES))}"
            )
        config = AutoConfig.for_model(**settings)
        shape = {
            "model_type": model_type,
            "layers": config.num_hidden_layers,
            "heads": config.num_attention_heads,
            "width": config.hidden_size,
        }
        if first is None:
            first = (revision, shape)
        elif shape != first[1]:
            differ = ", ".join(
                f"{key} {first[1][key]} vs {value}"
                for key, value in shape.items()
                if value != first[1][key]
            )
            raise SuiteError(
                f"{where}.revisions: {revision!r} is another architecture than "
                f"{first[0]!r} ({differ}; {path}); a suite is one training run's revisions: "
                f"give the other model a suite of its own"
            )
        positions = getattr(config, "max_position_embeddings", None)
        if positions is not None and suite["context_size"] > positions:
            raise SuiteError(
                f"{where}.context_size: {suite['context_size']} exceeds revision {revision!r}'s "
                f"{positions} positions ({path}: max_position_embeddings); use context_size <= "
                f"{positions}, the context the suite was trained with"
            )


def probe_distinct_ids(suite: dict, probe: dict) -> int:
    """``2s``: the distinct ids a row of the probe's control batch holds for the suite
    (``make_probe_batches``), so the fewest the vocabulary may have."""
    return 2 * min(probe["max_half_length"], suite["context_size"] // 2)


def _check_vocabulary(
    name: str, suite: dict, probe: dict, revision: str, base_dir: str | os.PathLike
) -> None:
    distinct = probe_distinct_ids(suite, probe)
    if suite["vocab_size"] is None:
        tokenizer_size(name, suite, revision, base_dir, at_least=distinct)
    elif suite["vocab_size"] < distinct:
        raise SuiteError(
            f"suites.{name}.vocab_size: {suite['vocab_size']} ids are fewer than the probe's "
            f"2s = 2 min(probe.max_half_length, context_size // 2) = {distinct} distinct tokens "
            f"(its control batch's rows); set vocab_size to the model's vocabulary or lower "
            f"probe.max_half_length"
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
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The heads and model tables of every revision of the suite (see the module docstring),
    and the fingerprints of their trained parameters (``ihsweep.probing.fingerprints``)."""
    import torch

    from ihsweep.probing.run import probe_tables

    revisions = revision_names(suite)
    vocab_size = suite["vocab_size"] or tokenizer_size(
        name, suite, revisions[0], base_dir, at_least=probe_distinct_ids(suite, probe)
    )
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    budget = max(revision_step(r) for r in revisions) * suite["batch_size"] * suite["context_size"]
    frames, prints = [], []
    for revision in revisions:
        heads, fingerprint = _revision_tables(
            name, suite, revision, (probe, vocab_size), (device, dtype), Path(cache_dir), base_dir
        )
        frames.append(heads)
        prints.append(fingerprint)
    heads, model = probe_tables(frames)
    model = model.assign(budget=budget, outcome="completed", outcome_detail="",
                         predicted_tokens=math.nan)  # fmt: skip
    return heads, model, pd.concat(prints, ignore_index=True)


def _revision_tables(
    name: str,
    suite: dict,
    revision: str,
    probing: tuple[dict, int],
    loading: tuple,
    cache_dir: Path,
    base_dir: str | os.PathLike,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One revision's heads table and fingerprints: from their caches, else from one load of
    the revision that serves both (``probing``: the probe settings and vocabulary size;
    ``loading``: the device and dtype)."""
    import time

    import torch
    from safetensors import SafetensorError

    from ihsweep.files.io import read_cached, write_parquet
    from ihsweep.probing import fingerprints
    from ihsweep.probing.hf import load_revision
    from ihsweep.probing.run import holds_every_score

    (probe, vocab_size), (device, dtype) = probing, loading
    cache = cache_dir / f"{revision}.parquet"
    key = cache_key(suite, revision, vocab_size, probe)
    print_cache = cache_dir / FINGERPRINT_CACHE / f"{revision}.parquet"
    print_key = fingerprints.cache_key(suite["model"], revision, dtype)
    heads = read_cached(cache, key)  # a damaged cache is named and recomputed
    heads = heads if holds_every_score(heads) else None
    prints = read_cached(print_cache, print_key)
    if heads is not None and prints is not None:
        return heads, prints
    source, git_revision = revision_source(suite, revision, base_dir)
    try:
        model = load_revision(
            source, git_revision or "main", offline(suite), device=device, dtype=dtype
        )
    except (OSError, ValueError, SafetensorError) as err:  # missing, or a damaged file
        raise SuiteError(f"suites.{name}: cannot load revision {revision!r}: {err}") from err
    if prints is None:
        started = time.perf_counter()
        threads = torch.get_num_threads()  # the job's threads (execution.threads)
        prints = fingerprints.tensor_rows(model, revision, revision_step(revision), threads)
        write_parquet(prints, print_cache, key=print_key)
        seconds = time.perf_counter() - started
        print(f"fingerprinted {name} {revision} in {seconds:.3g} s", flush=True)
    if heads is None:
        heads = _probe_loaded(name, suite, revision, model, probe, vocab_size, source)
        write_parquet(heads, cache, key=key)
    return heads, prints


def _probe_loaded(
    name: str, suite: dict, revision: str, model, probe: dict, vocab_size: int, source: str
) -> pd.DataFrame:
    """The heads table of one loaded revision, with the run's columns."""
    from ihsweep.probing.hf import probe_hf

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
        n_params=parameter_count(model, source),
        train_loss=math.nan,
        val_loss=math.nan,
        **summary,
    )
    print(f"probed {name} {revision}: ps_max {summary['ps_max']:.3f}", flush=True)
    return heads


def parameter_count(model, source: str) -> int:
    """The parameters the model has. An export of ours records its own count: transformers
    counts the all-zero MLP (and attention output bias) an attention-only model is exported
    with, which the model does not have and which would skew the law's size term."""
    spec = Path(source) / EXPORT_SPEC
    if spec.is_file():
        return int(json.loads(spec.read_text())["n_params"])
    return sum(p.numel() for p in model.parameters())


def tokenizer_size(
    name: str, suite: dict, revision: str, base_dir: str | os.PathLike = ".", at_least: int = 2
) -> int:
    """The real vocabulary: the tokenizer's size, not the (padded) embedding's rows. A folder
    without tokenizer files gives transformers an empty tokenizer (one token): fewer than
    ``at_least`` tokens (the probe's 2s) is refused, naming ``vocab_size``."""
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
    if len(tokenizer) < at_least:
        raise SuiteError(
            f"suites.{name}.vocab_size: not set, and the tokenizer at revision {revision!r} "
            f"({source}) has {len(tokenizer)} token(s), fewer than the probe's {at_least} "
            f"distinct ones (no tokenizer files there?); set suites.{name}.vocab_size to the "
            f"model's real vocabulary"
        )
    return len(tokenizer)
