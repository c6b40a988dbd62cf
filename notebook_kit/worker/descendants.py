"""Finding every process below a given one, from ``/proc`` (Linux).

``/proc/PID/task/TID/children`` is not compiled into every kernel, so the tree is rebuilt from
each process's parent pid in ``/proc/PID/stat``: one pass over ``/proc``, a few milliseconds
for a few hundred processes.
"""

from __future__ import annotations

import os

__all__ = ["descendants"]


def descendants(root: int) -> list[int]:
    """Pids of every process whose chain of parents reaches ``root``, nearest first.

    Example:
        >>> os.getpid() in descendants(os.getppid())
        True
    """
    children: dict[int, list[int]] = {}
    for pid, parent in _parents():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        below = [child for pid in frontier for child in children.get(pid, ())]
        found += below
        frontier = below
    return found


def _parents() -> list[tuple[int, int]]:
    """``(pid, parent pid)`` of every process now listed in ``/proc``."""
    pairs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = text[text.rindex(b")") + 2 :].split()
        pairs.append((int(name), int(fields[1])))
    return pairs
