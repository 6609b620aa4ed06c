"""What a study's jobs cost on a device profile: ``ihsweep.cost``'s arithmetic, run by run.

``StudyCost(study)`` takes the profile of the study's ``execution`` section
(``ihsweep.cost.device_profile``; or one given, as the report's CPU view does). The rules ask
it for each job's runtime; ``ihsweep.steps.prepare`` for each run's memory; the cost report for its
rows.
"""

from __future__ import annotations

import math

from ihsweep import cost
from ihsweep.config import EXECUTION, Run, Study

BYTES_PER_TOKEN = 4.0  # of English text under GPT-2's tokenizer (4.16 on the KJV): chunk sizing


class StudyCost:
    """A study's runs and data jobs, costed on one device profile."""

    def __init__(self, study: Study, profile: dict | None = None):
        self.study = study
        self.execution = study.config[EXECUTION]
        # The study's own profile decides which jobs ask for a GPU, whatever view is costed.
        self.gpu_kind = cost.device_profile(self.execution)
        self.profile = self.gpu_kind if profile is None else profile
        self.cpu = cost.device_profile({**self.execution, "device_profile": "cpu"})

    @property
    def memory_limit(self) -> float:
        """Bytes a training job may use on the study's device profile (``ihsweep.cost``)."""
        return cost.memory_limit(self.profile, self.execution)

    def micro_batch(self, run: Run, setting: int | str | None = None) -> int | None:
        """The micro-batch a run trains at on the study's device profile: ``setting`` (by
        default ``execution.micro_batch``) resolved by ``cost.choose_micro_batch``; None when
        even one sequence does not fit."""
        return self._micro_batch(run, self.profile, setting)

    def _micro_batch(self, run: Run, profile: dict, setting=None) -> int | None:
        return cost.choose_micro_batch(
            self.execution["micro_batch"] if setting is None else setting,
            self.study.model_of(run),
            self.study.vocab_size_of(run.data),
            run.batch_size,
            run.context_size,
            cost.profile_device_type(profile),
            cost.memory_limit(profile, self.execution),
        )

    def gpu_speedup(self, run: Run) -> float:
        """How many times as fast the study's device profile trains ``run`` as one CPU thread
        (the ``cpu`` profile) does, predicted; 1 where the study's profile is the CPU's."""
        return self._train_seconds(run, self.cpu) / self._train_seconds(run, self.gpu_kind)

    def gpus(self, run: Run) -> int:
        """GPUs a cluster job of ``run`` (training, probing) asks for: ``execution.gpu``, or
        under ``auto`` one where ``gpu_speedup`` is at least ``cost.GPU_MIN_SPEEDUP``, else
        none (the job computes on its CPUs)."""
        if self.execution["gpu"] != "auto":
            return self.execution["gpu"]
        return 1 if self.gpu_speedup(run) >= cost.GPU_MIN_SPEEDUP else 0

    def peak_memory(self, run: Run, micro_batch: int) -> dict[str, float]:
        return cost.peak_memory(
            self.study.model_of(run),
            self.study.vocab_size_of(run.data),
            micro_batch,
            run.context_size,
            cost.profile_device_type(self.profile),
        )

    def train_seconds(self, run: Run, tokens: int | None = None) -> float:
        """Estimated seconds of training ``tokens`` (by default the full budget) on the study's
        device profile (``ihsweep.cost``)."""
        return self._train_seconds(run, self.profile, tokens)

    def _train_seconds(self, run: Run, profile: dict, tokens: int | None = None) -> float:
        micro_batch = self._micro_batch(run, profile) or 1
        passes = len(cost.micro_batch_sizes(run.batch_size, micro_batch))
        fpt = cost.flops_per_token(
            self.study.model_of(run), self.study.vocab_size_of(run.data), run.context_size
        )
        updates = self.study.total_steps(run) if tokens is None else tokens // run.tokens_per_step
        return cost.train_seconds(updates, passes, updates * run.tokens_per_step, fpt, profile)

    def train_minutes(self, run: Run, attempt: int = 1) -> int:
        """Runtime a cluster training job asks for (``ihsweep.cost.job_minutes``): the full
        budget's, since a run may form no induction heads and train to its end; on the CPU
        profile when the job asks for no GPU (``gpus``)."""
        on_gpu = self.gpus(run) and cost.profile_device_type(self.gpu_kind) == "cuda"
        profile = self.gpu_kind if on_gpu else self.cpu
        return cost.job_minutes(self._train_seconds(run, profile), self.execution, attempt)

    def early_stop_tokens(self, run: Run) -> int:
        """Tokens the run is expected to train (``cost.early_stop_tokens``): with early stop on
        and a law that predicts its transition, the first checkpoint ``margin_decades`` past the
        prediction; otherwise its budget."""
        tokens = [step * run.tokens_per_step for step in self.study.checkpoint_steps(run)]
        rule, prediction = self.study.early_stop(run), self.study.prediction(run)
        if rule is None or prediction is None:
            return tokens[-1]
        return cost.early_stop_tokens(
            prediction["tokens"], rule["margin_decades"], tokens, run.tokens_per_step
        )

    def row(self, run: Run) -> dict:
        """The run's row of ``python -m ihsweep.cost``."""
        micro_batch = self.micro_batch(run) or 1
        n_params = cost.parameter_count(
            self.study.model_of(run), self.study.vocab_size_of(run.data)
        )
        n_checkpoints = len(self.study.checkpoint_steps(run))
        updates = self.study.total_steps(run)
        seconds = self.train_seconds(run)
        stop_tokens = self.early_stop_tokens(run)
        return {
            "run_id": run.id,
            "updates": updates,
            "tokens": updates * run.tokens_per_step,
            "early_stop_tokens": stop_tokens,
            "micro_batch": micro_batch,
            "peak_gb": self.peak_memory(run, micro_batch)["total"] / cost.GB,
            "limit_gb": self.memory_limit / cost.GB,
            "device_hours": seconds / 3600,
            "early_stop_device_hours": self.train_seconds(run, stop_tokens) / 3600,
            "walltime_min": self.train_minutes(run),
            "gpus": self.gpus(run),
            "gpu_speedup": self.gpu_speedup(run),
            "checkpoints": n_checkpoints,
            # fp32 weights per checkpoint, and two resume states (weights and AdamW's moments)
            "checkpoint_gb": (n_checkpoints * 4 + 24) * n_params / cost.GB,
        }

    def tokenize_minutes(self, data: str, attempt: int = 1) -> int:
        corpus = self.study.config["datasets"][data]["corpus"]
        return cost.tokenize_minutes(corpus, self.execution, attempt)

    def chunk_minutes(self, data: str, context: int, attempt: int = 1) -> int:
        dataset = self.study.config["datasets"][data]
        if dataset["family"] == "markov":
            tokens = (dataset["n_train_sequences"] + dataset["n_val_sequences"]) * context
        else:
            size = cost.corpus_bytes(dataset["corpus"])
            tokens = None if size is None else size / BYTES_PER_TOKEN
        return cost.chunk_minutes(tokens, self.execution, attempt)

    def probe_minutes(self, attempt: int = 1) -> int:
        return attempt * math.ceil(self.execution["probe_minutes"])
