"""The Accelerator's view of its device mesh: Accelerate's names for ranks and groups.

``torch_device_mesh`` (with the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp``), the ranks
along each dimension, which batch a rank reads, and ``maybe_context_parallel``. All of it
asks the strategy, which owns the mesh; without a ``ParallelismConfig`` there is none.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from notebook_kit.accelerator.parallelism_config import ParallelismConfig

__all__ = ["ParallelMethods"]


class ParallelMethods:
    """Mesh properties of :class:`~notebook_kit.accelerator.Accelerator` (Accelerate's names)."""

    strategy: Any
    num_processes: int
    process_index: int

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        """The ``ParallelismConfig`` in use (None without one)."""
        return getattr(self.strategy, "config", None)

    @property
    def torch_device_mesh(self) -> Any:
        """The ``DeviceMesh`` of the ``ParallelismConfig``, dimensions named as Accelerate's
        (``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, and the flattened ``dp``,
        ``dp_shard_cp``, ``dp_cp``); None without one.

        Example::

            accelerator.torch_device_mesh["dp_shard"].get_local_rank()
        """
        return getattr(self.strategy, "device_mesh", None)

    def _local_rank(self, dim: str, what: str) -> int:
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(
                f"{what} needs a ParallelismConfig: Accelerator(parallelism_config=...)."
            )
        if dim not in config.active_mesh_dims:
            return 0
        return int(self.torch_device_mesh.get_local_rank(dim))

    @property
    def tensor_parallel_rank(self) -> int:
        """This rank's index in its ``tp`` group (0 when tensor parallel is off)."""
        return self._local_rank("tp", "tensor_parallel_rank")

    @property
    def context_parallel_rank(self) -> int:
        """This rank's index in its ``cp`` group (0 when context parallel is off)."""
        return self._local_rank("cp", "context_parallel_rank")

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index along ``dp_replicate`` (0 when it is off)."""
        return self._local_rank("dp_replicate", "data_parallel_rank")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This rank's index along ``dp_shard`` (0 when it is off)."""
        return self._local_rank("dp_shard", "data_parallel_shard_rank")

    def _data_shards(self) -> tuple[int, int]:
        """(Shards of the data, the one this rank reads): every rank of a ``tp``/``cp`` group
        reads the same batch, so only the data-parallel ranks split the data."""
        data_parallel = getattr(self.strategy, "data_parallel", None)
        if data_parallel is None:
            return self.num_processes, self.process_index
        return data_parallel()

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: Sequence[torch.Tensor] | None = None,
        buffer_seq_dims: Sequence[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Split ``buffers`` along their sequence dims over the ``cp`` group for the block.

        With ``cp_size`` > 1 (GPUs, FSDP2) the attention inside runs as ring attention over
        the group's shards; otherwise the block runs unchanged, with a warning, as in
        Accelerate. Enter it anew for every step.

        Example::

            for batch in loader:
                with accelerator.maybe_context_parallel(
                        buffers=[batch["input_ids"], batch["labels"]], buffer_seq_dims=[1, 1]):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
        """
        config = self.parallelism_config
        if config is None or not config.cp_enabled:
            warnings.warn(
                "maybe_context_parallel has no effect: context parallel is off. Set "
                "ParallelismConfig(cp_size=...) above 1 to turn it on.",
                stacklevel=3,
            )
            yield
            return
        with self.strategy.context_parallel(buffers, buffer_seq_dims, no_restore_buffers):
            yield
