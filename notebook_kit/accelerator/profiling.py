"""``accelerator.profile()`` and its ``ProfileKwargs``, with Accelerate's fields and file names.

The profiler is torch's own (``torch.profiler.profile``); what this adds is what Accelerate
adds: the handler's fields checked (here when the object is made, naming the field, rather than
when the block starts), and one Chrome trace per rank, ``profile_<process index>.json`` in
``output_trace_dir``, written when the block ends, after which every rank waits for the others
(so no rank reads a folder another is still writing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from notebook_kit.accelerator.configuration import KwargsHandler

__all__ = ["ProfileKwargs", "profile_block", "trace_name"]

ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]
_ALWAYS = ("cpu", "cuda")  # as in Accelerate: torch warns itself when CUDA is not there
_WHEN_AVAILABLE = ("xpu", "mtia")  # taken only where torch has the device
_NEEDED_KEYS = ("wait", "warmup", "active")  # torch.profiler.schedule's keyword-only arguments
_OPTIONAL_KEYS = ("repeat", "skip_first", "skip_first_wait")
_FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def trace_name(process_index: int) -> str:
    """The Chrome trace one rank writes, named as Accelerate names it.

    Example:
        >>> trace_name(1)
        'profile_1.json'
    """
    return f"profile_{process_index}.json"


@dataclass
class ProfileKwargs(KwargsHandler):
    """How ``accelerator.profile()`` builds its ``torch.profiler.profile`` (Accelerate's fields).

    Attributes:
        activities: What to record: ``"cpu"``, ``"cuda"`` (and ``"xpu"``/``"mtia"`` where
            torch has that device); None: torch's default (CPU, and CUDA when available).
        schedule_option: ``torch.profiler.schedule``'s arguments: ``wait``, ``warmup`` and
            ``active`` (needed), ``repeat``, ``skip_first`` and ``skip_first_wait``; the
            block's ``prof.step()`` calls move through it. None: record the whole block.
        on_trace_ready: Called with the profiler each time a scheduled cycle is recorded.
        record_shapes, profile_memory, with_stack, with_flops, with_modules: torch's flags.
        output_trace_dir: Folder for one Chrome trace per rank, ``profile_<rank>.json``,
            written when the block ends (open them in ``chrome://tracing`` or Perfetto).
            None: no file.

    Raises:
        ValueError: An unknown activity, a schedule key missing or unknown, a negative count.
        TypeError: A field of the wrong type; each message names the field.

    Example::

        kwargs = ProfileKwargs(activities=["cpu"], output_trace_dir="traces")
        accelerator = Accelerator(kwargs_handlers=[kwargs])
        with accelerator.profile() as prof:
            train_step()
        print(prof.key_averages().table(row_limit=5))
    """

    activities: list[ProfilerActivity] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        if self.activities is not None:
            _profiler_activities(self.activities)
        if self.schedule_option is not None:
            _check_schedule(self.schedule_option)
        if self.on_trace_ready is not None and not callable(self.on_trace_ready):
            raise TypeError(
                f"ProfileKwargs.on_trace_ready must be a function taking the profiler, or None; "
                f"got {self.on_trace_ready!r}."
            )
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"ProfileKwargs.{name} must be True or False, got {getattr(self, name)!r}."
                )
        if self.output_trace_dir is not None and not isinstance(
            self.output_trace_dir, str | os.PathLike
        ):
            raise TypeError(
                f"ProfileKwargs.output_trace_dir must be a folder path or None, got "
                f"{self.output_trace_dir!r}."
            )

    def build(self) -> torch.profiler.profile:
        """The ``torch.profiler.profile`` these fields describe (not started)."""
        schedule = None
        if self.schedule_option is not None:
            schedule = torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=_profiler_activities(self.activities) if self.activities else None,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


def _profiler_activities(names: Any) -> list[torch.profiler.ProfilerActivity]:
    """torch's activity for each name; an unknown or unavailable one is refused by name."""
    if isinstance(names, str) or not isinstance(names, list | tuple):
        raise TypeError(f"ProfileKwargs.activities must be a list such as ['cpu'], got {names!r}.")
    usable = [*_ALWAYS, *(name for name in _WHEN_AVAILABLE if _available(name))]
    activities = []
    for name in names:
        if name not in usable:
            absent = name in (*_WHEN_AVAILABLE, "hpu")
            why = " (torch has no such device here)" if absent else ""
            raise ValueError(
                f"ProfileKwargs.activities: {name!r} is not an activity{why}; use "
                f"{', '.join(repr(word) for word in usable)}."
            )
        activities.append(getattr(torch.profiler.ProfilerActivity, name.upper()))
    return activities


def _available(device: str) -> bool:
    module = getattr(torch, device, None)
    return bool(module is not None and module.is_available())


def _check_schedule(option: Any) -> None:
    """``option`` as ``torch.profiler.schedule`` takes it, or an error naming the key."""
    if not isinstance(option, Mapping):
        raise TypeError(
            f"ProfileKwargs.schedule_option must be a dict such as "
            f"dict(wait=1, warmup=1, active=3), got {option!r}."
        )
    missing = [key for key in _NEEDED_KEYS if key not in option]
    unknown = [key for key in option if key not in (*_NEEDED_KEYS, *_OPTIONAL_KEYS)]
    if missing or unknown:
        problem = f"lacks {', '.join(map(repr, missing))}" if missing else ""
        problem += " and " if missing and unknown else ""
        problem += f"has unknown {', '.join(map(repr, unknown))}" if unknown else ""
        raise ValueError(
            f"ProfileKwargs.schedule_option {problem}: it needs 'wait', 'warmup' and "
            f"'active'; 'repeat', 'skip_first' and 'skip_first_wait' may be added."
        )
    for key, value in option.items():
        least = 1 if key == "active" else 0  # a cycle that records nothing is not a schedule
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(
                f"ProfileKwargs.schedule_option[{key!r}] must be an integer >= {least}, "
                f"got {value!r}."
            )


@contextlib.contextmanager
def profile_block(
    handler: ProfileKwargs, process_index: int, wait_for_everyone: Callable[[], None]
) -> Iterator[torch.profiler.profile]:
    """Profile the block; then, with ``output_trace_dir``, write this rank's trace and wait for
    every rank. A block that raises writes nothing, as in Accelerate."""
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    folder = os.fspath(handler.output_trace_dir)
    os.makedirs(folder, exist_ok=True)
    profiler.export_chrome_trace(os.path.join(folder, trace_name(process_index)))
    wait_for_everyone()
