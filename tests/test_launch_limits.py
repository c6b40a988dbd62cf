"""Inputs that used to start badly are refused first, with the reason: a worker count beyond the
machine's limits, a config path that is a directory or not text, a launch from inside a worker.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from notebook_kit import LaunchConfig, WorkerError, WorkerPool, notebook_launcher
from notebook_kit.config.environment import usable_cpu_count
from notebook_kit.config.launch_config import saved_default
from notebook_kit.config.process_limits import PER_CORE
from notebook_kit.launch.plan import make_plan

pytestmark = pytest.mark.usefixtures("config_file")


def test_a_huge_worker_count_is_refused_at_once_naming_the_ceiling() -> None:
    with pytest.raises(ValueError, match="num_processes must be an integer from 1 to 1024"):
        LaunchConfig(num_processes=10**9)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"num_processes must be >= 1 and <= 1024, got 10+\."):
        notebook_launcher(lambda: None, num_processes=10**9)
    with pytest.raises(ValueError, match="num_processes must be >= 1 and <= 1024"):
        WorkerPool(num_processes=10**9)
    assert time.monotonic() - started < 5  # refused, not built up first


def test_more_workers_than_the_cores_allow_is_refused_naming_the_cores() -> None:
    cores = usable_cpu_count()
    too_many = PER_CORE * cores + 1
    if too_many > 1024:
        pytest.skip(f"{cores} cores allow more workers than the config's ceiling")
    message = rf"num_processes={too_many} .* {PER_CORE} workers per CPU core \({cores} here\)"
    with pytest.raises(ValueError, match=message):
        notebook_launcher(lambda: None, num_processes=too_many)


@contextlib.contextmanager
def _open_file_limit(soft: int) -> Iterator[None]:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_more_workers_than_open_files_allow_is_refused_before_any_pipe_is_opened() -> None:
    open_now = len(list(Path("/proc/self/fd").iterdir()))
    with _open_file_limit(open_now + 64 + 10 * 3), pytest.raises(ValueError) as refused:
        WorkerPool(num_processes=4)
    assert "the open-file limit (`ulimit -n` is" in str(refused.value)
    assert "allows at most 3" in str(refused.value) and "Too many open files" not in str(
        refused.value
    )


def test_the_banner_warns_when_processes_outnumber_the_cores() -> None:
    cores = usable_cpu_count()
    banner = make_plan(LaunchConfig(num_processes=cores + 1)).banner()
    assert f"Warning: {cores + 1} processes share {cores} CPU core" in banner
    assert f"num_processes={cores} avoids that" in banner
    assert "Warning" not in make_plan(LaunchConfig(num_processes=cores)).banner()


def test_a_config_path_that_is_a_directory_is_an_error_naming_it(
    config_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    monkeypatch.setenv("NOTEBOOK_KIT_CONFIG", str(folder))
    with pytest.raises(ValueError, match=f"NOTEBOOK_KIT_CONFIG names {folder}, which is a dir"):
        saved_default()
    with pytest.raises(ValueError, match="which is a directory"):
        notebook_launcher(lambda: None)


def test_a_config_file_that_is_not_utf8_is_an_error_naming_it(config_file: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_bytes(b'{"seed": "\xff\xfe"}')
    with pytest.raises(ValueError, match=f"{config_file} is not UTF-8 text"):
        saved_default()


def _launch_again() -> None:
    notebook_launcher(lambda: None, num_processes=2)


@pytest.mark.integration
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_launch_from_inside_a_worker_is_refused_in_words_for_a_worker() -> None:
    with pytest.raises(WorkerError) as refused:
        notebook_launcher(_launch_again, num_processes=2, threads_per_process=1)
    message = str(refused.value)
    assert "notebook_launcher was called inside a worker of a running launch (rank" in message
    assert "this kernel" not in message
