"""Deliberate breakages of the cluster probe's GPU count: taken by the node's torch in a
zygote's child, never by torch in the engine worker, and kept as the engine gives it where it
knows it.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_COUNT = "tests/test_node_gpu_count.py::"
_ARCH = "tests/test_architecture.py::test_an_engine_worker_never_imports_torch"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "probe-counts-gpus-in-the-engine-worker",
        "the probe counts GPUs in a process started as the node's; the engine worker never "
        "imports torch",
        (
            Edit(
                "node/probe.py",
                "        gpus=counted if gpus is None else gpus,\n",
                '        gpus=__import__("torch").cuda.device_count() if gpus is None else gpus,\n',
            ),
        ),
        (
            f"{_COUNT}test_the_probe_counts_what_this_machines_torch_sees_and_the_worker_never"
            "_imports_torch",
            f"{_COUNT}test_the_count_is_the_node_processs_own",
        ),
    ),
    Mutation(
        "probe-gpu-count-never-asked",
        "the probe asks the node-like process for the GPU count when the engine does not know it",
        (
            Edit(
                "node/probe.py",
                "_node_answers(payload, count_gpus=gpus is None)",
                "_node_answers(payload, count_gpus=False)",
            ),
        ),
        (f"{_COUNT}test_the_count_is_the_node_processs_own",),
    ),
    Mutation(
        "probe-child-counts-no-gpus",
        "the node-like process reports the GPUs its torch counts",
        (
            Edit(
                "node/probe_child.py",
                "        return int(torch.cuda.device_count())\n",
                "        return int(torch.cuda.is_initialized())\n",
            ),
        ),
        (f"{_COUNT}test_the_count_is_the_node_processs_own",),
    ),
    Mutation(
        "probe-overrides-the-engines-gpu-count",
        "an engine that knows its node's GPUs (Ray's resources) keeps that count",
        (
            Edit(
                "node/probe.py",
                "        gpus=counted if gpus is None else gpus,\n",
                "        gpus=counted,\n",
            ),
            Edit(
                "node/probe.py",
                "_node_answers(payload, count_gpus=gpus is None)",
                "_node_answers(payload, count_gpus=True)",
            ),
        ),
        (
            f"{_COUNT}test_the_probe_counts_what_this_machines_torch_sees_and_the_worker_never"
            "_imports_torch",
        ),
    ),
    Mutation(
        "node-module-imports-torch-in-a-function",
        "no module an engine worker runs imports torch, not even inside a function",
        (
            Edit(
                "node/probe.py",
                '    """The installed version of ``package`` (the kernel asks the same)."""\n',
                '    """The installed version of ``package`` (the kernel asks the same)."""\n'
                "    import torch  # noqa: F401\n",
            ),
        ),
        (_ARCH,),
    ),
    Mutation(
        "engine-worker-imports-the-probe-child",
        "the module that imports torch is only a zygote's target, never imported by the worker",
        (
            Edit(
                "node/probe.py",
                "from notebook_kit.node.protocol import ProbeReport\n",
                "from notebook_kit.node.protocol import ProbeReport\n"
                "from notebook_kit.node import probe_child  # noqa: F401\n",
            ),
        ),
        (_ARCH,),
    ),
)
