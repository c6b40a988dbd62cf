"""The Accelerator's process helpers, collectives and metric log (a mixin over its state).

Kept apart from ``accelerator.py`` so each file has one job: there, preparing (and in
``distributed_methods.py``, stepping); here, talking to the other processes and to the notebook.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from notebook_kit.accelerator import operations
from notebook_kit.accelerator.delegated import Delegated
from notebook_kit.atomic_file import replace_atomically
from notebook_kit.integrations.trackers import make_trackers
from notebook_kit.runtime import metrics, stopping
from notebook_kit.runtime.context import current_launch
from notebook_kit.runtime.log_values import LoggedHistory, check_log_call
from notebook_kit.runtime.progress import report_total

if TYPE_CHECKING:
    from notebook_kit.accelerator.async_save import BackgroundSaves
    from notebook_kit.accelerator.optimizer import GradientState
    from notebook_kit.accelerator.partial_state import AcceleratorState

__all__ = ["ProcessMethods"]

F = TypeVar("F", bound=Callable[..., Any])


class ProcessMethods:
    """Helpers an Accelerator offers about its processes (attributes set by the Accelerator)."""

    state: AcceleratorState
    gradient_state: GradientState
    logged: LoggedHistory
    log_with: list[Any]
    logging_dir: Path | None
    trackers: list[Any]
    tracker_config: dict[str, Any]
    _trigger: bool
    _background_saves: BackgroundSaves

    is_main_process = Delegated[bool]("state")
    is_local_main_process = Delegated[bool]("state")
    is_last_process = Delegated[bool]("state")

    # -- synchronisation ------------------------------------------------------------------

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this line (no-op on one process).

        Example::

            accelerator.wait_for_everyone()
        """
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on the others (e.g. a download).

        Example::

            with accelerator.main_process_first():
                dataset = load_or_build_cache()
        """
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Like ``main_process_first`` but per node."""
        return self.state.local_main_process_first()

    def split_between_processes(
        self, inputs: Sequence[Any] | Mapping[str, Any] | torch.Tensor, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """Give each process a contiguous share of a list, tensor or dict of them.

        Example::

            with accelerator.split_between_processes(["a", "b", "c"]) as mine:
                results = [work(item) for item in mine]
        """
        return self.state.split_between_processes(inputs, apply_padding)

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the main process (None elsewhere).

        Example::

            @accelerator.on_main_process
            def report(): print("done")
        """
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on each node's main process."""
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the last process."""
        return self.state.on_last_process(function)

    def on_process(self, function: F | None = None, process_index: int = 0) -> Any:
        """Decorator: run ``function`` only on ``process_index``.

        Example::

            @accelerator.on_process(process_index=1)
            def report(): ...
        """
        return self.state.on_process(function, process_index)

    def on_local_process(self, function: F | None = None, local_process_index: int = 0) -> Any:
        """Decorator: run ``function`` only on ``local_process_index`` of each node."""
        return self.state.on_local_process(function, local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only.

        Example::

            accelerator.print(f"epoch {epoch}: loss {loss:.3f}")
        """
        self.state.print(*args, **kwargs)

    def save(self, obj: Any, f: str | os.PathLike[str]) -> None:
        """``torch.save`` on the main process only, atomically (no half-written file).

        Example::

            accelerator.save(accelerator.get_state_dict(model), "model.pt")
        """
        if not self.is_main_process:
            return
        replace_atomically(Path(f), lambda handle: torch.save(obj, handle))

    # -- collectives ----------------------------------------------------------------------

    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (or nested lists/dicts of them) from all processes.

        Example::

            all_losses = accelerator.gather(loss.detach())
        """
        return operations.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the samples ``even_batches`` repeated in the last round.

        Example::

            predictions = accelerator.gather_for_metrics(logits.argmax(dim=-1))
        """
        as_objects = use_gather_object or not _only_tensors(input_data)
        if as_objects:
            items = input_data if isinstance(input_data, list) else [input_data]
            data = operations.gather_object(items)
        else:
            data = operations.gather(input_data)
        remainder = self.gradient_state.remainder
        if not (self.gradient_state.end_of_dataloader and remainder > 0):
            return data
        if as_objects:
            return data[:remainder]
        return operations.recursively_apply(lambda tensor: tensor[:remainder], data)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce tensors over all processes: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

        Example::

            total = accelerator.reduce(correct, "sum")
        """
        return operations.reduce(tensor, reduction, scale)  # type: ignore[arg-type]

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: float = 0, pad_first: bool = False
    ) -> Any:
        """Pad tensors along ``dim`` to the largest size on any process.

        Example::

            tokens = accelerator.pad_across_processes(tokens, dim=1, pad_index=0)
        """
        return operations.pad_across_processes(tensor, dim, pad_index, pad_first)

    # -- metrics --------------------------------------------------------------------------

    def log(
        self,
        values: Mapping[str, Any],
        step: int | None = None,
        log_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Record metrics: kept in ``logged``, streamed to the notebook during a launch, and
        written by the trackers of ``log_with`` (on the main process, as in Accelerate).

        Never waits for the device: a tensor is read later, by the metrics thread (or when
        ``logged`` is read). Values are checked as ``notebook_kit.log`` checks them.

        Example::

            accelerator.log({"loss": loss}, step=step)
        """
        checked, step = check_log_call(values, step)
        snapshots = metrics.snapshot_values(checked)
        self.logged.append(step, snapshots)
        metrics.log_snapshots(current_launch(), snapshots, step)  # never waits for the kernel
        for tracker in self.trackers:  # the user's trackers read the values as they see fit
            tracker.log(checked, step=step, **dict((log_kwargs or {}).get(tracker.name, {})))

    @property
    def should_stop(self) -> bool:
        """True on every rank at the same step once the Stop button was clicked.

        A collective: call it at the same point of each step on every rank.

        Example::

            for batch in loader:
                train_step(batch)
                if accelerator.should_stop:
                    break
        """
        return stopping.should_stop(current_launch())

    def progress(self, total: int | None = None) -> None:
        """Set the total number of steps of the kernel's progress bar.

        Without it the total is the prepared dataloader's length times the epochs begun.

        Example::

            accelerator.progress(total=len(train_loader) * epochs)
        """
        report_total(current_launch(), total)

    def init_trackers(
        self,
        project_name: str,
        config: Mapping[str, Any] | None = None,
        init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Start the trackers of ``log_with`` for a run named ``project_name`` (main process).

        ``config`` is stored with the run (TensorBoard's HParams); ``init_kwargs`` maps a
        tracker's name to keyword arguments for it, e.g. ``{"tensorboard": {"flush_secs": 5}}``.
        The live plot needs no initialisation.

        Example::

            accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
            accelerator.init_trackers("digits", config={"lr": 0.01})  # runs/digits/
        """
        self.tracker_config = {"project_name": project_name, **dict(config or {})}
        if not self.is_main_process:
            return
        self.end_trackers()  # a second init_trackers starts a new run, as in Accelerate
        self.trackers = make_trackers(self.log_with, project_name, self.logging_dir, init_kwargs)
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(dict(config))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called ``name`` (its writer or run with ``unwrap=True``).

        Example::

            writer = accelerator.get_tracker("tensorboard", unwrap=True)
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        started = ", ".join(repr(tracker.name) for tracker in self.trackers) or "none"
        raise ValueError(
            f"No tracker named {name!r} was started on this process (started: {started}); "
            "trackers run on the main process after init_trackers()."
        )

    def end_trackers(self) -> None:
        """Finish every started tracker (files closed); ``end_training`` calls it."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()

    def end_training(self) -> None:
        """Wait for a pending ``save_state(async_save=True)`` (raising its error), finish the
        trackers, send the last buffered metrics, then wait for every process.

        Example::

            accelerator.end_training()
        """
        self._background_saves.wait()
        self.end_trackers()
        metrics.close_channel(current_launch())
        self.wait_for_everyone()

    # -- triggers -------------------------------------------------------------------------

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` sees on every process.

        Example::

            if loss.item() > 1e6: accelerator.set_trigger()
        """
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every process if any process called ``set_trigger`` (then reset)."""
        # On the process's device: an nccl group cannot reduce a CPU tensor.
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self.state.device)
        raised = operations.reduce(flag, "sum").item() > 0
        self._trigger = False
        return raised


def _only_tensors(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return all(_only_tensors(item) for item in data)
    if isinstance(data, Mapping):
        return all(_only_tensors(value) for value in data.values())
    return False
