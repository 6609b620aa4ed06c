"""The fault matrix's writers class: two training jobs on one run folder (``ihsweep.files.lease``).

The run is the toy run of ``_fault_kills`` made long enough (20,000 updates) to start a second
job beside the first. Its lease expires 6 s after its holder's last renewal (``--lease-seconds
6``; 180 s by default). A job "on another node" runs in its own UTS namespace (``unshare``)
under the host name ``gpu-node-7``, so its lease names a host whose pids cannot be checked from
here, as a cluster node's would. Cases, each in a fresh folder:
- live: a second job while the first trains refuses at once in one line naming the first's
  host and pid, with exit 73, and the first ends the run alone;
- killed here: the first killed -9; the second sees the pid gone and takes over at once;
- live on another node: the second says in one line that it waits for the lease to expire,
  sees it renewed, and refuses in one line naming host and pid; the first ends the run alone;
- killed on another node: the first killed -9 there; the second says it waits, waits out the
  lease, takes over and ends the run;
- paused: the first stopped (SIGSTOP, a frozen node) past its lease; the second takes over and
  ends the run; the first, continued, finds its lease gone and stops without writing.
Each passes when the refusals and waits happened as said and the run equals the uninterrupted
one (as in ``_fault_kills.differences``). The quick subset is the first two; where ``unshare``
cannot rename a host, the cases on another node are left out, with a line that says so.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import package_env
from _fault_kills import differences, finished, prepare_data, toy_spec, train_argv

LEASE = ("--lease-seconds", "6")
STEPS = 20000
EXIT_LEASE = 73
OTHER_HOST = "gpu-node-7"
# unshare execs the job itself, so the Popen's pid is the job's (signals reach it directly)
ON_OTHER_HOST = ("unshare", "--uts", "--map-root-user", "sh", "-c",
                 f'hostname {OTHER_HOST} && exec "$@"', "sh")  # fmt: skip
WAIT_LINE = "which cannot be checked from here: waiting"


def start(job: dict, run_dir: Path, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, *train_argv(job, run_dir, "auto"), *LEASE],
                            env=package_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def other_host_available() -> str | None:
    """None if a job can run under another host name here; else why not."""
    probe = subprocess.run([*ON_OTHER_HOST, "hostname"], capture_output=True, text=True)
    if probe.returncode == 0 and probe.stdout.strip() == OTHER_HOST:
        return None
    return f"unshare cannot give a job another host name here: {probe.stderr.strip()[-200:]}"


def second_job(job: dict, run_dir: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, *train_argv(job, run_dir, "auto"), *LEASE]
    return subprocess.run(argv, env=package_env(), capture_output=True, text=True, timeout=600)


def wait_training(proc: subprocess.Popen, run_dir: Path, rows: int = 50) -> None:
    """Until the first job has logged ``rows`` loss rows (it holds the lease by then)."""
    deadline = time.monotonic() + 300
    csv = run_dir / "loss.csv"
    while not (csv.exists() and csv.read_text().count("\n") > rows):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the first job ended before training: {proc.communicate()}")
        time.sleep(0.01)


def refused(proc: subprocess.CompletedProcess, host: str, pid: int, waited: bool) -> str | None:
    """None if ``proc`` refused in one line naming the holder, after one line saying it waits
    when ``waited``; else what it did instead."""
    lines, said = proc.stderr.splitlines(), proc.stdout.splitlines()
    waits = len(said) == 1 and WAIT_LINE in said[0] if waited else not said
    if proc.returncode == EXIT_LEASE and len(lines) == 1 and f"host {host}, pid {pid}" in lines[0]:
        if waits:
            return None
    return f"rc {proc.returncode}, stdout {proc.stdout[-200:]!r}, stderr {proc.stderr[-300:]!r}"


def waited_then_finished(job: dict, run_dir: Path) -> str | None:
    """None if a job on ``run_dir`` said once that it waits, then trained to the end."""
    second = second_job(job, run_dir)
    waits = [line for line in second.stdout.splitlines() if WAIT_LINE in line]
    if second.returncode == 0 and len(waits) == 1 and f"host {OTHER_HOST}" in waits[0]:
        return None
    return f"rc {second.returncode}, waits {waits!r}, stderr {second.stderr[-300:]!r}"


def alone(first: subprocess.Popen, second, host: str, waited: bool) -> list[str]:
    """Problems unless ``second`` was refused and the ``first`` then ended the run."""
    out, err = first.communicate(timeout=600)
    problems = [f"second: {why}"] if (why := refused(second, host, first.pid, waited)) else []
    if first.returncode != 0:
        problems.append(f"first ended rc {first.returncode}: {err[-300:]}")
    return problems


def beside(first: subprocess.Popen, job: dict, run_dir: Path) -> subprocess.CompletedProcess:
    """A second job on ``run_dir`` once ``first`` trains (``first`` is killed if that fails)."""
    try:
        wait_training(first, run_dir)
        return second_job(job, run_dir)
    except BaseException:
        first.kill()
        raise


def case_live(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    return alone(first, beside(first, job, run_dir), socket.gethostname(), waited=False)


def case_killed_here(job, run_dir) -> list[str]:
    first = start(job, run_dir)
    wait_training(first, run_dir)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    failure = finished(job, run_dir, LEASE)
    return [] if failure is None else [f"takeover: {failure}"]


def case_live_elsewhere(job, run_dir) -> list[str]:
    first = start(job, run_dir, ON_OTHER_HOST)
    return alone(first, beside(first, job, run_dir), OTHER_HOST, waited=True)


def case_killed_elsewhere(job, run_dir) -> list[str]:
    first = start(job, run_dir, ON_OTHER_HOST)
    wait_training(first, run_dir)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    if (why := waited_then_finished(job, run_dir)) is not None:
        return [f"second: {why}"]
    return [f"probe: {failure}"] if (failure := finished(job, run_dir, LEASE)) else []


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
    "a second job while the first trains on another node": case_live_elsewhere,
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
        if not quick and (why := other_host_available()) is not None:
            names = [name for name in names if "another node" not in name]
            print(f"writers: the cases on another node are not tried: {why}", file=sys.stderr)
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
