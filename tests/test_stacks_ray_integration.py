"""``notebook_kit.stacks()`` during a Ray cluster run: the request reaches each node through the
Ray hub's control value, as on Dask through its variable.

Two nodes of one rank on this machine's local Ray instance (the Ray tests' own, started once
for the module): rank 0 sleeps in C, rank 1 waits in ``dist.all_reduce``; the stacks come
from both nodes within the call's timeout; then the run is interrupted.
"""

from __future__ import annotations

import pytest

from notebook_kit import notebook_launcher
from notebook_kit.launch.stack_requests import RankStacks
from tests.optional import needs
from tests.test_ray_integration import ray_runtime  # noqa: F401  (the module's Ray instance)
from tests.test_stacks_cluster_integration import _asker, _check
from tests.test_stacks_integration import _sleep_or_reduce

pytestmark = [pytest.mark.integration, needs("ray", what="Ray cluster runs")]


def test_stacks_of_a_ray_run_come_from_every_node_within_the_timeout() -> None:
    found: list[tuple[RankStacks, float]] = []
    thread = _asker(found)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(
            _sleep_or_reduce, num_processes=1, num_nodes=2, cluster="ray", live=False, timeout=120
        )
    thread.join(5)
    _check(found)
