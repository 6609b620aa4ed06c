"""The fault matrix: every fault class a study must survive, tried on purpose and counted.

    python bench/faults.py [--quick] [--classes kills,files,writers,configs] [--out faults.json]

Prints one ``passed/tried`` line per class, then each failed case. The classes:
- kills: kill -9 at named points of a training job (every phase: a step, a micro-batch, a
  checkpoint write, between a checkpoint and its state, the state's rotation, the early-stop
  rule, the completion record), rerun: the run equals an uninterrupted one
  (``bench/_fault_kills.py``);
- files: each file kind truncated, overwritten with random bytes and with zeros: one line
  naming the file, recovered by the documented fix, nothing else touched
  (``bench/_fault_files.py``);
- writers: two jobs on one run: the second refuses while the first lives, takes over after
  kill -9 of the first and its lease's expiry, and the run equals an uninterrupted one
  (``bench/_fault_writers.py``);
- configs: malformed config files (YAML syntax, a key given twice at several depths, empty,
  missing, wrong types, out-of-range values, unknown keys) through ``ihsweep.cost`` and a
  Snakemake dry run: one line naming the file and line, or the key (``bench/_fault_configs.py``).

``--quick`` runs a few cases of each class (tests/test_faults.py runs it in CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CLASSES = ("kills", "files", "writers", "configs")


def cases_of(name: str, quick: bool) -> list[tuple[str, bool, str]]:
    if name == "kills":
        from _fault_kills import kill_cases

        return [(c.name, c.passed, c.detail) for c in kill_cases(quick)]
    if name == "files":
        from _fault_files import file_damage_cases

        return file_damage_cases(quick)
    if name == "configs":
        from _fault_configs import config_cases

        return config_cases(quick)
    from _fault_writers import writer_cases

    return writer_cases(quick)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few cases of each class")
    p.add_argument(
        "--classes", default=",".join(CLASSES), help="comma-separated, of " + ", ".join(CLASSES)
    )
    p.add_argument("--out", type=Path, help="write every case as JSON here")
    args = p.parse_args(argv)
    record, failed = {}, 0
    for name in args.classes.split(","):
        if name not in CLASSES:
            p.error(f"no class {name!r}; the classes are {', '.join(CLASSES)}")
        start = time.perf_counter()
        cases = cases_of(name, args.quick)
        seconds = time.perf_counter() - start
        passed = sum(ok for _, ok, _ in cases)
        print(f"{name}: {passed}/{len(cases)} passed ({seconds:.0f} s)", flush=True)
        for case, ok, detail in cases:
            if not ok:
                print(f"  FAILED {case}: {detail}", flush=True)
        failed += len(cases) - passed
        record[name] = {
            "seconds": round(seconds, 1),
            "cases": [{"case": c, "passed": ok, "detail": d} for c, ok, d in cases],
        }
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
