"""Rule ``train``: train (or resume) one run (``ihsweep.training.loop``).

    python -m ihsweep.steps.train --spec '<json of ihsweep.config.Study.train_spec>' \
        --data-dir results/data/<data>/C<C> --run-dir results/runs/<run id> \
        [--device auto --threads 1 --progress-seconds 15 --micro-batch auto --memory-mb 16000 \
         --compile auto --vocab-padding auto --fused-loss auto --device-profile auto]

The execution flags left out take the schema's `execution` defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ihsweep.early_stop import stop_rule_of
from ihsweep.io import json_arg
from ihsweep.lease import EXPIRE_SECONDS, LeaseHeld, LeaseLost
from ihsweep.steps import _args
from ihsweep.training.execution import STEP_SETTINGS
from ihsweep.training.loop import train
from ihsweep.training.progress import terminal_output

EXIT_LEASE = 73  # EX_CANTCREAT: the run folder is another job's


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("train", "Train one run; a killed run resumes from its last saved state.")
    p.add_argument("--spec", type=json_arg, required=True, help="run spec as JSON (or @file)")
    p.add_argument("--data-dir", required=True, type=Path, help="the run's chunk folder")
    p.add_argument("--run-dir", required=True, type=Path, help="the run's folder")
    _args.add_execution(p)
    p.add_argument(
        "--progress-seconds", type=int, help="seconds between progress lines (0: every update)"
    )
    p.add_argument(
        "--micro-batch",
        type=_args.micro_batch_arg,
        help="sequences per forward/backward pass: a number, or auto",
    )
    p.add_argument(
        "--memory-mb", type=int, help="the job's host memory (micro-batch auto on the CPU)"
    )
    p.add_argument(
        "--compile",
        type=_args.compile_arg,
        help="run the loss through torch.compile: true, false or auto",
    )
    p.add_argument(
        "--vocab-padding",
        type=_args.vocab_padding_arg,
        help="pad the lm-head GEMM's rows to a multiple of this: a number (1: none), or auto",
    )
    p.add_argument(
        "--fused-loss",
        type=_args.compile_arg,
        help="fuse the lm head and its loss: true, false or auto",
    )
    p.add_argument(
        "--device-profile",
        help="the profile bench/gpu_plan.py wrote, whose measurements decide the autos",
    )
    p.add_argument(
        "--stop-after-step", type=int, help="save resume state and stop after this step (tests)"
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        default=EXPIRE_SECONDS,
        help="how long the run folder stays locked after this job dies (on another host)",
    )
    args = p.parse_args(argv)
    execution = _args.execution(args)
    try:
        # A progress bar in a terminal; under Snakemake the log's timed lines.
        with terminal_output():
            train(
                args.spec,
                args.data_dir,
                args.run_dir,
                execution["device"],
                execution["threads"],
                execution["progress_seconds"],
                execution["micro_batch"],
                execution["train_mem_mb"],
                args.stop_after_step,
                {key: execution[key] for key in (*STEP_SETTINGS, "device_profile")},
                stop_rule_of(args.spec),
                args.lease_seconds,
            )
    except (LeaseHeld, LeaseLost) as err:  # another job's folder: one line, not a traceback
        print(f"[{args.spec.get('run_id', args.run_dir)}] {err}", file=sys.stderr, flush=True)
        return EXIT_LEASE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
