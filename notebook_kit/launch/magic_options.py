"""The options of a ``%%distributed`` cell: which ranks, blocking or not, where values and lines go.

They follow ipyparallel's ``%%px`` (``--targets``, ``--noblock``, ``--local``, ``-o``,
``--group-outputs``), with this pool's words: ``--ranks 1,2`` or ``--ranks 0:4:2`` (a Python
slice of the pool's ranks), ``--noblock``, ``--local``, ``--out NAME``, ``--group-outputs``
(rank by rank, the default) or ``--interleave`` (lines as they arrive, each after its rank),
``--pdb`` (a cell that fails on a rank opens pdb in that rank's failing frame, at once), and
``--reload auto|off`` (whether edited modules are reloaded on the ranks first: for this cell;
on the line form, for the pool from now on).
Everything here is checked before anything runs, and a bad option is IPython's ``UsageError``
naming the option and the fix. The magic itself is :mod:`notebook_kit.launch.magic`.

Runs in the kernel.
"""

from __future__ import annotations

import argparse
import keyword
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError

__all__ = [
    "CELL_ONLY",
    "CellOptions",
    "RankChoice",
    "out_name",
    "parse_ranks",
    "refuse_cell_options",
    "reload_word",
    "usage_error",
]

# Options that mean something for a cell only, as the line form would ignore them.
CELL_ONLY = ("ranks", "noblock", "local", "out", "group_outputs", "interleave", "pdb")

_OPTIONS = (
    "-n, --pool, --cluster, --num-nodes, --ranks, --noblock, --local, --out, --group-outputs, "
    "--interleave, --pdb, --reload"
)


@dataclass(frozen=True)
class RankChoice:
    """The ranks a cell runs on, as written: listed ranks, or a slice of the pool's ranks."""

    text: str
    listed: tuple[int, ...] = ()
    sliced: slice | None = None

    def resolve(self, world_size: int) -> list[int]:
        """The pool's ranks this choice names, or ``UsageError`` when one is not there.

        Example:
            >>> parse_ranks("0:4:2").resolve(4), parse_ranks("1,2").resolve(3)
            ([0, 2], [1, 2])
        """
        if self.sliced is not None:
            chosen = list(range(world_size))[self.sliced]
            if not chosen:
                raise UsageError(
                    f"--ranks {self.text} selects none of the pool's {world_size} ranks "
                    f"(0 to {world_size - 1}); pick ranks from that range."
                )
            return chosen
        missing = [rank for rank in self.listed if rank >= world_size]
        if missing:
            raise UsageError(
                f"--ranks {self.text}: the pool has {world_size} ranks (0 to {world_size - 1}), "
                f"so rank {missing[0]} is not there; pick ranks from that range, or start a "
                f"larger pool with `%%distributed -n {missing[0] + 1}`."
            )
        return sorted(set(self.listed))


def parse_ranks(text: str) -> RankChoice:
    """``--ranks``'s value: ``1,2`` (listed ranks) or ``start:stop[:step]`` (a slice).

    Raises ``argparse.ArgumentTypeError``, which IPython shows as a ``UsageError`` naming
    ``--ranks``.

    Example:
        >>> parse_ranks("1, 2").listed, parse_ranks("::2").sliced
        ((1, 2), slice(None, None, 2))
    """
    written = text.strip().strip("'\"").strip()  # IPython passes quotes through: --ranks ''
    fix = "write ranks as 1,2 or as a slice start:stop:step such as 0:4:2"
    if not written:
        raise argparse.ArgumentTypeError(f"no ranks given; {fix}.")
    try:
        if ":" in written:
            parts = [int(part) if part.strip() else None for part in written.split(":")]
            if len(parts) > 3 or any(part is not None and part < 0 for part in parts):
                raise ValueError(written)
            if len(parts) == 3 and parts[2] == 0:
                raise ValueError(written)
            return RankChoice(written, sliced=slice(*parts))
        listed = tuple(int(part) for part in written.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a set of ranks; {fix}.") from None
    if any(rank < 0 for rank in listed):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks count from 0; {fix}.")
    return RankChoice(written, listed=listed)


def reload_word(text: str) -> str:
    """``--reload``'s value: ``auto`` or ``off``.

    Example:
        >>> reload_word("off")
        'off'
    """
    word = text.strip().strip("'\"").lower()
    if word not in ("auto", "off"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a reload mode; write --reload auto (reload edited modules of "
            "your own on every rank first) or --reload off (keep the code the workers loaded)."
        )
    return word


def out_name(text: str) -> str:
    """``--out``'s value: a Python name for the kernel's ``{rank: value}``.

    Example:
        >>> out_name("values")
        'values'
    """
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Python name; give the variable to set, e.g. --out values."
        )
    return text


@dataclass(frozen=True)
class CellOptions:
    """A cell's options, checked together: what runs where, and how it is shown."""

    ranks: RankChoice | None
    noblock: bool
    local: bool
    out: str | None
    interleave: bool
    pdb: bool = False  # a failure opens pdb on the failing rank, in this cell
    reload: str | None = None  # "auto"/"off" for this cell; None: the pool's setting

    @classmethod
    def from_arguments(cls, options: Any) -> CellOptions:
        """Check the options that only make sense together, before anything starts."""
        if options.group_outputs and options.interleave:
            raise UsageError(
                "--group-outputs and --interleave choose opposite layouts of the workers' "
                "lines: give one (--group-outputs, rank by rank, is the default)."
            )
        if options.noblock and options.local:
            raise UsageError(
                "--local runs the cell in the kernel after the ranks, which a --noblock cell "
                "does not wait for: drop one of them (or run the kernel's part in the next "
                "cell, after `%distributed wait`)."
            )
        if options.noblock and options.pdb:
            raise UsageError(
                "--pdb asks pdb's prompt in this cell when the cell fails, but a --noblock cell "
                "returns at once: drop --noblock, or leave --pdb out and call pool.debug() "
                "after `%distributed wait` shows the failure."
            )
        return cls(
            options.ranks, options.noblock, options.local, options.out, options.interleave,
            options.pdb, options.reload,
        )  # fmt: skip


def refuse_cell_options(options: Any) -> None:
    """The line form (``%distributed``) with an option that only a cell means."""
    for name in CELL_ONLY:
        if getattr(options, name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} is an option of a %%distributed cell: write it on the cell's first "
                f"line, `%%distributed {flag} ...`, with the code below it."
            )


def usage_error(error: UsageError) -> UsageError:
    """IPython's parse error, with the options this magic knows and where they are described."""
    said = str(error).rstrip(".")
    return UsageError(f"%%distributed: {said}. Its options: {_OPTIONS} (`%distributed?`).")
