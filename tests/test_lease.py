"""One writer per run folder (ihsweep.files.lease): a second job refuses while the first lives, and
takes over once the first is dead (at once on the same host) or its lease has expired (another
host, which cannot check a pid).

The lease files of "another host" are written in the protocol's own format (a JSON record with
that host's name); everything else is the real thing: processes, files, kill -9, renewals.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from ihsweep.files.lease import LEASE_JSON, Holder, LeaseHeld, RunLease, read_holder
from ihsweep.files.records import read_progress
from ihsweep.steps.train import EXIT_LEASE
from test_train import (
    TIMEOUT,
    assert_same_tensors,
    final_weights,
    make_dataset,
    make_spec,
    run_to_end,
    subprocess_env,
    train_cmd,
    wait_for_step,
)


def other_host_lease(folder: Path, renewed_ago: float, expire_seconds: float = 180) -> Holder:
    """A lease as a job on node ``gpu-node-7`` would have written it."""
    holder = Holder("f" * 32, "gpu-node-7", 4242, "123", "987654", time.time() - renewed_ago,
                    expire_seconds)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LEASE_JSON).write_text(json.dumps(asdict(holder)))
    return holder


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_lease_on_a_held_folder_names_the_holder(tmp_path):
    with RunLease(tmp_path):
        record = read_holder(tmp_path / LEASE_JSON)
        assert record.host == socket.gethostname() and record.pid > 0
        with pytest.raises(LeaseHeld) as err:
            RunLease(tmp_path).acquire()
        assert f"{tmp_path} is being written by another job (host {record.host}, pid" in str(err)
    assert not (tmp_path / LEASE_JSON).exists()  # released
    RunLease(tmp_path).acquire().release()


def test_a_lease_on_another_host_holds_until_it_expires(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    other_host_lease(tmp_path, renewed_ago=100)
    with pytest.raises(LeaseHeld, match="host gpu-node-7, pid 4242, SLURM job 987654") as err:
        RunLease(tmp_path, wait_for_expiry=False).acquire()
    assert "expires in 80 s" in str(err.value)
    other_host_lease(tmp_path, renewed_ago=181)  # its holder stopped renewing 3 minutes ago
    lease = RunLease(tmp_path).acquire()
    try:
        holder = read_holder(tmp_path / LEASE_JSON)
        assert holder.token == lease.token and holder.slurm_job == "55"
    finally:
        lease.release()
    assert list(tmp_path.iterdir()) == []  # nothing moved aside stays behind


def test_a_lease_from_another_host_is_waited_out_and_refused_if_renewed(tmp_path, capsys):
    other_host_lease(tmp_path, renewed_ago=0, expire_seconds=1.5)  # its holder was killed
    lease = RunLease(tmp_path, 0.5, 3, wait_for_expiry=True).acquire()
    lease.release()
    out = capsys.readouterr().out
    assert "leased by host gpu-node-7, pid 4242, SLURM job 987654, which cannot be checked" in out

    holder = other_host_lease(tmp_path, renewed_ago=0, expire_seconds=1.5)
    done = threading.Event()

    def renew_as_a_live_holder():
        while not done.wait(0.3):
            renewed = replace(holder, renewed=time.time())
            (tmp_path / LEASE_JSON).write_text(json.dumps(asdict(renewed)))

    renewer = threading.Thread(target=renew_as_a_live_holder)
    renewer.start()
    try:
        with pytest.raises(LeaseHeld, match="host gpu-node-7"):
            RunLease(tmp_path, 0.5, 3, wait_for_expiry=True).acquire()
    finally:
        done.set()
        renewer.join()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path):
    holder = other_host_lease(tmp_path, renewed_ago=0)
    dead = replace(holder, host=socket.gethostname(), pid=dead_pid())
    (tmp_path / LEASE_JSON).write_text(json.dumps(asdict(dead)))
    RunLease(tmp_path).acquire().release()
    # A live pid whose start time differs is a reused pid: not the holder either.
    reused = replace(dead, pid=subprocess.os.getpid(), pid_started="1")
    (tmp_path / LEASE_JSON).write_text(json.dumps(asdict(reused)))
    RunLease(tmp_path).acquire().release()


def test_a_half_written_lease_is_stale_only_after_an_expiry(tmp_path):
    (tmp_path / LEASE_JSON).write_text('{"tok')  # a crash between create and write
    lease = RunLease(tmp_path, renew_seconds=0.1, expire_seconds=2)
    with pytest.raises(LeaseHeld, match="it is unreadable or kept changing hands"):
        lease.acquire()  # tries for about a second
    time.sleep(1.1)
    lease.acquire().release()


def test_renewals_move_the_time_and_notice_a_takeover(tmp_path):
    lease = RunLease(tmp_path, renew_seconds=0.1, expire_seconds=1).acquire()
    try:
        first = read_holder(tmp_path / LEASE_JSON).renewed
        time.sleep(0.35)
        assert read_holder(tmp_path / LEASE_JSON).renewed > first and lease.lost is None
        other_host_lease(tmp_path, renewed_ago=0)  # taken over while this job was paused
        time.sleep(0.35)
        assert lease.lost == (
            f"the lease of {tmp_path} was taken over by host gpu-node-7, pid 4242, SLURM job 987654"
        )
        assert read_holder(tmp_path / LEASE_JSON).host == "gpu-node-7"  # not overwritten
    finally:
        lease.release()
    assert read_holder(tmp_path / LEASE_JSON).host == "gpu-node-7"  # not removed: not its own


# --------------------------------------------------------------------------------------------
# Two training jobs on one run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "C32")


def start(spec, data_dir, run_dir, log: Path, *flags) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(train_cmd(spec, data_dir, run_dir, *flags), env=subprocess_env(),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


@pytest.mark.slow  # 3,000 updates twice (a reference and the run) and a 6 s lease waited out
def test_two_writers_one_refuses_then_takes_over_and_the_run_is_whole(data_dir, tmp_path):
    """The first job trains; a second refuses in one line naming its host and pid and touches
    nothing; the first is killed -9 on "another node" (its lease says so): the next job waits
    for the lease to expire, then resumes, and the run equals an uninterrupted one."""
    spec = make_spec(steps=3000, every=500)  # long enough to start a second job beside it
    reference = tmp_path / "reference"
    run_to_end(spec, data_dir, reference)

    run_dir, lease_flags = tmp_path / "run", ("--lease-seconds", "6")
    first = start(spec, data_dir, run_dir, tmp_path / "first.log", *lease_flags)
    try:
        # past its first checkpoint (step 500), so that the job after the kill has one to resume
        wait_for_step(first, run_dir, 510, tmp_path / "first.log")
        loss_before = (run_dir / "loss.csv").read_text()
        second = subprocess.run(train_cmd(spec, data_dir, run_dir, *lease_flags),
                                env=subprocess_env(), capture_output=True, text=True,
                                timeout=TIMEOUT)  # fmt: skip
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    assert second.returncode == EXIT_LEASE and second.stdout == "", second
    (line,) = second.stderr.splitlines()
    host = socket.gethostname()
    assert f"{run_dir} is being written by another job (host {host}, pid {first.pid}" in line
    assert (run_dir / "loss.csv").read_text().startswith(loss_before)
    assert read_progress(run_dir)["state"] == "running"  # the second wrote nothing

    holder = read_holder(run_dir / LEASE_JSON)
    on_node = replace(holder, host="gpu-node-7", renewed=time.time())
    (run_dir / LEASE_JSON).write_text(json.dumps(asdict(on_node)))
    out = run_to_end(spec, data_dir, run_dir, *lease_flags)  # waits for the lease to expire
    assert f"is leased by host gpu-node-7, pid {first.pid}" in out
    assert "resuming at step" in out
    assert not (run_dir / LEASE_JSON).exists() and not list(run_dir.rglob("*.tmp"))
    assert_same_tensors(final_weights(run_dir), final_weights(reference))
    assert (run_dir / "loss.csv").read_text() == (reference / "loss.csv").read_text()
