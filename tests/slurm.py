"""A real one-host SLURM cluster for tests: munge, slurmctld and two slurmd, started as root.

Debian's ``slurmctld``, ``slurmd`` and ``munge`` run unchanged from a private folder: their
own munge key and socket, state and spool folders, loopback ports picked free, and one
partition of two node names that both map to this host (``slurmd -N NAME``), so a job of two
nodes is two sets of processes here. The first host of a job's node list is node 0's address,
as on a real cluster, so the node names must resolve: where they do not, they are added to
``/etc/hosts`` as loopback names while the cluster runs (a cluster's own DNS, in one file).

Everything started here is stopped by :meth:`SlurmCluster.stop`: the jobs first (``scancel``),
then the daemons. Clients (``sbatch``, ``srun``, ``squeue``, dask-jobqueue) find the cluster
through ``SLURM_CONF`` in :attr:`SlurmCluster.environment`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.processes import free_port

NODES = ("nk1", "nk2")
PARTITION = "nk"
TIME_LIMIT_MINUTES = 10  # a job left behind ends by itself within this
START_TIMEOUT_S = 60.0
_HOSTS = Path("/etc/hosts")
SEARCH_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"  # daemons live in sbin
_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "sinfo")


def unavailable() -> str | None:
    """Why a SLURM cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmctld and slurmd needs root"
    missing = [name for name in _PROGRAMS if shutil.which(name, path=SEARCH_PATH) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing): "
            "apt-get install slurmctld slurmd slurm-client munge"
        )
    return None


def _free_ports_in_a_row(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports (the nodes' port range)."""
    for _ in range(100):
        first = free_port()
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + count):
                    probe = stack.enter_context(socket.socket())
                    probe.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports on loopback")


class SlurmCluster:
    """The daemons of one test cluster, their folder, and how clients reach them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.environment = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH}
        self.daemons: list[subprocess.Popen] = []
        self._munged_pid: int | None = None
        self._hosts_line: str | None = None

    def start(self) -> None:
        munge = self.folder / "munge"
        munge.mkdir(mode=0o700)
        (munge / "munge.key").write_bytes(os.urandom(1024))
        (munge / "munge.key").chmod(0o600)
        subprocess.run(
            [
                shutil.which("munged", path=SEARCH_PATH) or "munged",
                "--force",
                f"--key-file={munge / 'munge.key'}",
                f"--socket={munge / 'socket'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'seed'}",
            ],
            check=True,
            timeout=30,
        )
        self._munged_pid = int((munge / "munged.pid").read_text())
        self._write_conf(munge / "socket")
        self._name_the_nodes()
        self._daemon(["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        for name in NODES:
            self._daemon(["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait_until_idle()

    def _write_conf(self, munge_socket: Path) -> None:
        folder = self.folder
        for name in ("state", "log", *(f"spool-{node}" for node in NODES)):
            (folder / name).mkdir()
        first_port = _free_ports_in_a_row(len(NODES))
        lines = [
            "ClusterName=notebookkit",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"AuthInfo=socket={munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool-%n'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=5",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        # One line for every node: slurmd refuses two lines with the same NodeHostname.
        lines.append(
            f"NodeName={','.join(NODES)} "
            f"NodeHostname={','.join(socket.gethostname() for _ in NODES)} "
            f"NodeAddr={','.join('127.0.0.1' for _ in NODES)} CPUs={os.cpu_count() or 2} "
            f"RealMemory=8000 Port=[{first_port}-{first_port + len(NODES) - 1}] State=UNKNOWN"
        )
        lines.append(
            f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES "
            f"MaxTime={TIME_LIMIT_MINUTES} State=UP OverSubscribe=FORCE:4"
        )
        self.conf.write_text("\n".join(lines) + "\n")

    def _name_the_nodes(self) -> None:
        unknown = []
        for name in NODES:
            try:
                socket.gethostbyname(name)
            except OSError:
                unknown.append(name)
        if unknown:
            self._hosts_line = f"127.0.0.1 {' '.join(unknown)}  # {self.folder}\n"
            with open(_HOSTS, "a") as hosts:
                hosts.write(self._hosts_line)

    def _forget_the_nodes(self) -> None:
        if self._hosts_line is None:
            return
        text = _HOSTS.read_text()
        _HOSTS.write_text(text.replace(self._hosts_line, ""))
        self._hosts_line = None

    def _daemon(self, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{command[0]}-{len(self.daemons)}.out", "wb")  # noqa: SIM115
        self.daemons.append(
            subprocess.Popen(
                [shutil.which(command[0], path=SEARCH_PATH) or command[0], *command[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment,
                start_new_session=True,
            )
        )
        log.close()

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        states = ""
        while time.monotonic() < deadline:
            dead = [Path(d.args[0]).name for d in self.daemons if d.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited at start: {self.logs()}")
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
            if sorted(line.split()[1] for line in states.splitlines() if line.strip()) == [
                "idle"
            ] * len(NODES):
                return
            time.sleep(0.2)
        raise RuntimeError(f"SLURM nodes not idle in {START_TIMEOUT_S:g} s: {states!r}")

    def run(self, *command: str, check: bool = True, timeout: float = 30.0, **kwargs):
        """Run a SLURM client command against this cluster."""
        return subprocess.run(
            [shutil.which(command[0], path=SEARCH_PATH) or command[0], *command[1:]],
            env=self.environment,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            **kwargs,
        )

    def jobs(self) -> list[str]:
        """The ids of the jobs the controller still holds, in any state but finished."""
        out = self.run("squeue", "-h", "-o", "%i", check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_for_no_jobs(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.jobs(), f"jobs still held: {self.jobs()}"

    def logs(self) -> str:
        texts = []
        for path in sorted((self.folder / "log").glob("*")):
            with contextlib.suppress(OSError):
                texts.append(f"--- {path.name}\n{path.read_text()[-1500:]}")
        return "\n".join(texts)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--partition", PARTITION, check=False)
            self.wait_for_no_jobs(within=20)
        for daemon in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        if self._munged_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._munged_pid, signal.SIGTERM)
        self._forget_the_nodes()


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A started one-host SLURM cluster; everything stopped and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="nk-slurm-"))  # short: munge's socket path
    cluster = SlurmCluster(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
