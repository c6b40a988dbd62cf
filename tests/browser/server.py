"""A private JupyterLab server for browser tests: no token, loopback only, nothing downloaded.

Every piece of state the server could read from the user's machine (Jupyter config, runtime
files, Lab settings and workspaces, IPython profile, notebook_kit's saved default) points into
a temporary folder, so a test run sees the same Lab on every machine and touches nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.processes import free_port

# Lab settings that keep a headless run offline and deterministic. "windowingMode: none" keeps
# every cell in the DOM, so selectors find cells that are scrolled out of view.
_LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
        "doNotDisturbMode": True,
    },
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
}
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 10.0


def _write_settings(settings_dir: Path) -> None:
    for plugin, values in _LAB_SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class LabServer:
    """``jupyter lab`` serving ``root`` on 127.0.0.1, started in its own process group.

    Example:
        >>> server = LabServer(root, state_dir); server.start()
        >>> server.url("lab/tree/01_quickstart.ipynb")
        >>> server.stop()
    """

    def __init__(self, root: Path, state_dir: Path) -> None:
        self.root = root
        self.state_dir = state_dir
        self.port = free_port()
        self.log_path = state_dir / "jupyterlab.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, path: str = "") -> str:
        """Absolute URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def environment(self) -> dict[str, str]:
        """The server's (and so every kernel's) environment: private dirs, no pytest marker."""
        env = dict(os.environ)
        # ipykernel stops forwarding fd-level output when this is set (worker prints vanish).
        env.pop("PYTEST_CURRENT_TEST", None)
        for name, folder in {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
            "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
            "IPYTHONDIR": "ipython",
        }.items():
            (self.state_dir / folder).mkdir(parents=True, exist_ok=True)
            env[name] = str(self.state_dir / folder)
        env["NOTEBOOK_KIT_CONFIG"] = str(self.state_dir / "notebook_kit" / "launch.json")
        return env

    def command(self) -> list[str]:
        """The ``jupyter lab`` command line: no auth, no browser, no network."""
        return [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            "--IdentityProvider.token=",
            "--PasswordIdentityProvider.hashed_password=",
            "--ServerApp.disable_check_xsrf=True",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ]

    def start(self) -> None:
        """Start the server and wait until its REST API answers.

        Raises:
            RuntimeError: The server exited or did not answer in time; the message holds its log.
        """
        env = self.environment()
        _write_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own, stopped as one in stop()
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited at start:\n{self.log()}")
            with contextlib.suppress(OSError):
                self.request("GET", "api/status")
                return
            time.sleep(0.2)
        raise RuntimeError(f"JupyterLab did not answer in {_START_TIMEOUT:.0f} s:\n{self.log()}")

    def log(self) -> str:
        """The server's output so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, method: str, path: str) -> Any:
        """Call the server's REST API; the decoded JSON answer, or None for an empty one."""
        request = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def kernel_process(self, kernel_id: str) -> psutil.Process:
        """The kernel's process, found among the server's children by its connection file."""
        assert self.process is not None
        for child in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(f"kernel-{kernel_id}.json" in part for part in child.cmdline()):
                    return child
        raise LookupError(f"no process for kernel {kernel_id}")

    def descendants(self) -> list[psutil.Process]:
        """Every live process the server started: kernels and whatever they forked."""
        if self.process is None or self.process.poll() is not None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            children = psutil.Process(self.process.pid).children(recursive=True)
            return [child for child in children if _alive(child)]
        return []

    def shut_down_kernels(self) -> None:
        """Delete every session and kernel, as closing them in Lab would."""
        with contextlib.suppress(OSError, urllib.error.URLError):
            for session in self.request("GET", "api/sessions") or []:
                self.request("DELETE", f"api/sessions/{session['id']}")
            for kernel in self.request("GET", "api/kernels") or []:
                self.request("DELETE", f"api/kernels/{kernel['id']}")

    def wait_for_no_descendants(self, timeout: float) -> list[psutil.Process]:
        """Wait for the server's child processes to end; those still alive after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := self.descendants()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def stop(self) -> list[psutil.Process]:
        """Shut kernels down, stop the server's process group; processes that had to be killed."""
        if self.process is None:
            return []
        self.shut_down_kernels()
        leftovers = self.wait_for_no_descendants(_STOP_TIMEOUT)
        for process in leftovers:  # kernels and workers run in process groups of their own
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(_STOP_TIMEOUT)
        return leftovers


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
