"""Rule ``probe_suite``: PS and LA per head, AR per model, at every revision of one checkpoint
suite of a Hugging Face causal LM (``ihsweep.probing.suite``).

    python -m ihsweep.steps.probe_suite --name pythia-160m --suite '<suites.<name> JSON>' \
        --probe '<probe JSON>' --heads .../probes/<key>/heads.parquet \
        --model-table .../probes/<key>/model.parquet

Each revision's result is cached beside the tables (``probes/<key>/cache/<revision>.parquet``),
so a revision probed before is not loaded again. Beside the tables it also writes the
revisions' fingerprints and duplicate groups (``layout.SUITE_FILES``:
``ihsweep.probing.fingerprints``), one line per group to the log, and the groups as the suite's
report page.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ihsweep.config import complete
from ihsweep.config.execution import add_flags, flags_execution
from ihsweep.files import layout
from ihsweep.files.io import atomic_path, json_arg, write_parquet
from ihsweep.probing.fingerprints import duplicate_groups
from ihsweep.probing.suite import SuiteError, probe_suite
from ihsweep.report.tables import suite_duplicates, write_page
from ihsweep.steps import _args
from ihsweep.training.execution import pick_device


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("probe_suite", "Probe every revision of a checkpoint suite.")
    p.add_argument("--name", required=True, help="the suite's name (a key of `suites`)")
    p.add_argument("--suite", required=True, type=json_arg, help="its `suites.<name>` entry")
    _args.add_spec(p, "--probe", "probe", required=False)
    p.add_argument("--heads", required=True, type=Path, help="output: per-head table (Parquet)")
    p.add_argument("--model-table", required=True, type=Path, help="output: per-revision table")
    p.add_argument("--base-dir", default=".", help="folder that a local suite's path is under")
    add_flags(p, "probe_suite")
    args = p.parse_args(argv)
    execution = flags_execution(args, "probe_suite")
    torch.set_num_threads(execution.threads)
    suite = complete("suite", args.suite)
    try:
        heads, model, fingerprints = probe_suite(
            args.name,
            suite,
            complete("probe", args.probe),
            pick_device(execution.device),
            args.heads.parent / "cache",
            args.base_dir,
        )
    except SuiteError as err:  # a revision that is not there: its name, not a traceback
        print(err, file=sys.stderr)
        return 1
    write_parquet(heads, args.heads)
    write_parquet(model, args.model_table)
    prints, groups, page = (args.heads.parent / name for name in layout.SUITE_FILES)
    write_parquet(fingerprints, prints)
    duplicates = duplicate_groups(args.name, fingerprints)
    with atomic_path(groups) as tmp:
        duplicates.to_csv(tmp, index=False)
    write_page(page, suite_duplicates(args.name, duplicates))
    for line in duplicates["line"]:
        print(f"duplicate revisions: {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
