"""The probe: one short Dask task per chosen worker before a cluster run starts anything.

It reports the worker's versions and GPUs, finds the network interface that reaches node 0
(the route the kernel will give to gloo and NCCL: a host name that resolves to 127.0.0.1, as
inside a Linux network namespace, does not matter), and unpickles the function to show it
can be rebuilt there.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import traceback
from importlib import metadata

from notebook_kit.node.protocol import ProbeReport

__all__ = ["interface_for", "probe_version", "probe_worker"]


def probe_worker(payload: bytes, node0_host: str) -> ProbeReport:
    """Run on a Dask worker: describe it and try to rebuild the function."""
    from distributed import get_worker

    worker = get_worker()
    host = _host_of(worker.address)
    interface, local = interface_for(node0_host)
    return ProbeReport(
        worker=worker.address,
        host=host,
        hostname=socket.gethostname(),
        python=".".join(map(str, sys.version_info[:3])),
        torch=probe_version("torch"),
        notebook_kit=probe_version("notebook_kit"),
        gpus=_gpu_count(),
        interface=interface,
        local_address=local,
        rebuild_error=_rebuild_error(payload),
    )


def interface_for(target: str) -> tuple[str | None, str | None]:
    """The interface (and its address) whose route reaches ``target``.

    A UDP socket's ``connect`` sends nothing: it only asks the kernel's routing table which
    local address would be used, which is then matched to an interface name.
    """
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            local = probe.getsockname()[0]
    except OSError:
        return None, None
    if ipaddress.ip_address(local).is_loopback:
        return _loopback_name(psutil.net_if_addrs()), local
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return name, local
    return None, local


def _loopback_name(interfaces: dict) -> str | None:
    for name, addresses in interfaces.items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addresses):
            return name
    return None


def _host_of(address: str) -> str:
    """``tcp://198.18.0.2:40123`` -> ``198.18.0.2`` (also for ``[::1]``)."""
    hostport = address.split("://", 1)[-1]
    return hostport.rsplit(":", 1)[0].strip("[]")


def probe_version(package: str) -> str:
    """The installed version of ``package`` (the kernel asks the same)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _gpu_count() -> int:
    """GPUs torch would see, asked without creating a CUDA context in the Dask worker."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _rebuild_error(payload: bytes) -> str | None:
    import cloudpickle

    try:
        cloudpickle.loads(payload)
    except Exception as error:
        lines = traceback.format_exception_only(type(error), error)
        return "".join(lines).strip()
    return None
