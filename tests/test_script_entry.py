"""The per-process entry of `notebook-kit launch` runs a script like `python script.py`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    import helper  # a module next to the script, found as `python script.py` would find it
    atexit.register(lambda: print("atexit ran", flush=True))
    print(__name__, sys.argv[1:])
    if sys.argv[1] == "raise":
        raise ValueError("broken script")
    if sys.argv[1] == "exit":
        sys.exit(3)
    """
)


@pytest.mark.parametrize(
    ("mode", "status", "expected"),
    [("ok", 0, "__main__ ['ok', 'x']"), ("exit", 3, "atexit ran"), ("raise", 1, "atexit ran")],
)
def test_script_runs_as_main_and_keeps_its_exit_status(tmp_path, mode, status, expected):
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "script.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "notebook_kit.cli.script_entry", str(tmp_path / "script.py")]
    done = subprocess.run([*command, mode, "x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert expected in done.stdout
    if mode == "raise":
        assert "ValueError: broken script" in done.stderr
