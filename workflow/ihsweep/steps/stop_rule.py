"""The early-stop rule: a run stops once its own checkpoints confirm emergence.

``training.stop_after_emergence`` puts an ``early_stop`` block in a run's spec (the probe and
emergence settings and the margin, ``ihsweep.config.Study.early_stop``); ``stop_rule_of(spec)``
turns it into the ``StopRule`` the trainer asks at every checkpoint. The rule probes the
checkpoints so far with the probe step's own code and cache (``ihsweep.probing.run.probe_run``)
and applies ``ihsweep.analysis.emergence.confirmed_emergence``. It lives here, above training,
probing and analysis, so that the trainer depends on none of them.
"""

from __future__ import annotations

from pathlib import Path


class EmergenceStop:
    """Stops a run ``margin_decades`` past the upper end of its confirmed transition."""

    def __init__(self, rule: dict):
        self.rule = rule
        self.probed: dict = {}  # probe_run's memo: each checkpoint is probed or read once

    def __call__(self, run_dir: Path, device) -> str | None:
        # Imported here: pandas and scipy add ~60 MB to every training job's resident memory,
        # which the memory estimate (ihsweep.cost) does not count, and only this rule needs them.
        from ihsweep.analysis.emergence import confirmed_emergence
        from ihsweep.probing.run import probe_run

        _, series = probe_run(run_dir, self.rule["probe"], device, memo=self.probed)
        return confirmed_emergence(series, self.rule["emergence"], self.rule["margin_decades"])


def stop_rule_of(spec: dict) -> EmergenceStop | None:
    """The stop rule of a run's spec (None: it trains to its budget)."""
    rule = spec.get("early_stop")
    return None if rule is None else EmergenceStop(rule)
