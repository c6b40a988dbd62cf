"""Three calls any launched training loop can make, with or without an ``Accelerator``.

``log`` sends metrics to the live plot, ``should_stop`` answers the Stop button (the same
answer on every rank, at the same step) and counts the step on the progress bar, ``progress``
sets the bar's total. A plain ``torch.distributed`` + ``DistributedDataParallel`` loop gets the
whole live view from these three. Outside a launch they do nothing (``should_stop`` is False),
so the same function also runs as a plain script.

Example:
    >>> import notebook_kit
    >>> def train():
    ...     notebook_kit.progress(total=epochs * len(loader))
    ...     for epoch in range(epochs):
    ...         for inputs, targets in loader:
    ...             loss = step(inputs, targets)
    ...             notebook_kit.log({"loss": loss})
    ...             if notebook_kit.should_stop():
    ...                 return
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

from notebook_kit.runtime import stopping
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.log_values import check_log_call
from notebook_kit.runtime.metrics import count_samples, log_from_worker, speed_counter
from notebook_kit.runtime.progress import advance, report_total

__all__ = ["log", "progress", "set_flops_per_sample", "should_stop", "stop_reason"]


def log(values: Mapping[str, Any], step: int | None = None, *, samples: int | None = None) -> None:
    """Send metrics to the kernel's live plot and ``last_run().metrics``; never waits.

    Every rank may log: the plot shows the mean over the ranks that logged a step. Tensors
    are read by a background thread, so logging a loss does not wait for the device. The
    values are checked here, as ``Accelerator.log`` checks them.

    Args:
        values: Metric name to a number or a one-element tensor.
        step: The training step; None numbers this rank's calls 0, 1, 2, ...
        samples: Samples this rank trained on since its last call (the batch size): counted
            for the samples/s of the speed line. A prepared data loader counts them without
            this; once given, this count replaces the loader's.

    Raises:
        TypeError: A value is not a number or a one-element tensor, ``step`` is not an int,
            or ``samples`` is not a non-negative int.
        ValueError: A number too large for a float.

    Example::

        notebook_kit.log({"loss": loss}, step=step, samples=len(inputs))
    """
    checked, step = check_log_call(values, step)
    if samples is not None:
        if isinstance(samples, bool) or not isinstance(samples, Integral) or samples < 0:
            raise TypeError(
                f"log(samples=...) must be a non-negative int (the batch size), got {samples!r}."
            )
        count_samples(current_launch(), int(samples))
    log_from_worker(current_launch(), checked, step)


def set_flops_per_sample(flops: float) -> None:
    """Give the model's training FLOPs per sample (forward and backward), for the MFU.

    A transformers model prepared by the Accelerator needs nothing: its FLOPs come from its
    config (``6 * params + 12 * layers * width * sequence`` per token). For any other model,
    call this once in the training function, on every rank; the speed line then shows the model
    FLOPs utilisation against the GPU's peak. Outside a launch this does nothing.

    Raises:
        TypeError: ``flops`` is not a positive number.

    Example::

        notebook_kit.set_flops_per_sample(6 * num_parameters * sequence_length)
    """
    if isinstance(flops, bool) or not isinstance(flops, Real) or not flops > 0:
        raise TypeError(
            f"set_flops_per_sample(flops) takes a positive number (the training FLOPs of one "
            f"sample), got {flops!r}."
        )
    counter = speed_counter(current_launch())
    if counter is not None:
        counter.flops_per_sample = float(flops)


def should_stop() -> bool:
    """True on every rank, at the same step, once the Stop button was clicked or a node was
    told it will be taken away (SIGTERM: a preempted VM, a job at its time limit).

    Call it once per training step on every rank (it is a collective: the ranks agree through
    the process group, like ``accelerator.should_stop``); each call also counts one finished
    step on the progress bar.

    Example::

        for inputs, targets in loader:
            train_step(inputs, targets)
            if notebook_kit.should_stop():
                break
    """
    context = current_launch()
    advance(context)
    return stopping.should_stop(context)


def stop_reason() -> str | None:
    """Why ``should_stop()`` turned True (the same text on every rank), or None before.

    A node that receives SIGTERM has until its machine goes (seconds to minutes) to save::

        for step, batch in enumerate(loader, start=first_step):
            train_step(batch)
            if notebook_kit.should_stop():
                accelerator.save_state()  # resumed by accelerator.load_state() next time
                print(f"stopped at step {step}: {notebook_kit.stop_reason()}")
                return step
    """
    return stopping.stop_reason(current_launch())


def progress(total: int | None) -> None:
    """Set the number of steps the progress bar counts to (None: unknown).

    The bar counts ``should_stop()`` calls; without them, the last step given to ``log``.

    Raises:
        TypeError: ``total`` is not a non-negative int or None.

    Example::

        notebook_kit.progress(total=epochs * len(loader))
    """
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise TypeError(f"progress(total=...) must be a non-negative int or None, got {total!r}.")
    report_total(current_launch(), total)
