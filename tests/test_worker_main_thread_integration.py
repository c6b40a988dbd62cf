"""The function runs on its worker's main thread: signal handlers it installs work."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest
import torch

from notebook_kit import notebook_launcher

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]


def test_the_function_can_install_signal_handlers():
    def install():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, previous)
        return threading.current_thread() is threading.main_thread()

    assert notebook_launcher(install, num_processes=2) is True


def test_a_sigterm_handler_of_the_function_runs_when_the_launch_stops_it(tmp_path):
    def train():
        rank = torch.distributed.get_rank()

        def save_and_leave(signum, frame):
            (tmp_path / f"saved-{rank}").write_text(signal.Signals(signum).name)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, save_and_leave)
        (tmp_path / f"ready-{rank}").touch()
        while True:
            signal.pause()

    with pytest.raises(TimeoutError):
        notebook_launcher(train, num_processes=2, timeout=3)
    assert (tmp_path / "ready-0").exists() and (tmp_path / "ready-1").exists()
    assert (tmp_path / "saved-0").read_text() == "SIGTERM"
    assert (tmp_path / "saved-1").read_text() == "SIGTERM"


def test_signals_handled_in_a_worker_never_reach_the_kernels_event_loop():
    # An event loop in the kernel (ipykernel's asyncio) learns of signals through a wake-up
    # descriptor; a forked worker holds a copy of it.
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)
    try:

        def handle_own_signal():
            signal.signal(signal.SIGUSR1, lambda signum, frame: None)
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.1)  # the handler ran

        notebook_launcher(handle_own_signal, num_processes=2)
        with contextlib.suppress(BlockingIOError):
            leaked = os.read(read, 64)
            pytest.fail(f"the kernel's wake-up descriptor received {leaked!r}")
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
