"""Asking a question in a short-lived forked child, the questions that count GPUs without
initialising CUDA here, and what the CUDA driver's answers mean.

Whatever the child initialises (CUDA above all) dies with it, so the caller stays fork-safe.
No wait here is unbounded: a child stuck in a hung GPU driver ignores even SIGKILL (it sleeps
uninterruptibly in the kernel), and a blocking ``waitpid`` on it would hang the notebook
kernel for good. Such a child is given up after a grace, and reaped later if it ever exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_SUCCESS",
    "describe_gpus_here",
    "driver_error",
    "nvml_count",
    "run_in_fork",
]

_T = TypeVar("_T")
_PROBE_TIMEOUT_S = 60.0
_EXIT_GRACE_S = 5.0  # a probe that answered gets this long to exit before SIGKILL
_KILL_GRACE_S = 2.0  # and this long after SIGKILL before it is given up
# Probe children that did not die even of SIGKILL (a hung driver holds them in the kernel's
# uninterruptible sleep): reaped later if they ever exit, never waited for.
_abandoned_probes: set[int] = set()

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3  # what cuInit answers in a child forked after it ran
CUDA_ERROR_NO_DEVICE = 100  # a driver, but no GPU: nothing to say
# What the driver's other answers mean, for the banner of a run that therefore uses the CPU.
_CUDA_ERRORS = {
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    34: "CUDA_ERROR_STUB_LIBRARY: the driver library found is a stub, not a real driver",
    101: "CUDA_ERROR_INVALID_DEVICE: CUDA_VISIBLE_DEVICES names no usable GPU",
    802: "CUDA_ERROR_SYSTEM_NOT_READY: the system is not ready (is the fabric manager running?)",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: the kernel driver and the CUDA driver library "
    "differ in version (reboot, or reinstall the driver)",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: the CUDA compatibility package does not "
    "support this GPU",
    999: "CUDA_ERROR_UNKNOWN: the driver failed (often after a GPU fault, or a missing "
    "/dev/nvidia-uvm)",
}


def driver_error(status: int | None) -> str | None:
    """What a ``cuInit`` answer means for the run, or None when it leaves nothing to say."""
    if status in (None, CUDA_SUCCESS, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NO_DEVICE):
        return None
    meaning = _CUDA_ERRORS.get(status, "see the CUDA driver API's error codes")
    return f"the CUDA driver failed to start (cuInit returned {status}, {meaning})"


def describe_gpus_here() -> list[list[Any]]:
    """Name and memory of every visible GPU, queried in this process (initialises CUDA)."""
    import torch

    return [
        [index, props.name, props.total_memory]
        for index in range(torch.cuda.device_count())
        for props in [torch.cuda.get_device_properties(index)]
    ]


def nvml_count() -> int:
    """GPU count from NVML/AMD SMI through torch, or -1 when that route is unavailable."""
    import torch

    try:
        if torch.version.hip:
            return int(torch.cuda._device_count_amdsmi())
        return int(torch.cuda._device_count_nvml())
    except Exception:  # private torch helpers: any failure just means "ask another way"
        return -1


def run_in_fork(function: Callable[[], _T], timeout: float = _PROBE_TIMEOUT_S) -> _T:
    """Run ``function`` in a forked child and return its JSON-able result.

    Raises RuntimeError if the child fails or takes longer than ``timeout``; a child that
    will not die is given up after a grace (see the module's docstring).
    """
    _reap_abandoned()
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a threaded process (a kernel always is); the child
        # only runs ``function`` and exits, never returning into the kernel's threads.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        status = 0
        try:
            payload = json.dumps({"result": function()})
        except BaseException as error:
            payload, status = json.dumps({"error": f"{type(error).__name__}: {error}"}), 1
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(payload)
        os._exit(status)
    os.close(write_end)
    try:
        answer = _read_answer(read_end, pid, timeout)
    finally:
        os.close(read_end)
        _reap_or_abandon(pid)
    try:
        message = json.loads(answer or b"{}")
    except json.JSONDecodeError as error:
        raise RuntimeError("the probe process sent an unreadable answer") from error
    if "result" not in message:
        raise RuntimeError(f"the probe process failed: {message.get('error', 'no answer')}")
    return message["result"]


def _read_answer(read_end: int, pid: int, timeout: float) -> bytes:
    """Everything the child writes until it closes the pipe, within ``timeout`` seconds."""
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([read_end], [], [], timeout)
        if not ready:
            _kill_child(pid)
            raise RuntimeError(f"the probe process did not answer within {timeout:.0f} s")
        chunk = os.read(read_end, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _kill_child(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _exited_within(pid: int, seconds: float) -> bool:
    """Reap ``pid`` if it exits within ``seconds`` (polled: ``waitpid`` itself cannot time out)."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True  # already reaped
        if done:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _reap_or_abandon(pid: int) -> None:
    if _exited_within(pid, _EXIT_GRACE_S):
        return
    _kill_child(pid)
    if not _exited_within(pid, _KILL_GRACE_S):
        _abandoned_probes.add(pid)


def _reap_abandoned() -> None:
    for pid in list(_abandoned_probes):
        if _exited_within(pid, 0):
            _abandoned_probes.discard(pid)
