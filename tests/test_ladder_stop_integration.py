"""The Stop button ends every rung of the ladder early, at the same step on every rank.

As in ``test_stop_integration.py``, a real kernel runs the launching cell and the test plays
JupyterLab: it clicks the live view's Stop button with a ``comm_msg`` on a kernel subshell,
once the progress bar has moved. Each run must then return normally (no error in the cell).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel_cells import cell_messages, real_kernel, run_cell
from tests.optional import needs_accelerate, needs_transformers
from tests.test_stop_integration import _Clicker, _errors, _printed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]

REPOSITORY = Path(__file__).resolve().parents[1]
DEFINE = f"""\
import sys
sys.path.insert(0, {str(REPOSITORY)!r})
import notebook_kit
from notebook_kit import notebook_launcher
from tests import ladder_rungs

def report(last_steps):
    record = notebook_kit.last_run()
    same = len(set(last_steps)) == 1
    print('RESULT', same, record.stopped, record.succeeded, last_steps[0], flush=True)
"""


class _ClickWhenMoving(_Clicker):
    """Clicks Stop once the progress bar shows a few finished steps."""

    def __init__(self, client: Any, steps: int = 3) -> None:
        super().__init__(client)
        self.steps = steps

    def __call__(self, message: dict) -> None:
        content = message["content"]
        if message["msg_type"] == "comm_open":
            super().__call__(message)  # remembers the button (clicks only after a while)
            return
        value = content.get("data", {}).get("state", {}).get("value")
        if (
            _steps_shown(value) >= self.steps
            and self.button is not None
            and self.clicked_at is None
        ):
            self.click()


def _steps_shown(value: Any) -> int:
    """Steps a progress update shows: the bar's value, or the count in its text beside it
    ("41% · 41/100 · …" with a total, "30 steps · …" without one)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    found = re.search(r"(?:^|· )(\d+)(?:/\d+| steps?\b)", value) if isinstance(value, str) else None
    return int(found.group(1)) if found else 0


@pytest.fixture(scope="module")
def kernel() -> Iterator[Any]:
    with real_kernel() as (_, client):
        run_cell(client, DEFINE)
        yield client


def _stopped_run(client: Any, launch: str, steps_of: str, timeout: float = 120) -> int:
    """Run ``launch`` (which sets ``result``), click Stop, return the step every rank ended on."""
    clicker = _ClickWhenMoving(client)
    code = f"{launch}\nreport({steps_of})"
    started = time.monotonic()
    messages = cell_messages(client, client.execute(code), timeout=timeout, on_message=clicker)
    assert clicker.clicked_at is not None, "the run never showed progress"
    assert _errors(messages) == []
    printed = _printed(messages)
    line = next((line for line in printed.splitlines() if line.startswith("RESULT")), "")
    assert line.startswith("RESULT True True True"), printed
    assert time.monotonic() - clicker.clicked_at < 30 < timeout  # ended soon after the click
    assert clicker.clicked_at > started
    return int(line.split()[-1])


def test_stop_ends_a_raw_ddp_loop(kernel: Any) -> None:
    launch = (
        "result = notebook_launcher(ladder_rungs.raw_ddp, args=(100_000, 0.02), num_processes=2)"
    )
    assert _stopped_run(kernel, launch, "[rank['last_step'] for rank in result]") < 99_999


def test_stop_ends_an_accelerator_loop(kernel: Any) -> None:
    launch = (
        "result = notebook_launcher(ladder_rungs.accelerator_loop, args=(100_000, 0.02), "
        "num_processes=2)"
    )
    assert _stopped_run(kernel, launch, "result['last_steps']") < 99_999


@needs_accelerate
def test_stop_ends_an_accelerate_accelerator_loop(kernel: Any) -> None:
    launch = (
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "result = notebook_launcher(ladder_rungs.accelerate_loop, args=(model, 100_000, 0.02), "
        "num_processes=2)"
    )
    assert _stopped_run(kernel, launch, "result['last_steps']") < 99_999


@needs_transformers
def test_stop_ends_a_trainer_run_through_its_own_control_flow(kernel: Any, tmp_path: Path) -> None:
    launch = (
        "model = ladder_rungs.tiny_bert()\n"
        "result = notebook_launcher(ladder_rungs.train_with_trainer, "
        f"args=(model, {str(tmp_path)!r}), kwargs={{'pause': 0.05, 'epochs': 500}}, "
        "num_processes=2)"
    )
    # 500 epochs of 8 steps would be 4000 steps: the Trainer returned its output early.
    assert _stopped_run(kernel, launch, "result['global_steps']") < 4000
