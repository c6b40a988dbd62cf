"""Plain-text display of a launch: each worker line prefixed with its rank."""

from __future__ import annotations

import sys
from typing import Any

from notebook_kit.live.observer import LaunchInfo, LaunchSummary, Stream

__all__ = ["ConsolePrinter"]


class ConsolePrinter:
    """Prints worker lines as ``[rank N] text`` on the kernel's stdout or stderr.

    Each line goes out in one write, so lines of different ranks never mix mid-line.
    """

    def on_start(self, info: LaunchInfo) -> None:
        print(info.banner, flush=True)

    def on_output(self, rank: int, stream: Stream, line: str) -> None:
        target = sys.stderr if stream == "stderr" else sys.stdout
        target.write(f"[rank {rank}] {line}\n")

    def on_message(self, rank: int, kind: str, payload: Any) -> None:
        """Messages (metrics) have no plain-text form here."""

    def on_tick(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    def on_finish(self, summary: LaunchSummary) -> None:
        self.on_tick()
