"""Fingerprints of a checkpoint suite's revisions, and the revisions that are not what their
names say (docs/checkpoints.md#revisions-that-are-not-what-their-names-say).

Dating induction heads in a suite assumes each revision holds the weights of its step. Upstream
reports say that is not always so (EleutherAI/pythia #195, #205: early branches serving
final-era weights; #206: the first shard of a late revision, input embedding and early layers,
copied from the final one). So the probe step records, per revision, a SHA-256 of every trained
parameter as loaded (``tensor_rows``), and a whole-revision fingerprint from them
(``revision_sha256``):

- the hash covers the tensor, not the file: its dtype, its shape and its bytes in memory, so two
  file layouts of the same weights (sharded or single, safetensors or .bin) agree;
- trained parameters only (``named_parameters``): constant buffers, such as a causal mask or
  rotary frequencies, are the same in every revision by construction and would say nothing;
- of the model already loaded for probing: no second read of the files. It is the weights the
  probe sees: in bf16 on a GPU, in fp32 on the CPU (so a fingerprint is compared with others of
  the same dtype only, and the cache is keyed by it).

``duplicate_groups`` names what the fingerprints show, one row per group: revisions whose whole
fingerprints are equal (``identical``), and revisions that share a trained parameter tensor
while the rest differs (``shared``, the #206 case). A tensor whose elements are all equal (a
norm's ones or a bias's zeros at step 0, the all-zero MLP of an attention-only export) is the
same in many honest revisions and names no origin, so it takes part in the whole fingerprint
but never makes a ``shared`` group.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import torch
import torch.nn as nn

from ihsweep.analysis.duplicates import DUPLICATE_COLUMNS

FINGERPRINT_COLUMNS = [
    "revision", "step", "parameter", "dtype", "shape", "constant", "sha256", "revision_sha256",
]  # fmt: skip
_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def cache_key(model: str, revision: str, dtype: torch.dtype) -> str:
    """A revision's fingerprint cache key: where its weights come from and the dtype they were
    loaded in (not the probe settings, which do not change the weights)."""
    blob = json.dumps({"model": model, "revision": revision, "dtype": str(dtype)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (row-major), wherever it lives."""
    digest = hashlib.sha256(f"{tensor.dtype} {tuple(tensor.shape)}\n".encode())
    flat = tensor.detach().contiguous().reshape(-1)
    digest.update(flat.view(torch.uint8).cpu().numpy())  # hashlib reads the buffer in place
    return digest.hexdigest()


def tensor_rows(model: nn.Module, revision: str, step: int, threads: int = 1) -> pd.DataFrame:
    """One row per trained parameter of a loaded revision (``FINGERPRINT_COLUMNS``), hashed
    ``threads`` tensors at a time (hashlib and torch release the GIL on large buffers)."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        rows = list(pool.map(_tensor_row, sorted(model.named_parameters())))
    table = pd.DataFrame(rows, columns=FINGERPRINT_COLUMNS[2:-1])
    table.insert(0, "step", step)
    table.insert(0, "revision", revision)
    return table.assign(revision_sha256=revision_sha256(table))


def _tensor_row(named: tuple[str, nn.Parameter]) -> dict:
    name, parameter = named
    return {
        "parameter": name,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "shape": "x".join(map(str, parameter.shape)),
        "constant": _constant(parameter),
        "sha256": tensor_sha256(parameter),
    }


def _constant(parameter: torch.Tensor) -> bool:
    """Whether every element has the same bytes. A strided sample first: a trained tensor is
    told apart at once, and only an (almost) constant one pays a full pass."""
    flat = parameter.detach().reshape(-1)
    bits = flat.view(_INTEGERS[flat.element_size()])  # compared as hashed: bytes
    if bits.numel() == 0:
        return True
    sample = bits[:: max(1, bits.numel() // 64)]
    return bool((sample == bits[0]).all()) and bool((bits == bits[0]).all())


def revision_sha256(tensors: pd.DataFrame) -> str:
    """The whole-revision fingerprint: SHA-256 of every parameter's name and hash, by name."""
    pairs = zip(tensors["parameter"], tensors["sha256"], strict=True)
    lines = sorted(f"{parameter} {sha}\n" for parameter, sha in pairs)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def duplicate_groups(suite: str, fingerprints: pd.DataFrame) -> pd.DataFrame:
    """The suite's duplicate groups (``DUPLICATE_COLUMNS``), ordered by their first step:
    ``identical`` whole fingerprints, then tensors ``shared`` outside those (see the module
    docstring). ``revisions`` and ``steps`` are space-separated; ``tensors`` the shared
    parameters, space-separated, a module's all written ``module.*`` (``*``: every one);
    the count ``n_tensors`` is of tensors, not of names;
    ``line`` is the group in one line, as status and the report show it."""
    steps = dict(zip(fingerprints["revision"], fingerprints["step"], strict=True))
    every = sorted(set(fingerprints["parameter"]))
    whole = fingerprints.drop_duplicates("revision").groupby("revision_sha256")["revision"]
    identical = [frozenset(revisions) for _, revisions in whole if len(revisions) > 1]
    groups = [("identical", revisions, every) for revisions in identical]
    groups += [("shared", *group) for group in _shared(fingerprints, identical)]
    # A module is named whole (module.*) when all its tensors that can be shared are.
    shareable = sorted(set(fingerprints.loc[~fingerprints["constant"].astype(bool), "parameter"]))
    rows = [_row(suite, *group, steps, every, shareable) for group in groups]
    table = pd.DataFrame(rows, columns=["first", *DUPLICATE_COLUMNS])
    table = table.sort_values(["first", "kind"], kind="stable")
    return table[DUPLICATE_COLUMNS].reset_index(drop=True)


def _shared(fingerprints: pd.DataFrame, identical: list[frozenset]) -> list[tuple]:
    """(revisions, the tensors they share) for each set of revisions that hold the same
    non-constant tensor, leaving out sets inside one identical group."""
    shared: dict[frozenset, list[str]] = {}
    varying = fingerprints[~fingerprints["constant"].astype(bool)]
    for (parameter, _), rows in varying.groupby(["parameter", "sha256"], sort=True):
        revisions = frozenset(rows["revision"])
        if len(revisions) > 1 and not any(revisions <= group for group in identical):
            shared.setdefault(revisions, []).append(parameter)
    return list(shared.items())


def compact(names: list[str], every: list[str]) -> list[str]:
    """``names`` with each module whose parameters in ``every`` (two or more) are all among them
    written as ``module.*`` (``gpt_neox.layers.0.*``), the shortest such prefix."""
    chosen = set(names)
    out: list[str] = []
    for name in sorted(chosen):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth]) + "."
            under = [n for n in every if n.startswith(prefix)]
            if len(under) > 1 and chosen.issuperset(under):
                name = prefix + "*"
                break
        if name not in out:
            out.append(name)
    return out


def _row(
    suite: str,
    kind: str,
    revisions: frozenset,
    names: list[str],
    steps: dict,
    every: list[str],
    shareable: list[str],
) -> dict:
    ordered = sorted(revisions, key=lambda r: (steps[r], r))
    claimed = [str(steps[r]) for r in ordered]
    tensors = ["*"] if kind == "identical" else compact(names, shareable)
    if kind == "identical":
        what = f"hold identical weights (all {len(every)} parameter tensors)"
    else:
        what = f"share {len(names)} of {len(every)} parameter tensors: {', '.join(tensors)}"
    return {
        "first": steps[ordered[0]],
        "suite": suite,
        "kind": kind,
        "revisions": " ".join(ordered),
        "steps": " ".join(claimed),
        "n_tensors": len(names),
        "tensors": " ".join(tensors),
        "line": f"{suite}: {', '.join(ordered)} (steps {', '.join(claimed)}) {what}",
    }
