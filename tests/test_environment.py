"""notebook_kit.environment(): facts, fork-safety and the saved config, without touching CUDA."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import notebook_kit
from notebook_kit import LaunchConfig

# notebook_kit.config.environment is the function; the module is reached through importlib.
env_module = importlib.import_module("notebook_kit.config.environment")


pytestmark = pytest.mark.usefixtures("config_file")


def test_report_facts(config_file: Path) -> None:
    report = notebook_kit.environment()
    assert report.torch_version == torch.__version__
    assert 1 <= report.cpu_count <= report.machine_cpu_count
    assert "gloo" in report.backends
    assert report.config_path == config_file and report.config_from_env
    assert report.saved_config is None and report.config_error is None
    if not torch.cuda._is_compiled():
        assert report.gpus == () and "built without CUDA" in (report.gpu_note or "")
    assert report.fork_safe
    assert not torch.cuda.is_initialized()


def test_text_and_html_renderings(config_file: Path) -> None:
    LaunchConfig(num_processes=2, seed=3).save()
    report = notebook_kit.environment()
    text = report.to_text()
    for label in ("torch", "CPU cores", "GPUs", "Backends", "Fork-safe", "Saved config"):
        assert label in text
    assert "num_processes = 2" in text and "backend = auto" in text
    assert "$NOTEBOOK_KIT_CONFIG" in text
    assert repr(report) == text
    page = report._repr_html_()
    assert page.startswith('<table class="nk-environment">')
    assert "num_processes = 2" in page and "<script" not in page


def test_broken_saved_config_is_reported_not_raised(config_file: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text('{"workers": 4}')
    report = notebook_kit.environment()
    assert report.saved_config is None
    assert "Unknown LaunchConfig key" in (report.config_error or "")
    assert "unreadable" in report.to_text()


def test_cuda_initialised_makes_the_kernel_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(env_module, "_detect_gpus", lambda: ((), "stubbed"))
    report = notebook_kit.environment()
    assert not report.fork_safe
    assert "Restart the kernel" in report.to_text()
    assert "color:#b00020" in report._repr_html_()


def test_active_process_group_makes_the_kernel_unsafe(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        report = notebook_kit.environment()
    finally:
        dist.destroy_process_group()
    assert report.process_group_active and not report.fork_safe
    assert "destroy_process_group" in report.to_text()
    assert notebook_kit.environment().fork_safe


def test_gpu_list_from_a_forked_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a CUDA build without NVML does: the GPUs are described by a child process.
    monkeypatch.setattr(env_module, "_cuda_compiled", lambda: True)
    monkeypatch.setattr(env_module, "_nvml_count", lambda: -1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(env_module, "_describe_gpus_here", lambda: [[0, "Fake GPU", 2**34]])
    parent = os.getpid()
    assert env_module.gpu_count() == 1
    report = notebook_kit.environment()
    assert report.gpus == (env_module.GpuInfo(0, "Fake GPU", 2**34),)
    assert "0: Fake GPU, 16.0 GiB" in report.to_text()
    assert os.getpid() == parent


def test_probe_reports_a_failing_child() -> None:
    assert env_module._run_in_fork(lambda: {"pid": os.getpid()})["pid"] != os.getpid()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        env_module._run_in_fork(lambda: 1 / 0)


@pytest.mark.integration
def test_import_and_report_leave_cuda_untouched() -> None:
    code = (
        "import torch, notebook_kit\n"
        "notebook_kit.environment(); notebook_kit.ConfigPanel()\n"
        "assert not torch.cuda.is_initialized()\n"
        "bad = getattr(torch._C, '_cuda_isInBadFork', lambda: False)()\n"
        "assert not bad\n"
    )
    env = dict(os.environ, NOTEBOOK_KIT_CONFIG="/nonexistent/launch.json")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
