"""The payload of a cluster run: the function and its arguments, pickled so the nodes rebuild them.

cloudpickle sends what a notebook cell defines by value and refers to everything else by
module and name, which a node then imports. A module the kernel imports from a folder the
nodes do not have (one added to ``sys.path`` at run time, a file sent with
a Dask ``client.upload_file``, a helper folder) would fail there with ``ModuleNotFoundError``. So
the chosen workers are asked, each in a process started as its node process will be
(:func:`notebook_kit.node.probe.missing_modules`), which of the modules the payload refers to
they cannot import; those the kernel has as Python source are then sent by value, and the
question is asked again for the modules their code refers to in turn. What still cannot be
sent (a compiled extension, a package the nodes lack) is left to the probe, whose verdict
names the module and the fix before any rank starts.

Example::

    payload = engine.ship(workers, ((train, (), {}), []))  # payload_asking, on engine.ask
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from notebook_kit.node.probe import missing_modules

__all__ = ["payload_asking", "pickle_recording_modules"]

_ROUNDS = 4  # modules sent by value may refer to others the nodes lack; rarely more than 2


def payload_asking(ask: Callable[..., list[Any]], obj: Any) -> bytes:
    """``obj`` pickled so every chosen worker can rebuild it in its node process; ``ask(f,
    *args)`` runs ``f(*args)`` once on each chosen worker (any engine) and returns the answers."""
    by_value: set[str] = set()
    asked: set[str] = set()
    data, referenced = pickle_recording_modules(obj, by_value)
    for _ in range(_ROUNDS):
        question = sorted(_could_be_missing(referenced) - asked - by_value)
        if not question:
            break
        asked.update(question)
        answers = ask(missing_modules, question)
        missing = {name for answer in answers for name in answer}
        sendable = {name for name in missing if _sendable_by_value(name)}
        if not sendable:
            break
        by_value |= sendable
        data, referenced = pickle_recording_modules(obj, by_value)
    return data


def pickle_recording_modules(obj: Any, by_value: Iterable[str] = ()) -> tuple[bytes, set[str]]:
    """``obj`` cloudpickled with the modules ``by_value`` sent by value, and the top-level
    names of the modules the pickle refers to by name (which a node must import).

    Example:
        >>> import json
        >>> sorted(pickle_recording_modules((json.dumps, 1))[1])
        ['json']
    """
    modules = [sys.modules[name] for name in sorted(set(by_value)) if name in sys.modules]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    buffer = io.BytesIO()
    try:
        pickler = _RecordingPickler(buffer)
        pickler.dump(obj)
    finally:  # registering is cloudpickle-wide: it lasts only for this pickle
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    return buffer.getvalue(), pickler.referenced - set(by_value)


class _RecordingPickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.referenced: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.referenced.add(obj.__name__.split(".", 1)[0])
        elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str):
                self.referenced.add(module.split(".", 1)[0])
        return super().reducer_override(obj)


# What every node has: the node process runs on them, and the probe checks their versions.
_ON_EVERY_NODE = frozenset({"__main__", "cloudpickle", "notebook_kit", "torch"})


def _could_be_missing(names: set[str]) -> set[str]:
    """Modules a node might lack: not the standard library, not what every node runs on."""
    standard = sys.stdlib_module_names | set(sys.builtin_module_names) | _ON_EVERY_NODE
    return {name for name in names if name not in standard}


def _sendable_by_value(name: str) -> bool:
    """Whether the kernel has ``name`` as Python code (a compiled extension cannot travel)."""
    module = sys.modules.get(name)
    if module is None:
        return False
    path = getattr(module, "__file__", None)
    return path is None or str(path).endswith(".py")
