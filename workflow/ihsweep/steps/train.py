"""Rule ``train``: train (or resume) one run (``ihsweep.training.loop``).

    python -m ihsweep.steps.train --spec '<json of ihsweep.config.Study.train_spec>' \
        --data-dir results/data/<data>/C<C> --run-dir results/runs/<run id> \
        [--device auto --threads 1 --micro-batch auto ...]

The execution flags are the schema's `execution` settings that name the train rule
(``ihsweep.config.execution``; ``--help`` lists them); those left out take their defaults. It
exits 0 when the job ends (the run completed, stopped early or diverged, or stopped at
``--stop-after-step``), EXIT_INTERRUPTED on a signal (the retry resumes) and EXIT_LEASE when
another job holds the run folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ihsweep.config.execution import add_flags, flags_execution
from ihsweep.files.io import json_arg
from ihsweep.files.lease import EXPIRE_SECONDS, LeaseHeld, LeaseLost
from ihsweep.steps import _args
from ihsweep.steps.stop_rule import stop_rule_of
from ihsweep.training.loop import train
from ihsweep.training.progress import terminal_output
from ihsweep.training.stops import Interrupted

EXIT_LEASE = 73  # EX_CANTCREAT: the run folder is another job's
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again", the retry resumes from the saved state


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("train", "Train one run; a killed run resumes from its last saved state.")
    p.add_argument("--spec", type=json_arg, required=True, help="run spec as JSON (or @file)")
    p.add_argument("--data-dir", required=True, type=Path, help="the run's chunk folder")
    p.add_argument("--run-dir", required=True, type=Path, help="the run's folder")
    add_flags(p, "train")
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
    label = f"[{args.spec.get('run_id', args.run_dir)}]"
    try:
        # A progress bar in a terminal; under Snakemake the log's timed lines.
        with terminal_output():
            train(
                args.spec,
                args.data_dir,
                args.run_dir,
                flags_execution(args, "train"),
                stop_rule_of(args.spec),
                stop_after_step=args.stop_after_step,
                lease_seconds=args.lease_seconds,
            )
    except Interrupted as stop:  # the state is saved: the retry resumes, no traceback
        print(f"{label} {stop}", flush=True)
        return EXIT_INTERRUPTED
    except (LeaseHeld, LeaseLost) as err:  # another job's folder: one line, not a traceback
        print(f"{label} {err}", file=sys.stderr, flush=True)
        return EXIT_LEASE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
