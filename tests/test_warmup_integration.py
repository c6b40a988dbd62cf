"""The workers' one-time imports are paid once in the kernel, not at every launch."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.integration

PROBE = """
import sys, time
from notebook_kit import notebook_launcher
from notebook_kit.launch.warmup import WARM_MODULES

def inherited():
    return [name for name in WARM_MODULES if name in sys.modules]

# Launched at once, while the background imports may still run: the fork waits for them.
first = notebook_launcher(inherited, num_processes=2, live=False)
second = notebook_launcher(inherited, num_processes=2, live=False)
print(first == second == list(WARM_MODULES))
"""


def test_forked_workers_inherit_the_warm_modules_even_when_launched_at_once():
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, env=environment
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"


# A loaded machine, made reproducible: the warm-up thread is running but 2 s late to begin its
# import (a trace function of this process's threads waits there), and the launch comes at once.
LATE_WARM_UP = """
import sys, threading, time
from notebook_kit.launch.warmup import WARM_MODULES

def late(frame, event, arg):
    if frame.f_code.co_name == "import_module" and threading.current_thread().name == (
        "notebook_kit-warmup"
    ):
        threading.settrace(None); sys.settrace(None)
        time.sleep(2.0)
    return None

threading.settrace(late)  # threads started from here on; the warm-up starts on import
from notebook_kit import notebook_launcher

def inherited():
    return [name for name in WARM_MODULES if name in sys.modules]

print(notebook_launcher(inherited, num_processes=2, live=False) == list(WARM_MODULES))
"""


def test_workers_fork_after_the_warm_up_even_when_its_thread_starts_late():
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run(
        [sys.executable, "-c", LATE_WARM_UP],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True", "a worker forked before the warm-up"


# --- The stop button pressed while a launch waits for the warm-up, in real kernels ----------

IMPORT_CELL = "from notebook_kit import notebook_launcher"
# A DDP step: the first one imports torch._dynamo, which the warm-up thread may be importing.
TRAIN_CELL = """\
def train():
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()
    return dist.get_world_size()
"""
LAUNCH_CELL = "print('RESULT', notebook_launcher(train, num_processes=2, live=False))"
ROUNDS = 24  # each a fresh kernel: the warm-up runs once per process
AT_ONCE = 3  # kernels in flight together


def _round(delay: float, give_up: threading.Event) -> dict[str, object] | None:
    """Import, launch at once and press the stop button ``delay`` s in; then launch again.

    None when another round has already failed (a poisoned kernel needs no second witness).
    """
    from tests.kernel_cells import cell_messages, real_kernel, run_cell

    if give_up.is_set():
        return None
    with real_kernel() as (manager, client):
        run_cell(client, TRAIN_CELL, timeout=60)
        run_cell(client, IMPORT_CELL, timeout=120)
        msg_id = client.execute(LAUNCH_CELL)  # the launch cell follows the import directly
        time.sleep(delay)
        manager.interrupt_kernel()  # as Jupyter does: SIGINT to the kernel's process group
        pressed = cell_messages(client, msg_id, timeout=120)
        after = [run_cell(client, LAUNCH_CELL, timeout=120) for _ in range(2)]
    found = {"delay": delay, "pressed": _outcome(pressed), "after": [_outcome(m) for m in after]}
    if _poisoned(found):
        give_up.set()
    return found


def _poisoned(found: dict[str, object]) -> bool:
    """Poisoned: a launch after the press fails, or the pressed one fails other than by the
    interrupt. A press that lands before the kernel has begun the cell ends the request with
    no output at all ("KeyboardInterrupt caught in kernel"), which is Jupyter's own outcome."""
    return found["after"] != ["RESULT 2", "RESULT 2"] or found["pressed"] not in (
        "RESULT 2",
        "KeyboardInterrupt: ",
        "",
    )


def _outcome(messages: list[dict]) -> str:
    """'RESULT 2' for a launch that trained, else the error's name and value."""
    for message in messages:
        if message["msg_type"] == "error":
            content = message["content"]
            return f"{content['ename']}: {content['evalue']}"
    text = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    return next((line for line in text.splitlines() if line.startswith("RESULT")), text)


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_interrupt_while_a_launch_waits_for_the_warm_up_never_poisons_the_kernel():
    """Pressed 0–1 s into the first launch: that launch trains or ends with a plain
    KeyboardInterrupt, and every launch after it trains."""
    from concurrent.futures import ThreadPoolExecutor

    delays = [round(random.uniform(0.0, 1.0), 3) for _ in range(ROUNDS)]
    delays[:4] = [0.0, 0.02, 0.05, 0.08]  # the first moments, where a press hit every time
    give_up = threading.Event()
    with ThreadPoolExecutor(AT_ONCE) as pool:
        rounds = [r for r in pool.map(_round, delays, [give_up] * ROUNDS) if r is not None]
    bad = [r for r in rounds if _poisoned(r)]
    interrupted = [r for r in rounds if str(r["pressed"]).startswith("KeyboardInterrupt")]
    assert not bad, f"kernels poisoned ({len(rounds)} of {ROUNDS} rounds run): {bad}"
    assert interrupted, f"no press landed during a launch: {rounds}"


SLOW_MODULE = "import time\ntime.sleep(1.5)\nVALUE = 'initialised'\n"


def test_a_fork_waits_for_an_import_in_another_thread(tmp_path, monkeypatch):
    """Any thread's import, not only the warm-up's: the child never gets a half-done module."""
    from notebook_kit.launch import launcher  # noqa: F401  (registers the at-fork hook)
    from notebook_kit.launch.warmup import imports_under_way

    (tmp_path / "nk_slow_import.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importer = threading.Thread(target=__import__, args=("nk_slow_import",))
    importer.start()
    deadline = time.monotonic() + 10
    while "nk_slow_import" not in imports_under_way():
        assert time.monotonic() < deadline, "the other thread's import never showed"
        time.sleep(0.005)
    pid = os.fork()
    if pid == 0:  # the child only looks: importing a half-done module here could hang
        module = sys.modules.get("nk_slow_import")
        os._exit(0 if getattr(module, "VALUE", None) == "initialised" else 3)
    _, status = os.waitpid(pid, 0)
    importer.join()
    assert os.waitstatus_to_exitcode(status) == 0, "the fork copied a module half-imported"


# --- Two presses while the live view's first imports run, in a real kernel -----------------

# A loaded machine, made reproducible: matplotlib's import reaches ``matplotlib.artist`` (cut
# there, the package stays broken until the kernel restarts), waits, and the stop button is
# pressed twice, 0.3 s apart, meanwhile (SIGINT to the kernel's process group, as Jupyter).
SLOW_MATPLOTLIB = """\
import importlib.machinery, os, signal, sys, threading, time
class SlowArtist:  # the module's code waits, not the finder (which holds Python's import lock)
    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.artist":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Slow(spec.loader)
        return spec
class Slow:
    def __init__(self, loader):
        self.loader = loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        for after in (0.3, 0.6):
            threading.Timer(after, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
        time.sleep(2.0)
        self.loader.exec_module(module)
sys.meta_path.insert(0, SlowArtist())
"""
VIEW_LAUNCH_CELL = "print('RESULT', notebook_launcher(lambda: 2, num_processes=2))"


@pytest.mark.kernel
def test_presses_during_the_live_views_first_imports_never_leave_them_half_done():
    """The first launch ends with the interrupt; the next one shows its view and trains."""
    from tests.kernel_cells import real_kernel, run_cell

    with real_kernel() as (_, client):
        run_cell(client, IMPORT_CELL, timeout=120)
        first = "import sys; print('RESULT', 'matplotlib' in sys.modules)"
        assert _outcome(run_cell(client, first)) == "RESULT False"  # the launch imports it
        run_cell(client, SLOW_MATPLOTLIB, timeout=30)
        pressed = _outcome(run_cell(client, VIEW_LAUNCH_CELL, timeout=120))
        messages = run_cell(client, VIEW_LAUNCH_CELL, timeout=120)
    assert pressed in ("KeyboardInterrupt: ", ""), pressed  # "": IPython's own, as above
    assert _outcome(messages) == "RESULT 2", _outcome(messages)
    shown = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in data for data in shown), shown
