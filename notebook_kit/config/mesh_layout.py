"""Where each rank sits in a device mesh: pure arithmetic over the parallelism sizes.

A ``ParallelismConfig`` (``dp_replicate × dp_shard × cp × tp``, Accelerate's names and
order) lays the ranks out row-major, ``tp`` innermost, as ``init_device_mesh`` does: ranks
that differ only in their ``tp`` coordinate are neighbours, and so sit on the same node.
:class:`MeshLayout` answers, without any process group, what the launch, the banner, the
environment report and a failure message need: a rank's coordinates, which ranks form each
group, and whether the groups fit the nodes. The Accelerator builds the real ``DeviceMesh``
from the same layout.

Example:
    >>> layout = MeshLayout.of({"dp_replicate": 2, "dp_shard": 2})
    >>> layout.coordinates(3)
    {'dp_replicate': 1, 'dp_shard': 1}
    >>> layout.groups("dp_shard")
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MESH_ORDER", "MeshLayout", "check_mesh_fits"]

# Accelerate's canonical order: the outermost dimension first, tensor parallel innermost (its
# all-reduces run every layer, so its ranks must be the closest ones).
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "tp")
# Dimensions Accelerate flattens, and what each joins (only the enabled ones of each).
FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


@dataclass(frozen=True)
class MeshLayout:
    """The enabled dimensions (size > 1) of a mesh, outermost first.

    Attributes:
        names: Dimension names in ``MESH_ORDER``.
        sizes: Their sizes, in the same order.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, sizes: Mapping[str, int]) -> MeshLayout:
        """The layout of the dimensions in ``sizes`` larger than 1, in Accelerate's order."""
        unknown = set(sizes) - set(MESH_ORDER)
        if unknown:
            raise ValueError(f"Unknown mesh dimensions {sorted(unknown)}; known: {MESH_ORDER}.")
        enabled = [name for name in MESH_ORDER if sizes.get(name, 1) > 1]
        return cls(tuple(enabled), tuple(sizes[name] for name in enabled))

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    def size(self, name: str) -> int:
        """The size of dimension ``name`` (1 when it is not enabled)."""
        return self.sizes[self.names.index(name)] if name in self.names else 1

    def flattened(self) -> dict[str, tuple[str, ...]]:
        """Accelerate's joint dimensions that exist here: name -> the dimensions it joins."""
        joined = {}
        for name, parts in FLATTENED.items():
            present = tuple(part for part in parts if part in self.names)
            if present:
                joined[name] = present
        return joined

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index along each dimension (row-major, the last one fastest)."""
        coordinates: dict[str, int] = {}
        for name, size in zip(reversed(self.names), reversed(self.sizes), strict=True):
            rank, coordinates[name] = divmod(rank, size)
        return {name: coordinates[name] for name in self.names}

    def groups(self, name: str) -> list[list[int]]:
        """The ranks of each group along ``name`` (a flattened name joins its dimensions).

        Ranks in one group differ only in the coordinates of ``name``; every rank is in one.
        """
        joined = self.flattened().get(name, (name,))
        missing = [part for part in joined if part not in self.names]
        if missing:
            raise KeyError(f"The mesh has no dimension {name!r}; it has {self.all_names()}.")
        found: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            where = self.coordinates(rank)
            key = tuple(where[other] for other in self.names if other not in joined)
            found.setdefault(key, []).append(rank)
        return list(found.values())

    def all_names(self) -> list[str]:
        """Every dimension name ``accelerator.torch_device_mesh`` answers to."""
        return [*self.names, *self.flattened()]

    def where(self, rank: int) -> str:
        """``rank``'s coordinates as text: ``dp_replicate=1, dp_shard=0``."""
        return ", ".join(f"{name}={index}" for name, index in self.coordinates(rank).items())

    def describe(self, limit: int = 4) -> str:
        """One line for the banner: the shape, then each dimension's groups of ranks.

        Example:
            >>> print(MeshLayout.of({"dp_shard": 2, "tp": 2}).describe())
            Mesh dp_shard 2 × tp 2: dp_shard groups [0 2] [1 3]; tp groups [0 1] [2 3]
        """
        pairs = zip(self.names, self.sizes, strict=True)
        shape = " × ".join(f"{name} {size}" for name, size in pairs)
        parts = []
        for name in self.names:
            groups = self.groups(name)
            shown = " ".join("[" + " ".join(map(str, group)) + "]" for group in groups[:limit])
            more = f" … {len(groups) - limit} more" if len(groups) > limit else ""
            parts.append(f"{name} groups {shown}{more}")
        return f"Mesh {shape}: " + "; ".join(parts)


def check_mesh_fits(layout: MeshLayout, processes_per_node: int, num_nodes: int) -> None:
    """Refuse a mesh the launch cannot lay out on its nodes, before anything starts.

    The sizes must multiply to the world size. When ``dp_replicate`` is to span the nodes
    (HSDP across machines), each ``dp_shard`` × ``cp`` × ``tp`` block must fit on one node,
    so that a shard's all-gathers stay on the node's own links.

    Raises:
        ValueError: Naming every size, the world size and the fix.
    """
    world = processes_per_node * num_nodes
    sizes = ", ".join(f"{name}_size={layout.size(name)}" for name in MESH_ORDER)
    if layout.world_size != world:
        raise ValueError(
            f"ParallelismConfig sizes {sizes} multiply to {layout.world_size}, but the launch "
            f"has world size {world} ({num_nodes} node(s) × {processes_per_node} process(es)). "
            "Make dp_replicate_size × dp_shard_size × cp_size × tp_size equal the world size."
        )
    if num_nodes == 1 or layout.size("dp_replicate") == 1:
        return
    inner = layout.world_size // layout.size("dp_replicate")
    if processes_per_node % inner:
        raise ValueError(
            f"ParallelismConfig sizes {sizes} ask for HSDP across {num_nodes} nodes of "
            f"{processes_per_node} process(es), but a dp_shard × cp × tp group of {inner} ranks "
            f"would span nodes. Choose dp_shard_size × cp_size × tp_size dividing "
            f"{processes_per_node} (e.g. dp_shard_size={processes_per_node}, "
            f"dp_replicate_size={num_nodes}), so that the shards stay within each node."
        )
