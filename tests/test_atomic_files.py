"""Files notebook_kit replaces (the saved launch config, ``accelerator.save``'s checkpoint,
``save_state``'s manifest) are replaced atomically: a process that dies mid-write leaves the
old file whole. The crash is real: a forked child may grow a file to a few bytes only, and the
kernel kills it (SIGXFSZ) in the middle of the new file's write, as a full disk or a kill would.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path

import torch

from notebook_kit import Accelerator, LaunchConfig


def _killed_while_writing(write: Callable[[], None], limit: int) -> int:
    """Run ``write`` in a child whose files may not grow past ``limit`` bytes; the signal
    that ended it (0 if it finished)."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: die, as on a kill
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            write()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def test_a_crash_while_saving_the_config_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    LaunchConfig(num_processes=2, seed=1).save(path)
    before = path.read_bytes()
    new = LaunchConfig(num_processes=3, seed=2)
    assert _killed_while_writing(lambda: new.save(path), limit=len(before) // 2) == signal.SIGXFSZ
    assert path.read_bytes() == before
    assert LaunchConfig.load(path) == LaunchConfig(num_processes=2, seed=1)


def test_a_crash_while_saving_a_checkpoint_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    accelerator = Accelerator()
    accelerator.save({"w": torch.zeros(4)}, path)
    before = path.read_bytes()
    bigger = {"w": torch.ones(100_000)}
    killed = _killed_while_writing(lambda: accelerator.save(bigger, path), limit=len(before))
    assert killed == signal.SIGXFSZ
    assert path.read_bytes() == before
    assert torch.equal(torch.load(path)["w"], torch.zeros(4))
