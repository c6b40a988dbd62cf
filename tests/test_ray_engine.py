"""``cluster="ray"`` before anything starts: the handles, and what a missing ray says.

No Ray runtime here: these run whether ray is installed or not (``ray`` is hidden where the
test needs it missing). The runs themselves are tests/test_ray_integration.py.
"""

from __future__ import annotations

import sys

import pytest

from notebook_kit import WorkerPool, notebook_launcher
from notebook_kit.launch.cluster.engines.ray import _renamed
from notebook_kit.node.links.ray import RunHub
from notebook_kit.node.protocol import Control, control_frame
from tests.optional import needs


def _train():
    return 1


@pytest.mark.parametrize("handle", ["ray", "ray://head:10001"])
def test_without_ray_cluster_ray_says_how_to_install_it_before_anything_starts(monkeypatch, handle):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'notebook_kit\[ray\]'") as caught:
        notebook_launcher(_train, cluster=handle, num_nodes=2, num_processes=1, live=False)
    assert f"cluster={handle!r} runs the launch on a Ray cluster" in str(caught.value)
    with pytest.raises(ImportError, match=r"pip install 'notebook_kit\[ray\]'"):
        WorkerPool(cluster=handle, num_nodes=2, num_processes=1, live=False)


def test_another_string_is_refused_naming_the_handles():
    with pytest.raises(ValueError, match=r"cluster='dask' is not a cluster: .*'ray'.*'ray://"):
        notebook_launcher(_train, cluster="dask", num_nodes=2, live=False)


@needs("ray", what="the Ray handle's check")
def test_cluster_ray_without_ray_init_says_to_join_a_cluster_first():
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray runtime of another test module is up in this process")
    with pytest.raises(ValueError, match=r"ray\.init\(address='auto'\).*ray://head:10001"):
        notebook_launcher(_train, cluster="ray", num_nodes=2, live=False)
    assert not ray.is_initialized()  # nothing was started on the user's behalf


def test_a_place_whose_process_died_is_renamed():
    assert not _renamed("10.0.0.2/ab12cd34#1")
    assert _renamed("10.0.0.2/ab12cd34#1.2")


def test_the_hub_serves_each_run_until_it_is_forgotten():
    """The kernel's hub, as a plain object: a claim that arrives before the kernel's first
    call asks again, a forgotten run's claim is refused, and forgetting wakes its waiters."""
    import asyncio

    async def scenario() -> None:
        hub = RunHub()
        assert hub.claim("a", 0, "w0") is None  # the kernel's first call has not arrived
        hub.set_control("a", control_frame(Control(0)))
        hub.set_control("b", control_frame(Control(0)))
        assert hub.claim("a", 0, "w0") is True and hub.claim("a", 0, "w1") is False
        hub.put("a", 0, [b"event"])
        hub.put("b", 1, [b"other"])
        taken = await hub.take("a", 1.0)
        assert [batch for _, batch in taken] == [{"node": 0, "events": [b"event"]}]
        waiting = asyncio.ensure_future(hub.take("a", 30.0))
        commands = asyncio.ensure_future(hub.commands_after("a", 0, 30.0))
        control = asyncio.ensure_future(hub.control("a", await hub.control("a"), 30.0))
        await asyncio.sleep(0.05)
        hub.forget("a")
        assert await asyncio.wait_for(waiting, 1.0) == []  # woken, not left waiting
        assert await asyncio.wait_for(commands, 1.0) == []
        assert await asyncio.wait_for(control, 1.0) is None
        assert hub.runs() == ["b"] and await hub.control("a") is None
        assert hub.claim("a", 1, "w1") is False  # a late claim of a forgotten run
        hub.set_control("a", control_frame(Control(1)))  # a late publish
        assert hub.runs() == ["b"]

    asyncio.run(scenario())


def test_a_nodes_control_read_waits_in_the_hub_for_a_change_but_not_for_a_lease_tick():
    """A running node's control thread asks with the value it knows: the hub answers once
    Stop or an abort arrives, and the kernel's lease ticks alone do not wake it."""
    import asyncio

    def value(lease: int, stop: bool = False, abort: str = "") -> bytes:
        return control_frame(Control(lease, stop, abort))

    async def scenario() -> None:
        hub = RunHub()
        hub.set_control("a", value(0))
        known = await hub.control("a", None, 30.0)  # nothing known yet: at once
        assert known == value(0)
        assert await hub.control("a", value(0, stop=True), 30.0) == value(0)  # it differs
        asking = asyncio.ensure_future(hub.control("a", known, 30.0))
        hub.set_control("a", value(1))
        hub.set_control("a", value(2))
        await asyncio.sleep(0.2)
        assert not asking.done()  # the lease moved, nothing else: still waiting
        hub.set_control("a", value(3, stop=True))
        assert await asyncio.wait_for(asking, 1.0) == value(3, stop=True)
        assert await hub.control("a", value(3, stop=True), 0.05) == value(3, stop=True)

    asyncio.run(scenario())
