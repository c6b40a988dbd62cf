"""Floods: a worker printing an enormous line is relayed in linear time, in bounded pieces,
and a failure elsewhere is still seen at once; ranks logging far faster than the kernel reads
lose points in between, never the newest."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

import notebook_kit
from notebook_kit import WorkerError, last_run, notebook_launcher
from notebook_kit.live.headless import QuietObserver
from notebook_kit.runtime.messages import MetricsBatch

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


_LOG_CALLS = 150_000  # per rank: 300,000 log calls in a few seconds


def _log_flood(marks: Path) -> None:
    rank = dist.get_rank()
    for step in range(_LOG_CALLS):
        notebook_kit.log({"loss": step / 4 + rank}, step=step)
    (marks / str(rank)).touch()  # every call made: the kernel may read again


class _StalledReader(QuietObserver):
    """The quiet view (the run is recorded), reading nothing until every rank made all its log
    calls: their buffers are full, whatever the machine's speed."""

    def __init__(self, marks: Path) -> None:
        super().__init__()
        self.marks = marks
        self.stalled = False

    def on_metrics(self, batch: MetricsBatch) -> None:
        deadline = time.monotonic() + 60
        while not self.stalled and len(list(self.marks.iterdir())) < 2:
            assert time.monotonic() < deadline, "the ranks never finished logging"
            time.sleep(0.05)
        self.stalled = True
        super().on_metrics(batch)


def test_a_flood_of_log_calls_drops_points_in_between_but_keeps_each_rank_s_newest(
    tmp_path: Path,
) -> None:
    notebook_launcher(
        _log_flood, args=(tmp_path,), num_processes=2, observer=_StalledReader(tmp_path)
    )
    record = last_run()
    assert record is not None and record.dropped > 0  # the buffers overflowed
    last = _LOG_CALLS - 1
    for rank in (0, 1):
        assert record.rank_metrics[rank]["loss"][-1] == (last, last / 4 + rank)
    assert record.metrics["loss"][-1] == (last, last / 4 + 0.5)
