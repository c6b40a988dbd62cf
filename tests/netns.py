"""Two "hosts" made of Linux network namespaces, for cluster tests that need distinct addresses.

Three namespaces get one veth each, all plugged into a bridge that lives in a fourth
namespace, so nothing is added to the machine's own network: ``host0`` (the scheduler and
the kernel side), ``host1`` and ``host2`` (a Dask worker each). Addresses come from the
benchmarking range 198.18.0.0/15 and no namespace has a route out, so every packet stays on
the bridge. :func:`hosts` always deletes the namespaces, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

__all__ = ["Hosts", "hosts", "netns_unavailable"]

SUBNET = "198.18.0"  # /24 inside 198.18.0.0/15


def netns_unavailable() -> str | None:
    """Why the namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "Linux network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"nkprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns is unavailable here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *args] if namespace is None else ["ip", "-n", namespace, *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    """The namespaces of one test: ``names[i]`` is host i, at ``address(i)``."""

    tag: str
    names: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def interface(self, host: int) -> str:
        return f"nk{self.tag}h{host}"

    def start(self, host: int, argv: list[str], **popen) -> subprocess.Popen:
        """Start ``argv`` inside host ``host``'s namespace; it is killed at the end."""
        process = subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], **popen)
        self.processes.append(process)
        return process

    def link_down(self, host: int) -> None:
        """Cut host ``host`` off the bridge, as a network failure would."""
        _ip("link", "set", self.interface(host), "down", namespace=self.names[host])


@contextlib.contextmanager
def hosts(count: int = 3) -> Iterator[Hosts]:
    """Make ``count`` hosts on one bridge; kill what was started in them and delete them all."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    made = Hosts(secrets.token_hex(2))
    bridge_ns = f"nk{made.tag}br"
    try:
        _ip("netns", "add", bridge_ns)
        made.names.append(bridge_ns)
        _ip("link", "add", "br0", "type", "bridge", namespace=bridge_ns)
        _ip("link", "set", "br0", "up", namespace=bridge_ns)
        for host in range(count):
            name = f"nk{made.tag}h{host}"
            _ip("netns", "add", name)
            made.names.insert(host, name)
            inside, outside = made.interface(host), f"nk{made.tag}p{host}"
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", name)
            _ip("link", "set", outside, "netns", bridge_ns)
            _ip("link", "set", outside, "master", "br0", namespace=bridge_ns)
            _ip("link", "set", outside, "up", namespace=bridge_ns)
            _ip("addr", "add", f"{made.address(host)}/24", "dev", inside, namespace=name)
            _ip("link", "set", inside, "up", namespace=name)
            _ip("link", "set", "lo", "up", namespace=name)
        yield made
    finally:
        for process in made.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for name in made.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
