"""Deliberate breakages of the pool's declared backend: its protocol, its settling, its error.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_POOL = "tests/test_pool_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "pool-backend-lacks-a-member",
        "both pool backends implement every member of the PoolBackend protocol",
        (
            Edit(
                "launch/cluster/pool.py",
                "    def exit_codes(self)",
                "    def _exit_codes(self)",
            ),
        ),
        ("tests/test_pool.py::test_both_pool_backends_have_every_member_of_the_backend_protocol",),
    ),
    Mutation(
        "pool-error-forgets-a-closed-pool",
        "a failed pool command's error says in a field whether the pool was closed",
        (
            Edit(
                "launch/pool/results.py",
                '    fate: PoolFate = "stopped" if backend.restarts_after_fault else "closed"',
                '    fate: PoolFate = "stopped"',
            ),
        ),
        (
            "tests/test_pool.py::"
            "test_a_failed_command_says_in_a_field_whether_the_pool_kept_stopped_or_closed_its_workers",
        ),
    ),
    Mutation(
        "pool-settle-interrupts-no-one",
        "on a fault or Ctrl-C the pool interrupts the ranks still running; they keep their state",
        (Edit("launch/pool/backend.py", "        interrupt()\n", "        pass\n"),),
        (_POOL + "test_interrupt_of_python_code_keeps_the_workers_and_their_names",),
    ),
    Mutation(
        "pool-settle-waits-forever",
        "ranks that do not stop within the settling time are stopped, within two seconds",
        (
            Edit(
                "launch/pool/backend.py",
                "        return self.ends is not None and now >= self.ends\n",
                "        return False\n",
            ),
        ),
        (_POOL + "test_interrupt_of_blocked_code_stops_the_workers_within_two_seconds",),
    ),
)
