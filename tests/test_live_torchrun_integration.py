"""The text view under ``notebook-kit launch`` (torchrun): rank 0 speaks for the job, once."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leftover_processes")]

SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    from notebook_kit import Accelerator, notebook_launcher
    from notebook_kit.runtime.context import current_launch
    from notebook_kit.runtime.progress import advance

    def train(steps):
        accelerator = Accelerator()
        accelerator.progress(total=steps)
        for step in range(steps):
            # rank 0 logs 1/(step+1), rank 1 three times that: the mean is twice rank 0's
            loss = (1 + 2 * dist.get_rank()) / (step + 1)
            accelerator.log({"loss": loss}, step=step)
            advance(current_launch())  # what a prepared loader counts
        accelerator.end_training()
        return steps

    if __name__ == "__main__":
        notebook_launcher(train, args=(40,), num_processes=2)
    """
)


def test_banner_and_summary_come_once_from_rank_0_with_the_mean_over_ranks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = [sys.executable, "-m", "notebook_kit", "launch", "--num-processes", "2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    assert printed.count("Running under torchrun") == 1, printed
    finished = re.findall(r"^\[finished\].*$", printed, re.M)
    assert len(finished) == 1, printed
    assert "step 40/40 (100%)" in finished[0] and "loss 0.05" in finished[0]  # (1/40 + 3/40) / 2
