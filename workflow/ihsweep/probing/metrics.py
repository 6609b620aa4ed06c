"""The probes' scores by name: the one home of the columns the probe tables hold and of the
names that figures and reports give them (no torch: the aggregate steps import it).

A per-head score (``HEAD_SCORES``) is a column of the per-head table (``ihsweep.probing.scores``
computes it). Its maximum over the heads of layers ``probe.min_layer`` and up, ``<score>_max``,
is a column of the model table and an emergence metric, as is the model-level associative
recall ``ar_acc``. ``EMERGENCE_METRICS`` is what the schema's ``emergence.metric`` accepts
(``tests/test_probes.py`` holds the two equal).
"""

from __future__ import annotations

# column -> (abbreviation, name)
HEAD_SCORES = {
    "ps": ("PS", "prefix-matching score"),
    "la": ("LA", "logit attribution"),
    # PS minus PS on a control batch that repeats nothing: the part a positional head lacks
    "ps_content": ("content PS", "content prefix-matching score"),
}
HEAD_MAXIMA = [f"{score}_max" for score in HEAD_SCORES]

# metric -> its name in figure titles and legends
EMERGENCE_METRICS = {
    **{f"{score}_max": f"{name} (max over heads)" for score, (_, name) in HEAD_SCORES.items()},
    "ar_acc": "associative-recall accuracy",
}
# metric -> its short label beside a run's curves
CURVE_LABELS = {
    **{f"{score}_max": f"{abbr} (max over heads)" for score, (abbr, _) in HEAD_SCORES.items()},
    "ar_acc": "AR accuracy",
}
