"""The cost table of a study: what ``python -m ihsweep.cost`` and ``make cost`` print.

    python -m ihsweep.cost                              # the study in config.yaml
    python -m ihsweep.cost --configfile workflow/studies/paper.yaml --csv cost.csv

One row per training run (``ihsweep.cost.study.StudyCost.row``), then the totals of both
budgets, in the units of the study's device (``format_cost``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ihsweep.config import ConfigError, add_configfile, reports_config_errors, study_of_files
from ihsweep.cost import device_profile, gpu_visible, profile_device_type
from ihsweep.cost.study import StudyCost

COLUMNS = [
    "run_id", "updates", "tokens", "early_stop_tokens", "micro_batch", "peak_gb", "limit_gb",
    "device_hours", "early_stop_device_hours", "walltime_min", "gpus", "gpu_speedup",
    "checkpoints", "checkpoint_gb",
]  # fmt: skip


def format_eta(seconds: float) -> str:
    """A duration as a run's progress line and ``ihsweep.status`` show an ETA: 1h05m, 4m09s."""
    s = int(max(0, seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def cost_table(costed: StudyCost):
    """One row per run of a costed study (``StudyCost.row``), as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([costed.row(run) for run in costed.study.runs], columns=COLUMNS)


def early_stop_summary(study) -> str:
    """How the study's runs are expected to end, as the totals line of early stop says it."""
    rules = {run: study.early_stop(run) for run in study.runs}
    stopping = [run for run, rule in rules.items() if rule is not None]
    if not stopping:
        return "early stop off (training.stop_after_emergence): every run trains its budget"
    predicted = [run for run in stopping if study.prediction(run) is not None]
    if not predicted:
        return (
            "no law predicts the transitions (checkpoints.densify), so every run is counted at "
            "its budget"
        )
    law = study.densify["law"]
    margins = "/".join(f"{m:g}" for m in sorted({rules[r]["margin_decades"] for r in predicted}))
    text = (
        f"each run stops at the first checkpoint {margins} decades past the transition the law "
        f"U_pt = T / (B^a C^b) predicts, a {law['a']:g}, b {law['b']:g}, log10 T "
        f"{law['log10_T']:g} (from {study.densify['source']})"
    )
    unpredicted = len(study.runs) - len(predicted)
    return text + (
        f"; {unpredicted} runs the law does not predict: their budget" * bool(unpredicted)
    )


def format_cost(table, costed: StudyCost) -> str:
    """The table and its totals in the units of the study's device: GPU-hours and GPU memory,
    or core-hours (one thread per job, as the CPU profile is measured) and host memory."""
    import pandas as pd

    profile = costed.profile
    unit = "core" if profile_device_type(profile) == "cpu" else "GPU"
    memory = "host" if unit == "core" else "GPU"
    shown = pd.DataFrame(
        {
            "run": table.run_id,
            "updates": table.updates,
            "tokens": [f"{t / 1e6:,.1f}M" for t in table.tokens],
            "stop_at": [f"{t / 1e6:,.1f}M" for t in table.early_stop_tokens],
            "micro_batch": table.micro_batch,
            f"{memory}_GB": [
                f"{p:.1f}/{m:.0f}" for p, m in zip(table.peak_gb, table.limit_gb, strict=True)
            ],
            f"{unit}_h": [f"{h:.2f}" for h in table.device_hours],
            f"{unit}_h_stop": [f"{h:.2f}" for h in table.early_stop_device_hours],
            "walltime_min": table.walltime_min,
            "ckpts": table.checkpoints,
            "ckpt_GB": [f"{g:.2f}" for g in table.checkpoint_gb],
        }
    )
    full, stop = table.tokens.sum(), table.early_stop_tokens.sum()
    lines = [
        shown.to_string(index=False),
        f"{len(table)} runs, {table.updates.sum():,} updates at their budgets",
        f"  full budgets: {full / 1e9:.2f}B tokens, {table.device_hours.sum():.1f} {unit}-hours",
        f"  with early stop: {stop / 1e9:.2f}B tokens ({stop / full:.0%}), "
        f"{table.early_stop_device_hours.sum():.1f} {unit}-hours: "
        f"{early_stop_summary(costed.study)}",
        f"  walltime asked for: {table.walltime_min.sum() / 60:.1f} hours (each job for its "
        f"full budget: a run may form no induction heads); "
        f"{table.checkpoint_gb.sum():.1f} GB of checkpoints",
        f"device profile {profile['name']}: {profile['source']}",
    ]
    return "\n".join(lines)


def shown_cost(costed: StudyCost, gpu_here: bool | None = None) -> StudyCost:
    """The study as the cost report shows it. When `auto` sized the jobs for a GPU (device and
    device_profile both auto, the rule asking for one) but this machine shows none
    (``gpu_visible``; ``gpu_here`` overrides), its jobs train here on the CPU: the study costed
    on the CPU, whose table speaks of core-hours and host memory."""
    execution = costed.execution
    on_auto = execution["device"] == "auto" and execution["device_profile"] == "auto"
    if not on_auto or profile_device_type(costed.profile) == "cpu":
        return costed
    if gpu_visible() if gpu_here is None else gpu_here:
        return costed
    return StudyCost(costed.study, device_profile({**execution, "device": "cpu"}))


def cost_report(study, gpu_here: bool | None = None):
    """What `python -m ihsweep.cost` prints, and the table it shows (for --csv). When the table
    is the CPU's in place of the GPU the jobs are sized for (``shown_cost``), a last line gives
    what the same runs cost on that GPU. Raises ValueError for a device profile it cannot
    read."""
    costed = StudyCost(study)
    if not study.runs:
        text = "no training runs: the study trains nothing (checkpoint suites only)"
        return text, cost_table(costed)
    shown = shown_cost(costed, gpu_here)
    try:
        table = cost_table(shown)
    except ValueError:  # a cell that fits the GPU but not the CPU job's memory
        shown, table = costed, cost_table(costed)
    text = format_cost(table, shown)
    if shown is costed:
        return text, table
    on_gpu = cost_table(costed)
    return (
        f"{text}\non a GPU (device profile {costed.profile['name']}, which sizes cluster jobs): "
        f"{on_gpu.device_hours.sum():.1f} GPU-hours at the full budgets, "
        f"{on_gpu.early_stop_device_hours.sum():.1f} with early stop",
        table,
    )


@reports_config_errors
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ihsweep.cost", description=__doc__)
    add_configfile(parser)
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)
    study = study_of_files(args.configfile, args.config)
    try:
        device_profile(study.config["execution"])
    except ValueError as err:
        raise ConfigError(f"execution.device_profile: {err}") from None
    text, table = cost_report(study)
    print(text)
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0
