"""Whether a pool command carries a reload order, and what it ships: the kernel side of reloading.

A pool's ``reload`` setting: ``"auto"`` reloads edited user modules on every rank before each
cell, call and push (:mod:`notebook_kit.worker.pool.reloading` does it there); ``"off"`` runs
on the code the workers hold. Left unset (None), the pool follows IPython's ``%autoreload``
in this kernel: off after ``%autoreload 0`` (or ``off``), on otherwise, and on where the
extension is not loaded. A cell's ``%%distributed --reload`` overrides it for that cell.

Locally the workers see the kernel's files and check their mtimes themselves: the order is
empty, and nothing changed costs one ``stat`` per user module on each rank. A cluster's nodes
may hold other copies of the files (or none), so the kernel ships the text of each user
module it has loaded whose file changed since it last shipped (or since the pool started),
checked to compile first: a syntax error is named here, before anything is sent.

Runs in the kernel.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Literal

from notebook_kit.runtime.pool_commands import (
    PoolCall,
    PoolCell,
    PoolCommand,
    PoolPush,
    ReloadOrder,
    ShippedSource,
)
from notebook_kit.worker.pool.reloading import ModuleReloadError, PoolReloader, source_file_of

__all__ = ["RELOAD_CHOICES", "ReloadMode", "ReloadPolicy", "check_reload", "kernel_autoreload"]

ReloadMode = Literal["auto", "off"]
RELOAD_CHOICES: tuple[ReloadMode, ...] = ("auto", "off")


def check_reload(value: Any, name: str = "reload") -> ReloadMode | None:
    """``value`` if it is a reload mode (or None), else a ``ValueError`` naming ``name``.

    Example:
        >>> check_reload("off")
        'off'
    """
    if value is None or value in RELOAD_CHOICES:
        return value
    raise ValueError(
        f"{name}={value!r}: choose 'auto' (edited modules of your own are reloaded on every "
        "rank before each command) or 'off' (the workers keep the code they loaded); leave it "
        "out to follow %autoreload."
    )


def kernel_autoreload() -> bool | None:
    """Whether IPython's ``%autoreload`` is on in this kernel; None where it is not loaded."""
    module = sys.modules.get("IPython")
    shell = module.get_ipython() if module is not None else None  # type: ignore[attr-defined]
    if shell is None:
        return None
    magics = shell.magics_manager.registry.get("AutoreloadMagics")
    reloader = getattr(magics, "_reloader", None)
    return None if reloader is None else bool(reloader.enabled)


class ReloadPolicy:
    """A pool's reload setting, and the order it adds to each command.

    Example::

        policy = ReloadPolicy("auto", ship=False)
        command = policy.attach(PoolCell("f()", "<cell>", b""))  # command.reload: an order
    """

    def __init__(self, mode: ReloadMode | None, ship: bool) -> None:
        self.mode = check_reload(mode)
        # The kernel's user modules and their files' mtimes when last shipped (or first seen:
        # what the kernel holds at the start is what the nodes start from).
        self._shipped = PoolReloader() if ship else None

    def active(self, override: ReloadMode | None = None) -> bool:
        """Whether a command now reloads: ``override``, else the setting, else %autoreload."""
        mode = check_reload(override, "--reload") or self.mode
        if mode is None:
            return kernel_autoreload() is not False
        return mode == "auto"

    def attach(self, command: PoolCommand, override: ReloadMode | None = None) -> PoolCommand:
        """``command`` with its reload order, when it runs code and reloading is on.

        Raises:
            ModuleReloadError: (a cluster pool) an edited module does not compile.
        """
        if not isinstance(command, PoolCell | PoolCall | PoolPush) or not self.active(override):
            return command
        shipped = self._ship() if self._shipped is not None else ()
        return dataclasses.replace(command, reload=ReloadOrder(shipped))

    def _ship(self) -> tuple[ShippedSource, ...]:
        changed = self._changed()
        sources = []
        for name, (filename, _) in changed.items():
            with open(filename, encoding="utf-8") as file:
                text = file.read()
            try:
                compile(text, filename, "exec")
            except (SyntaxError, ValueError) as error:
                raise ModuleReloadError(_not_importing(name, filename, error)) from None
            sources.append(ShippedSource(name, text))
        assert self._shipped is not None
        for name, (_, mtime) in changed.items():  # sent: the next change is news again
            self._shipped.mtimes[name] = mtime
        return tuple(sources)

    def _changed(self) -> dict[str, tuple[str, float]]:
        """The kernel's user modules whose file changed since last shipped; new ones are
        recorded as they are (the nodes import those files themselves)."""
        assert self._shipped is not None
        self._shipped.note_new_modules()
        changed = {}
        for name, known in list(self._shipped.mtimes.items()):
            filename = source_file_of(name)
            if filename is None:
                continue
            try:
                mtime = os.stat(filename).st_mtime
            except OSError:
                continue
            if mtime > known:
                changed[name] = (filename, mtime)
        return changed


def _not_importing(name: str, filename: str, error: BaseException) -> str:
    line = getattr(error, "lineno", None)
    where = f"{filename}, line {line}" if line else filename
    return (
        f"module {name!r} ({where}) was edited and no longer imports: "
        f"{type(error).__name__}: {error}. Nothing was sent: the nodes keep its old code; fix "
        "the file and run the command again (reload='off' runs on the old code)."
    )
