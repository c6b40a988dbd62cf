"""What torchrun starts on every process of ``notebook-kit launch``: the user's script, then a
clean exit.

The script runs as ``__main__`` exactly as ``python script.py`` would run it. Afterwards the
process leaves with ``os._exit`` once atexit handlers have run and the process group is gone:
torch's objects are then not torn down in the interpreter's arbitrary shutdown order, which
can abort (``terminate called without an active exception``) a rank whose work was done.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import sys
import traceback
from typing import NoReturn

import torch.distributed as dist


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
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


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
