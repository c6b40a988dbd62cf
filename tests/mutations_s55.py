"""Deliberate breakages a cluster run must not survive unnoticed, caught by the scale
benchmark's machinery at a tiny size (``tests/test_scale_benchmark.py``): Stop that never
reaches a node's ranks, metrics a node never passes on, a failure named on the wrong rank.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_TINY = (
    "tests/test_scale_benchmark.py::"
    "test_points_lines_stop_and_the_failure_are_all_measured_at_a_tiny_size"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "scale-stop-never-reaches-the-node-process",
        "Stop pressed in the kernel reaches every rank of every node, and the scale benchmark "
        "reports a Stop that did not",
        (
            Edit(
                "node/task.py",
                "if self.control.stop_requested and self.master_sent and not self.stop_sent:",
                "if False and self.control.stop_requested and self.master_sent:",
            ),
        ),
        (_TINY,),
    ),
    Mutation(
        "scale-node-relay-drops-metrics",
        "Every rank's metrics reach the kernel's plot feed through its node's relay, and the "
        "scale benchmark reports ranks whose points never arrived",
        (
            Edit(
                "launch/node_process/relay.py",
                "    def on_metrics(self, batch: MetricsBatch) -> None:\n        self.send(batch)",
                "    def on_metrics(self, batch: MetricsBatch) -> None:\n        pass",
            ),
        ),
        (_TINY,),
    ),
    Mutation(
        "scale-failure-named-on-the-node-not-the-rank",
        "A failed rank on a node is named by its own rank, not as its node's first rank, and "
        "the scale benchmark checks the rank the error names",
        (
            Edit(
                "launch/cluster/attempt.py",
                "            self.result.failures += on_kernel_clock(failures, time.monotonic())",
                "            self.result.failures.append(node_lost(\n"
                "                node, node * self.settings.num_processes,\n"
                '                self.reports[node].worker, "its ranks failed", "worker"))',
            ),
        ),
        (_TINY,),
    ),
)
