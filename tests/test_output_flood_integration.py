"""A worker printing an enormous line: relayed in linear time, in bounded pieces, and a
failure elsewhere is still seen at once."""

from __future__ import annotations

import sys
import time

import pytest
import torch.distributed as dist

from notebook_kit import WorkerError, notebook_launcher

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

MIB = 1 << 20
MAX_LINE_BYTES = 16 * 1024  # docs/guarantees.md: longer lines arrive in pieces of 16 KiB


class _Counter:
    """An observer that keeps only sizes, so the test measures the relay, not a display."""

    def __init__(self) -> None:
        self.pieces = 0
        self.longest = 0
        self.total = 0

    def on_start(self, info) -> None:
        pass

    def on_output(self, rank, stream, line) -> None:
        self.pieces += 1
        self.longest = max(self.longest, len(line.encode()))
        self.total += len(line)

    def on_message(self, rank, kind, payload) -> None:
        pass

    def on_tick(self) -> None:
        pass

    def on_finish(self, summary) -> None:
        pass


def test_a_64_mib_line_without_newline_is_relayed_in_bounded_pieces():
    size = 64 * MIB

    def shout():
        if dist.get_rank() == 0:
            block = "x" * MIB
            for _ in range(size // MIB):
                sys.stdout.write(block)

    counter = _Counter()
    started = time.monotonic()
    notebook_launcher(shout, num_processes=2, observer=counter, timeout=120)
    seconds = time.monotonic() - started
    assert counter.total == size  # nothing lost
    assert counter.longest <= MAX_LINE_BYTES
    assert counter.pieces >= size // MAX_LINE_BYTES
    assert seconds < 20, f"{seconds:.1f} s to relay 64 MiB"  # was ~30 s and quadratic


def test_a_failure_is_seen_within_a_second_while_another_rank_floods_one_line():
    def flood_or_fail():
        if dist.get_rank() == 0:
            block = "y" * MIB
            while True:
                sys.stdout.write(block)
        time.sleep(1.0)
        raise RuntimeError("rank 1 fails during the flood")

    with pytest.raises(WorkerError) as caught:
        notebook_launcher(flood_or_fail, num_processes=2, observer=_Counter(), timeout=120)
    seen = time.monotonic()
    assert caught.value.rank == 1
    assert "rank 1 fails during the flood" in str(caught.value)
    assert seen - caught.value.failure.time < 1.0  # "within a fraction of a second"
