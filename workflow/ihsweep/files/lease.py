"""One writer per run folder: a lease its holder renews, which expires when the holder dies.

A training job takes the lease of its run folder (``lease.json`` in it) before it reads or
writes anything there, renews it every ``renew_seconds`` from a background thread and removes
it when it ends. A second job on the same folder (a ``--rerun-incomplete`` beside a job whose
Snakemake was killed, or the same run submitted twice to a cluster) finds the lease held and
refuses in one line that names the holder: host, pid and SLURM job id.

On a cluster's shared filesystem a process on another node cannot be checked, so a lease lives
as long as it is renewed: a holder that died (kill -9, a lost node) blocks the folder for at
most ``expire_seconds`` after its last renewal; a training job that finds such a lease waits
that long once (a retry after an OOM kill on a node starts by itself) and refuses if it was
renewed meanwhile. On the holder's own host a dead pid is seen at once, so a job killed on a
workstation is taken over by the next start without waiting, and a live one is refused at once.

The protocol needs only atomic create (``O_EXCL``) and atomic rename, which NFS and Lustre
provide. A lease is created with ``O_EXCL``; an expired one is moved aside under a unique name
before it is replaced, and put back if what was moved aside turns out to be a fresh lease of
another job (two jobs taking over the same expired lease at the same moment). A holder that finds
its lease gone or someone else's at a renewal (it was paused for longer than the expiry) has
lost it: ``lost`` says why, and the trainer stops without writing anything more. The trainer
asks ``check`` after every update and before its completion record: a holder whose renewals
are overdue (its process was frozen) renews there first, so it learns of a takeover before it
writes, not a renewal later.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

LEASE_JSON = "lease.json"
RENEW_SECONDS = 30.0
EXPIRE_SECONDS = 180.0


class LeaseHeld(Exception):
    """Another live job holds the folder's lease."""


class LeaseLost(Exception):
    """This job's lease was taken over: the folder is another job's now."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, and until when it counts without a renewal."""

    token: str
    host: str
    pid: int
    pid_started: str | None  # the process's start time on its host, so a reused pid is not it
    slurm_job: str | None
    renewed: float  # Unix time of the last renewal
    expire_seconds: float

    def describe(self) -> str:
        slurm = f", SLURM job {self.slurm_job}" if self.slurm_job else ""
        return f"host {self.host}, pid {self.pid}{slurm}"

    def expired(self, now: float) -> bool:
        return now - self.renewed > self.expire_seconds

    def dead_here(self) -> bool:
        """Whether the holder ran on this host and that process is gone."""
        return self.host == socket.gethostname() and process_start(self.pid) != self.pid_started


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot; None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:  # no /proc (macOS): a signal-0 probe, which cannot tell a reused pid
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in ``path`` (None: no lease, or a record half-written by a crash)."""
    try:
        return Holder(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return None


class RunLease:
    """The lease of one folder: ``acquire`` it, ``release`` it; ``lost`` is set (the reason) when
    a renewal finds it taken over. With ``wait_for_expiry``, a lease held from another host is
    waited out once: a job retried after its holder was killed there (SLURM's OOM kill, a lost
    node) starts when that lease expires, and one renewed meanwhile is refused."""

    def __init__(
        self,
        folder: str | os.PathLike,
        renew_seconds: float = RENEW_SECONDS,
        expire_seconds: float = EXPIRE_SECONDS,
        wait_for_expiry: bool = False,
    ):
        if not 0 < renew_seconds < expire_seconds:
            raise ValueError("a lease must be renewed more often than it expires")
        self.path = Path(folder) / LEASE_JSON
        self.renew_seconds, self.expire_seconds = renew_seconds, expire_seconds
        self.wait_for_expiry = wait_for_expiry
        self.token = uuid.uuid4().hex
        self.lost: str | None = None
        self._renewed_at = 0.0  # time.monotonic() of this job's last write of the lease
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self) -> Holder:
        pid = os.getpid()
        return Holder(self.token, socket.gethostname(), pid, process_start(pid),
                      os.environ.get("SLURM_JOB_ID"), time.time(), self.expire_seconds)  # fmt: skip

    def acquire(self) -> RunLease:
        """Take the lease, or raise ``LeaseHeld`` naming the live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        waited = not self.wait_for_expiry
        for _ in range(20):  # each turn either succeeds or found a lease that changed meanwhile
            if self._create():
                self._start_renewing()
                return self
            holder = read_holder(self.path)
            if holder is None:
                if self._half_written_and_stale():
                    self._move_aside(None)
                else:
                    time.sleep(0.05)  # being written right now
                continue
            if not (holder.expired(time.time()) or holder.dead_here()):
                if waited or holder.host == socket.gethostname():  # a live process here
                    raise LeaseHeld(self._held_message(holder))
                self._wait_out(holder)
                waited = True
                continue
            self._move_aside(holder)
        raise LeaseHeld(
            f"{self.path} could not be taken: it is unreadable or kept changing hands (an"
            f" unreadable lease counts as stale {self.expire_seconds:.0f} s after it was written)"
        )

    def check(self) -> str | None:
        """Why this job no longer holds the lease (None: it does). Called before a job writes:
        a job that was paused (a frozen node, SIGSTOP) past its renewals renews first, and
        finds out whether another job has taken the folder meanwhile."""
        if self.lost is None and time.monotonic() - self._renewed_at > 2 * self.renew_seconds:
            self._renew()
        return self.lost

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this job's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = read_holder(self.path)
        if holder is not None and holder.token == self.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self.record()), f)
        self._renewed_at = time.monotonic()
        return True

    def _half_written_and_stale(self) -> bool:
        """An unreadable lease: a crash between create and write. Stale once its file is older
        than an expiry (a live writer fills it within microseconds)."""
        try:
            return time.time() - self.path.stat().st_mtime > self.expire_seconds
        except FileNotFoundError:
            return False

    def _move_aside(self, seen: Holder | None) -> None:
        """Remove the stale lease ``seen`` (None: unreadable) without removing a fresh one that
        another job put in its place since it was read."""
        aside = self.path.with_name(f".{LEASE_JSON}.{self.token}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = read_holder(aside)
        if moved == seen or (moved is None and seen is None):
            aside.unlink(missing_ok=True)
            return
        try:  # a fresh lease: put it back, unless yet another one is there already
            os.link(aside, self.path)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)

    def _wait_out(self, holder: Holder) -> None:
        """Sleep until ``holder``'s lease expires, unless it is renewed."""
        left = holder.renewed + holder.expire_seconds - time.time()
        print(f"{self.path.parent} is leased by {holder.describe()}, which cannot be checked from"
              f" here: waiting {left:.0f} s for the lease to expire", flush=True)  # fmt: skip
        deadline = time.monotonic() + left + 0.1
        while (wait := deadline - time.monotonic()) > 0:
            time.sleep(min(wait, holder.expire_seconds / 12))
            if read_holder(self.path) != holder:  # renewed, released or taken: look again
                return

    def _held_message(self, holder: Holder) -> str:
        age = time.time() - holder.renewed
        left = holder.expire_seconds - age
        return (
            f"{self.path.parent} is being written by another job ({holder.describe()}; lease"
            f" renewed {age:.0f} s ago): wait for it to end or stop it; if it died, its lease"
            f" expires in {max(left, 0):.0f} s"
        )

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_seconds):
            if not self._renew():
                return

    def _renew(self) -> bool:
        with self._renewing:  # the thread's renewals and check()'s
            if self.lost is not None:
                return False
            holder = read_holder(self.path)
            if holder is None or holder.token != self.token:
                who = "removed" if holder is None else f"taken over by {holder.describe()}"
                self.lost = f"the lease of {self.path.parent} was {who}"
                return False
            tmp = self.path.with_name(f".{LEASE_JSON}.{self.token}.tmp")
            tmp.write_text(json.dumps(asdict(self.record())))
            os.replace(tmp, self.path)
            self._renewed_at = time.monotonic()
            return True
