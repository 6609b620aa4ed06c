"""What makes Snakemake redo a job: the workflow profile's rerun triggers, as Snakemake reads
them on every run (alone, under the slurm profile, and overridden on the command line).

That a refactor of the rules' commands replans nothing on a finished study, and that the `code`
trigger would, is tested on test_workflow's tiny study
(``test_a_refactor_of_the_rules_commands_retrains_and_reprobes_nothing``).
"""

from __future__ import annotations

import pytest
from conftest import REPO
from snakemake.cli import parse_args
from snakemake.settings.types import RerunTrigger

WORKFLOW = ["--snakefile", str(REPO / "Snakefile"), "-n"]
SLURM = ["--profile", str(REPO / "slurm")]
PROFILE_TRIGGERS = {RerunTrigger.MTIME, RerunTrigger.PARAMS, RerunTrigger.INPUT}


@pytest.mark.parametrize("profile", [[], SLURM], ids=["local", "slurm"])
def test_every_run_leaves_out_the_code_and_software_env_triggers(profile, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # found beside the Snakefile, wherever Snakemake is typed
    _, args = parse_args([*profile, *WORKFLOW])
    assert set(args.rerun_triggers) == PROFILE_TRIGGERS
    _, args = parse_args([*profile, *WORKFLOW, "--rerun-triggers", "code"])
    assert set(args.rerun_triggers) == {RerunTrigger.CODE}  # the command line wins
    _, args = parse_args([*profile, *WORKFLOW, "--workflow-profile", "none"])
    assert RerunTrigger.CODE in args.rerun_triggers  # Snakemake's default, without the profile
