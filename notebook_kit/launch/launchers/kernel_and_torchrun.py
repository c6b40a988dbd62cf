"""The launchers that start no process: the kernel itself (one process), or a torchrun process."""

from __future__ import annotations

from notebook_kit.launch.calling_process import KERNEL_PLACE, run_in_calling_process, torchrun_place
from notebook_kit.launch.launchers.base import Launcher, Steps
from notebook_kit.launch.plan import Call
from notebook_kit.launch.stacks_here import stacks_here
from notebook_kit.live.observer import LaunchObserver

__all__ = ["InKernelLauncher", "TorchrunLauncher"]


class InKernelLauncher(Launcher):
    """One process: the function runs in the kernel, inside a gloo group of one.

    Exceptions reach the caller unchanged, so ``%debug`` lands in the user's frame.
    """

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        with stacks_here(KERNEL_PLACE.rank):
            return run_in_calling_process(call, self.plan, self.view(observer), KERNEL_PLACE)
        yield  # a generator that needs no wait: it runs at the first step


class TorchrunLauncher(Launcher):
    """Under torchrun the processes exist already: each runs the function in the job's group."""

    def run(self, call: Call, observer: LaunchObserver | None) -> Steps:
        place = torchrun_place()
        assert place is not None, "select_launcher picks this launcher under torchrun only"
        with stacks_here(place.rank):  # this process's rank only: the others are elsewhere
            return run_in_calling_process(call, self.plan, self.view(observer), place)
        yield  # a generator that needs no wait: it runs at the first step
