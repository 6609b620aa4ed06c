"""Train one run: one (dataset, model, batch size B, context size C, seed) configuration.

``train(spec, data_dir, run_dir, execution, stop_rule)`` takes a spec from
``ihsweep.config.Study.train_spec`` and the job's ``ihsweep.config.Execution``; the command is
``python -m ihsweep.steps.train``. It reads as the algorithm; its parts live
beside it, each testable alone:

- the batches (``sampler``), the update of (model, optimizer, batch) and its loss (``step``),
  the device and micro-batch (``execution``);
- which updates checkpoint, log and at what learning rate (``schedule``);
- why a run stops before its budget: signals, divergence, a stop rule handed in (``stops``);
- the resume state (``resume``), checkpoint files (``checkpoints``, ``weights``);
- progress lines or a bar (``progress``); the run's records, ``run.json``, ``progress.json``
  and ``loss.csv``, are written through ``ihsweep.files.records`` only.

Checkpoints are saved at the token counts of the spec (converted to steps), each with the
resume state, so a killed job restarts at its last checkpoint and ends with the same weights,
bit for bit on CPU, as an uninterrupted run: the batch at step i is a pure function of (seed,
i), and the model, optimiser and RNG states are restored exactly. SIGTERM or SIGUSR1 (sent by
SLURM before a walltime kill or on preemption) saves the resume state at the next step and
raises ``Interrupted`` (the step exits non-zero). ``bench/trainer_vs_minimal.py`` times this
trainer against a minimal nanoGPT-style loop (they end with the same weights).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ihsweep import cost
from ihsweep.config import Execution
from ihsweep.data.chunks import open_chunks, read_chunks_meta
from ihsweep.files import records
from ihsweep.files.lease import EXPIRE_SECONDS, LeaseLost, RunLease
from ihsweep.training.checkpoints import list_checkpoints
from ihsweep.training.environment import environment
from ihsweep.training.events import TrainEvents
from ihsweep.training.execution import prepare_device, resolve_micro_batch, step_path
from ihsweep.training.model import GPT, GPTConfig
from ihsweep.training.progress import progress_of, summary_line
from ihsweep.training.resume import (
    SAVED_WITH_CHECKPOINT,
    Resumed,
    read_resume_step,
    remove_temporaries,
    resume,
    save_state,
    spec_hash,
)
from ihsweep.training.sampler import ChunkSampler
from ihsweep.training.schedule import Schedule
from ihsweep.training.step import (
    evaluate,
    held_learning_rate,
    make_update,
    set_learning_rate,
)
from ihsweep.training.stops import (
    Diverged,
    DivergenceWatch,
    ForcedStop,
    Interrupted,
    StopRequested,
    StopRule,
)
from ihsweep.training.weights import save_checkpoint


class Outcome(enum.Enum):
    """How a job's session of a run ended. The first three end the run (its ``run.json`` says
    which); ``INTERRUPTED`` stopped at ``stop_after_step`` with the state saved, to resume (a
    signal raises ``Interrupted`` instead)."""

    COMPLETED = "completed"
    STOPPED_EARLY = "stopped_early"
    DIVERGED = "diverged"
    INTERRUPTED = "interrupted"


def train(
    spec: dict,
    data_dir: Path,
    run_dir: Path,
    execution: Execution,
    stop_rule: StopRule | None = None,
    *,
    stop_after_step: int | None = None,
    lease_seconds: float = EXPIRE_SECONDS,
) -> Outcome:
    """Run (or resume) one training run; returns how the session ended (the run's summary is
    its ``run.json``, ``records.read_run``).

    ``execution`` is the job's (the schema documents each setting). ``stop_rule`` is asked at
    every checkpoint whether the run stops there (``ihsweep.steps.stop_rule`` builds the spec's
    ``early_stop`` rule). ``stop_after_step``: save the state and stop after that step (tests).
    The job holds the run folder's lease (``ihsweep.files.lease``; it expires ``lease_seconds``
    after the job dies) from before it reads the folder until it ends: ``LeaseHeld`` when another
    job holds it. A signal saves the state and raises ``Interrupted``. ``progress.json`` follows the
    run (``records.write_progress``): running while it trains, then done, diverged, interrupted
    (a signal: the state is saved and the retry resumes) or failed (any error)."""
    run_dir = Path(run_dir)
    if spec.get("early_stop") is not None and stop_rule is None:
        raise ValueError(
            f"run {spec['run_id']}: its spec stops early (early_stop) but no stop rule was given;"
            " pass stop_rule=ihsweep.steps.stop_rule.stop_rule_of(spec)"
        )
    lease = RunLease(run_dir, lease_seconds / 6, lease_seconds, wait_for_expiry=True)
    tokens_per_step = spec["batch_size"] * spec["context_size"]
    with StopRequested() as signals, lease:
        for path in remove_temporaries(run_dir):
            print(f"[{spec['run_id']}] removed {path}, left by a write that was killed", flush=True)
        try:
            job = Job.build(spec, data_dir, execution)
            session = Session(signals, lease, stop_rule, stop_after_step)
            return Trainer(spec, run_dir, job, execution.progress_seconds, session).run()
        except (LeaseLost, Interrupted):
            raise  # the folder is another job's now, or the state is saved: nothing to record
        except ForcedStop as stop:
            records.write_stopped(run_dir, "interrupted", spec["total_steps"], tokens_per_step,
                                  signal=stop.signum)  # fmt: skip
            step = read_resume_step(run_dir)
            why = f"signal {stop.signum} again: stopped at once; the next start resumes from"
            raise Interrupted(stop.signum, f"{why} the state saved at step {step}") from None
        except Exception as err:
            records.write_stopped(run_dir, "failed", spec["total_steps"], tokens_per_step,
                                  error=f"{type(err).__name__}: {err}")  # fmt: skip
            raise


@dataclass(frozen=True)
class Session:
    """What a job's session answers to besides its run: signals, the folder's lease, the stop
    rule and the step it stops after (tests)."""

    signals: StopRequested
    lease: RunLease
    stop_rule: StopRule | None = None
    stop_after_step: int | None = None


@dataclass
class Job:
    """What a job trains with: data, model, optimiser and the update, on the job's device."""

    sampler: ChunkSampler
    val_batches: list[torch.Tensor]
    model: GPT
    optim: torch.optim.Optimizer
    device: torch.device
    micro_batch: int
    autocast: torch.autocast
    update: Callable[[GPT, torch.optim.Optimizer, torch.Tensor], torch.Tensor]  # make_update's
    held_lr: torch.Tensor | None = None  # the capturable update's learning rate

    def set_lr(self, lr: float) -> None:
        set_learning_rate(self.optim, lr, self.held_lr)

    @classmethod
    def build(cls, spec: dict, data_dir: Path, execution: Execution) -> Job:
        tcfg, B, C = spec["training"], spec["batch_size"], spec["context_size"]
        device = prepare_device(execution.device, execution.threads)
        # Chunks of C tokens; the model sees C-1 inputs and predicts C-1 targets per chunk.
        meta = read_chunks_meta(data_dir)
        sampler = ChunkSampler(open_chunks(data_dir, "train"), B, spec["seed"])
        val = open_chunks(data_dir, "val")
        n_val = min(len(val), tcfg["val_batches"] * B)
        val_batches = [
            torch.from_numpy(val[i : i + B].astype(np.int64)) for i in range(0, n_val, B)
        ]
        # Built on the CPU, so the initial weights do not depend on the device.
        torch.manual_seed(spec["seed"])
        cfg = GPTConfig(vocab_size=meta["vocab_size"], **spec["model_config"])
        model = GPT(cfg).to(device)
        optim = torch.optim.AdamW(
            model.parameters(),
            lr=tcfg["lr"],
            betas=tuple(tcfg["betas"]),
            eps=tcfg["eps"],
            weight_decay=tcfg["weight_decay"],
            fused=True,  # one kernel per step on CUDA and CPU: ~10% of a small CPU model's step
        )
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        micro_batch = resolve_micro_batch(
            execution.micro_batch, cfg, B, C, device, execution.train_mem_mb
        )
        path = step_path(execution, device, B, C)
        capturable = execution.capturable_update is True  # auto: today's update
        described = [path.describe()] + (["capturable update"] if capturable else [])
        print(
            f"[{spec['run_id']}] {len(cost.micro_batch_sizes(B, micro_batch))} micro-batch(es) "
            f"of at most {micro_batch} per update of B = {B} on {device}"
            + "".join(f", {part}" for part in described if part),
            flush=True,
        )
        update = make_update(
            micro_batch, autocast, tcfg["grad_clip"], path.loss_fn(device_type=device.type),
            capturable,
        )  # fmt: skip
        held_lr = held_learning_rate(device) if capturable else None
        return cls(sampler, val_batches, model, optim, device, micro_batch, autocast, update,
                   held_lr)  # fmt: skip


class Trainer:
    """One job's session of a run: made, it has resumed the run (the saved state loaded, the
    records continued at its step); ``run`` trains it to its end or to a stop."""

    def __init__(self, spec: dict, run_dir: Path, job: Job, progress_seconds: float,
                 session: Session):  # fmt: skip
        self.spec, self.run_dir, self.job, self.session = spec, Path(run_dir), job, session
        self.run_id, self.schedule = spec["run_id"], Schedule.of(spec)
        self.fingerprint = spec_hash(spec)
        self.tokens_per_step = spec["batch_size"] * spec["context_size"]
        cfg = job.model.cfg
        self.flops_per_token = cost.flops_per_token(cfg.to_dict(), cfg.vocab_size,
                                                    spec["context_size"])  # fmt: skip
        self.losses = records.LossLog(self.run_dir, self.tokens_per_step)
        self.events = TrainEvents(records.train_events(self.run_dir))  # loss.csv's, for TensorBoard
        self.unread: list[torch.Tensor] = []  # losses still on the device
        resumed = resume(self.run_dir, spec, job.model, job.optim)
        self.step = resumed.step
        self.recent = list(resumed.recent_losses)  # train losses of the current log window
        self.begin(resumed)
        # Times the session too; a bar in place of the log's lines when run in a terminal.
        self.progress = progress_of(progress_seconds, self.step, self.schedule.total_steps,
                                    self.tokens_per_step, self.run_id)  # fmt: skip
        self.watch = DivergenceWatch(cfg.vocab_size, spec["training"]["divergence_tokens"],
                                     self.tokens_per_step, self.losses.train_losses(),
                                     self.schedule.total_steps)  # fmt: skip

    def run(self) -> Outcome:
        self.job.model.train()
        if self.schedule.checkpoints(self.step) and (reason := self.stops_early()):
            return self.finish(Outcome.STOPPED_EARLY, reason)  # resumed where it had stopped
        while self.step < self.schedule.total_steps:
            lr = self.schedule.lr_of(self.step)
            self.job.set_lr(lr)
            x = self.job.sampler.batch(self.step)
            if self.job.device.type == "cuda":  # a copy that does not wait needs locked pages
                x = x.pin_memory()
            x = x.to(self.job.device, non_blocking=True)
            self.unread.append(self.job.update(self.job.model, self.job.optim, x))
            self.step += 1
            if (ended := self.after_update(lr)) is not None:
                return ended
        return self.finish(Outcome.COMPLETED)

    def begin(self, resumed: Resumed) -> None:
        """Write what the restart owes: the progress record, the loss log's header (or its rows
        after the state cut), a damaged checkpoint rewritten, step 0's checkpoint."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.losses.start(self.step)
        self.events.start(self.step)
        self.record_progress("running", None)
        if resumed.rewrite_train_loss is not None:  # evaluation draws no random numbers
            self.checkpoint(resumed.rewrite_train_loss)
            print(f"[{self.run_id}] rewrote the checkpoint of step {self.step} from the saved "
                  "state", flush=True)  # fmt: skip
        if self.step == 0 and self.schedule.checkpoints(0):
            self.save(math.nan, with_checkpoint=True, saved_on=SAVED_WITH_CHECKPOINT)

    def after_update(self, lr: float) -> Outcome | None:
        """Log, report, checkpoint and stop as the schedule and the stops say after an update;
        returns how the session ended when it ends here, None when it goes on."""
        step, schedule = self.step, self.schedule
        if lost := self.session.lease.check():
            raise LeaseLost(f"{lost} at step {step}: this job stops here")
        log_row, line_due = schedule.logs(step), self.progress.due(step, schedule.total_steps)
        interrupted = self.interruption()
        diverged = None
        if log_row or line_due or schedule.checkpoints(step) or interrupted:
            diverged = self.read_losses()
        if log_row and not diverged:
            train_loss = self.window_loss()
            self.losses.train(step, train_loss, lr)
            self.events.train(step, train_loss, lr)
            diverged = self.watch.check_logged(step, train_loss)
        if diverged:
            return self.finish_diverged(*diverged)
        if line_due:
            line = self.progress.line(step, schedule.total_steps, self.tokens_per_step,
                                      self.flops_per_token)  # fmt: skip
            self.progress.show(self.run_id, line)  # a log line, or a terminal's bar
            self.record_progress("running", self.progress.tokens_per_second)
            self.events.speed(step, self.progress.tokens_per_second)
        if schedule.checkpoints(step):
            ended = self.checkpoint_and_decide(interrupted)
            if ended is not None:
                return ended
        return self.interrupt(interrupted) if interrupted else None

    def interruption(self) -> str | None:
        """Why the job stops after this step without ending the run (None: it goes on)."""
        if self.session.signals.signum is not None:
            return f"on signal {int(self.session.signals.signum)}"
        return "at stop_after_step" if self.step == self.session.stop_after_step else None

    def read_losses(self) -> tuple[int, str] | None:
        """Move the unread losses to the host; (step, why) if one of them is not finite."""
        if not self.unread:
            return None
        values = torch.stack(self.unread).tolist()
        self.unread.clear()
        self.recent.extend(values)
        for value in values:
            self.progress.add(value)
        return self.watch.check_finite(self.step - len(values) + 1, values)

    def window_loss(self) -> float:
        return float(np.mean(self.window()))

    def window(self) -> list[float]:
        """The train losses of the current log window (its last ``log_every``)."""
        return self.recent[-self.schedule.log_every :]

    def checkpoint_and_decide(self, interrupted: str | None) -> Outcome | None:
        """Save this step's checkpoint and state; how the run ended if it ends here."""
        try:
            saved_on = SAVED_WITH_CHECKPOINT + (f", {interrupted}" if interrupted else "")
            self.save(self.window_loss(), with_checkpoint=True, saved_on=saved_on)
        except Diverged as err:
            return self.finish_diverged(err.step, err.why)
        del self.recent[: -self.schedule.log_every]
        if reason := self.stops_early():
            print(f"[{self.run_id}] {reason}", flush=True)
            return self.finish(Outcome.STOPPED_EARLY, reason)
        return None

    def checkpoint(self, train_loss: float) -> float:
        """Save the model as the checkpoint of this step; returns its val loss."""
        job = self.job
        val_loss = evaluate(job.model, job.val_batches, job.micro_batch, job.device, job.autocast)
        if not math.isfinite(val_loss):  # the last update broke the weights: not a checkpoint
            raise Diverged(self.step, f"validation loss {val_loss}")
        meta = {
            "run_id": self.run_id,
            "tokens": self.step * self.tokens_per_step,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "model_config": job.model.cfg.to_dict(),
            "n_params": job.model.n_params(),
            "spec": self.spec,
        }
        save_checkpoint(self.run_dir, self.step, job.model, meta)
        return val_loss

    def save(self, train_loss: float, with_checkpoint: bool, saved_on: str) -> None:
        """The checkpoint of this step (``with_checkpoint``) and the resume state, which records
        why it was saved (``saved_on``: with its checkpoint, the stop's reason, or both), so
        that the log of the run that resumes from it says so."""
        if with_checkpoint:
            val_loss = self.checkpoint(train_loss)
            self.losses.val(self.step, val_loss)
            self.events.val(self.step, val_loss)
        self.events.flush()  # what the state covers is on disk: a resume drops only later steps
        save_state(self.run_dir, self.fingerprint, self.step, self.job.model, self.job.optim,
                   self.window(), saved_on)  # fmt: skip

    def stops_early(self) -> str | None:
        """Why the run stops at this checkpoint before its budget (None: it goes on). The rule
        is asked at every checkpoint, the last one too (the early-stop rule probes each one,
        so the probe step finds them all cached)."""
        if self.session.stop_rule is None:
            return None
        reason = self.session.stop_rule(self.run_dir, self.job.device)
        self.job.model.train()
        return reason if self.step < self.schedule.total_steps else None

    def interrupt(self, why: str) -> Outcome:
        """Save the state (with the checkpoint, if this step has one) and stop the job: on a
        signal it raises ``Interrupted``, so the retry resumes; else it returns INTERRUPTED."""
        if not self.schedule.checkpoints(self.step):
            self.save(math.nan, with_checkpoint=False, saved_on=why)
        self.events.close()
        signum = self.session.signals.signum
        signum = None if signum is None else int(signum)
        self.record_progress("interrupted", self.progress.tokens_per_second, signal=signum)
        if signum is not None:
            raise Interrupted(signum, f"signal {signum}: state saved at step {self.step}")
        return Outcome.INTERRUPTED

    def finish_diverged(self, bad_step: int, why: str) -> Outcome:
        bad_lr = self.schedule.lr_of(bad_step - 1)  # of the update that gave bad_step's loss
        detail = f"{why} at step {bad_step} (lr {bad_lr:.4g})"
        print(f"[{self.run_id}] diverged: {detail}; stopped at step {self.step}", flush=True)
        return self.finish(Outcome.DIVERGED, detail)

    def finish(self, outcome: Outcome, detail: str = "") -> Outcome:
        """Write the completion record ``run.json`` of a run that ended (``outcome``: completed,
        stopped early or diverged, ``outcome_detail`` says why) and its last progress record."""
        if lost := self.session.lease.check():
            raise LeaseLost(f"{lost}: this job stops without recording the run")
        self.events.close()
        # Their steps and losses: the start of the job checked the weights' checksums already.
        checkpoints = list_checkpoints(self.run_dir, verify=False)
        summary = self.summary(outcome.value, detail, [m["step"] for m in checkpoints])
        speed = summary["tokens_per_second_this_session"]
        if outcome is Outcome.DIVERGED:
            self.record_progress("diverged", speed, error=detail)
        else:
            self.record_progress("done", speed, outcome=outcome.value)
        records.write_run(self.run_dir, summary)
        print(f"[{self.run_id}] {summary_line(summary, checkpoints)}", flush=True)
        return outcome

    def summary(self, outcome: str, detail: str, checkpoint_steps: list[int]) -> dict:
        spec, step, tokens_per_step = self.spec, self.step, self.tokens_per_step
        elapsed = time.perf_counter() - self.progress.start_time
        trained = step - self.progress.start_step
        final_loss = self.window_loss() if self.recent else math.nan
        return {
            "run_id": self.run_id,
            "outcome": outcome,
            "outcome_detail": detail,
            "steps": step,
            "tokens": step * tokens_per_step,
            "total_steps": spec["total_steps"],
            "budget": spec["total_steps"] * tokens_per_step,
            "prediction": spec.get("prediction"),
            "n_params": self.job.model.n_params(),
            "device": str(self.job.device),
            "micro_batch": self.job.micro_batch,
            "checkpoints": checkpoint_steps,
            "final_train_loss": final_loss if math.isfinite(final_loss) else None,
            "seconds_this_session": round(elapsed, 1),
            "tokens_per_second_this_session": round(trained * tokens_per_step / elapsed, 1)
            if trained > 0
            else None,
            "spec_hash": self.fingerprint,
            "spec": spec,
            # What it trained on; equal for two sessions on one machine, and not in spec_hash.
            "environment": environment(self.job.device),
        }

    def record_progress(self, state: str, tokens_per_second: float | None, **extra) -> None:
        records.write_progress(self.run_dir, state, self.step, self.schedule.total_steps,
                               self.tokens_per_step, tokens_per_second, **extra)  # fmt: skip
