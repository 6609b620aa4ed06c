"""The fault matrix's writers class: two training jobs on one run folder (``ihsweep.lease``).

The run is the toy run of ``_fault_kills`` made long enough (20,000 updates) to start a second
job beside the first. Its lease expires 6 s after its holder's last renewal (``--lease-seconds
6``; 180 s by default). Cases, each in a fresh folder:
- live: a second job while the first trains refuses in one line naming the first's host and
  pid, with exit 73, and the first ends the run alone;
- killed here: the first killed -9; the second, on the same host, sees the pid gone and takes
  over at once;
- killed on another node: the first's lease says another host (as a job on a cluster node
  would have written it), and it was killed -9 there; the second refuses until the lease
  expires, then takes over;
- paused: the first stopped (SIGSTOP, a frozen node) past its lease; the second takes over and
  ends the run; the first, continued, finds its lease gone and stops without writing.
Each passes when the refusals happened as said and the run equals the uninterrupted one (as in
``_fault_kills.differences``).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _fault_kills import differences, env, finished, prepare_data, toy_spec, train_argv

LEASE = ("--lease-seconds", "6")
STEPS = 20000
EXIT_LEASE = 73


def start(job: dict, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *train_argv(job, run_dir, "auto"), *LEASE],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def second_job(job: dict, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *train_argv(job, run_dir, "auto"), *LEASE], env=env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def wait_training(proc: subprocess.Popen, run_dir: Path, rows: int = 50) -> None:
    """Until the first job has logged ``rows`` loss rows (it holds the lease by then)."""
    deadline = time.monotonic() + 300
    csv = run_dir / "loss.csv"
    while not (csv.exists() and csv.read_text().count("\n") > rows):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the first job ended before training: {proc.communicate()}")
        time.sleep(0.01)


def refused(proc: subprocess.CompletedProcess, host: str, pid: int | None) -> str | None:
    """None if ``proc`` refused in one line naming the holder; else what it did instead."""
    lines = proc.stderr.splitlines()
    named = f"(host {host}, pid {pid}" if pid is not None else f"(host {host}"
    if proc.returncode == EXIT_LEASE and len(lines) == 1 and named in lines[0] and not proc.stdout:
        return None
    return f"rc {proc.returncode}, stdout {proc.stdout[-200:]!r}, stderr {proc.stderr[-300:]!r}"


def case_live(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    try:
        wait_training(first, run_dir)
        second = second_job(job, run_dir)
    finally:
        out, err = first.communicate(timeout=600)
    problems = [f"second: {why}"] if (why := refused(second, socket.gethostname(),
                                                    first.pid)) else []  # fmt: skip
    if first.returncode != 0:
        problems.append(f"first ended rc {first.returncode}: {err[-300:]}")
    return problems


def case_killed_here(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    wait_training(first, run_dir)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    failure = finished(job, run_dir, LEASE)
    return [] if failure is None else [f"takeover: {failure}"]


def case_killed_elsewhere(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    wait_training(first, run_dir)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    lease = run_dir / "lease.json"
    record = {**json.loads(lease.read_text()), "host": "gpu-node-7", "renewed": time.time()}
    lease.write_text(json.dumps(record))
    problems = []
    if why := refused(second_job(job, run_dir), "gpu-node-7", record["pid"]):
        problems.append(f"before expiry: {why}")
    time.sleep(max(0.0, record["renewed"] + 6.5 - time.time()))
    if (failure := finished(job, run_dir, LEASE)) is not None:
        problems.append(f"after expiry: {failure}")
    return problems


def case_paused(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    wait_training(first, run_dir)
    first.send_signal(signal.SIGSTOP)
    time.sleep(6.5)
    failure = finished(job, run_dir, LEASE)
    first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=600)
    problems = [] if failure is None else [f"takeover: {failure}"]
    if first.returncode != EXIT_LEASE or "was removed" not in err:
        problems.append(f"the paused job went on: rc {first.returncode}, {err[-300:]!r}")
    return problems


CASES = {
    "a second job while the first trains": case_live,
    "first killed -9 on this host": case_killed_here,
    "first killed -9 on another node": case_killed_elsewhere,
    "first paused past its lease": case_paused,
}


def writer_cases(quick: bool) -> list[tuple[str, bool, str]]:
    with tempfile.TemporaryDirectory(prefix="ihsweep-writers-") as tmp:
        work = Path(tmp)
        job = toy_spec(4, 32, STEPS * 128, [k * 128 for k in range(2000, STEPS + 1, 2000)], False)
        job.update(data=prepare_data(work), micro_batch="auto", reference=work / "reference")
        if (failure := finished(job, job["reference"])) is not None:
            raise RuntimeError(f"the reference run failed: {failure}")
        names = list(CASES)[:2] if quick else list(CASES)
        results = []
        for i, name in enumerate(names):
            run_dir = work / f"run-{i}"
            problems = CASES[name](job, run_dir)
            if (run_dir / "run.json").exists() and not problems:
                if finished(job, run_dir, LEASE) is None:  # probe tables for the comparison
                    problems = differences(run_dir, job["reference"])
            elif not problems:
                problems = ["no run.json"]
            results.append((name, not problems, "; ".join(problems) or "as said, run equal"))
        return results
