"""Deliberate breakages of notebook_kit, and the tests that must catch each one.

``python -m tests.bite`` copies ``notebook_kit/`` to a temporary folder, applies one named
breakage at a time by exact-snippet replacement, and runs the few tests that guard it against
that copy (``-x``; subprocesses and Jupyter kernels use the copy too, through ``PYTHONPATH``
and the working directory). A breakage the tests do not catch is a *survivor*; a snippet
that no longer exists in the code is *stale* (the breakage must be rewritten); a breakage
noticed only because pytest-timeout ended a hung test is a *timeout* (the guarding test needs
its own bound, so that it fails saying what took too long); each makes the run fail.
``python -m tests.bite --list`` lists the breakages, ``python -m tests.bite NAME ...`` runs
some of them.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tests.mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "notebook_kit"
# Tests are run from a scratch folder holding the broken package; everything else links back.
_LINKED = ("tests", "notebooks", "docs", "benchmarks", "pyproject.toml", "README.md")
# The slowest guarding test takes 25 s on an idle 2-core machine. A breakage that makes a test
# hang ends it here: pytest-timeout's thread method ends the whole run, teardown included.
_PER_TEST_TIMEOUT_S = 90
# What pytest-timeout writes when it ends a test: the thread method's banner around the stacks
# before it exits the run, and the signal method's failure message.
_TIMED_OUT = re.compile(
    r"^\++ Timeout \++$|^Failed: Timeout \(>[\d.]+s\) from pytest-timeout", re.M
)


@dataclass(frozen=True)
class Verdict:
    """What became of one breakage."""

    name: str
    outcome: str  # "caught", "survived", "timeout", "stale" or "error"
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.outcome == "caught"


def apply(mutation: Mutation, package: Path) -> str | None:
    """Apply ``mutation`` to the package copy; a problem (stale snippet) as text, else None."""
    for edit in mutation.edits:
        path = package / edit.path
        if not path.is_file():
            return f"{PACKAGE}/{edit.path} does not exist"
        text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            where = "no longer" if count == 0 else f"{count} times"
            return f"the snippet is {where} in {PACKAGE}/{edit.path}: {edit.old.strip()[:80]!r}"
        path.write_text(text.replace(edit.old, edit.new))
    return None


def stale(mutations: Iterable[Mutation]) -> list[str]:
    """Apply each mutation to a fresh copy of the package; what no longer applies, as text."""
    problems = []
    for mutation in mutations:
        with tempfile.TemporaryDirectory(prefix="bite-") as scratch:
            package = Path(scratch) / PACKAGE
            shutil.copytree(ROOT / PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
            problem = apply(mutation, package)
        if problem is not None:
            problems.append(f"{mutation.name}: {problem}")
    return problems


def missing_tests(mutations: Iterable[Mutation]) -> list[str]:
    """Guarding test ids whose file or test function does not exist (a renamed test), as text.

    Read from the files' syntax, so a rename shows at once, where running the breakage would
    only show it as an error on the run whose share of breakages includes it."""
    functions: dict[Path, set[str]] = {}
    problems = []
    for mutation in mutations:
        for test_id in mutation.tests:
            path, _, name = test_id.partition("::")
            file = ROOT / path
            if not file.is_file():
                problems.append(f"{mutation.name}: no file {path}")
                continue
            if file not in functions:
                tree = ast.parse(file.read_text())
                functions[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            if name and name.split("[", 1)[0] not in functions[file]:
                problems.append(f"{mutation.name}: no test {test_id}")
    return problems


def _scratch(folder: Path) -> Path:
    """A folder holding a fresh copy of the package and links to the rest of the repository."""
    shutil.copytree(ROOT / PACKAGE, folder / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for name in _LINKED:
        if (ROOT / name).exists():
            (folder / name).symlink_to(ROOT / name)
    return folder


def run_tests(
    folder: Path, test_ids: Sequence[str], stop_early: bool = True
) -> tuple[int, str, bool]:
    """Run ``test_ids`` against the package in ``folder``; (pytest's status, output tail,
    whether pytest-timeout ended a test)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(folder)  # forked workers, subprocesses and kernels: the copy
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-o", f"timeout={_PER_TEST_TIMEOUT_S}", "-o", "timeout_method=thread"]
    command += ["--no-header", "-rN"]
    command += ["-x", *test_ids] if stop_early else list(test_ids)
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    return done.returncode, output[-2500:], _TIMED_OUT.search(output) is not None


def judge(mutation: Mutation) -> Verdict:
    """Break the package as ``mutation`` says and run its guarding tests."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bite-") as scratch:
        folder = _scratch(Path(scratch))
        problem = apply(mutation, folder / PACKAGE)
        if problem is not None:
            return Verdict(mutation.name, "stale", problem, time.monotonic() - started)
        status, output, timed_out = run_tests(folder, mutation.tests)
    seconds = time.monotonic() - started
    if timed_out:  # a hang, not a failure the test states: it would hang the suite as well
        detail = (
            f"a guarding test was ended by pytest-timeout ({_PER_TEST_TIMEOUT_S} s here), not "
            "by a failure of its own: bound the wait inside the test"
        )
        return Verdict(mutation.name, "timeout", detail, seconds)
    if status == 1:  # a test failed: the breakage was noticed
        return Verdict(mutation.name, "caught", "", seconds)
    if status == 0:
        return Verdict(mutation.name, "survived", "every guarding test passed", seconds)
    return Verdict(mutation.name, "error", f"pytest exited with {status}:\n{output}", seconds)


def baseline(mutations: Iterable[Mutation]) -> tuple[int, str]:
    """Run every guarding test once on the unbroken package: a catch only counts if they pass."""
    ids = sorted({test for mutation in mutations for test in mutation.tests})
    with tempfile.TemporaryDirectory(prefix="bite-") as scratch:
        status, output, _ = run_tests(_scratch(Path(scratch)), ids, stop_early=False)
    return status, output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bite", description=__doc__)
    parser.add_argument("names", nargs="*", help="breakages to try (default: all)")
    parser.add_argument("--list", action="store_true", help="list the breakages and exit")
    parser.add_argument(
        "--check", action="store_true", help="only check that every breakage still applies"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip running the tests on the unbroken code"
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=1, help="breakages tried at once (default: 1)"
    )
    options = parser.parse_args(argv)
    if options.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name}: {mutation.promise}")
        return 0
    known = {mutation.name: mutation for mutation in MUTATIONS}
    unknown = [name for name in options.names if name not in known]
    if unknown:
        parser.error(f"unknown breakages {unknown}; --list shows them")
    chosen = [known[name] for name in options.names] or list(MUTATIONS)
    if options.check:
        problems = stale(chosen)
        print("\n".join(problems) or f"all {len(chosen)} breakages apply")
        return 1 if problems else 0
    if not options.no_baseline:
        status, output = baseline(chosen)
        if status != 0:
            print(f"The guarding tests fail on the unbroken code:\n{output}", flush=True)
            return 2
        print("baseline: every guarding test passes on the unbroken code", flush=True)
    if options.jobs < 1:
        parser.error(f"--jobs must be 1 or more, got {options.jobs}")
    verdicts = []
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        for future in as_completed([pool.submit(judge, mutation) for mutation in chosen]):
            verdict = future.result()
            verdicts.append(verdict)
            print(f"{verdict.outcome:>8}  {verdict.name} ({verdict.seconds:.0f} s)", flush=True)
            if verdict.detail and not verdict.ok:
                print("          " + verdict.detail.replace("\n", "\n          "), flush=True)
    missed = [v for v in verdicts if not v.ok]
    print(f"{len(verdicts) - len(missed)} of {len(verdicts)} breakages caught", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
