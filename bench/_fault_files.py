"""The fault matrix's file class: each kind of file a step reads, damaged three ways.

A one-run study (a 300-type BPE on a small generated corpus, an attention-only d=16 model,
20k tokens, three checkpoints) runs to completion once through the real ``snakemake`` command
line; the sha256 of every file under results/ is its snapshot. Then, for each file kind and
each damage (truncated to half, overwritten with random bytes or with zeros of the same
length), a copy of the finished study (the workdir with its .snakemake/, mtimes kept) gets the
damage, and Snakemake is run as a user would to use the file. Snakemake does not notice a
damaged file whose time did not change, so that run forces the step that reads it
(``--forcerun`` of that job's output). The case passes when
- a file the step must refuse: the run fails, and its output or a job's log has one line
  ``damaged <kind> <the file>: ...``, and no new log text holds a Python traceback; no file
  outside the failing job's outputs (``Case.outputs``) changed;
- a file that is a cache or rewritten anyway (probe cache, resume state, progress.json): the
  run succeeds (a damaged cache or state is named in one line too, for the cache checked);
and, after the documented fix (``Case.fix``: remove the file or folder, rerun snakemake, or
force the train job), every file under results/ equals the snapshot except the logs and the
fields that record time (``VARYING``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DAMAGES = ("truncated", "random", "zeros")
# What legitimately differs between two runs of the same study: wall-clock fields of JSON
# files (run.json's session timings, the data sidecars' seconds), and files that only record
# progress or what happened (logs, progress.json).
VARYING = {
    "run.json": ("seconds_this_session", "tokens_per_second_this_session"),
    "tokens.json": ("seconds",),
    "chunks.json": ("seconds",),
    # The checkout's version: it changes only when the code does while the matrix runs.
    "provenance.json": ("code_version", "code_sha256"),
    # A resume state's bytes are not reproducible (torch.save), its content is: the .pt files
    # are compared tensor by tensor (``state_digest``), so their sidecars' sha256 may differ.
    "resume.json": ("sha256",),
    # Where and when the study was last started: each case runs in a copy of the finished
    # study, and its fix reruns Snakemake there, which records that folder and a new start.
    "study.json": ("directory", "started"),
    "resume.prev.json": ("sha256",),
}
SKIPPED = ("results/logs/", "progress.json")
# A run's TensorBoard folders (tensorboard/train/, tensorboard/probe-<key>/) are compared by
# their scalars, read back: each session writes a file of its own (named by time, host and
# pid), and tokens/s is a timing.
TENSORBOARD = "tensorboard"

STUDY = """\
models:
  tiny: {n_layer: 2, n_head: 2, d_model: 16, mlp: false, n_ctx: 16}
datasets:
  small:
    family: natural
    corpus: {source: files, paths: [corpus.txt]}
    tokenizer: {kind: bpe, vocab_size: 300}
runs:
  - {data: small, model: tiny, batch_size: 4, context_size: 16, seed: 0}
training: {tokens: 20480, lr: 0.003}
checkpoints: {start: 5120, linear_from: 10240, every: 10240}
lawfit: {bootstrap: 10}
"""


def corpus_text() -> str:
    """A small deterministic corpus: sentences of a few hundred made-up words."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 7))) for _ in range(400)]
    lines = [" ".join(rng.choice(words, size=rng.integers(5, 15))) + "." for _ in range(3000)]
    return "\n\n".join(lines) + "\n"


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
           "--directory", str(workdir), *args,
           "--configfile", str(workdir / "config.yaml")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          env=env)  # fmt: skip


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":
        path.write_bytes(np.random.default_rng(len(data)).bytes(len(data)))
    else:
        path.write_bytes(bytes(len(data)))


def normalised(path: Path) -> str:
    """The file's sha256, of its JSON without ``VARYING`` fields where it has some."""
    if path.suffix == ".pt":
        return state_digest(path)
    fields = VARYING.get(path.name)
    if fields:
        try:
            value = json.loads(path.read_text())
            for field in fields:
                value.pop(field, None)
            return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
        except ValueError:
            pass  # damaged: its raw bytes differ from the snapshot's, as they should
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state_digest(path: Path) -> str:
    """A resume state's content: every tensor's bytes and every other value, in key order."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # damaged: unequal to any good state
        return hashlib.sha256(path.read_bytes()).hexdigest()
    digest = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(str((value.dtype, tuple(value.shape))).encode())
            digest.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                feed(item)
        else:
            digest.update(repr(value).encode())

    feed(state)
    return digest.hexdigest()


def snapshot(workdir: Path) -> dict[str, str]:
    files = {}
    for path in sorted((workdir / "results").rglob("*")):
        rel = str(path.relative_to(workdir))
        if TENSORBOARD in path.relative_to(workdir).parts[:-1]:
            if path.is_dir() and path.parent.name == TENSORBOARD:
                files[rel] = events_digest(path)
        elif path.is_file() and not rel.startswith(SKIPPED[0]) and path.name != SKIPPED[1]:
            files[rel] = normalised(path)
    return files


def events_digest(folder: Path) -> str:
    """A TensorBoard folder's scalars but tokens/s: per tag, every (step, value) in order."""
    from ihsweep.files.records import SPEED, read_scalars

    scalars = {tag: values for tag, values in read_scalars(folder).items() if tag != SPEED}
    return hashlib.sha256(json.dumps(scalars, sort_keys=True).encode()).hexdigest()


def log_texts(workdir: Path) -> dict[str, str]:
    return {str(p): p.read_text(errors="replace") for p in (workdir / "results/logs").rglob("*")
            if p.is_file()}  # fmt: skip


@dataclass
class Case:
    """One file kind: where it is, how a user makes a step read it, what that step may
    change, and the documented fix (a list of actions: a path to remove, or snakemake args)."""

    kind: str  # as the one line names it
    find: Callable[[Path], Path]
    trigger: Callable[[Path], list[str]]
    outputs: Callable[[Path], list[str]]  # prefixes of the paths the failing job may change
    fix: Callable[[Path], list]  # [Path to remove | list of snakemake args]
    refused: bool = True  # False: a cache or a file rewritten anyway; the run succeeds


def one(workdir: Path, pattern: str) -> Path:
    found = sorted(workdir.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def rel(workdir: Path, path: Path) -> str:
    return str(path.relative_to(workdir))


def cases() -> dict[str, Case]:
    run = "results/runs/*/*/*"
    chunk_dir = "results/data/*/C16"
    first = "step_000080"  # the first checkpoint (5,120 tokens of B = 4, C = 16)
    cache = f"{run}/probes/*/cache/{first}.parquet"
    weights = f"{run}/ckpt/{first}.safetensors"

    def run_json(w: Path) -> str:
        return rel(w, one(w, f"{run}/run.json"))

    def model_table(w: Path) -> str:
        return rel(w, one(w, f"{run}/probes/*/model.parquet"))

    def figure(w: Path) -> str:
        return rel(w, one(w, f"{run}/figures/*/run.png"))

    def probe_outputs(w: Path) -> list[str]:
        return [model_table(w), model_table(w).replace("model.parquet", "heads.parquet")]

    def figure_outputs(w: Path) -> list[str]:
        return [str(Path(figure(w)).parent) + "/"]

    def regenerate(w: Path) -> list:  # remove the folder, target it, rerun what failed
        folder = one(w, chunk_dir)
        record = rel(w, one(w, run)) + "/run.json"  # gone: the failed job's output
        return [folder, [rel(w, folder) + "/chunks.json"], ["--forcerun", record]]

    def rewrite(pattern: str) -> Callable[[Path], list]:  # remove it, target it, rerun
        return lambda w: [one(w, pattern), [rel(w, one(w, pattern))], []]

    train = {"trigger": lambda w: ["--forcerun", run_json(w)], "outputs": lambda w: [run_json(w)]}
    probe = {"trigger": lambda w: ["--forcerun", model_table(w)], "outputs": probe_outputs}
    figure_job = {"trigger": lambda w: ["--forcerun", figure(w)], "outputs": figure_outputs}
    retrain = {"fix": lambda w: [["--forcerun", run_json(w)], []]}
    return {
        "dataset shard": Case("dataset shard", lambda w: one(w, f"{chunk_dir}/train.bin"),
                              fix=regenerate, **train),
        "tokens JSON": Case("tokens JSON", lambda w: one(w, "results/data/*/tokens.json"),
                            trigger=lambda w: ["--forcerun", "chunk"],
                            outputs=lambda w: [rel(w, one(w, chunk_dir)) + "/"],
                            fix=rewrite("results/data/*/tokens.json")),
        "chunks JSON": Case("chunks JSON", lambda w: one(w, f"{chunk_dir}/chunks.json"),
                            fix=regenerate, **train),
        "checkpoint weights": Case("checkpoint", lambda w: one(w, weights),
                                   **probe, **retrain),
        "checkpoint JSON": Case("checkpoint", lambda w: one(w, f"{run}/ckpt/{first}.json"),
                                **probe, **retrain),
        "resume state": Case("resume state", lambda w: one(w, f"{run}/state/resume.pt"),
                             refused=False, fix=lambda w: [[]], **train),
        "probe cache": Case("probe cache", lambda w: one(w, cache),
                            refused=False, fix=lambda w: [[]], **probe),
        "heads parquet": Case("probe table", lambda w: one(w, f"{run}/probes/*/heads.parquet"),
                              fix=rewrite(f"{run}/probes/*/heads.parquet"),
                              **figure_job),
        # Overwritten, it is newer than what was made from it: the aggregate reruns and fails too.
        "model parquet": Case("probe table", lambda w: one(w, f"{run}/probes/*/model.parquet"),
                              fix=rewrite(f"{run}/probes/*/model.parquet"),
                              trigger=figure_job["trigger"],
                              outputs=lambda w: [*figure_outputs(w), "results/studies/"]),
        "run.json": Case("run record", lambda w: one(w, f"{run}/run.json"),
                         fix=rewrite(f"{run}/run.json"), **probe),
        "progress.json": Case("progress record", lambda w: one(w, f"{run}/progress.json"),
                              refused=False, fix=lambda w: [[]], **train),
    }  # fmt: skip


QUICK = ("dataset shard/zeros", "probe cache/random", "model parquet/truncated",
         "checkpoint weights/zeros")  # fmt: skip


def file_damage_cases(quick: bool) -> list[tuple[str, bool, str]]:
    """(case, passed, one-line detail) for each file kind and damage; ``quick``: four cases."""
    with tempfile.TemporaryDirectory(prefix="ihsweep-faults-files-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        (base / "config.yaml").write_text(STUDY)
        (base / "corpus.txt").write_text(corpus_text())
        done = snakemake(base)
        if done.returncode != 0:
            return [("build the study", False, done.stdout[-300:] + done.stderr[-300:])]
        want = snapshot(base)
        results = []
        for kind, case in cases().items():
            for how in DAMAGES:
                name = f"{kind}/{how}"
                if quick and name not in QUICK:
                    continue
                workdir = Path(tmp) / "case"
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.copytree(base, workdir, symlinks=True)
                try:
                    passed, detail = try_case(workdir, case, how, want)
                except Exception as err:  # a broken case is a failed case, with its reason
                    passed, detail = False, f"{type(err).__name__}: {err}"
                results.append((name, passed, detail))
        return results


def try_case(workdir: Path, case: Case, how: str, want: dict[str, str]) -> tuple[bool, str]:
    path = case.find(workdir)
    target = rel(workdir, path)
    logs_before = log_texts(workdir)
    damage(path, how)
    allowed = [target, *case.outputs(workdir)]
    proc = snakemake(workdir, *case.trigger(workdir))
    new_text = (
        proc.stdout
        + proc.stderr
        + "".join(
            text[len(logs_before.get(p, "")) :] if text.startswith(logs_before.get(p, "")) else text
            for p, text in log_texts(workdir).items()
        )
    )
    lines = [ln for ln in new_text.splitlines() if ln.startswith(f"damaged {case.kind} {target}")]
    if case.refused and proc.returncode == 0:
        return False, f"the step did not refuse {target}"
    if not case.refused and proc.returncode != 0:
        return False, f"snakemake failed: {proc.stderr.strip().splitlines()[-1:]}"
    if (case.refused or case.kind == "probe cache") and not lines:
        return False, f"no line 'damaged {case.kind} {target}: ...'"
    if "Traceback" in new_text:
        return False, "a traceback in the job's log"
    if case.refused:
        changed = [f for f, digest in snapshot(workdir).items() if want.get(f) != digest]
        changed += [f for f in want if not (workdir / f).exists()]
        outside = [f for f in changed if not any(f.startswith(a) for a in allowed)]
        if outside:
            return False, f"changed outside the failing job's outputs: {outside[:3]}"
    for action in case.fix(workdir):
        if isinstance(action, Path):
            shutil.rmtree(action) if action.is_dir() else action.unlink()
            continue
        fixed = snakemake(workdir, *action)
        if fixed.returncode != 0:
            return False, f"the fix failed: {fixed.stderr.strip().splitlines()[-1:]}"
    got = snapshot(workdir)
    differ = sorted(f for f in set(got) | set(want) if got.get(f) != want.get(f))
    if differ:
        return False, f"after the fix, differ from the snapshot: {differ[:4]}"
    line = lines[0] if lines else "(no line: rewritten silently)"
    return True, line[:200]
