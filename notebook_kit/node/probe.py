"""The probe: one short task per chosen worker before a cluster run starts anything.

It reports the worker's versions and GPUs, finds the network interface that reaches node 0
(the route the kernel will give to gloo and NCCL: a host name that resolves to 127.0.0.1, as
inside a Linux network namespace, does not matter), and unpickles the function to show it
can be rebuilt there. The rebuilding, the question which modules a node can import and the
count of GPUs happen in a process started as the node task starts its node process
(``probe_child``), not in the worker: the worker's own ``sys.path`` (a folder it was started
with, what ``client.upload_file`` sent it) is not the node's, and counting GPUs takes torch,
which costs a long-lived worker seconds and hundreds of MiB and can touch the CUDA driver. So
only such a process gives the node's answer, and the worker never imports torch.
"""

from __future__ import annotations

import ipaddress
import os
import pickle
import select
import socket
import sys
from importlib import metadata

from notebook_kit.node.links.dask_nanny import nanny_presets
from notebook_kit.node.protocol import ProbeReport

__all__ = [
    "host_of",
    "interface_for",
    "missing_modules",
    "node_environment",
    "probe_report",
    "probe_version",
    "worker_python_path",
]

_NODE_LIKE_SECONDS = 45.0  # bound on the node-like process, below the kernel's wait


def probe_report(
    worker: str, host: str, payload: bytes, node0_host: str, gpus: int | None = None
) -> ProbeReport:
    """Run on any engine's worker: describe this machine and try to rebuild the function.

    ``worker`` and ``host`` are the worker's names as the kernel knows them; ``gpus`` what
    the engine gives a node there, or None: as many as a node process's torch counts.
    """
    interface, local = interface_for(node0_host)
    rebuild_error, counted = _node_answers(payload, count_gpus=gpus is None)
    return ProbeReport(
        worker=worker,
        host=host,
        hostname=socket.gethostname(),
        python=".".join(map(str, sys.version_info[:3])),
        torch=probe_version("torch"),
        notebook_kit=probe_version("notebook_kit"),
        gpus=counted if gpus is None else gpus,
        interface=interface,
        local_address=local,
        rebuild_error=rebuild_error,
    )


def interface_for(target: str) -> tuple[str | None, str | None]:
    """The interface (and its address) whose route reaches ``target`` (IPv4 or IPv6).

    A UDP socket's ``connect`` sends nothing: it only asks the kernel's routing table which
    local address would be used, which is then matched to an interface name.

    Example:
        >>> interface_for("127.0.0.1")[1]
        '127.0.0.1'
    """
    import psutil

    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            local = str(probe.getsockname()[0]).split("%", 1)[0]  # fe80::1%eth0 -> fe80::1
    except OSError:
        return None, None
    interfaces = psutil.net_if_addrs()
    if ipaddress.ip_address(local).is_loopback:
        return _loopback_name(interfaces, family), local
    for name, addresses in interfaces.items():
        if any(a.family == family and a.address.split("%", 1)[0] == local for a in addresses):
            return name, local
    return None, local


def _loopback_name(interfaces: dict, family: int) -> str | None:
    for name, addresses in interfaces.items():
        if any(
            a.family == family and ipaddress.ip_address(a.address.split("%", 1)[0]).is_loopback
            for a in addresses
        ):
            return name
    return None


def host_of(address: str) -> str:
    """``tcp://198.18.0.2:40123`` -> ``198.18.0.2`` (also for ``[::1]``)."""
    hostport = address.split("://", 1)[-1]
    return hostport.rsplit(":", 1)[0].strip("[]")


def probe_version(package: str) -> str:
    """The installed version of ``package`` (the kernel asks the same)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def missing_modules(names: list[str]) -> list[str]:
    """Run on a Dask worker: which of these top-level modules a node process cannot import.

    Example (here, in a process started as a node's):
        >>> missing_modules(["json", "no_such_module_here"])
        ['no_such_module_here']
    """
    answer = _in_node_like_process(("missing", list(names)))
    return list(answer) if isinstance(answer, list) else list(names)


def worker_python_path(inherited: str | None = None) -> str:
    """``PYTHONPATH`` for a process this Dask worker starts, so it imports what the worker can.

    The entries of the worker's ``sys.path`` that a fresh interpreter would not have: its
    local directory (where ``client.upload_file`` and ``UploadDirectory`` put files) and the
    folders it was started with, before ``inherited``. The standard library and
    site-packages are left to the interpreter, in its own order.

    Example:
        >>> worker_python_path("/opt/inherited").split(os.pathsep)[-1]
        '/opt/inherited'
    """
    import site
    import sysconfig

    standard = {os.path.realpath(p) for p in sysconfig.get_paths().values()}
    standard |= {os.path.realpath(p) for p in site.getsitepackages()}
    standard.add(os.path.realpath(site.getusersitepackages()))
    standard |= {os.path.realpath(p) for p in sys.path if "lib-dynload" in p or p.endswith(".zip")}
    entries: list[str] = []
    for entry in sys.path:
        if entry and os.path.realpath(entry) not in standard and entry not in entries:
            entries.append(entry)
    if inherited:
        entries += [p for p in inherited.split(os.pathsep) if p and p not in entries]
    return os.pathsep.join(entries)


def _node_answers(payload: bytes, count_gpus: bool) -> tuple[str | None, int]:
    """Why a node process could not unpickle ``payload`` (None: it can) and, if
    ``count_gpus``, how many GPUs its torch sees: one process answers both."""
    answer = _in_node_like_process(("probe", (payload, count_gpus)))
    if isinstance(answer, tuple):
        error, gpus = answer
        return error, int(gpus or 0)
    return str(answer), 0  # it did not start or answer: the probe refuses the worker anyway


def _in_node_like_process(request: tuple) -> object:
    """Ask a process started as the node task starts a node process (forked by this worker's
    zygote, with the node environment) and return its answer."""
    import tempfile

    from notebook_kit.node.zygote import ZygoteChild, ZygoteError, local_zygote

    env = node_environment(None)
    requests, ask = os.pipe()
    answers, answer = os.pipe()
    with tempfile.TemporaryFile() as printed:  # what the user's code prints while rebuilt
        try:
            child = ZygoteChild(
                local_zygote(env).path, "notebook_kit.node.probe_child:serve", [requests, answer],
                env, name="nk-probe", streams=(printed.fileno(), printed.fileno()),
                timeout=_NODE_LIKE_SECONDS,
            )  # fmt: skip
        except ZygoteError as error:
            for fd in (ask, answers):
                os.close(fd)
            return f"a process started as a node's could not start: {error}"
        finally:
            os.close(requests)
            os.close(answer)
        try:
            with os.fdopen(ask, "wb") as sending:
                sending.write(pickle.dumps(request))
        except OSError:
            pass  # it ended early: its exit code says why
        with os.fdopen(answers, "rb") as receiving:
            ready = select.select([receiving], [], [], _NODE_LIKE_SECONDS)[0]
            data = receiving.read() if ready else b""
        if not ready:
            child.kill()
            child.wait()
            return f"a process started as a node's did not answer within {_NODE_LIKE_SECONDS:g} s"
        code = child.wait()
        if code != 0 or not data:
            printed.seek(0)
            tail = printed.read().decode(errors="replace").strip().splitlines()[-3:]
            return f"a process started as a node's ended with code {code}: " + " / ".join(tail)
    return pickle.loads(data)


def node_environment(interface: str | None) -> dict[str, str]:
    """The worker's environment, less what Dask's nanny tuned for its own worker process, plus
    the interface gloo and NCCL must use to reach node 0, and a ``PYTHONPATH`` that gives the
    node process the worker's own folders (its local directory, where ``client.upload_file``
    and ``UploadDirectory`` put files, and those it was started with).

    The nanny sets ``distributed.nanny.pre-spawn-environ`` in its environment before it starts
    the worker: one-thread BLAS and OpenMP pools, and ``MALLOC_TRIM_THRESHOLD_=65536``, which
    makes glibc hand freed memory back at once and serve every large block with a fresh
    ``mmap``. A training process that frees and allocates its activations every step then
    faults in each of their pages again: about five times the page faults of a process started
    without it, and nearly twice the CPU time per step of a small CNN. The node process starts
    as a local launch's ranks do, without them; the ranks size their thread pools themselves.
    """
    env = dict(os.environ)
    for name, value in nanny_presets().items():
        if env.get(name) == value:
            del env[name]
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
        env["NCCL_SOCKET_IFNAME"] = interface
    env["PYTHONPATH"] = worker_python_path(env.get("PYTHONPATH"))
    return env
