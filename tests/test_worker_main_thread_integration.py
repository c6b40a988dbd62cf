"""The function runs on its worker's main thread: signal handlers it installs work."""

from __future__ import annotations

import signal
import threading

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
