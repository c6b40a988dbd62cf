"""The deliberate breakages ``python -m tests.bite`` applies, each with the tests that guard it.

Each breakage replaces one exact snippet of ``notebook_kit`` (paths relative to the package);
when the code changes so that a snippet no longer matches, the run reports the breakage as
stale and it must be rewritten against the new code. Guarding tests are few, small and fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``path``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    """One named breakage of a README promise and the tests that must notice it."""

    name: str
    promise: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]


_LAUNCHER = "tests/test_launcher_integration.py::"
_PROMISES = "tests/test_promises_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "sweep-removed",
        "a worker's own child processes are stopped with it",
        (
            Edit(
                "worker/guardian.py",
                """            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):""",
                """            pass
        with contextlib.suppress(ChildProcessError):""",
            ),
            Edit(
                "worker/guardian.py",
                """            for pid in descendants(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
""",
                "",
            ),
        ),
        (f"{_PROMISES}test_the_grandchildren_of_a_failed_worker_are_stopped",),
    ),
    Mutation(
        "weights-loaded-after-failure",
        "a failed or interrupted run leaves the kernel's model untouched",
        (
            Edit(
                "launch/launcher.py",
                """        outcome = self.supervisor.outcome()
""",
                """        outcome = self.supervisor.outcome()
        load_home_weights(self.kernel_models, (outcome.result or {}).get("weights", {}))
""",
            ),
        ),
        (
            f"{_LAUNCHER}test_weights_of_kernel_models_are_untouched_by_failed_runs",
            f"{_LAUNCHER}test_weights_of_kernel_models_are_untouched_by_an_interrupted_run",
        ),
    ),
    Mutation(
        "shutdown-delayed",
        "an interrupt ends every worker within 2 seconds",
        (
            Edit(
                "launch/supervisor.py",
                """        self._stopping = True
""",
                """        self._stopping = True
        time.sleep(2.1)
""",
            ),
        ),
        (
            f"{_LAUNCHER}test_interrupt_of_the_caller_stops_workers_and_restores_handlers",
            "tests/test_launcher_kernel_integration.py::"
            "test_kernel_interrupt_stops_workers_and_next_launch_works",
        ),
    ),
    Mutation(
        "max-restarts-ignored",
        "max_restarts= starts the workers again after a failure, that many times",
        (
            Edit(
                "launch/launcher.py",
                "if error is not None or self.restart_count >= self.plan.max_restarts:",
                "if True:",
            ),
        ),
        (
            "tests/test_fault_tolerance_integration.py::test_a_failure_beyond_max_restarts_is_raised",
        ),
    ),
    Mutation(
        "max-restarts-unbounded",
        "a failure beyond max_restarts is raised",
        (
            Edit(
                "launch/launcher.py",
                "if error is not None or self.restart_count >= self.plan.max_restarts:",
                "if error is not None or self.restart_count > self.plan.max_restarts:",
            ),
        ),
        (
            "tests/test_fault_tolerance_integration.py::test_a_failure_beyond_max_restarts_is_raised",
        ),
    ),
    Mutation(
        "fork-probe-says-safe",
        "a CUDA context already in the kernel, as a forked probe asks the driver, is refused",
        (
            Edit(
                "config/environment.py",
                "bad = bool(torch_bad_fork()) or status == _CUDA_ERROR_NOT_INITIALIZED",
                "bad = False",
            ),
        ),
        (f"{_LAUNCHER}test_cuda_seen_as_initialised_by_the_fork_probe_is_refused",),
    ),
    Mutation(
        "fork-probe-failure-swallowed",
        "a fork-safety probe that cannot answer refuses the launch",
        (
            Edit(
                "config/environment.py",
                "return KernelState(cuda_bad_fork=False, cuda_devices=0, probe_error=str(error))",
                "return KernelState(cuda_bad_fork=False, cuda_devices=0)",
            ),
        ),
        (
            "tests/test_gpu_decisions.py::"
            "test_a_probe_child_that_fails_is_reported_not_taken_for_safe",
        ),
    ),
    Mutation(
        "partial-checkpoint-is-latest",
        "a checkpoint left unfinished by a killed process is never loaded",
        (
            Edit(
                "accelerator/checkpoint_methods.py",
                "            existing = self._numbered_checkpoints(committed=True)\n",
                "            existing = self._numbered_checkpoints()\n",
            ),
        ),
        (
            "tests/test_checkpoint_faults_integration.py::"
            "test_total_limit_keeps_two_good_checkpoints_after_a_kill_mid_save",
        ),
    ),
    Mutation(
        "stop-flag-never-read",
        "Stop makes should_stop true on every rank at the same step",
        (
            Edit(
                "runtime/context.py",
                "return self.stop_flag is not None and self.stop_flag.is_set()",
                "return False",
            ),
        ),
        (f"{_PROMISES}test_stop_reaches_every_rank_at_the_same_step",),
    ),
    Mutation(
        "prepare-returns-a-wrapper",
        "on one process prepare(model) returns your own module",
        (
            Edit(
                "accelerator/accelerator.py",
                "        else:\n            wrapped = model\n",
                "        else:\n            wrapped = nn.Sequential(model)\n",
            ),
        ),
        (
            "tests/test_accelerator.py::"
            "test_bf16_runs_the_forward_in_bfloat16_on_the_users_own_module",
        ),
    ),
    Mutation(
        "cuda-tensors-not-moved-home",
        "tensors in a result arrive on the CPU wherever the workers had them",
        (
            Edit(
                "worker/homeward.py",
                'if not isinstance(obj, torch.Tensor) or obj.device.type in ("cpu", "meta"):',
                "if True:",
            ),
        ),
        ("tests/test_homeward.py",),
    ),
    Mutation(
        "warmup-not-started",
        "workers' one-time imports are paid once in the kernel",
        (
            Edit(
                "launch/launcher.py",
                "\nstart_warmup()  # from the import cell on",
                "\n# from the import cell on",
            ),
        ),
        (
            "tests/test_warmup_integration.py::"
            "test_forked_workers_inherit_the_warm_modules_even_when_launched_at_once",
        ),
    ),
    Mutation(
        "rank-blame-reversed",
        "the WorkerError names the rank that caused it, not the one that lost its peer",
        (
            Edit(
                "errors.py",
                "primary = [failure for failure in failures if not failure.is_secondary]",
                "primary = [failure for failure in failures if failure.is_secondary]",
            ),
        ),
        ("tests/test_arguments.py::test_root_cause_skips_consequences_of_another_rank",),
    ),
    Mutation(
        "output-lines-split",
        "worker output reaches the cell as whole lines, per rank",
        (
            Edit(
                "launch/line_reader.py",
                "    def _feed(self, chunk: bytes, emit: Emit) -> None:\n",
                "    def _feed(self, chunk: bytes, emit: Emit) -> None:\n"
                "        for line in chunk.splitlines():  # each read as it came\n"
                "            self._emit(line, emit)\n"
                "        return\n",
            ),
        ),
        (f"{_PROMISES}test_warnings_and_c_level_writes_reach_the_cell_as_whole_lines_per_rank",),
    ),
    Mutation(
        "range-checks-removed",
        "bad arguments raise ValueError naming the parameter, before any process starts",
        (
            Edit(
                "config/arguments.py",
                "    if value < minimum or (maximum is not None and value > maximum):",
                "    if False:",
            ),
        ),
        ("tests/test_arguments.py::test_bad_arguments_are_refused_before_forking",),
    ),
    Mutation(
        "seed-not-applied",
        "seed= seeds every worker before the function starts",
        (
            Edit(
                "worker/entry.py",
                "    if spec.plan.seed is not None:\n        set_seed(spec.plan.seed)",
                "    pass",
            ),
        ),
        (f"{_PROMISES}test_the_seed_is_applied_in_every_worker",),
    ),
    Mutation(
        "port-released-before-forking",
        "the free port is held from choosing it until the workers use it",
        (
            Edit(
                "launch/forking.py",
                "    listener_fd = listener.fileno() if listener is not None else None\n",
                "    if listener is not None:\n"
                "        listener.close()  # chosen now, bound again by rank 0 after the fork\n"
                "    listener_fd = None\n",
            ),
            Edit(
                "worker/rendezvous.py",
                "    if spec.listen_fd is not None:\n        return dist.TCPStore(",
                "    if spec.rank == 0:\n        return dist.TCPStore(",
            ),
            Edit("worker/rendezvous.py", "            master_listen_fd=spec.listen_fd,\n", ""),
        ),
        (f"{_PROMISES}test_the_port_cannot_be_taken_between_binding_and_forking",),
    ),
    Mutation(
        "dropped-count-lost",
        "metrics dropped under back-pressure are counted",
        (Edit("runtime/metrics.py", '"dropped": state[0],', '"dropped": 0,'),),
        ("tests/test_metrics.py::test_a_blocked_kernel_never_blocks_log_and_drops_are_counted",),
    ),
    Mutation(
        "even-batches-ignored",
        "even_batches: every rank runs the same number of steps",
        (
            Edit(
                "accelerator/sharding.py",
                "self.even_batches = even_batches and num_processes > 1",
                "self.even_batches = False",
            ),
        ),
        ("tests/test_data_loader.py::test_wrap_around_matches_accelerate_dealing",),
    ),
    Mutation(
        "no-sync-syncs",
        "no_sync skips the gradient all-reduce",
        (
            Edit(
                "accelerator/accelerator.py",
                "context = model.no_sync() if isinstance(model, DistributedDataParallel) else None",
                "context = None",
            ),
        ),
        (f"{_PROMISES}test_no_sync_skips_the_all_reduce_and_a_synced_step_averages",),
    ),
    Mutation(
        "clip-does-not-clip",
        "clip_grad_norm_ clips the gradients' total norm",
        (
            Edit(
                "accelerator/accelerator.py",
                "return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)",
                "return torch.nn.utils.get_total_norm([p.grad for p in parameters], norm_type)",
            ),
        ),
        (f"{_PROMISES}test_autocast_and_clip_grad_norm_on_two_processes",),
    ),
    Mutation(
        "fp16-loss-not-scaled",
        "fp16 scales the loss before backward and unscales before the step",
        (Edit("accelerator/accelerator.py", "loss = self.scaler.scale(loss)", "loss = loss"),),
        ("tests/test_accelerator.py::test_fp16_path_uses_a_grad_scaler_and_keeps_the_loss_finite",),
    ),
    Mutation(
        "sigkill-late",
        "a worker that ignores SIGTERM is killed after a short grace (SIGTERM, then SIGKILL)",
        (
            Edit(
                "worker/guardian.py",
                "TERMINATE_GRACE_SECONDS = 0.5",
                "TERMINATE_GRACE_SECONDS = 3.0",
            ),
        ),
        (f"{_PROMISES}test_a_worker_ignoring_sigterm_is_killed_after_the_grace",),
    ),
    Mutation(
        "quiet-view-hides-errors",
        "live=False still shows errors",
        (Edit("live/headless.py", '        if stream == "stderr":\n', "        if False:\n"),),
        (f"{_PROMISES}test_live_false_still_shows_errors",),
    ),
    Mutation(
        "debug-frame-lost",
        "with num_processes=1 exceptions and %debug land in your frame",
        (
            Edit(
                "launch/in_kernel.py",
                "        error = raised\n        raise\n",
                "        error = raised\n        raise RuntimeError(f'launch failed: {raised}')\n",
            ),
        ),
        (
            "tests/test_promises_kernel_integration.py::"
            "test_debug_after_a_launch_in_the_kernel_lands_in_the_users_frame",
        ),
    ),
    Mutation(
        "logging-outside-a-launch-starts-a-channel",
        "outside a launch log, should_stop and progress do nothing",
        (
            Edit(
                "runtime/metrics.py",
                "    if context is None or context.send is None:\n        return\n    channel(",
                "    if context is None:\n        return\n    channel(",
            ),
        ),
        ("tests/test_metrics.py::test_outside_a_launch_logging_does_nothing",),
    ),
)
