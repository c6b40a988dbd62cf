"""The probe's questions, answered in a process started as a node process is: a child of the
engine worker's zygote, which imported torch, run with the node's environment.

Never imported by the engine worker (``node.probe`` names ``serve`` only as the zygote's
target): this is the one module under ``node/`` that imports torch, and it does so where a
node process would, so the answers are the node's. Which modules it can import and whether
the function unpickles depend on the node's ``sys.path``; how many GPUs it sees on its
``CUDA_VISIBLE_DEVICES`` and on the torch it runs, which the engine worker never loads.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import traceback

__all__ = ["answer", "serve"]


def serve(argv: list[str]) -> int:
    """In a zygote's child: a request on the first pipe, its answer on the second."""
    with os.fdopen(int(argv[0]), "rb") as requests:
        request = pickle.loads(requests.read())
    answered = pickle.dumps(answer(request))
    with os.fdopen(int(argv[1]), "wb") as answers:
        answers.write(answered)
    return 0


def answer(request: tuple) -> object:
    """The answer to one request of ``node.probe``.

    ``("missing", names)``: the names a node cannot import. ``("probe", (payload, count))``:
    why the payload cannot be unpickled here (None: it can) and, if ``count``, the GPUs
    torch sees here (else None).
    """
    kind, body = request
    if kind == "missing":
        return [name for name in body if not _importable(name)]
    payload, count = body
    return _rebuild_error(payload), (gpus_seen() if count else None)


def gpus_seen() -> int:
    """The GPUs this process's torch counts, as a node process's ``device_count`` would.

    ``device_count`` asks NVML first (no CUDA context, honouring ``CUDA_VISIBLE_DEVICES``),
    and the CUDA runtime only when NVML cannot answer; either way only in this short-lived
    child, never in the zygote the node processes are forked from.
    """
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # a torch that cannot count GPUs gives a node none to use
        return 0


def _rebuild_error(payload: bytes) -> str | None:
    import cloudpickle

    try:
        cloudpickle.loads(payload)
    except BaseException as error:  # what the node would meet, whatever it is
        lines = traceback.format_exception_only(type(error), error)
        return "".join(lines).strip()
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
