"""Plain-text display of a launch: each worker line prefixed with its rank."""

from __future__ import annotations

import sys

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream, rank_label
from notebook_kit.runtime.messages import MetricsBatch

__all__ = ["ConsolePrinter", "last_segment"]


class ConsolePrinter:
    """Prints worker lines as ``[rank N] text`` on the kernel's stdout or stderr.

    Each line goes out in one write, so lines of different ranks never mix mid-line.
    """

    nodes: dict[int, int] = {}  # noqa: RUF012 (replaced per launch, never mutated)

    def on_start(self, info: LaunchInfo) -> None:
        self.nodes = info.node_of()
        print(info.banner, flush=True)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        target = sys.stderr if stream == "stderr" else sys.stdout
        target.write(f"[{rank_label(rank, self.nodes)}] {line}\n")

    def on_metrics(self, batch: MetricsBatch) -> None:
        """Metrics have no plain-text form here."""

    def on_tick(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        self.on_tick()


def last_segment(line: str) -> str:
    """What a terminal would show of a line redrawn with carriage returns (a tqdm bar).

    Example:
        >>> last_segment(" 10%|#   |\\r 20%|##  |")
        ' 20%|##  |'
    """
    if "\r" not in line:
        return line
    segments = [segment for segment in line.split("\r") if segment.strip()]
    return segments[-1] if segments else ""
