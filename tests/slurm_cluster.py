"""A real single-node SLURM cluster on this machine, for the tests that claim SLURM.

``LocalSlurm(root).start()`` runs munged, slurmctld and slurmd from the Debian packages (which
``.ci/run`` installs with apt-get; nothing is installed here) as plain child processes, with
every state, spool, log and pid file under ``root``, two fake GPUs (character devices like
/dev/null: SLURM counts and hands them out, CUDA never sees them) and the two partitions the
slurm profile names, its ``slurm_partition`` (the default: jobs without a GPU) and its
``gpu_partition``, over the one node, so that the real profile needs no partition override.
``stop()`` stops the three daemons by pid and removes the config files it wrote.

Facts this relies on (each seen with Slurm 22.05 and snakemake-executor-plugin-slurm 2.8): the
config must be at /etc/slurm/slurm.conf (jobs lose ``SLURM_CONF``), so this needs root; without
slurmdbd, status checks must use squeue, and MinJobAge must stay well above the polling
interval.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import yaml

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
CONF_DIR = Path("/etc/slurm")
PROFILE = Path(__file__).resolve().parents[1] / "slurm" / "config.yaml"
N_GPUS = 2


def missing_requirements() -> str | None:
    """Why a local cluster cannot start here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"SLURM binaries missing: {', '.join(missing)} (apt-get install slurmctld slurmd "
            "slurm-client munge, as .ci/run does)"
        )
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (its config must live in /etc/slurm)"
    if not Path("/etc/munge/munge.key").exists():
        return "no /etc/munge/munge.key (the munge package creates it on install)"
    return None


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.procs: dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname()
        self.socket = self.root / "munge.sock"
        self._written: list[Path] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalSlurm:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        shutil.copy("/etc/munge/munge.key", key)
        key.chmod(0o600)
        for i in range(N_GPUS):
            device = self.root / f"gpu{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
        self._write(CONF_DIR / "slurm.conf", self.slurm_conf())
        self._write(CONF_DIR / "gres.conf", self.gres_conf())
        self._spawn(
            "munged",
            "munged", "-F", "--force", f"--socket={self.socket}", f"--key-file={key}",
            f"--pid-file={self.root / 'munged.pid'}", f"--seed-file={self.root / 'munged.seed'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
        )  # fmt: skip
        self._wait(lambda: self.socket.exists(), timeout, "munged socket")
        self._spawn("slurmctld", "slurmctld", "-D", "-i")
        self._spawn("slurmd", "slurmd", "-D")
        self._wait(self._node_idle, timeout, "the node to become idle")
        return self

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for path in self._written:
            path.unlink(missing_ok=True)
        self._written.clear()

    # --- what the tests ask ------------------------------------------------------------------

    def jobs(self) -> list[dict]:
        """Queued and running jobs: id, state and comment (the plugin puts the rule there)."""
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True, check=True
        ).stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.strip()]
        return [{"id": i, "state": s, "comment": c} for i, s, c in rows]

    def wait_until_empty(self, timeout: float = 120.0) -> None:
        self._wait(lambda: not self.jobs(), timeout, "the queue to drain")

    def output(self, name: str) -> str:
        """What a daemon printed (its log files are in the same folder)."""
        path = self.root / "log" / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- config ------------------------------------------------------------------------------

    def slurm_conf(self) -> str:
        cpus = os.cpu_count() or 1
        mem_mb = _memory_mb() * 9 // 10
        partitions = yaml.safe_load(PROFILE.read_text())["default-resources"]
        r = self.root
        return f"""\
ClusterName=ihsweep-test
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MinJobAge=300
DefMemPerCPU=1000
ReturnToService=2
KillWait=30
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
GresTypes=gpu
NodeName={self.host} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:fake:{N_GPUS} State=UNKNOWN
PartitionName={partitions["slurm_partition"]} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName={partitions["gpu_partition"]} Nodes=ALL MaxTime=INFINITE State=UP
"""

    def gres_conf(self) -> str:
        return f"AutoDetect=off\nName=gpu Type=fake File={self.root}/gpu[0-{N_GPUS - 1}]\n"

    # --- helpers -----------------------------------------------------------------------------

    def _write(self, path: Path, text: str) -> None:
        if path.exists() and path not in self._written:
            raise RuntimeError(f"{path} exists: refusing to replace another cluster's config")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self._written.append(path)

    def _spawn(self, name: str, *cmd: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "w")  # noqa: SIM115 (lives with the process)
        self.procs[name] = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _node_idle(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.output(name)[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}: {tail}")
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")
