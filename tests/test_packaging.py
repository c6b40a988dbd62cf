"""The package metadata builds without deprecation warnings and agrees with the README."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUILD_METADATA = """
import sys
from setuptools import build_meta
print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


def test_metadata_builds_without_deprecation_warnings(tmp_path: Path) -> None:
    project = tmp_path / "project"  # a copy: the build writes egg-info beside pyproject.toml
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    (project / "notebook_kit").mkdir()
    (project / "notebook_kit" / "__init__.py").write_text("")
    out = tmp_path / "metadata"
    out.mkdir()
    built = subprocess.run(
        [sys.executable, "-c", BUILD_METADATA, str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Deprecat" not in built.stdout + built.stderr
    metadata = (out / built.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_readme_asks_for_the_python_the_package_requires() -> None:
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    readme = re.search(r"Python (3\.\d+)( or newer)?", (ROOT / "README.md").read_text())
    assert readme, "the README names no Python version"
    assert required == f">={readme[1]}" and readme[2], (
        f"README asks for {readme[0]!r}, pyproject.toml requires {required!r}"
    )
