"""Where a study stands: one line per configuration (training run), from the files on disk.

    python -m ihsweep.status                      # the running study, else config.yaml's
    python -m ihsweep.status --watch              # redraw every 10 s until Ctrl-C
    python -m ihsweep.status --watch 30 --jobs 4  # 4 runs train at a time (the study's ETA)
    python -m ihsweep.status --study cpu-full     # a study recorded in results/studies/
    python -m ihsweep.status --configfile my.yaml --csv status.csv
    python -m ihsweep.status --directory /scratch/ih   # a study run with snakemake --directory

It starts nothing and needs no Snakemake lock, so it works while a study runs, locally or on
SLURM. It reads from the current folder, or from ``--directory DIR`` as Snakemake does:
``results/`` and the default config.yaml in DIR, a ``--configfile`` relative to where the
command is typed.

**Which study.** The first line names the study reported, why that one, its config files, the
folder it runs in and when it started. Every study the workflow started records these in
``results/studies/<study>/study.json`` (``ihsweep.report.provenance.StudyClaim``). With
``--configfile`` (and ``--config``, as Snakemake's), status reports the study of those files;
with ``--study NAME``, the study recorded under that name, read from its recorded config files.
With neither, it lists the recorded studies (running or not) and reports the running one
(runs with a fresh ``progress.json``); of several running, the one started last; of none, the
study of config.yaml, saying so (``ihsweep.status.studies``).

**States:**

- ``done``: trained and probed; ``trained``: run.json is there, the probe tables are not yet.
  Both cover the two good endings, told apart by the ``outcome`` column: ``completed`` (trained
  to its budget) or ``stopped early`` (stopped once its emergence was confirmed,
  ``training.stop_after_emergence``; its tokens fall short of the budget on purpose);
- ``diverged``: training hit a non-finite loss and ended there (run.json ``outcome``, or
  ``progress.json`` state "diverged"); the ``error`` column says where, e.g. "train loss nan at
  step 812 (lr 0.006)". The rest of the sweep goes on without it;
- ``running``: the run's ``progress.json`` says so and was updated within the last
  ``--active-minutes`` (default 5);
- ``interrupted``: it stopped on a signal with its state saved (the retry resumes it);
- ``failed``: it stopped on an error (the ``error`` column), or says running but has not been
  updated for longer than ``--active-minutes`` (killed; read its log);
- ``missing``: not started.

Each run's state comes from its ``progress.json`` (``ihsweep.files.records.write_progress``) and
its completion record ``run.json``; nothing here reads the training log. **Columns** (of
``--csv``; the printed table shows them shortened):

- ``run_id, state``; ``outcome``: ``completed``, ``stopped_early`` or ``diverged`` once the run
  has ended (run.json's value; a run.json without one counts as completed), empty before;
- ``tokens``: tokens trained (the largest of run.json's, the last progress record's and the
  last checkpoint's); ``budget``: its token budget (run.json's, else the study's);
- running runs only: ``tokens_per_second`` (printed ``speed``), the speed progress.json
  recorded over the window before its last record (``execution.progress_seconds``, 15 s);
  ``percent`` (``%``): tokens of the budget; ``eta_seconds`` (``ETA``): the tokens left at the
  last record over that speed, less the time since the record;
- ``emerged``, ``tokens_pt``, ``tokens_lo``, ``tokens_hi``: the observed emergence point and its
  95% interval, from the study's aggregates' emergence tables when built;
- ``predicted_tokens`` and ``prediction``, where the prediction comes from: ``run.json`` (the
  point the law predicted when the run was planned, ``checkpoints.densify``, recorded with the
  run) when the run has one, else ``lawfit`` (today's fit,
  ``results/studies/<study>/natural/lawfit.json``, for the run's B and C; natural-data runs
  only); ``predicted_within``: whether the prediction lies inside the observed interval (only
  for emerged runs with a prediction);
- ``error``: why a failed run stopped, or where a diverged one diverged.

After the table come the state counts and a totals line: tokens trained against the budget
over the runs that have ended (and the saving in %) and over all runs, how many stopped early
and how many diverged, and "the law predicted N of M emerged runs within their interval" over
the emerged runs with a prediction.

**The study's ETA** (the last line, ``ihsweep.status.live``): when the unfinished runs (all
but done, trained and diverged) have trained to their budgets. A run with a recorded speed
(running, or interrupted or failed after its first progress line) counts at that speed
(``measured``); the others at the cost model's estimate (``python -m ihsweep.cost``, on the
device profile it shows), and the line gives each part's sum. Runs train one after another, as
Snakemake runs them on one machine, unless ``--jobs N`` says N at a time (as ``snakemake
--jobs N`` on a cluster): the running runs hold their slots, and each waiting run takes the
slot that frees first. Training only: the probe and aggregate jobs are not counted, and an
early stop ends a run before its budget.

**Checkpoint suites** (``ihsweep.status.suites``): a study with suites lists them after its
runs (a study of suites alone, such as pythia.yaml, lists only them): per suite its model, B
and C, how many of its revisions are probed (their results cached by the probe job) and its
state, ``done``, ``probed k of n`` or ``missing``; then each suite's revisions probed and not
yet. ``python -m ihsweep.where '<suite>/<revision pattern>'`` prints those revisions' files.

**Checkpoint suites' duplicate revisions** (``ihsweep.status.duplicates``): after the suites, one
line per group of revisions that hold identical weights or share a trained tensor, as the probe
step found them (docs/checkpoints.md); none before a suite is probed or when it is clean.

``--watch [SECONDS]`` prints the same frame every SECONDS (default 10) until Ctrl-C: redrawn
in place in a terminal, one after another into a file.
"""

from ihsweep.status.command import main
from ihsweep.status.table import (
    damaged_records,
    format_table,
    run_outcome,
    run_state,
    status_table,
    totals,
)

__all__ = [
    "damaged_records", "format_table", "main", "run_outcome", "run_state",
    "status_table", "totals",
]  # fmt: skip
