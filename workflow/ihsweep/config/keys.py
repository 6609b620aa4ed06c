"""Where a study's files are: each folder keyed by the settings that decide its files.

``StudyPaths(study)`` (``study.paths``) gives every concrete path of ``ihsweep.files.layout`` for
one study. A folder's key is ``layout.settings_key`` of what decides its files, and of the keys of
the folders it reads, so a change upstream moves everything downstream to new folders:

==========  ============================================================================
folder      its key covers
==========  ============================================================================
dataset     the dataset's entry (defaults filled in; without the Markov ``grid`` name)
            and, for a Markov cell, its chain's folder
chain       the chain's spec and, for a bigram chain, its source dataset's folder
run         the run's training spec (model, recipe, budget, checkpoints, early-stop
            rule, the law's prediction) and its dataset's folder
suite       the suite's entry (without ``keep_duplicates``, which only the fit reads)
probes      the ``probe`` section (inside a run or suite folder)
figures     the ``probe`` and ``emergence`` sections (inside a run folder)
==========  ============================================================================

Execution settings (device, threads, micro-batch, resources, compile) are in no key: where
and how a run executes never moves it. Names stay in the keys as well as in the paths, so two
names are two folders even for equal settings.
"""

from __future__ import annotations

from functools import cached_property

from ihsweep.config.study import Run, Study
from ihsweep.files import layout


class StudyPaths:
    """Every folder and file of one study, keyed (``ihsweep.files.layout`` gives the shapes)."""

    def __init__(self, study: Study):
        self.study = study
        self._run_keys: dict[Run, str] = {}  # a run's spec takes a moment; the DAG asks often

    # ---- keys --------------------------------------------------------------------------------

    def dataset_key(self, data: str) -> str:
        spec = self.study.dataset_spec(data)
        spec.pop("grid", None)  # the entry's name: it names the chain, not the data
        chain = spec.get("chain")
        source = self.chain_folder(self.study.grid_of(data)) if chain else None
        return layout.settings_key({"dataset": spec, "chain": source})

    def chain_key(self, grid: str) -> str:
        chain = self.study.chain_spec(grid)
        source = self.dataset_folder(chain["source"]) if chain["kind"] == "bigram" else None
        return layout.settings_key({"chain": chain, "source": source})

    def run_key(self, run: Run) -> str:
        if run not in self._run_keys:
            spec = self.study.train_spec(run)
            folder = self.dataset_folder(run.data)
            self._run_keys[run] = layout.settings_key({"run": spec, "data": folder})
        return self._run_keys[run]

    def suite_key(self, suite: str) -> str:
        spec = dict(self.study.suites[suite])
        spec.pop("keep_duplicates", None)  # decides the emergence fit, not the suite's files
        return layout.settings_key(spec)

    @cached_property
    def probe_key(self) -> str:
        return probe_key(self.study.config["probe"])

    @cached_property
    def figure_key(self) -> str:
        config = self.study.config
        return layout.settings_key({"probe": config["probe"], "emergence": config["emergence"]})

    def dataset_folder(self, data: str) -> str:
        """``<data>-<key>``: the dataset's folder name under results/data/."""
        return layout.keyed(data, self.dataset_key(data))

    def chain_folder(self, grid: str) -> str:
        return layout.keyed(grid, self.chain_key(grid))

    # ---- paths -------------------------------------------------------------------------------

    def dataset_dir(self, data: str) -> str:
        return layout.dataset_dir(data, self.dataset_key(data))

    def chunk_dir(self, data: str, context: int) -> str:
        return layout.chunk_dir(data, self.dataset_key(data), context)

    def chain_dir(self, grid: str) -> str:
        return layout.chain_dir(grid, self.chain_key(grid))

    def dataset_file(self, name: str, data: str) -> str:
        return layout.dataset_file(name, data, self.dataset_key(data))

    def chunk_file(self, name: str, data: str, context: int) -> str:
        return layout.chunk_file(name, data, self.dataset_key(data), context)

    def chain_file(self, name: str, grid: str) -> str:
        return layout.chain_file(name, grid, self.chain_key(grid))

    def run_dir(self, run: Run) -> str:
        return layout.run_dir(run, self.run_key(run))

    def run_file(self, name: str, run: Run) -> str:
        return layout.run_file(name, run, self.run_key(run))

    def probe_table(self, name: str, run: Run) -> str:
        return layout.probe_table(name, self.run_dir(run), self.probe_key)

    def run_figures(self, run: Run) -> list[str]:
        return layout.run_figures(self.run_dir(run), self.figure_key)

    def export_dir(self, run: Run) -> str:
        return layout.export_dir(run, self.run_key(run))

    def run_log(self, rule: str, run: Run) -> str:
        subkeys = {"probe": [self.probe_key], "run_figure": [self.figure_key]}.get(rule, [])
        return layout.run_log(rule, run, self.run_key(run), *subkeys)

    def suite_dir(self, suite: str) -> str:
        return layout.suite_dir(suite, self.suite_key(suite))

    def suite_table(self, name: str, suite: str) -> str:
        return layout.probe_table(name, self.suite_dir(suite), self.probe_key)

    def suite_file(self, name: str, suite: str) -> str:
        return layout.suite_file(name, self.suite_dir(suite), self.probe_key)

    def revision_cache(self, suite: str, revision: str) -> str:
        """A suite revision's probe result, cached by the probe step (``probe_suite``)."""
        return layout.probe_cache(self.suite_dir(suite), revision, self.probe_key)


def probe_key(probe: dict) -> str:
    """The key of a probe setting (the ``probe`` section, defaults filled in): the training
    job's early-stop probes and the probe step share one cache through it."""
    return layout.settings_key(probe)
