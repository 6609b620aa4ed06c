"""Rule ``probe``: PS and LA per head, AR per model, at every checkpoint of one run
(``ihsweep.probing.run``).

    python -m ihsweep.steps.probe --run-dir results/runs/<run folder> --probe '<probe JSON>' \
        --heads .../probes/<key>/heads.parquet --model-table .../probes/<key>/model.parquet

It also rewrites the run's TensorBoard scalars of these tables, ``tensorboard/probe-<key>/``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ihsweep.config import complete
from ihsweep.config.execution import add_flags, flags_execution
from ihsweep.files.io import write_parquet
from ihsweep.probing.run import probe_run, read_run_record, with_run_record, write_events
from ihsweep.steps import _args
from ihsweep.training.execution import pick_device


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("probe", "Probe every checkpoint of a run into its two tables.")
    p.add_argument("--run-dir", required=True, type=Path, help="run folder with ckpt/")
    _args.add_spec(p, "--probe", "probe", required=False)
    p.add_argument("--heads", required=True, type=Path, help="output: per-head table (Parquet)")
    p.add_argument("--model-table", required=True, type=Path, help="output: per-checkpoint table")
    add_flags(p, "probe")
    args = p.parse_args(argv)
    execution = flags_execution(args, "probe")
    torch.set_num_threads(execution.threads)
    probe = complete("probe", args.probe)
    record = read_run_record(args.run_dir)
    diverged = record.get("outcome") == "diverged"
    heads, model = probe_run(args.run_dir, probe, pick_device(execution.device), diverged)
    model = with_run_record(model, record)
    write_parquet(heads, args.heads)
    write_parquet(model, args.model_table)
    write_events(args.run_dir, probe, model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
