"""Benchmark: what every job pays before its work starts, this tree against a baseline commit.

Each rule runs ``python -m ihsweep.steps.<step>`` in a fresh interpreter, so a study of N runs
pays each step's imports N times (cpu-full: ~300 jobs on 2 cores). This times
``python -c "import ihsweep.steps.<step>"`` for the working tree and for ``--baseline`` (a git
ref, extracted with ``git archive`` to a temporary folder), alternating, ``--repeats`` times each;
the medians and their ratio are printed per step, with the heavy packages each side loaded.

    .venv/bin/python bench/step_startup.py                      # against HEAD
    .venv/bin/python bench/step_startup.py --baseline e4340ee --repeats 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("train", "probe", "run_figure", "chunk", "aggregate_natural", "aggregate_markov")
# Packages whose import alone costs a tenth of a second or more here.
HEAVY = ("torch", "torch._dynamo", "scipy", "matplotlib", "pandas", "jsonschema", "transformers")

PROBE = """
import sys
import ihsweep.steps.{step}
import ihsweep, json
print(json.dumps({{"file": ihsweep.__file__,
                  "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def import_once(workflow_dir: Path, step: str) -> dict:
    """Wall seconds of one fresh interpreter importing the step (start-up included), and what
    it loaded; checks that the tree it was asked for is the one imported."""
    code = PROBE.format(step=step, heavy=HEAVY)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(workflow_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["file"]).is_relative_to(workflow_dir):
        sys.exit(f"imported {result['file']}, not the tree under {workflow_dir}")
    return {"wall": wall, "heavy": result["heavy"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="HEAD", help="git ref to compare with (default HEAD)")
    p.add_argument("--repeats", type=int, default=5, help="imports per step and side")
    p.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "workflow"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        sides = {"this tree": ROOT / "workflow", args.baseline: Path(tmp) / "workflow"}
        print(f"median wall seconds of {args.repeats} fresh imports, alternating")
        print(f"{'step':<18} {'this tree':>10} {args.baseline:>10} {'ratio':>6}  loaded")
        for step in args.steps:
            walls = {name: [] for name in sides}
            heavy = {}
            for _ in range(args.repeats):
                for name, tree in sides.items():
                    once = import_once(tree, step)
                    walls[name].append(once["wall"])
                    heavy[name] = once["heavy"]
            new, old = (statistics.median(walls[name]) for name in sides)
            only_old = sorted(set(heavy[args.baseline]) - set(heavy["this tree"]))
            note = ", ".join(heavy["this tree"]) + (
                f" (baseline also {', '.join(only_old)})" if only_old else ""
            )
            print(f"{step:<18} {new:>10.2f} {old:>10.2f} {old / new:>5.2f}x  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
