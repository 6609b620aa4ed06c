"""A checkpoint suite's revisions, as its config names them: a named list or the list given.

It lives with the study model, not with the probes, so that the reading tools (``status``,
``where``) list a suite's revisions without loading torch.
"""

from __future__ import annotations

# Pythia's published revisions: step0, log-spaced steps 1 ... 512, then every 1000 steps.
PYTHIA_REVISIONS = tuple(
    [f"step{s}" for s in (0, *(2**i for i in range(10)))]
    + [f"step{s}" for s in range(1000, 143001, 1000)]
)
REVISION_LISTS = {"pythia": PYTHIA_REVISIONS}


def revision_names(suite: dict) -> list[str]:
    """The suite's revisions in its order: a named list (``pythia``) or the given list."""
    revisions = suite["revisions"]
    return list(REVISION_LISTS[revisions]) if isinstance(revisions, str) else list(revisions)
