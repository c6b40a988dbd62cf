"""``breakpoint()`` on a rank of a Ray cluster node: the prompt comes home through the run's hub
and the typed line goes back on its command list, as on Dask through the scheduler's topics.

Two nodes of one rank on this machine's local Ray instance (the Ray tests' own). The kernel's
``input()`` is the one piece left out here (the Dask test types in a real kernel's cell): the
desk's question is answered by a script, everything else is the real path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from notebook_kit.launch.cluster import attempt
from notebook_kit.launch.debugger_desk import DebuggerDesk
from tests.optional import needs
from tests.test_ray_integration import (
    assert_nothing_left,
    ray_runtime,  # noqa: F401  (the module's Ray instance)
)

pytestmark = [pytest.mark.integration, needs("ray", what="Ray cluster runs")]


def _train() -> float:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.tensor([10.0 + rank])
    secret = 40 + rank  # noqa: F841  (read at the prompt)
    if rank == 1:
        breakpoint()
    dist.all_reduce(x)  # rank 0, on the other node, waits here
    return float(x)


def _typed(monkeypatch: pytest.MonkeyPatch, lines: Iterator[str]) -> list[tuple[str, str]]:
    """The kernel's desk asks this script instead of the cell; what it was shown, in order."""
    asked: list[tuple[str, str]] = []

    def ask(output: str, prompt: str) -> str:
        asked.append((output, prompt))
        return next(lines)

    monkeypatch.setattr(attempt, "DebuggerDesk", lambda: DebuggerDesk(ask=ask))
    return asked


def _launch(function: Callable[[], float]) -> float:
    """``function`` on two Ray nodes of one rank (a closure: shipped by value to the nodes)."""
    return notebook_launcher(
        function, cluster="ray", num_nodes=2, num_processes=1, live=False, timeout=120
    )


def test_p_on_a_ray_nodes_rank_shows_its_variable_and_c_ends_the_run(monkeypatch) -> None:
    asked = _typed(monkeypatch, iter(["p secret", "c"]))
    assert _launch(lambda: _train()) == 21.0
    assert [prompt for _, prompt in asked] == ["(Pdb rank 1) "] * 2
    assert "41" in asked[1][0], asked  # rank 1's own variable, shown before its next prompt
    assert_nothing_left()


def test_q_on_a_ray_nodes_rank_fails_the_run_and_the_next_launch_works(monkeypatch) -> None:
    _typed(monkeypatch, iter(["q"]))
    with pytest.raises(WorkerError) as raised:
        _launch(lambda: _train())
    assert "rank 1" in str(raised.value) and "quit the debugger" in str(raised.value)
    assert_nothing_left()
    assert _launch(lambda: 7) == 7
    assert_nothing_left()
