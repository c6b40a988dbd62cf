"""Pickling what a worker sends to the kernel, with every device tensor moved to the CPU.

Unpickling a CUDA tensor in the kernel would initialise CUDA there, and a kernel holding a
CUDA context can no longer fork workers that use the GPU. So tensors (and random generators)
leave a worker on the CPU, wherever they sit inside the value (nested containers, objects,
parameters); the kernel gets the same values with ``device == cpu``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import cloudpickle
import torch
from torch import nn

__all__ = ["dumps_for_kernel", "reduce_on_host"]


def reduce_on_host(obj: Any) -> Any:
    """A pickler's ``reducer_override`` step: a device tensor is reduced as its CPU copy.

    Returns ``NotImplemented`` for everything else, so a pickler can chain it with its own.

    Example:
        >>> reduce_on_host(1)
        NotImplemented
    """
    if isinstance(obj, torch.Generator):
        return _generator_on_host(obj)
    if not isinstance(obj, torch.Tensor) or obj.device.type in ("cpu", "meta"):
        return NotImplemented  # everything else pickles as usual
    host = obj.detach().cpu()
    if isinstance(obj, nn.Parameter):
        host = nn.Parameter(host, requires_grad=obj.requires_grad)
    elif obj.requires_grad:
        host.requires_grad_(True)
    return host.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


def _generator_on_host(generator: torch.Generator) -> Any:
    """A GPU generator is reduced as a CPU generator with the same seed.

    Pickled as it is, it would be rebuilt on its GPU in the kernel, initialising CUDA there.
    A CUDA generator's state (seed and offset of a counter-based generator) means nothing to a
    CPU one, so the seed is what comes home: ``initial_seed()`` is kept, the position is not.
    """
    if generator.device.type == "cpu":
        return NotImplemented
    host = torch.Generator()
    host.manual_seed(generator.initial_seed())
    return host.__reduce__()


class _HostPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        return reduce_on_host(obj)


class _HostCloudPickler(cloudpickle.Pickler):
    """cloudpickle, with tensors moved to the CPU on the way."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = reduce_on_host(obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced


def dumps_for_kernel(obj: Any, *, by_value: bool = False) -> bytes:
    """``pickle.dumps(obj)``, with tensors on any device stored as CPU tensors.

    ``by_value``: classes and functions defined on the workers travel by value (cloudpickle),
    as a pool call's result must, since the kernel cannot import them.

    Example::

        pickle.loads(dumps_for_kernel({"w": torch.ones(2, device="cuda")}))["w"].device
        # device(type='cpu')
    """
    buffer = io.BytesIO()
    pickler = _HostCloudPickler if by_value else _HostPickler
    pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
