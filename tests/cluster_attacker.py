"""A third party on the cluster: it finds a run's topics and posts what would run code.

Run as ``python -m tests.cluster_attacker dask SCHEDULER MARKER`` (a plain
``distributed.Client`` to the scheduler, the run's event and command topics found with
``get_events``) or ``python -m tests.cluster_attacker ray GCS MARKER`` (the kernel's hub actor
found with ``ray.util.list_named_actors``). Every forgery, if it were unpickled anywhere,
would create ``MARKER``. It prints the names it posted to, one a line, and exits.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any

from notebook_kit.node.protocol import NodePrint, RunCommand, Seal, encode
from notebook_kit.runtime.pool_commands import PoolCall

_FIND_SECONDS = 90.0


class Forged:
    """Unpickled, it creates the marker file (in whichever process unpickles it)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "a"))


def forged_events(marker: str) -> list[bytes]:
    """A bare pickle, and a frame of the right shape sealed with a secret not the run's."""
    return [pickle.dumps(Forged(marker)), encode(NodePrint(Forged(marker)), Seal.new())]  # type: ignore[arg-type]


def forged_commands(marker: str) -> list[bytes]:
    """A pool ``call`` whose body the ranks would unpickle, sealed with the wrong secret."""
    body = pickle.dumps(Forged(marker))
    command = RunCommand(10**6, PoolCall(body, None), (0, 1), ())
    return [pickle.dumps(Forged(marker)), encode(command, Seal.new())]


def attack_dask(address: str, marker: str) -> list[str]:
    from distributed import Client

    with Client(address, timeout=60, set_as_default=False) as client:
        deadline = time.monotonic() + _FIND_SECONDS
        while True:
            topics = [t for t in client.get_events() if t.startswith("notebook_kit-")]
            events = [t for t in topics if t.endswith("-events")]
            if events or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        commands = [t for t in topics if t.endswith("-commands")]
        for topic in events:
            for frame in forged_events(marker):
                client.log_event(topic, {"node": 0, "events": [frame]})
        for topic in commands:
            for frame in forged_commands(marker):
                client.log_event(topic, frame)
        time.sleep(0.5)  # the scheduler has passed them on before this client leaves
    return events + commands


def attack_ray(address: str, marker: str) -> list[str]:
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        deadline = time.monotonic() + _FIND_SECONDS
        while True:  # the kernel makes its hub with its first run
            hubs = [
                ray.get_actor(actor["name"], namespace=actor["namespace"])
                for actor in ray.util.list_named_actors(all_namespaces=True)
                if actor["name"].startswith("notebook_kit-hub-")
            ]
            held = [(hub, run) for hub in hubs for run in ray.get(hub.runs.remote(), timeout=30)]
            if held or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for hub, run in held:
            for frame in forged_events(marker):  # each its own batch, as on Dask
                ray.get(hub.put.remote(run, 0, [frame]), timeout=30)
        return [run for _, run in held]
    finally:
        ray.shutdown()


if __name__ == "__main__":
    kind, address, marker = sys.argv[1:4]
    attack = attack_dask if kind == "dask" else attack_ray
    print("\n".join(attack(address, marker)), flush=True)
