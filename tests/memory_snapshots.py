"""A CUDA memory snapshot as ``torch.cuda.memory._snapshot()`` returns it, built by hand.

Its shape is torch's (``segments`` of ``blocks``, each block's ``frames`` innermost first, a
``device_traces`` list): what memory_viz reads and ``notebook_kit.worker.memory_summary``
summarises. Stands in for the allocator on machines without a GPU.
"""

from __future__ import annotations

import os
from typing import Any

import torch

TORCH = os.path.dirname(torch.__file__)
MiB = 2**20


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def block(size: int, frames: list[dict[str, Any]], state: str = "active_allocated") -> dict:
    return {
        "address": 139_800_000_000 + size,
        "size": size,
        "requested_size": size,
        "state": state,
        "frames": frames,
    }


def snapshot(user_file: str, big_line: int, small_line: int) -> dict[str, Any]:
    """Two segments: 512 MiB live from ``big_line`` (two blocks, made inside torch's Linear),
    96 MiB from ``small_line``, 64 MiB freed and 32 MiB awaiting another stream."""
    linear = frame(f"{TORCH}/nn/modules/linear.py", 125, "forward")
    module = frame(f"{TORCH}/nn/modules/module.py", 1786, "_call_impl")
    big = [linear, module, frame(user_file, big_line, "train")]
    small = [frame(user_file, small_line, "train")]
    first = [block(256 * MiB, big), block(256 * MiB, big), block(64 * MiB, [], "inactive")]
    second = [block(96 * MiB, small), block(32 * MiB, small, "active_awaiting_free")]
    segments = [
        _segment(first, 576 * MiB, 512 * MiB),
        _segment(second, 128 * MiB, 96 * MiB),
    ]
    oom = {"action": "oom", "size": 1024 * MiB, "stream": 0, "device_free": 12 * MiB, "frames": big}
    return {
        "segments": segments,
        "device_traces": [[oom]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    }


def _segment(blocks: list[dict], total: int, allocated: int) -> dict[str, Any]:
    return {
        "device": 0,
        "address": blocks[0]["address"],
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
    }
