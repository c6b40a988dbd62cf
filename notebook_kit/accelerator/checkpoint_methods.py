"""The Accelerator's checkpoint methods (a mixin): what goes into ``save_state`` and where.

The file format and the atomic commit live in :mod:`notebook_kit.accelerator.checkpointing`;
how models and optimizers are written (whole, or sharded per rank) is the strategy's
``checkpoint_parts``; this mixin only collects the Accelerator's prepared objects and resolves
numbered checkpoint folders.

Numbered checkpoints follow Accelerate's automatic naming: ``save_state()`` without a directory
writes ``project_dir/checkpoints/checkpoint_<n>`` with ``n`` one past the highest existing
number (so a restarted run continues the sequence), ``load_state()`` without a directory loads
the newest *committed* one (a save cut short by a crash is skipped) and returns where it was,
or returns None when there is none yet (so one function both starts and resumes), and
``ProjectConfiguration(total_limit=N)`` keeps only the newest ``N``.

Every directory may be a local path or an fsspec URL (:mod:`~notebook_kit.accelerator.storage`).

Only *complete* checkpoints (with a committed manifest) count. A ``checkpoint_<n>`` that a
killed save left without its manifest is removed, with a warning, by the next numbered save
before it writes, so it is never loaded, never counted towards ``total_limit`` and never
keeps a good checkpoint from being kept. A folder without a manifest that save_state did not
write (other files in it) is left alone and ignored, with a warning.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from notebook_kit.accelerator import operations
from notebook_kit.accelerator.async_save import BackgroundSaves
from notebook_kit.accelerator.checkpoint_files import (
    MANIFEST,
    CheckpointError,
    is_state_folder,
    read_manifest,
    state_folder,
)
from notebook_kit.accelerator.checkpointing import Stateful, load_checkpoint, save_checkpoint
from notebook_kit.accelerator.data_loader import skip_first_batches
from notebook_kit.accelerator.model_files import parse_shard_size, write_model_files
from notebook_kit.accelerator.save_agreement import decided_by_rank_zero
from notebook_kit.accelerator.storage import (
    StoragePath,
    check_root,
    fresh,
    is_local,
    refresh,
    remove_tree,
    storage_path,
)
from notebook_kit.accelerator.writer_lease import WriterLease

if TYPE_CHECKING:
    import torch
    from torch import nn

    from notebook_kit.accelerator.data_loader import PreparedDataLoader
    from notebook_kit.accelerator.optimizer import AcceleratedOptimizer, AcceleratedScheduler
    from notebook_kit.accelerator.state import ProcessState
    from notebook_kit.accelerator.strategies import Strategy

__all__ = ["CheckpointMethods"]


class CheckpointMethods:
    """``save_state``/``load_state`` and friends; needs the Accelerator's prepared objects."""

    project_dir: StoragePath | None
    total_limit: int | None
    scaler: torch.amp.GradScaler | None
    _models: list[nn.Module]
    _optimizers: list[AcceleratedOptimizer]
    _schedulers: list[AcceleratedScheduler]
    _dataloaders: list[PreparedDataLoader]
    _custom_objects: list[Any]
    _background_saves: BackgroundSaves

    state: ProcessState
    strategy: Strategy

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with ``state_dict``/``load_state_dict`` in ``save_state``.

        Example::

            accelerator.register_for_checkpointing(ema)
        """
        for obj in objects:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise ValueError(f"{type(obj).__name__} has no state_dict/load_state_dict.")
            self._custom_objects.append(obj)

    def _stateful(self) -> Stateful:
        parts = self.strategy.checkpoint_parts(self._models, self._optimizers)
        return Stateful(
            models=parts.models,
            optimizers=parts.optimizers,
            sharded=parts.sharded,
            schedulers=self._schedulers,
            dataloaders=self._dataloaders,
            custom=self._custom_objects,
            scaler=self.scaler,
        )

    def _checkpoint_root(self) -> StoragePath:
        if self.project_dir is None:
            raise ValueError(
                "Give save_state/load_state a directory, or create the Accelerator with "
                "project_dir=... to use numbered checkpoints."
            )
        return self.project_dir / "checkpoints"

    def _numbered_checkpoints(self, committed: bool = False) -> list[tuple[int, StoragePath]]:
        """``(n, folder)`` for every ``checkpoint_<n>``, oldest first (only finished ones)."""
        root = self._checkpoint_root()
        refresh(root)
        children = root.iterdir() if root.is_dir() else []
        found = [
            (path.name.rpartition("_")[2], path)
            for path in children
            if path.name.startswith("checkpoint_")
        ]
        numbered = sorted((int(number), path) for number, path in found if number.isdigit())
        return [item for item in numbered if not committed or (item[1] / MANIFEST).is_file()]

    def _newest_loadable(self) -> int | None:
        """The newest finished ``checkpoint_<n>`` whose state is there, saying which newer
        ones were passed over and why; None when there is none."""
        existing = self._numbered_checkpoints(committed=True)
        passed: list[str] = []
        for number, folder in reversed(existing):
            try:
                state_folder(folder, read_manifest(folder))
            except (OSError, CheckpointError) as error:
                passed.append(f"{folder.name} ({error})")
                continue
            if passed:
                warnings.warn(
                    f"load_state() loads {folder}, the newest complete checkpoint; it passed "
                    f"over {'; '.join(passed)}.",
                    stacklevel=3,
                )
            return number
        return None

    def _claim_and_number(self) -> int:
        """Rank 0's first step of a numbered save: this run's lease on ``project_dir``
        (another run saving there is refused), then the next number."""
        root = self._checkpoint_root().parent
        check_root(root)  # the lease is the first write: never into a bucket that is not there
        if is_local(root):
            root.mkdir(parents=True, exist_ok=True)
        lease = self.__dict__.get("_writer_lease")
        if lease is None:  # made here, not in __init__: only numbered saves need one
            lease = self._writer_lease = WriterLease()
        lease.claim(root)
        return self._next_number()

    def _next_number(self) -> int:
        """One past the highest ``checkpoint_<n>`` left after removing unfinished saves."""
        for _, folder in self._numbered_checkpoints():
            if not (folder / MANIFEST).is_file():
                _remove_unfinished(folder)
        existing = self._numbered_checkpoints()
        return existing[-1][0] + 1 if existing else 0

    @contextlib.contextmanager
    def _storage_renewed_on_failure(self) -> Iterator[None]:
        """A save that failed may have lacked credentials set since: the next one gets new
        filesystem objects, for ``project_dir`` and any URL, which read them again."""
        try:
            yield
        except Exception:
            self.project_dir = fresh(self.project_dir)
            raise

    def _drop_old_checkpoints(self) -> None:
        """Keep the newest ``total_limit`` complete checkpoints; only after a new one is saved,
        so a crash while saving never leaves fewer than ``total_limit`` behind."""
        limit = self.total_limit
        if limit is None or self.state.process_index != 0:
            return
        for _, folder in self._numbered_checkpoints(committed=True)[:-limit]:
            remove_tree(folder)

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        async_save: bool = False,
    ) -> StoragePath:
        """Save models, optimizers, schedulers, scaler, RNG states and data positions.

        Must be called on every process. The save is atomic: a crash during it leaves the
        previous checkpoint in ``output_dir`` intact, and a failed save removes what it wrote.
        Without ``output_dir`` it writes the next ``project_dir/checkpoints/checkpoint_<n>``
        and then drops the oldest complete ones beyond ``total_limit``.

        ``output_dir`` (and ``project_dir``) may be a URL such as ``s3://bucket/run/step_100``;
        ``storage_options`` go to its fsspec backend (credentials otherwise come from the
        environment and the backend's config files). Every rank must see the same folder: one
        that is different on each machine is refused before anything is written.

        ``async_save=True`` copies the state to host memory and returns; a thread writes the
        copy while training goes on, so changes made after the call are not in the checkpoint.
        It is committed (and ``total_limit`` applied) only once every rank's files are
        written. The next ``save_state``, ``load_state``, ``end_training`` and the end of a
        launched function (or, outside a launch, the interpreter's exit) wait for it, and
        raise its error if it failed. A function ending with an error or an interrupt
        abandons it: never committed, removed by the next save. It costs one host copy of the
        state. Accelerate has no such option on ``save_state`` (its DCP path alone saves
        asynchronously); here it covers every strategy and storage.

        Returns where the checkpoint is (being) written.

        Raises:
            CheckpointSpaceError: The disk filled up (an ``OSError``); the partial save was
                removed, earlier checkpoints are intact, and a later call can succeed.
            CheckpointSaveError: The previous asynchronous save failed (raised here, at the
                wait), or another rank could not write its part.
            TypeError: ``async_save`` is not a bool.

        Example::

            accelerator.save_state("checkpoints/step_100")
            accelerator.save_state(async_save=True)  # training goes on while it is written
        """
        if not isinstance(async_save, bool):
            raise TypeError(
                f"save_state(async_save=...) takes True or False, got {async_save!r} "
                f"({type(async_save).__name__}); pass async_save=True to write in the "
                "background."
            )
        with self._storage_renewed_on_failure():
            self._background_saves.wait()
            return self._save_state(output_dir, storage_options, async_save)

    def _save_state(
        self, output_dir: Any, storage_options: Mapping[str, Any] | None, async_save: bool
    ) -> StoragePath:
        self.strategy.enter_collective("save_state")
        background = self._background_saves if async_save else None
        if output_dir is not None:
            where = storage_path(output_dir, storage_options, name="output_dir")
            return save_checkpoint(
                where, self._stateful(), self.state.process_index, background=background
            )
        root = self._checkpoint_root()
        which = f"the next checkpoint ({root})"
        rank = self.state.process_index
        number = decided_by_rank_zero(root, which, rank, self._claim_and_number, "numbering it")
        return save_checkpoint(
            self._checkpoint_root() / f"checkpoint_{number}",
            self._stateful(),
            self.state.process_index,
            number=number,
            background=background,
            after_commit=self._drop_old_checkpoints,
        )

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> StoragePath | None:
        """Restore what ``save_state`` wrote; the next data pass resumes where it stopped.

        Returns where the checkpoint was. Without ``input_dir`` the newest finished
        ``checkpoint_<n>`` of ``project_dir`` is loaded, and None is returned when there is
        none yet (Accelerate raises there), so one training function both starts and resumes::

            accelerator.load_state()  # None on the first run, the checkpoint on a restart

        ``input_dir`` may be a URL, as for :meth:`save_state`.

        Raises:
            FileNotFoundError: No checkpoint (or a file of it) at ``input_dir``.
            CheckpointError: A damaged or edited file (named in the message), or saved with
                another number of processes or other objects.
            CheckpointSaveError: A pending asynchronous save failed (see :meth:`save_state`).

        Example::

            accelerator.load_state("checkpoints/step_100")
        """
        self._background_saves.wait()  # a pending save first: it may be the one to load
        self.strategy.enter_collective("load_state")
        if input_dir is None:
            rank_zero = self.state.process_index == 0
            number = operations.broadcast_object(self._newest_loadable() if rank_zero else None)
            if number is None:  # rank 0's listing decides for every rank
                return None
            where = self._checkpoint_root() / f"checkpoint_{number}"
        else:
            where = storage_path(input_dir, storage_options, name="input_dir")
        load_checkpoint(where, self._stateful(), self.state.process_index)
        return where

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the model's full weights as Transformers' ``save_pretrained`` does.

        Safetensors files of at most ``max_shard_size`` each (``"10GB"``, ``"500MB"``, bytes)
        with ``model.safetensors.index.json`` when there are several; ``pytorch_model*.bin``
        with ``safe_serialization=False``. The main process writes. Under FSDP the weights are
        gathered first, so every process must call it.

        Example::

            accelerator.save_model(model, "trained", max_shard_size="200MB")
        """
        parse_shard_size(max_shard_size)  # a bad size fails before any gathering
        where = storage_path(save_directory, storage_options, name="save_directory")
        state = self.strategy.full_state_dict(model, "save_model")
        if self.state.process_index == 0:
            write_model_files(state, where, max_shard_size, safe_serialization)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """One pass of ``dataloader`` starting at batch ``num_batches`` of the epoch.

        Example::

            for batch in accelerator.skip_first_batches(train_dl, 10): ...
        """
        return skip_first_batches(dataloader, num_batches)


def _remove_unfinished(folder: StoragePath) -> None:
    """Remove a ``checkpoint_<n>`` that a killed save left without its manifest.

    Only a folder holding nothing but what a save writes is removed; anything else in it means
    it was not written by save_state, so it is left alone.
    """
    contents = list(folder.iterdir())
    ours = all(is_state_folder(p.name) or p.name.startswith(f".{MANIFEST}.") for p in contents)
    if not ours:
        warnings.warn(
            f"Ignoring {folder}: it holds no {MANIFEST} and files save_state did not write, "
            "so it is neither loaded nor counted towards total_limit.",
            stacklevel=4,
        )
        return
    warnings.warn(
        f"Removed {folder}: a save into it did not finish (no {MANIFEST}; the process was "
        "probably killed while saving). The newest complete checkpoint is unaffected.",
        stacklevel=4,
    )
    remove_tree(folder)
