"""Worker side of progress, run in every training process: a counter bumped per step.

Workers only bump a counter (rank 0's count is the run's progress); the metrics channel carries
it to the kernel with the next batch. The kernel owns the single bar
(:mod:`notebook_kit.live.progress`), so worker processes never draw one into the cell.
"""

from __future__ import annotations

from notebook_kit.runtime.context import LaunchContext
from notebook_kit.runtime.metrics import WorkerChannel, channel

__all__ = ["advance", "report_epoch_length", "report_steps", "report_total"]


def report_total(context: LaunchContext | None, total: int | None) -> None:
    """Set the number of steps of the whole run (``accelerator.progress(total=...)``).

    Example::

        report_total(current_launch(), len(loader) * epochs)
    """
    state = _rank0_channel(context)
    if state is None:
        return
    state.total = None if total is None else int(total)
    state.state_changed()


def report_epoch_length(context: LaunchContext | None, length: int, loader: object = None) -> None:
    """Tell the kernel how many steps one epoch has (a prepared dataloader's ``len``).

    Without an explicit total the bar's total becomes this length times the epochs begun.
    Only the first loader that reports counts (the training loader, iterated first); an
    evaluation loader iterated later leaves the bar alone.

    Example::

        report_epoch_length(current_launch(), len(prepared_loader), prepared_loader)
    """
    state = _rank0_channel(context)
    if state is None:
        return
    if state.progress_source is None:
        state.progress_source = id(loader)
    if state.progress_source != id(loader):
        return
    state.epoch_length = int(length)
    state.state_changed()


def advance(context: LaunchContext | None, steps: int = 1, loader: object = None) -> None:
    """Count ``steps`` finished training steps (cheap: an integer add on rank 0).

    Example::

        advance(current_launch())
    """
    state = _rank0_channel(context)
    if state is None:
        return
    if state.progress_source is not None and state.progress_source != id(loader):
        return  # another loader (evaluation) is being iterated
    state.steps += steps
    if state.direct:
        state.state_changed()


def report_steps(context: LaunchContext | None, steps: int) -> None:
    """Set the count of finished steps outright (a trainer that keeps its own step count).

    Example::

        report_steps(current_launch(), trainer_state.global_step)
    """
    state = _rank0_channel(context)
    if state is None or state.steps == steps:
        return
    state.steps = int(steps)
    if state.direct:
        state.state_changed()


def _rank0_channel(context: LaunchContext | None) -> WorkerChannel | None:
    """The metrics channel, on rank 0 of a launch (the one whose count is the run's)."""
    if context is None or context.send is None or context.rank != 0:
        return None
    return channel(context)
