"""Runs the test functions Accelerate ships with either Accelerate's names or ours bound.

Accelerate 1.15.0 ships its own distributed tests as plain functions in
``accelerate/test_utils/scripts/``. Each script is loaded here as a fresh module, then the names it
imported (``Accelerator``, ``gather``, ``set_seed``, ...) are rebound to notebook_kit's; the test
functions themselves run unchanged. Every case runs in a freshly forked driver process, so neither
Accelerate's process-wide singletons nor a failed case can leak into the next one; the driver runs
the case itself (1 process) or launches it on 2 forked workers with ``notebook_launcher``.

Needs ``accelerate`` (the ``bench`` extra). ``python -m tests.accelerate_parity_runner`` prints the
pass counts of both implementations.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any, Literal

# "one-import": ours, but the script keeps Accelerate's configuration objects and
# DistributedType, as a script that only changed ``from accelerate import Accelerator`` does.
Implementation = Literal["accelerate", "ours", "one-import"]
Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Case:
    """One call of one test function, as the script's ``main()`` would make it.

    Attributes:
        script: Module name under ``accelerate.test_utils.scripts``.
        name: Readable id (the function name, plus its arguments where there are variants).
        call: Runs the test given the loaded module and the implementation's API.
        processes: Process counts the test applies to (the script's own skip conditions).
        in_driver: The test launches processes itself (``notebook_launcher`` tests).
    """

    script: str
    name: str
    call: Callable[[ModuleType, SimpleNamespace], Any]
    processes: tuple[int, ...] = (1, 2)
    in_driver: bool = False

    @property
    def id(self) -> str:
        return f"{self.script}::{self.name}"


@dataclass(frozen=True)
class Outcome:
    status: Status
    detail: str = ""


@dataclass
class _Missing:
    """Stands in for a name notebook_kit lacks, so only the tests that use it fail."""

    name: str
    attributes: dict[str, Any] = field(default_factory=dict)

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise AttributeError(f"notebook_kit has no {self.name}")

    __call__ = _fail

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        self._fail()


def load_script(script: str, bindings: dict[str, Any]) -> ModuleType:
    """A fresh copy of an Accelerate test script with ``bindings`` replacing its imported names."""
    spec = importlib.util.find_spec(f"accelerate.test_utils.scripts.{script}")
    assert spec is not None and spec.origin is not None
    fresh = importlib.util.spec_from_file_location(f"_parity_{script}", spec.origin)
    assert fresh is not None and fresh.loader is not None
    module = importlib.util.module_from_spec(fresh)
    fresh.loader.exec_module(module)
    vars(module).update(bindings)
    return module


def _ours(name: str) -> Any:
    import notebook_kit

    try:
        return getattr(notebook_kit, name)
    except AttributeError:
        return _Missing(name)


def api(implementation: Implementation) -> SimpleNamespace:
    """What a case's driver code needs from an implementation (not what the tests import)."""
    if implementation == "accelerate":
        import accelerate
        from accelerate.utils import DataLoaderConfiguration, DistributedType

        return SimpleNamespace(
            Accelerator=accelerate.Accelerator,
            DataLoaderConfiguration=DataLoaderConfiguration,
            DistributedType=DistributedType,
            # The state Accelerate's own CPU launchers give the scripts (``--cpu``).
            state=lambda: accelerate.PartialState(cpu=True),
        )
    if implementation == "one-import":
        from accelerate.utils import DataLoaderConfiguration, DistributedType

        return SimpleNamespace(
            Accelerator=_ours("Accelerator"),
            DataLoaderConfiguration=DataLoaderConfiguration,
            DistributedType=DistributedType,
            state=_ours("PartialState"),
        )
    return SimpleNamespace(
        Accelerator=_ours("Accelerator"),
        DataLoaderConfiguration=_ours("DataLoaderConfiguration"),
        DistributedType=_ours("DistributedType"),
        state=_ours("PartialState"),
    )


def _summary(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return f"{type(error).__name__}: {first}"[:400]


def _drive(case: Case, implementation: Implementation, processes: int, bindings: dict) -> None:
    os.environ["ACCELERATE_NUM_PROCESSES"] = str(processes)  # read by test_notebook at import
    if implementation == "accelerate":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    module = load_script(case.script, bindings)
    interface = api(implementation)
    if case.in_driver or processes == 1:
        case.call(module, interface)
        return
    from notebook_kit import notebook_launcher

    notebook_launcher(
        case.call, args=(module, interface), num_processes=processes, live=False, timeout=90
    )


def _forked(function: Callable[..., Any], args: tuple[Any, ...], pipe: Any) -> None:
    os.setpgid(0, 0)  # its own process group: a timeout kills whatever it started, too
    os.chdir(tempfile.mkdtemp(prefix="parity-"))  # shared by the workers, removed by the OS
    try:
        reply: tuple[str, Any] = ("value", function(*args))
    except BaseException as error:  # report every failure, including pytest's own
        traceback.print_exc()
        reply = ("error", _summary(error))
    pipe.send_bytes(pickle.dumps(reply))  # plain pickle: torch's fd sharing dies with us
    pipe.close()
    sys.stdout.flush()
    os._exit(0)


def run_in_fork(function: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    """``function(*args)`` in a fresh forked process (in a fresh working folder); its result.

    Raises RuntimeError with the child's exception summary, or when it does not answer within
    ``timeout`` seconds (it is then killed).
    """
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_forked, args=(function, args, sender))
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise RuntimeError(f"no result within {timeout:.0f} s")
        kind, value = pickle.loads(receiver.recv_bytes())
    except EOFError:
        raise RuntimeError(f"the forked process died (exit code {child.exitcode})") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # leftovers of a hung or finished run
        child.join()
        receiver.close()
    if kind == "error":
        raise RuntimeError(value)
    return value


def run_case(
    case: Case,
    implementation: Implementation,
    processes: int,
    bindings_of: Callable[[str], dict[str, Any]],
    timeout: float = 300.0,
) -> Outcome:
    """Run ``case`` with one implementation on ``processes`` processes, in a fresh fork."""
    if processes not in case.processes:
        return Outcome("skip", f"the script runs it only on {case.processes} processes")
    try:
        run_in_fork(_drive, (case, implementation, processes, bindings_of(case.script)), timeout)
    except RuntimeError as error:
        return Outcome("fail", str(error))
    return Outcome("pass")


def main() -> None:
    """Print every case's outcome, then the pass counts of Accelerate and notebook_kit."""
    from tests.accelerate_parity_cases import CASES, OUT_OF_SCOPE, bindings

    words = sys.argv[1:]
    selected = [case for case in CASES if not words or any(word in case.id for word in words)]
    passed: dict[tuple[str, int], set[str]] = {}
    run: dict[int, int] = {}
    for case in selected:
        if case.id in OUT_OF_SCOPE:
            continue
        for processes in case.processes:
            run[processes] = run.get(processes, 0) + 1
            for implementation in os.environ.get("PARITY_IMPL", "accelerate,ours").split(","):
                outcome = run_case(case, implementation, processes, bindings(implementation))
                if outcome.status == "pass":
                    passed.setdefault((implementation, processes), set()).add(case.id)
                print(f"{processes}p {implementation:10} {outcome.status:4} {case.id} "
                      f"{outcome.detail}", flush=True)  # fmt: skip
    for processes, total in sorted(run.items()):
        theirs = passed.get(("accelerate", processes), set())
        ours = passed.get(("ours", processes), set())
        print(
            f"{processes} process(es), {total} tests: Accelerate passes {len(theirs)}, "
            f"notebook_kit {len(ours)}; of Accelerate's {len(theirs)}, notebook_kit passes "
            f"{len(theirs & ours)}"
        )


if __name__ == "__main__":
    main()
