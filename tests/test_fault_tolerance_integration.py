"""A rank that fails once at step 7 is restarted and resumes from the latest checkpoint.

The same training file runs three ways: straight through, through ``notebook_launcher`` with a
failure and ``max_restarts=1``, and through ``notebook-kit launch --max-restarts 1`` with a
failure. All three end with bit-identical parameters (CPU, gloo, one thread per process).
"""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch

import notebook_kit
from notebook_kit import notebook_launcher
from tests.processes import CLI, clean_environment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

TRAINING = textwrap.dedent(
    """
    import os
    import sys
    from pathlib import Path

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from notebook_kit import Accelerator, set_seed
    from notebook_kit.accelerator.configuration import ProjectConfiguration

    TOTAL_STEPS, FAIL_AT, KEEP = 12, 7, 2


    class NoisyData(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, index):
            x = torch.full((3,), float(index)) / 24 + 0.01 * torch.randn(3)
            return x, x.sum(dim=0, keepdim=True)


    class Progress:
        def __init__(self):
            self.step = 0

        def state_dict(self):
            return {"step": self.step}

        def load_state_dict(self, state):
            self.step = state["step"]


    def restart_count():
        names = ("NOTEBOOK_KIT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
        return next((int(os.environ[name]) for name in names if name in os.environ), 0)


    def train(project_dir, inject_failure):
        set_seed(0)
        project = ProjectConfiguration(project_dir, total_limit=KEEP)
        accelerator = Accelerator(project_config=project)
        model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = DataLoader(NoisyData(), batch_size=4, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        progress = Progress()
        accelerator.register_for_checkpointing(progress)
        if (Path(project_dir) / "checkpoints").is_dir():
            accelerator.load_state()
            accelerator.print(f"resumed after step {progress.step}")
        while progress.step < TOTAL_STEPS:
            for x, y in loader:
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
                progress.step += 1
                failing = inject_failure and restart_count() == 0
                if failing and progress.step == FAIL_AT and accelerator.process_index == 1:
                    raise RuntimeError(f"injected failure at step {FAIL_AT}")
                accelerator.save_state()
                if progress.step == TOTAL_STEPS:
                    break
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        return accelerator.gather(flat[None])


    if __name__ == "__main__":
        gathered = train(sys.argv[1], inject_failure=sys.argv[2] == "fail")
        if int(os.environ["RANK"]) == 0:
            torch.save(gathered, sys.argv[3])
    """
)


@pytest.fixture
def training(tmp_path: Path):
    path = tmp_path / "training.py"
    path.write_text(TRAINING)
    spec = importlib.util.spec_from_file_location("fault_tolerance_training", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checkpoints(project: Path) -> list[str]:
    return sorted(path.name for path in (project / "checkpoints").iterdir())


def test_launcher_restart_resumes_bit_identically_and_through_the_cli(tmp_path, training):
    straight = notebook_launcher(
        training.train, args=(str(tmp_path / "straight"), False), num_processes=2
    )
    project = tmp_path / "restarted"
    restarted = notebook_launcher(
        training.train, args=(str(project), True), num_processes=2, max_restarts=1
    )
    assert torch.equal(straight, restarted)
    assert _checkpoints(project) == ["checkpoint_10", "checkpoint_11"]  # total_limit=2
    first, second = notebook_kit.last_run().attempts  # a local restart is listed like a node's
    assert first.outcome == "failed" and first.failure.startswith("rank 1: RuntimeError"), (
        first.failure
    )
    assert (second.outcome, first.world_size, second.world_size) == ("success", 2, 2)

    # The same failure through torchrun's restarts.
    project, result = tmp_path / "cli", tmp_path / "cli.pt"
    command = [*CLI, "--num-processes", "2", "--threads-per-process", "1", "--max-restarts", "1"]
    command += [str(tmp_path / "training.py"), str(project), "fail", str(result)]
    done = subprocess.run(
        command, env=clean_environment(tmp_path), capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RuntimeError: injected failure at step 7" in done.stderr
    assert "resumed after step 6" in done.stdout
    assert torch.equal(torch.load(result), straight)
    assert _checkpoints(project) == ["checkpoint_10", "checkpoint_11"]


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_a_failure_beyond_max_restarts_is_raised(tmp_path, max_restarts):
    from notebook_kit import WorkerError
    from notebook_kit.runtime.context import current_launch

    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def always_fails():
        context = current_launch()
        (attempts / f"{context.restart_count}-{context.rank}").touch()
        if context.rank == 1:
            raise RuntimeError(f"broken for good (attempt {context.restart_count})")
        time.sleep(60)

    with pytest.raises(WorkerError, match=f"broken for good \\(attempt {max_restarts}\\)"):
        notebook_launcher(always_fails, num_processes=2, max_restarts=max_restarts)
    # Exactly 1 + max_restarts attempts, each of both ranks: no more, no fewer.
    expected = {f"{attempt}-{rank}" for attempt in range(max_restarts + 1) for rank in (0, 1)}
    assert {path.name for path in attempts.iterdir()} == expected
