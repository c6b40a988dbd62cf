"""Deliberate breakages of every rank's stacks on demand (``notebook_kit.stacks()``).

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_STACKS = "tests/test_stacks_integration.py::"
_FROM_A_THREAD = (
    _STACKS + "test_stacks_from_another_thread_name_the_sleep_and_the_all_reduce_then_the_run_stops"
)
_SILENT_RANK = (
    _STACKS
    + "test_a_rank_that_cannot_answer_gets_its_pid_and_state_and_the_call_keeps_its_deadline"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "stacks-request-never-taken",
        "the run's loop takes a stacks() request at its next turn and signals the ranks",
        (Edit("launch/supervisor.py", "            self.stacks.take(self.workers)\n", ""),),
        (_FROM_A_THREAD,),
    ),
    Mutation(
        "stacks-answers-go-to-the-stall-watch-only",
        "each rank's answer reaches the stacks() request that asked for it",
        (
            Edit(
                "launch/supervisor.py",
                "            self.stacks.on_stacks(worker.rank, list(message.threads))\n",
                "",
            ),
        ),
        (_FROM_A_THREAD,),
    ),
    Mutation(
        "stacks-waits-past-its-deadline",
        "stacks() returns within its timeout, whatever a rank does",
        (
            Edit(
                "launch/stack_requests.py",
                "    request.answered.wait(max(0.0, request.deadline - time.monotonic()))\n",
                "    request.answered.wait(request.timeout * 4)\n",
            ),
        ),
        (_SILENT_RANK,),
    ),
    Mutation(
        "stacks-silent-rank-without-its-state",
        "a rank that does not answer is named with its pid and process state",
        (
            Edit(
                "launch/stack_requests.py",
                '(f", process state {state}" if state else "")',
                '""',
            ),
        ),
        (_SILENT_RANK,),
    ),
    Mutation(
        "stacks-on-the-loop-thread-never-turn-the-loop",
        "stacks() on the thread of an awaited launch's event loop turns the run's loop itself",
        (Edit("launch/stack_requests.py", "        desk.pump_until(request)\n", "        pass\n"),),
        (_STACKS + "test_stacks_on_the_event_loops_thread_while_an_awaited_launch_runs_as_a_task",),
    ),
    Mutation(
        "stacks-pool-command-not-watched",
        "stacks() answers while a WorkerPool command runs",
        (
            Edit(
                "launch/pool/workers.py",
                "        self.supervisor.watch(self.plan.stall_seconds)\n",
                "        self.supervisor.stall.start(self.plan.stall_seconds)\n",
            ),
        ),
        (_STACKS + "test_stacks_during_a_pool_command_then_the_pool_closes_with_nothing_left",),
    ),
    Mutation(
        "stacks-native-frames-dropped",
        "with py-spy installed, each rank's native frames are added",
        (Edit("launch/stack_requests.py", "    if native:\n", "    if False:\n"),),
        (_FROM_A_THREAD,),
    ),
    Mutation(
        "stacks-native-frames-in-terminal-colours",
        "native frames read in a kernel whose environment forces colours are plain text",
        (
            Edit(
                "launch/native_stacks.py",
                '                env={**os.environ, "NO_COLOR": "1", "CLICOLOR_FORCE": "0", '
                '"FORCE_COLOR": "0"},\n',
                "",
            ),
            Edit("launch/native_stacks.py", '_ESCAPES.sub("", dump)', "dump"),
        ),
        (
            "tests/test_stacks_kernel_integration.py::"
            "test_stacks_from_a_second_cell_thread_while_a_launch_runs",
        ),
    ),
    Mutation(
        "stacks-signal-kills-a-worker-not-yet-answering",
        "a stacks() request that reaches a worker before its answering thread waits for it",
        (
            Edit(
                "worker/guardian.py",
                "signal.pthread_sigmask(signal.SIG_BLOCK, {STACKS_SIGNAL, PROFILE_SIGNAL})",
                "signal.pthread_sigmask(signal.SIG_BLOCK, {PROFILE_SIGNAL})",
            ),
        ),
        (_STACKS + "test_a_request_before_a_worker_can_answer_waits_for_it_and_kills_nothing",),
    ),
    Mutation(
        "stacks-cluster-request-never-relayed",
        "a node task passes the kernel's stacks() request on to its node process",
        (
            Edit(
                "node/task.py",
                "                orders.send_bytes(encode(ask, self.seal))\n",
                "                pass\n",
            ),
        ),
        (
            "tests/test_stacks_cluster_integration.py::"
            "test_stacks_of_a_cluster_run_come_from_every_node_within_the_timeout",
        ),
    ),
    Mutation(
        "stacks-waits-inside-the-runs-own-loop",
        "stacks() from inside the run's loop (a view's callback) is refused for ask_stacks()",
        (Edit("launch/stack_requests.py", "        if self.in_turn:\n", "        if False:\n"),),
        (_STACKS + "test_a_view_inside_the_runs_loop_asks_without_waiting_and_reads_a_future",),
    ),
    Mutation(
        "stacks-of-a-run-in-the-kernel-not-taken",
        "stacks() during a one-process run in the kernel shows the thread that runs it",
        (
            Edit(
                "launch/launchers/kernel_and_torchrun.py",
                "        with stacks_here(KERNEL_PLACE.rank):\n",
                "        with contextlib.nullcontext():\n",
            ),
            Edit(
                "launch/launchers/kernel_and_torchrun.py",
                "from __future__ import annotations\n",
                "from __future__ import annotations\n\nimport contextlib\n",
            ),
        ),
        (_STACKS + "test_one_process_in_the_kernel_answers_from_its_own_thread_without_a_signal",),
    ),
    Mutation(
        "stacks-request-left-at-an-ended-run-waits",
        "a request left at a run that just ended ends at once, with the error",
        (
            Edit(
                "launch/stack_requests.py",
                "        if self.closed:  # the run ended just now: nobody will take it\n",
                "        if False:\n",
            ),
        ),
        (_STACKS + "test_a_request_left_at_a_run_that_just_ended_ends_at_once_with_the_error",),
    ),
    Mutation(
        "stacks-timeout-unchecked",
        "stacks(timeout <= 0) is refused naming timeout",
        (
            Edit(
                "launch/stack_requests.py",
                "    if not math.isfinite(timeout) or timeout <= 0:\n",
                "    if False:\n",
            ),
        ),
        (_STACKS + "test_without_a_run_or_with_a_bad_timeout_the_error_says_what_to_do",),
    ),
)
