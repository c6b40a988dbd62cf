"""What torchrun starts on every process of ``notebook-kit launch``: the user's script, then a
clean exit.

The script runs as ``__main__`` exactly as ``python script.py`` would run it. Afterwards the
process leaves with ``os._exit`` once atexit handlers have run and the process group is gone:
torch's objects are then not torn down in the interpreter's arbitrary shutdown order, which
can abort (``terminate called without an active exception``) a rank whose work was done.

A script written by ``notebook-kit export`` also calls two helpers from here:
:func:`print_once_per_node`, the notebook's output once per node and its launches' on every
process; :func:`join_job_group`, the job's process group joined before the notebook's cells;
and :func:`job_temporary_folder`, the folder the kernel would have made once and shared.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import sys
import tempfile
import threading
import traceback
from typing import Any, NoReturn

import torch.distributed as dist

from notebook_kit.worker.entry import exit_flushed


def main(argv: list[str] | None = None) -> NoReturn:
    """Run ``script [args...]`` as ``__main__`` and exit with its status."""
    script, *arguments = sys.argv[1:] if argv is None else argv
    sys.argv = [script, *arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as request:
        status = _exit_status(request.code)
    except BaseException as error:  # reported like the interpreter would, then exit 1
        traceback.print_exc()
        _record_for_torchrun(error)
        status = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    if status == 0 and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    exit_flushed(status)


class _ScriptStdout:
    """Standard output of a process a launcher started (``LOCAL_RANK`` set) for an exported
    notebook.

    Every process writes whole lines, each in one write followed by a flush: the processes of
    a node share one pipe, and a line written in pieces (``print`` writes its text and then its
    end) could otherwise be split by another process's line. A process that is not its node's
    first (``LOCAL_RANK`` > 0) lets through only what a launched function prints, as every
    rank's output shows in a notebook launch; the rest of the notebook's output is left to the
    node's first process, as the kernel shows it once.
    """

    def __init__(self, stream: Any, once_per_node: bool) -> None:
        self._stream = stream
        self._once_per_node = once_per_node
        self._pending = ""
        self._lock = threading.Lock()  # a training loop's threads print too

    def write(self, text: str) -> int:
        from notebook_kit.runtime.context import current_launch

        if self._once_per_node and current_launch() is None:
            return len(text)
        with self._lock:
            lines, newline, self._pending = (self._pending + text).rpartition("\n")
            if newline:
                self._stream.write(lines + newline)
                self._stream.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._stream.write(self._pending)
                self._pending = ""
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, isatty: the stream's
        return getattr(self._stream, name)


def print_once_per_node() -> None:
    """Under torchrun, show the notebook's own output once per node and what its launches
    print on every process, each line whole (see :class:`_ScriptStdout`). Errors show
    everywhere.

    Example::

        print_once_per_node()  # what an exported script does before its first cell
    """
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and not isinstance(sys.stdout, _ScriptStdout):
        sys.stdout = _ScriptStdout(sys.stdout, once_per_node=local_rank != "0")


def join_job_group() -> None:
    """Under torchrun, join the job's process group now, before the notebook's cells, so
    they can make something once for the job (:func:`job_temporary_folder` is a collective);
    every launch then runs in this group. Elsewhere, or with a group already: no-op.

    Example::

        join_job_group()  # first thing an exported script does
    """
    from notebook_kit.launch.calling_process import torchrun_place
    from notebook_kit.runtime.process_group import init_group_from_environment

    place = torchrun_place()
    if place is None or place.world_size == 1 or dist.is_initialized():
        return
    import torch

    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", place.local_rank) if use_cuda else None
    init_group_from_environment("nccl" if use_cuda else "gloo", device=device)


def job_temporary_folder(
    suffix: str | None = None, prefix: str | None = None, dir: str | None = None
) -> str:
    """``tempfile.mkdtemp``, made once for the job: rank 0 makes it and every process gets
    its name, as a kernel's folder is shared by the workers it forks. A collective in a
    joined group; without one, plain ``mkdtemp``.

    Example::

        runs = job_temporary_folder(prefix="runs-")  # the same folder on every process
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tempfile.mkdtemp(suffix, prefix, dir)
    made = [tempfile.mkdtemp(suffix, prefix, dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(made, src=0)
    folder = str(made[0])
    os.makedirs(folder, exist_ok=True)  # another machine: a folder of that name there
    return folder


def _record_for_torchrun(error: BaseException) -> None:
    """Write torchrun's error file, so it names the rank that failed first (by timestamp)
    rather than whichever rank's exit it happened to notice first."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    with contextlib.suppress(Exception):
        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(error)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
