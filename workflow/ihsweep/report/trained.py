"""How an experiment's runs were trained, read from their completion records (``run.json``).

The report's front page states the study as it ran, not as its config reads: a run entry may
override the top-level ``training`` (another budget, another learning rate), so the budgets and
peak learning rates come from each run's own spec, e.g. "8,000,000 tokens per run at lr 0.002
(16 runs)", with ranges when the runs differ. The environments come from each record's
``environment`` object (Python, package versions, the torch build, CUDA, device, platform),
counted per distinct environment; a record without one counts as "not recorded".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from ihsweep.files.io import RERUN, read_json_file

NOT_RECORDED = "not recorded"
# The columns of the environments table, each a function of one ``environment`` object. Of the
# packages only torch, and any whose version differs between the environments (each run.json
# lists them all): a full list would fill the front page.
ENVIRONMENT_COLUMNS = {
    "Python": lambda env: env.get("python"),
    "torch": lambda env: (env.get("packages") or {}).get("torch"),
    "torch build": lambda env: env.get("torch_build"),
    "CUDA": lambda env: env.get("cuda") or "none",
    "device": lambda env: env.get("device"),
    "platform": lambda env: env.get("platform"),
}


def read_records(paths: Iterable[str | Path]) -> list[dict]:
    """The completion records at ``paths``, checked (the train step rewrites a damaged one)."""
    return [
        read_json_file(path, "run record", ("spec",), RERUN.format(path=path, step="train"))
        for path in map(Path, paths)
    ]


def budget(record: dict) -> int:
    """The run's token budget: recorded, or from its spec (records of older runs)."""
    spec = record["spec"]
    if record.get("budget") is not None:
        return int(record["budget"])
    return int(spec["total_steps"] * spec["batch_size"] * spec["context_size"])


def peak_lr(record: dict) -> float:
    return float(record["spec"]["training"]["lr"])


def training_sentence(records: list[dict]) -> str:
    """ "8,000,000 tokens per run at lr 0.002 (16 runs)"; ranges ("4,000,000 to 8,000,000
    tokens per run at lr 0.002 to 0.006") when the runs differ; "" for no runs."""
    if not records:
        return ""
    tokens = sorted({budget(r) for r in records})
    lrs = sorted({peak_lr(r) for r in records})
    tokens_text = " to ".join(f"{t:,}" for t in (tokens[0], tokens[-1])[: min(len(tokens), 2)])
    lr_text = " to ".join(f"{lr:g}" for lr in (lrs[0], lrs[-1])[: min(len(lrs), 2)])
    n = len(records)
    return f"{tokens_text} tokens per run at lr {lr_text} ({n} run{'s' if n != 1 else ''})"


def environment_counts(records: list[dict]) -> list[tuple[dict | None, int]]:
    """Each distinct ``environment`` of the records with its number of runs, most runs first
    (then in a fixed order); None stands for the records without one."""
    counts = Counter(
        json.dumps(r["environment"], sort_keys=True) if r.get("environment") else None
        for r in records
    )
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0] is None, item[0] or ""))
    return [(json.loads(key) if key else None, n) for key, n in ordered]


def environment_rows(records: list[dict]) -> list[list[str]]:
    """The environments table: a header row, then one row per distinct environment."""
    counts = environment_counts(records)
    recorded = [environment for environment, _ in counts if environment is not None]
    differing = _differing_packages(recorded)
    rows = [[*ENVIRONMENT_COLUMNS, *differing, "runs"]]
    for environment, n in counts:
        if environment is None:
            cells = [NOT_RECORDED] + [""] * (len(rows[0]) - 2)
        else:
            packages = environment.get("packages") or {}
            cells = [str(column(environment) or "") for column in ENVIRONMENT_COLUMNS.values()]
            cells += [str(packages.get(name) or "") for name in differing]
        rows.append([*cells, str(n)])
    return rows


def _differing_packages(environments: list[dict]) -> list[str]:
    """The packages, torch aside, whose version is not the same in every environment."""
    names = {name for env in environments for name in env.get("packages") or {}} - {"torch"}
    return sorted(
        name
        for name in names
        if len({(env.get("packages") or {}).get(name) for env in environments}) > 1
    )
