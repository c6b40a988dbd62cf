"""Every ``>>>`` example in the package's docstrings runs, and shows what it says it shows.

An example written as ``>>>`` promises a reader it can be pasted and gives that output; one
that needs a model, a launch or a file of its own is written as a plain code block instead
(``Example::``). The examples run with :mod:`doctest` in a fresh interpreter, in an empty
folder with an empty home, so no test before them and no saved config of the machine can
change what they print.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import notebook_kit

PACKAGE = Path(notebook_kit.__file__).parent

RUN_EXAMPLES = """
import doctest, importlib, json, pkgutil
import notebook_kit

examples, failures = 0, []
for info in pkgutil.walk_packages(notebook_kit.__path__, "notebook_kit."):
    if info.name.endswith("__main__"):  # importing it runs the command line
        continue
    module = importlib.import_module(info.name)
    for test in doctest.DocTestFinder().find(module, module.__name__):
        if not test.examples or test.filename != module.__file__:
            continue  # a name imported from another module is checked there
        report = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        result = runner.run(test, out=report.append)
        examples += len(test.examples)
        if result.failed:
            failures.append("".join(report))
print(json.dumps({"examples": examples, "failures": failures}))
"""


def _prompt_lines() -> int:
    """``>>>`` lines in the package's docstrings, read from the source, not through doctest."""
    count = 0
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node, clean=False) or ""
                count += len(re.findall(r"^\s*>>>", docstring, re.MULTILINE))
    return count


def test_every_docstring_example_runs_and_shows_its_output(tmp_path: Path) -> None:
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in {"NOTEBOOK_KIT_CONFIG", "XDG_CONFIG_HOME"}
    }
    environment["HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", RUN_EXAMPLES],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert not outcome["failures"], "\n".join(outcome["failures"])
    # Every prompt in the source ran: none sits where doctest does not look.
    assert outcome["examples"] == _prompt_lines() > 50


def test_no_example_is_skipped() -> None:
    """A ``+SKIP`` example is a ``>>>`` line that never runs: write it as a code block."""
    skipped = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "doctest: +SKIP" in path.read_text()
    ]
    assert not skipped, f"write these examples as plain code blocks: {skipped}"
