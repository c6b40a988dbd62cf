"""The kernel half of progress: what rank 0 reported, shown by one tqdm bar in the cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from notebook_kit.runtime.metrics import BATCH_KIND, SINGLE_KIND

__all__ = ["ProgressBar", "ProgressState"]


@dataclass
class ProgressState:
    """What the kernel knows about progress, from rank 0's batches and the logged steps.

    Example:
        >>> state = ProgressState(); state.update({"steps": 5, "total": 10}); state.count
        5
    """

    steps: int = 0
    total: int | None = None
    epoch_length: int | None = None
    epochs_begun: int = 0
    last_logged_step: int | None = None

    def update(self, payload: dict[str, Any]) -> None:
        """Take the progress fields of a metrics batch from rank 0."""
        self.steps = payload.get("steps", self.steps)
        self.total = payload.get("total", self.total)
        length = payload.get("epoch_length")
        if length is not None and self.epoch_length is None:
            self.epoch_length = length
        for _, step, _ in payload.get("records", ()):
            if step is not None:
                self.last_logged_step = max(step, self.last_logged_step or 0)

    def take(self, rank: int, kind: str, payload: Any) -> None:
        """Follow rank 0: its batches, or the step of its single ``log`` records."""
        if rank != 0:
            return
        if kind == BATCH_KIND:
            self.update(payload)
        elif kind == SINGLE_KIND and payload.get("step") is not None:
            self.last_logged_step = max(int(payload["step"]), self.last_logged_step or 0)

    @property
    def count(self) -> int:
        """Steps done: counted steps, else the last step logged."""
        if self.steps or self.last_logged_step is None:
            return self.steps
        return self.last_logged_step + 1

    @property
    def expected(self) -> int | None:
        """The total, explicit or from the epoch length (grows by an epoch when one is passed)."""
        if self.total is not None:
            return self.total
        if self.epoch_length:
            epochs = max(1, -(-self.count // self.epoch_length))
            return self.epoch_length * epochs
        return None


class ProgressBar:
    """The kernel's tqdm bar (a ``tqdm.notebook`` widget), fed from a ProgressState.

    Example:
        >>> bar = ProgressBar(); bar.show(state); bar.close(state, "success")
    """

    def __init__(self) -> None:
        from tqdm.notebook import tqdm as notebook_tqdm

        self.bar = notebook_tqdm(  # not displayed here: the live view places its widget
            total=None, display=False, unit="step", dynamic_ncols=True, mininterval=0.25
        )
        self.widget = self.bar.container

    def show(self, state: ProgressState) -> None:
        expected = state.expected
        if expected is not None and expected != self.bar.total:
            self._set_total(expected)
        if state.count > self.bar.n:
            self.bar.update(state.count - self.bar.n)

    def _set_total(self, total: int) -> None:
        progress = self.widget.children[1]  # tqdm.notebook draws an unknown total thin, in info
        progress.bar_style = ""
        progress.max = total
        progress.layout.width = None
        self.bar.total = total
        self.bar.refresh()

    def close(self, state: ProgressState, outcome: Literal["success", "stopped", "failed"]) -> None:
        """Show the final count; a stopped run is drawn in amber, a failed one in red.

        A run that succeeded without an explicit total did all its steps: the bar ends full.
        """
        if outcome == "success" and state.total is None and state.count:
            self._set_total(state.count)
        self.show(state)
        if outcome == "success":
            self.bar.close()
            return
        self.bar.refresh()
        self.widget.children[1].bar_style = "warning" if outcome == "stopped" else "danger"
        self.bar.disable = True  # tqdm's close would restyle a bar that ended short
