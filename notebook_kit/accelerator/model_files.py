"""Model weights as files other tools read: safetensors shards with an index, as Transformers
writes them, and a sharded (DCP) checkpoint merged into one safetensors file.

``save_pretrained`` layout: one ``model.safetensors``, or ``model-00001-of-0000N.safetensors``
files plus ``model.safetensors.index.json`` mapping each tensor to its file, so Transformers'
``from_pretrained`` (and ``safetensors.torch.load_file``) read what ``save_model`` wrote.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from notebook_kit.accelerator.checkpoint_files import (
    MANIFEST,
    CheckpointError,
    read_manifest,
    sharded_load_error,
)
from notebook_kit.accelerator.storage import (
    MissingRoot,
    StoragePath,
    check_root,
    is_local,
    storage_path,
)

__all__ = ["merge_sharded_weights", "parse_shard_size", "write_model_files"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_shard_size(size: int | str) -> int:
    """``max_shard_size`` in bytes: an int, or a string such as ``"10GB"`` or ``"500MiB"``.

    Example:
        >>> parse_shard_size("5MB")
        5000000
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"max_shard_size={size!r}: give a positive number of bytes or a string such as "
            "'10GB', '500MB' or '2GiB'."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Plain, contiguous CPU tensors; a tensor two names share is stored under each name
    (safetensors refuses shared storage, and ``load_state_dict`` wants every key)."""
    seen: set[int] = set()
    tensors = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        tensor = value.detach().cpu()
        pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else -1
        if pointer in seen:
            tensor = tensor.clone()
        seen.add(pointer)
        tensors[key] = tensor.contiguous()
    return tensors


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards


def write_model_files(
    state: dict[str, Any],
    directory: str | os.PathLike[str] | StoragePath,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[StoragePath]:
    """Write ``state`` as Transformers does; returns the files written.

    Example::

        write_model_files(model.state_dict(), "out", max_shard_size="1MB")
    """
    limit = parse_shard_size(max_shard_size)
    directory = storage_path(directory, name="save_directory")
    try:
        check_root(directory)  # mkdir would create a missing bucket
    except MissingRoot as error:
        raise CheckpointError(f"save_model to {directory}: {error} Nothing was saved.") from None
    directory.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(state)
    shards = _shards(tensors, limit)
    stem, suffix = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")
    names = (
        [f"{stem}.{suffix}"]
        if len(shards) == 1
        else [f"{stem}-{i:05d}-of-{len(shards):05d}.{suffix}" for i in range(1, len(shards) + 1)]
    )
    written = []
    for name, shard in zip(names, shards, strict=True):
        _write_shard(shard, directory / name, safe_serialization)
        written.append(directory / name)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": {
                key: name for name, shard in zip(names, shards, strict=True) for key in shard
            },
        }
        path = directory / f"{stem}.{suffix}.index.json"
        path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def _write_shard(shard: dict[str, torch.Tensor], path: StoragePath, safe: bool) -> None:
    if not safe:
        with path.open("wb") as handle:
            torch.save(shard, handle)
        return
    try:
        from safetensors.torch import save, save_file
    except ImportError as error:
        raise ImportError(
            "save_model(..., safe_serialization=True) needs safetensors: "
            "pip install 'notebook_kit[fsdp]' (or pass safe_serialization=False)."
        ) from error
    if is_local(path):
        save_file(shard, str(path), metadata={"format": "pt"})
    else:
        path.write_bytes(save(shard, metadata={"format": "pt"}))


def _dcp_folder(checkpoint: Path) -> Path:
    """The DCP folder of model 0 in ``checkpoint``: given directly, or inside a save_state
    checkpoint (its manifest names the state folder)."""
    if (checkpoint / ".metadata").is_file():
        return checkpoint
    if (checkpoint / MANIFEST).is_file():
        folder = checkpoint / read_manifest(checkpoint)["folder"] / "pytorch_model_fsdp_0"
        if (folder / ".metadata").is_file():
            return folder
    raise FileNotFoundError(
        f"{checkpoint} is not a sharded checkpoint: give the folder save_state wrote with FSDP "
        "(SHARDED_STATE_DICT), or its pytorch_model_fsdp_<i> folder."
    )


def merge_sharded_weights(
    checkpoint: str | os.PathLike[str], output: str | os.PathLike[str]
) -> Path:
    """Merge a sharded model checkpoint into ``output/model.safetensors`` (no processes needed).

    Raises:
        FileNotFoundError: ``checkpoint`` is not a sharded checkpoint.
        CheckpointError: It is one, but damaged: a shard missing or unreadable (named).

    Example::

        merge_sharded_weights("ckpt/checkpoint_3", "merged")
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = _dcp_folder(Path(checkpoint))
    with tempfile.TemporaryDirectory() as scratch:
        merged = Path(scratch) / "merged.pt"
        try:
            dcp_to_torch_save(folder, merged)
        except CheckpointException as error:  # a BaseException: ``except Exception`` misses it
            raise sharded_load_error(error, folder) from error
        state = torch.load(merged, map_location="cpu", weights_only=True)
    if set(state) == {"model"}:  # how save_state nests it
        state = state["model"]
    write_model_files(state, output, max_shard_size=2**62)  # one file
    return Path(output) / "model.safetensors"
