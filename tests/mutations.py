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
    """One named breakage of a documented promise and the tests that must notice it."""

    name: str
    promise: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]


_LAUNCHER = "tests/test_launcher_integration.py::"
_PROMISES = "tests/test_promises_integration.py::"
_FSDP = "tests/test_fsdp_integration.py::"
_WEIGHTS_HOME = (
    "tests/test_weights_home_integration.py::"
    "test_the_weights_come_home_adding_at_most_a_quarter_more_than_the_model_to_the_kernel"
)
_CLUSTER = "tests/test_cluster_integration.py::"
_ASYNC_SAVE = "tests/test_async_save_integration.py::"
_PREEMPTION = "tests/test_preemption_integration.py::"
_SURVIVAL = "tests/test_cluster_survival_integration.py::"
_CLUSTER_POOL = "tests/test_cluster_pool_integration.py::"
_MP_OBJECTS = "tests/test_multiprocessing_objects_integration.py::"
_GPU_PATHS = "tests/test_gpu_paths.py::"
_RAY = "tests/test_ray_integration.py::"
_RAY_CLIENT = "tests/test_ray_client_integration.py::"
_ZYGOTE = "tests/test_zygote.py::"

# The zygote no longer kills a child whose starter's connection closed.
_STARTER_GONE_UNHEARD = Edit(
    "node/zygote.py",
    "            with contextlib.suppress(ProcessLookupError):\n"
    "                os.kill(pid, signal.SIGKILL)\n"
    "            return\n",
    "            return\n",
)
_PARALLEL = "tests/test_parallelism_integration.py::"
_PARALLEL_UNIT = "tests/test_parallelism.py::"
_HSDP = _PARALLEL + "test_hsdp_trains_like_one_process_and_resumes_on_another_mesh"
_TP_FSDP = (
    _PARALLEL + "test_tensor_parallel_with_fsdp_on_a_transformers_model_matches_the_unsplit_one"
)
_TP_PLAIN = (
    _PARALLEL + "test_a_plain_model_splits_by_the_users_plan_from_launch_settings_and_failures"
    "_name_the_mesh"
)

_GPU_POOL = "tests/test_gpu_paths_pool_integration.py::"
_FRONT_END_IDLE = (
    "tests/test_live_kernel_integration.py::"
    "test_an_idle_the_front_end_caused_before_the_live_view_is_undone_as_it_shows"
)

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
                "launch/launchers/forked.py",
                """        outcome = self.supervisor.outcome()
""",
                """        outcome = self.supervisor.outcome()
        if outcome.result is not None:
            fd = getattr(self.launcher.weights_file, "fd", None)
            load_home_weights(self.kernel_models, outcome.result.weights, fd)
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
                "launch/restarts.py",
                "        if restart >= self.max_restarts:\n            return False",
                "        if True:\n            return False",
            ),
        ),
        (
            "tests/test_fault_tolerance_integration.py::test_a_failure_beyond_max_restarts_is_raised",
            f"{_CLUSTER}test_max_restarts_starts_every_node_again",
        ),
    ),
    Mutation(
        "pool-accepts-max-restarts-silently",
        "a WorkerPool refuses max_restarts, which it could only ignore",
        (
            Edit(
                "launch/pool/options.py",
                "    if max_restarts is not None and arguments.check_int(",
                "    if False and arguments.check_int(",
            ),
        ),
        ("tests/test_pool_integration.py::test_bad_settings_fail_before_any_fork",),
    ),
    Mutation(
        "max-restarts-unbounded",
        "a failure beyond max_restarts is raised",
        (
            Edit(
                "launch/restarts.py",
                "        if restart >= self.max_restarts:",
                "        if restart > self.max_restarts:",
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
                "bad = bool(torch_bad_fork()) or status == forked_probe.CUDA_ERROR_NOT_INITIALIZED",
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
                "        existing = self._numbered_checkpoints(committed=True)\n        passed",
                "        existing = self._numbered_checkpoints()\n        passed",
            ),
            Edit(
                "accelerator/checkpoint_methods.py",
                "                state_folder(folder, read_manifest(folder))\n",
                "                pass\n",
            ),
        ),
        (
            "tests/test_checkpoint_faults_integration.py::"
            "test_total_limit_keeps_two_good_checkpoints_after_a_kill_mid_save",
        ),
    ),
    Mutation(
        "async-commit-before-every-rank-wrote",
        "an async save is committed only once every rank's files are written",
        (
            Edit(
                "accelerator/checkpointing.py",
                "        failed = _first_failure(failure, group)\n",
                "        failed = None\n",
            ),
        ),
        (
            f"{_ASYNC_SAVE}test_async_saves_on_two_ranks_hold_the_state_at_the_call_and_commit_after_every_rank",
        ),
    ),
    Mutation(
        "async-save-writes-live-tensors",
        "an async save writes the state at the call, not what training changed since",
        (
            Edit(
                "accelerator/checkpointing.py",
                "            files, sharded = background.staging.copy((files, sharded))\n",
                "",
            ),
        ),
        (
            f"{_ASYNC_SAVE}test_async_saves_on_two_ranks_hold_the_state_at_the_call_and_commit_after_every_rank",
            f"{_ASYNC_SAVE}test_a_sharded_fsdp2_async_save_resumes_to_the_state_at_the_call",
        ),
    ),
    Mutation(
        "async-save-not-awaited-at-the-end-of-the-function",
        "a save still pending when the launched function returns is finished before it ends",
        (
            Edit(
                "accelerator/async_save.py",
                "            self.abandoned.set()\n            return\n        self.wait()\n",
                "            self.abandoned.set()\n            return\n",
            ),
        ),
        (
            f"{_ASYNC_SAVE}test_async_saves_on_two_ranks_hold_the_state_at_the_call_and_commit_after_every_rank",
        ),
    ),
    Mutation(
        "load-state-ignores-a-pending-async-save",
        "load_state waits for a pending async save first",
        (
            Edit(
                "accelerator/checkpoint_methods.py",
                "        self._background_saves.wait()  # a pending save first: it may be "
                "the one to load\n",
                "",
            ),
        ),
        (f"{_ASYNC_SAVE}test_a_sharded_fsdp2_async_save_resumes_to_the_state_at_the_call",),
    ),
    Mutation(
        "async-save-error-swallowed",
        "a failed background write is raised at the next wait, naming the checkpoint",
        (
            Edit(
                "accelerator/async_save.py",
                "        if error is None or self.abandoned.is_set():\n",
                "        if True:\n",
            ),
        ),
        (
            f"{_ASYNC_SAVE}test_a_failed_write_is_raised_at_the_next_save_and_an_abandoned_one_is_never_loaded",
        ),
    ),
    Mutation(
        "unshared-folder-saved-silently",
        "a folder each node sees as a different one is refused at the first save",
        (
            Edit(
                "accelerator/save_agreement.py",
                "    if size == 1:\n        return\n\n    def look()",
                "    if size >= 1:\n        return\n\n    def look()",
            ),
        ),
        (
            "tests/test_object_storage_integration.py::"
            "test_a_folder_that_is_not_shared_by_every_rank_is_refused_at_the_first_save",
        ),
    ),
    Mutation(
        "load-state-raises-without-a-checkpoint",
        "load_state() with no checkpoint yet returns None, so one function starts and resumes",
        (
            Edit(
                "accelerator/checkpoint_methods.py",
                "            if number is None:  # rank 0's listing decides for every rank\n"
                "                return None\n",
                "            if number is None:  # rank 0's listing decides for every rank\n"
                "                raise FileNotFoundError(self._checkpoint_root())\n",
            ),
        ),
        (
            "tests/test_object_storage_integration.py::"
            "test_numbered_checkpoints_on_s3_start_fresh_resume_and_keep_total_limit",
            "tests/test_checkpointing.py::test_numbered_checkpoints_in_project_dir",
        ),
    ),
    Mutation(
        "url-password-kept",
        "a URL carrying a password is refused, so no secret reaches a message",
        (Edit("accelerator/storage.py", "    if parts.password:", "    if False:"),),
        (
            "tests/test_object_storage_integration.py::"
            "test_a_url_without_its_backend_or_with_a_password_is_refused_before_saving",
        ),
    ),
    Mutation(
        "stale-listing-on-object-storage",
        "a listing on object storage sees what other processes wrote since",
        (
            Edit(
                "accelerator/storage.py",
                "    if not is_local(path):\n        path.fs.invalidate_cache()",
                "    if False:\n        path.fs.invalidate_cache()",
            ),
        ),
        (
            "tests/test_object_storage_integration.py::"
            "test_two_ranks_save_and_resume_through_s3_with_credentials_from_the_environment",
            "tests/test_object_storage_integration.py::"
            "test_an_interrupted_or_killed_save_on_s3_is_never_loaded",
            "tests/test_object_storage_integration.py::"
            "test_a_checkpoint_another_process_wrote_is_found_by_a_process_that_listed_before",
        ),
    ),
    Mutation(
        "resume-on-another-world-size-restarts-the-epoch",
        "a loader saved by N processes resumes on M at the same global sample",
        (
            Edit(
                "accelerator/prepared_loader.py",
                '        self._resume_skip = int(state["global_batches"])',
                "        self._resume_skip = 0",
            ),
        ),
        (
            "tests/test_resume_world_size_integration.py::test_ddp_resumes_on_another_world_size_and_sees_every_sample_once",
        ),
    ),
    Mutation(
        "shuffle-state-of-the-other-kind-ignored",
        "one process resumes the permutation several processes drew, and the other way",
        (
            Edit(
                "accelerator/samplers.py",
                '        if "generator" in state:\n            if self.generator is None:',
                '        if "generator" in state and self.generator is not None:\n'
                "            if self.generator is None:",
            ),
        ),
        (
            "tests/test_resume_world_size_integration.py::test_ddp_resumes_on_another_world_size_and_sees_every_sample_once",
        ),
    ),
    Mutation(
        "stop-flag-never-read",
        "Stop makes should_stop true on every rank at the same step",
        (
            Edit(
                "runtime/context.py",
                "return 0 if self.stop_flag is None else self.stop_flag.cause",
                "return 0",
            ),
        ),
        (f"{_PROMISES}test_stop_reaches_every_rank_at_the_same_step",),
    ),
    Mutation(
        "prepare-returns-a-wrapper",
        "on one process prepare(model) returns your own module",
        (
            Edit(
                "accelerator/strategies/single.py",
                "        self.patch_precision(model)\n        return model\n",
                "        self.patch_precision(model)\n        return nn.Sequential(model)\n",
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
                "worker/host_pickling.py",
                'if not isinstance(obj, torch.Tensor) or obj.device.type in ("cpu", "meta"):',
                "if True:",
            ),
        ),
        ("tests/test_host_pickling.py",),
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
                "    if value < minimum:\n",
                "    if False:\n",
            ),
            Edit(
                "config/arguments.py",
                "    if maximum is not None and value > maximum:\n",
                "    if False:\n",
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
        (Edit("runtime/metrics.py", "dropped=state[0],", "dropped=0,"),),
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
                "accelerator/strategies/ddp.py",
                "            return model.no_sync()\n",
                "            return contextlib.nullcontext()\n",
            ),
        ),
        (f"{_PROMISES}test_no_sync_skips_the_all_reduce_and_a_synced_step_averages",),
    ),
    Mutation(
        "clip-does-not-clip",
        "clip_grad_norm_ clips the gradients' total norm",
        (
            Edit(
                "accelerator/strategies/strategy.py",
                "return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)",
                "return torch.nn.utils.get_total_norm([p.grad for p in parameters], norm_type)",
            ),
        ),
        (f"{_PROMISES}test_autocast_and_clip_grad_norm_on_two_processes",),
    ),
    Mutation(
        "fp16-loss-not-scaled",
        "fp16 scales the loss before backward and unscales before the step",
        (
            Edit(
                "accelerator/distributed_methods.py",
                "loss = self.scaler.scale(loss)",
                "loss = loss",
            ),
        ),
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
                "launch/calling_process.py",
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
    Mutation(
        "view-built-before-fork",
        "the live view is built while the workers start, and gets all they sent meanwhile",
        (
            Edit(
                "launch/launchers/forked.py",
                """            self.observer = self.supervisor.observer = self.view()
            self.observer.on_start(info)
""",
                "",
            ),
            Edit(
                "launch/launchers/forked.py",
                """            started = time.monotonic()
""",
                """            self.observer = self.supervisor.observer = self.view()
            self.observer.on_start(info)
            started = time.monotonic()
""",
            ),
        ),
        (
            "tests/test_launchers.py::"
            "test_the_view_is_built_after_the_fork_and_gets_everything_sent_meanwhile_once",
        ),
    ),
    Mutation(
        "failure-decoded-without-traceback",
        "a rank's traceback reaches the kernel whole, from a launch or a pool",
        (
            Edit(
                "runtime/messages.py",
                "        return cls(qualified, str(error), text)\n",
                '        return cls(qualified, str(error), "")\n',
            ),
        ),
        (
            "tests/test_messages.py::test_a_failure_keeps_the_users_frames_and_names_its_rank",
            f"{_LAUNCHER}test_raising_rank_is_reported_with_traceback",
        ),
    ),
    Mutation(
        "import-adds-a-meta-path-finder",
        "importing notebook_kit changes only the documented environment variables",
        (
            Edit(
                "__init__.py",
                "from notebook_kit.config.environment import environment\n",
                "from notebook_kit.config.environment import environment\n"
                "import sys; sys.meta_path.append(importlib.machinery.PathFinder())\n",
            ),
        ),
        (
            "tests/test_import.py::"
            "test_importing_the_package_changes_only_the_documented_environment_variables",
        ),
    ),
    Mutation(
        "cluster-weights-stay-on-the-node",
        "a cluster run brings rank 0's weights home into the kernel's model",
        (
            Edit(
                "launch/cluster/run.py",
                "bring_home=lambda: load_home_weights(dict(enumerate(models)), result.weights),",
                "bring_home=lambda: None,",
            ),
        ),
        (f"{_CLUSTER}test_all_reduce_metrics_result_and_weights_come_home",),
    ),
    Mutation(
        "cluster-failure-not-sent-to-other-nodes",
        "a rank failing on one node ends every node of a cluster run",
        (
            Edit(
                "launch/cluster/attempt.py",
                """on_kernel_clock(failures, time.monotonic())
        self.end_all(f"node {node} failed")""",
                """on_kernel_clock(failures, time.monotonic())""",
            ),
        ),
        (f"{_CLUSTER}test_a_failing_rank_is_named_with_its_node_and_every_node_ends",),
    ),
    Mutation(
        "cluster-dead-worker-unnoticed",
        "a Dask worker that dies is named as its node lost, at once",
        (
            Edit(
                "launch/cluster/attempt.py",
                'self._lose(node, f"its {self.engine.worker_noun} left the cluster")',
                "pass",
            ),
        ),
        (f"{_CLUSTER}test_a_killed_dask_worker_is_node_lost_and_never_retrains",),
    ),
    Mutation(
        "cluster-node-outlives-its-worker",
        "a node process dies with its Dask worker",
        (
            Edit("node/zygote.py", "            _die_with(zygote)\n", ""),
            _STARTER_GONE_UNHEARD,
            Edit(
                "node/zygote.py",
                "                os.kill(pid, signal.SIGKILL)\n        for pid in list(",
                "                pass\n        for pid in list(",
            ),
        ),
        (f"{_CLUSTER}test_a_killed_dask_worker_is_node_lost_and_never_retrains",),
    ),
    Mutation(
        "zygote-child-outlives-its-starter",
        "a zygote's child is killed when its starter's connection closes",
        (_STARTER_GONE_UNHEARD,),
        (f"{_ZYGOTE}test_a_child_whose_starter_died_is_killed",),
    ),
    Mutation(
        "zygote-outlives-its-owner",
        "a zygote ends with its owner's process",
        (
            Edit(
                "node/zygote.py",
                '                elif key.data == "alive":\n                    self._end()\n'
                "                    return\n",
                '                elif key.data == "alive":\n'
                "                    self.selector.unregister(self.alive)\n",
            ),
        ),
        (f"{_ZYGOTE}test_the_zygote_ends_with_its_owner_and_takes_its_children",),
    ),
    Mutation(
        "zygote-children-outlive-it",
        "a zygote's children die with it",
        (Edit("node/zygote.py", "            _die_with(zygote)\n", ""),),
        (f"{_ZYGOTE}test_a_dead_zygote_is_a_clear_error_and_its_children_read_as_killed",),
    ),
    Mutation(
        "zygote-dies-of-sigterm",
        "a zygote ignores the SIGTERM a SLURM step or a process group sends every process",
        (
            Edit(
                "node/zygote.py",
                "    for signum in (signal.SIGINT, signal.SIGTERM):\n"
                "        signal.signal(signum, signal.SIG_IGN)\n",
                "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n",
            ),
        ),
        (f"{_ZYGOTE}test_sigint_and_sigterm_to_the_zygote_leave_it_serving",),
    ),
    Mutation(
        "zygote-child-keeps-the-zygotes-environment",
        "a zygote's child takes the environment of its request",
        (Edit("node/zygote.py", "            _take_environment(order.env)\n", ""),),
        (
            f"{_ZYGOTE}test_a_child_runs_its_target_with_its_environment_streams_and_the_"
            "preloaded_torch",
        ),
    ),
    Mutation(
        "zygote-made-per-launch",
        "a Dask worker keeps its zygote for the next launch",
        (
            Edit(
                "node/zygote.py",
                "        if _local is None or not _local.alive():\n",
                "        if True:\n",
            ),
        ),
        (f"{_CLUSTER}test_the_next_launch_forks_its_nodes_from_each_workers_warm_zygote",),
    ),
    Mutation(
        "ray-dead-keeper-kept",
        "a keeper that died is made again by the next launch",
        (
            Edit(
                "launch/cluster/engines/ray_actors.py",
                "            _deaths[key] = _deaths.get(key, 0) + 1\n",
                "            return made\n",
            ),
        ),
        (f"{_RAY}test_the_next_launch_forks_its_nodes_from_the_ray_nodes_keeper",),
    ),
    Mutation(
        "node-strips-the-nanny-settings-only-where-distributed-was-imported",
        "a Ray node's process starts without the nanny's settings a LocalCluster left behind",
        (
            Edit(
                "node/links/dask_nanny.py",
                "        if presets is None:\n",
                "        if False:\n",
            ),
        ),
        (
            f"{_RAY}test_all_reduce_metrics_result_and_weights_come_home",
            "tests/test_cluster_checks.py::"
            "test_a_process_that_never_imported_distributed_strips_the_nannys_settings_too",
        ),
    ),
    Mutation(
        "ray-control-read-never-waits",
        "a running node's control read waits in the hub for a change",
        (
            Edit(
                "node/links/ray.py",
                "                await asyncio.wait_for(state.changed.wait(), wait)\n",
                "                pass\n",
            ),
        ),
        (
            f"{_RAY}test_a_nodes_control_read_waits_in_the_hub_actor_while_the_kernel_publishes",
            "tests/test_ray_engine.py::"
            "test_a_nodes_control_read_waits_in_the_hub_for_a_change_but_not_for_a_lease_tick",
        ),
    ),
    Mutation(
        "ray-client-address-asked-of-the-client-api",
        "a kernel joined as a Ray client runs the cell again on that connection",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                "getattr(client.get_context().client_worker, ",
                "getattr(client.client_worker, ",
            ),
        ),
        (f"{_RAY_CLIENT}test_a_ray_client_kernel_launches_runs_the_cell_again_and_keeps_a_pool",),
    ),
    Mutation(
        "ray-client-handle-left-to-rays-retries",
        "a ray:// handle that no head takes is refused at once, naming the fix",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                "        socket.create_connection((host, port), timeout=_REACH_SECONDS).close()\n",
                "        pass\n",
            ),
        ),
        (f"{_RAY_CLIENT}test_a_ray_client_handle_that_no_head_takes_is_refused_at_once",),
    ),
    Mutation(
        "ray-failed-client-connection-left-half-made",
        "after a failed Ray client connection the kernel can join a cluster again",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                "    except BaseException as error:\n        ray.shutdown()\n",
                "    except BaseException as error:\n",
            ),
        ),
        (
            f"{_RAY_CLIENT}"
            "test_the_heads_gcs_port_is_named_and_the_kernel_can_join_the_right_one_after",
        ),
    ),
    Mutation(
        "grpc-fork-support-left-on",
        "a kernel holding a Ray client's gRPC threads forks workers that start none of gRPC's",
        (
            Edit(
                "__init__.py",
                'os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")\n',
                "",
            ),
        ),
        (f"{_RAY_CLIENT}test_a_ray_client_kernel_launches_runs_the_cell_again_and_keeps_a_pool",),
    ),
    Mutation(
        "ray-lease-tick-wakes-waiting-nodes",
        "a lease tick alone wakes no node's control read",
        (
            Edit(
                "node/links/ray.py",
                "        moved = _but_lease(control) != _but_lease(state.control)\n",
                "        moved = True\n",
            ),
        ),
        (
            f"{_RAY}test_a_nodes_control_read_waits_in_the_hub_actor_while_the_kernel_publishes",
            "tests/test_ray_engine.py::"
            "test_a_nodes_control_read_waits_in_the_hub_for_a_change_but_not_for_a_lease_tick",
        ),
    ),
    Mutation(
        "ray-zygote-in-the-node-tasks-process",
        "a Ray node's processes come from the kernel's keeper, which outlives Ray's workers",
        (
            Edit(
                "node/links/ray.py",
                "        return self._zygote\n",
                "        return local_zygote(env).path\n",
            ),
        ),
        (f"{_RAY}test_the_next_launch_forks_its_nodes_from_the_ray_nodes_keeper",),
    ),
    Mutation(
        "cluster-lease-ignored",
        "the nodes of a cluster run end when the kernel that started them dies",
        (
            Edit(
                "node/task.py",
                '"lease" if time.monotonic() - self._renewed > self._lease_seconds else ""',
                '""',
            ),
        ),
        (f"{_CLUSTER}test_a_dead_kernel_ends_every_node_through_its_lease",),
    ),
    Mutation(
        "cluster-rerun-trains-again",
        "Dask running a node task again never trains twice",
        (
            Edit(
                "node/links/dask.py",
                "    if started.get(callback_timeout=_RPC_SECONDS):",
                "    if False:",
            ),
        ),
        (f"{_CLUSTER}test_a_node_task_run_again_refuses_to_train",),
    ),
    Mutation(
        "newest-step-merged-away",
        "the newest logged step is its own point, exactly as logged",
        (
            Edit(
                "live/metrics.py",
                """        if len(self.pending) <= at:
            self.pending.extend([0.0] * (at + _FIELDS - len(self.pending)))
        _add_value(self.pending, at, step, value)
""",
                """        point = self.points.get(step // self.width)
        if point is None or len(point) <= at:
            point = self._point_for(step // self.width, rank)
        _add_value(point, at, step, value)
""",
            ),
        ),
        ("tests/test_metrics.py::test_the_newest_logged_step_is_its_own_point_exactly_as_logged",),
    ),
    Mutation(
        "route-idles-shown-mid-run",
        "the kernel shows Busy for the whole launch, with no Idle between two messages",
        (
            Edit(
                "live/kernel_status.py",
                'elif parent.get("header", {}).get("session") in self._held_sessions:',
                "elif False:",
            ),
        ),
        (
            "tests/test_live_kernel_integration.py::"
            "test_the_launchs_own_requests_never_show_idle_while_the_cell_runs",
        ),
    ),
    Mutation(
        "epoch-drawn-as-a-metric",
        "a logged epoch is a table column, not a plotted line",
        (
            Edit(
                "live/plot_layout.py",
                "        if not is_axis_name(name):\n            groups.setdefault(",
                "        if True:\n            groups.setdefault(",
            ),
        ),
        (
            "tests/test_plot_layout.py::test_a_logged_epoch_is_a_table_column_and_never_a_plotted_line",
        ),
    ),
    Mutation(
        "flat-line-drawn-as-noise",
        "a flat learning rate shows as a flat line with a sensible y range",
        (
            Edit(
                "live/plot_layout.py",
                "        low = high  # a constant",
                "        pass  # a constant",
            ),
        ),
        (
            "tests/test_plot_layout.py::test_a_flat_learning_rate_is_a_flat_line_in_a_readable_range",
        ),
    ),
    Mutation(
        "legend-and-summary-uncapped",
        "many metrics give a capped legend and summary",
        (
            Edit(
                "live/plot_layout.py",
                "tuple(members[:LINES_PER_PANEL]), max(0, len(members) - LINES_PER_PANEL)",
                "tuple(members), 0",
            ),
            Edit("live/metric_names.py", "        if len(shown) < limit:", "        if True:"),
        ),
        (
            "tests/test_plot_layout.py::"
            "test_thousands_of_metrics_and_huge_names_give_a_capped_legend_and_summary",
        ),
    ),
    Mutation(
        "execute-saves-only-a-success",
        "a failing notebook is still saved up to its failing cell",
        (
            Edit(
                "cli/notebook_runner.py",
                "            _save(notebook, Path(output), finished, echo)",
                "            _save(notebook, Path(output), finished, echo) if finished else None",
            ),
        ),
        (
            "tests/test_notebook_runner.py::"
            "test_a_failing_notebook_is_saved_up_to_its_failing_cell_and_exits_1",
        ),
    ),
    Mutation(
        "execute-checks-the-output-late",
        "the output path is checked before the first cell",
        (Edit("cli/notebook_runner.py", "        check_writable(output)\n", "        pass\n"),),
        (
            "tests/test_notebook_runner.py::test_an_unwritable_output_fails_before_the_first_cell_runs",
        ),
    ),
    Mutation(
        "accelerates-config-objects-refused",
        "Accelerate's own configuration objects are accepted, read field by field",
        (
            Edit(
                "accelerator/accelerate_objects.py",
                "    if isinstance(value, ours) or not is_accelerates(value, ours.__name__):",
                "    if True:",
            ),
        ),
        (
            "tests/test_accelerator_configuration.py::"
            "test_accelerates_own_configuration_objects_are_read_field_by_field",
        ),
    ),
    Mutation(
        "accelerate-field-silently-dropped",
        "an Accelerate field notebook_kit does not support is an error naming it",
        (
            Edit(
                "accelerator/accelerate_objects.py",
                "        if default is dataclasses.MISSING or given != default:",
                "        if False:",
            ),
        ),
        (
            "tests/test_accelerator_configuration.py::"
            "test_an_accelerate_field_notebook_kit_lacks_is_an_error_naming_it",
        ),
    ),
    Mutation(
        "files-written-in-place",
        "a checkpoint or config file is replaced atomically: a crash mid-write leaves the old one",
        (
            Edit(
                "atomic_file.py",
                'with open(temporary, "wb") as handle:',
                'with open(path, "wb") as handle:',
            ),
        ),
        (
            "tests/test_atomic_files.py::test_a_crash_while_saving_the_config_leaves_the_old_file_whole",
            "tests/test_atomic_files.py::"
            "test_a_crash_while_saving_a_checkpoint_leaves_the_old_file_whole",
        ),
    ),
    Mutation(
        "stop-without-a-vote",
        "Stop ends every rank at the same step, even when they see it at different steps",
        (
            Edit(
                "runtime/stopping.py",
                "    return _vote(votes, context)\n",
                "    return bool(context.stop_cause())\n",
            ),
        ),
        (
            f"{_PROMISES}"
            "test_stop_ends_every_rank_at_the_same_step_when_they_see_it_at_different_steps",
        ),
    ),
    Mutation(
        "store-prefix-guessable",
        "the one-node rendezvous prefix is secret and new at every launch",
        (
            Edit(
                "launch/forking.py",
                'return f"notebook_kit/{secrets.token_hex(16)}/"',
                'return f"notebook_kit/{plan.num_processes}/"',
            ),
        ),
        (
            "tests/test_rendezvous_integration.py::"
            "test_the_one_node_store_prefix_is_random_and_new_at_every_launch",
        ),
    ),
    Mutation(
        "mlflow-tracker-never-started",
        'log_with="mlflow" writes an MLflow run on the main process',
        (
            Edit(
                "integrations/trackers.py",
                "            trackers.append(MLflowTracker(project_name, **options))",
                "            pass",
            ),
        ),
        (
            "tests/test_trackers_integration.py::"
            "test_wandb_and_mlflow_keep_what_the_main_process_logged_and_the_plot_gets_it",
        ),
    ),
    Mutation(
        "docstring-example-no-longer-true",
        "a docstring's >>> example shows what the code does",
        (
            Edit(
                "live/progress.py",
                'return f"{hours}:{minutes:02d}:{secs:02d}" if hours else',
                'return f"{hours}:{minutes:02d}:{secs:02d}" if hours > 1 else',
            ),
        ),
        (
            "tests/test_docstring_examples.py::test_every_docstring_example_runs_and_shows_its_output",
        ),
    ),
    Mutation(
        "launcher-ignores-the-schema-range",
        "the launcher and LaunchConfig accept the same range for each setting",
        (
            Edit(
                "launch/plan.py",
                "        name: check_argument(SETTINGS[name], value)\n",
                "        name: value\n",
            ),
        ),
        ("tests/test_schema.py::test_the_launcher_and_the_config_refuse_the_same_range",),
    ),
    Mutation(
        "panel-keeps-its-own-range",
        "the panel's number boxes take the schema's range",
        (
            Edit(
                "launch/panel.py",
                "BoundedIntText(min=setting.minimum, max=setting.upper,",
                "BoundedIntText(min=setting.minimum, max=100,",
            ),
        ),
        ("tests/test_schema.py::test_a_setting_added_to_the_schema_reaches_the_panel",),
    ),
    Mutation(
        "environment-variables-ignored",
        "NOTEBOOK_KIT_<NAME> variables set a launch setting over the saved default",
        (
            Edit(
                "config/launch_config.py",
                "        {} if config else settings_from_environ(os.environ if environ",
                "        {} if True else settings_from_environ(os.environ if environ",
            ),
        ),
        ("tests/test_schema.py::test_a_setting_added_to_the_schema_reaches_the_environment",),
    ),
    Mutation(
        "worker-count-unchecked",
        "a worker count beyond the machine's limits is refused first, naming the limit",
        (
            Edit(
                "launch/plan.py",
                "        check_process_count(config.num_processes)\n",
                "        pass\n",
            ),
        ),
        (
            "tests/test_launch_limits.py::"
            "test_more_workers_than_the_cores_allow_is_refused_naming_the_cores",
        ),
    ),
    Mutation(
        "oversubscription-unsaid",
        "the banner warns when processes outnumber the cores",
        (
            Edit(
                "config/launch_plan.py",
                "if not self.cores or self.num_processes <= self.cores:",
                "if True:",
            ),
        ),
        ("tests/test_launch_limits.py::test_the_banner_warns_when_processes_outnumber_the_cores",),
    ),
    Mutation(
        "config-directory-ignored",
        "a saved-default path that is a directory is an error naming it",
        (
            Edit(
                "config/launch_config.py",
                "    if path.is_dir():\n",
                "    if False:\n",
            ),
        ),
        (
            "tests/test_launch_limits.py::test_a_config_path_that_is_a_directory_is_an_error_naming_it",
        ),
    ),
    Mutation(
        "worker-launch-worded-for-the-kernel",
        "a launch from inside a worker is refused in words for a worker",
        (
            Edit(
                "launch/preflight.py",
                "    if context is None or context.send is None:\n        return\n    raise",
                "    if True:\n        return\n    raise",
            ),
        ),
        (
            "tests/test_launch_limits.py::"
            "test_a_launch_from_inside_a_worker_is_refused_in_words_for_a_worker",
        ),
    ),
    Mutation(
        "repeated-presses-delivered",
        "Ctrl-C pressed two or three times ends a launching cell with one KeyboardInterrupt",
        (
            Edit(
                "launch/interrupts.py",
                "    def handle(self, signum: int, frame: FrameType | None) -> None:\n"
                "        if self.repeated():\n            return\n",
                "    def handle(self, signum: int, frame: FrameType | None) -> None:\n",
            ),
        ),
        (
            "tests/test_interrupt_latch.py::"
            "test_a_press_raises_once_and_its_quick_repeats_are_absorbed",
            "tests/test_interrupt_presses_integration.py::"
            "test_two_or_three_quick_presses_end_a_launch_with_one_keyboard_interrupt",
        ),
    ),
    Mutation(
        "no-shield-while-the-error-is-shown",
        "a press while IPython shows the launch's KeyboardInterrupt is absorbed",
        (
            Edit(
                "launch/interrupts.py",
                "        _active = None\n        _afterglow(previous)\n",
                "        _active = None\n        signal.signal(signal.SIGINT, previous)\n",
            ),
        ),
        (
            "tests/test_interrupt_presses_integration.py::"
            "test_two_or_three_quick_presses_end_a_launch_with_one_keyboard_interrupt",
        ),
    ),
    Mutation(
        "pdb-session-under-torchs-collective-timeout",
        "where the cell can answer pdb, the ranks' collectives wait for a rank at its prompt",
        (
            Edit(
                "launch/plan.py",
                "    return DEBUGGING_COLLECTIVE_TIMEOUT if can_type() else None",
                "    return None",
            ),
        ),
        (
            "tests/test_debugger_kernel_integration.py::"
            "test_a_collective_waits_a_week_where_the_cell_can_answer_pdb_and_torchs_default_elsewhere",
        ),
    ),
    Mutation(
        "group-made-without-the-plans-collective-timeout",
        "the process group is made with the plan's collective timeout",
        (
            Edit(
                "worker/rendezvous.py",
                '**({} if waits is None else {"timeout": timedelta(seconds=waits)}),',
                "",
            ),
        ),
        (
            "tests/test_debugger_kernel_integration.py::"
            "test_a_collective_waits_a_week_where_the_cell_can_answer_pdb_and_torchs_default_elsewhere",
        ),
    ),
    Mutation(
        "other-nodes-stall-report-blind-to-pdb",
        "on a cluster, a node's stall report shown in the kernel names a rank elsewhere in pdb",
        (
            Edit(
                "launch/cluster/attempt.py",
                "print(naming_ranks_in_pdb(event.text, self.debugger.ranks()), flush=True)",
                "print(event.text, flush=True)",
            ),
        ),
        (
            "tests/test_debugger_cluster_kernel_integration.py::"
            "test_p_prints_rank_1s_variable_on_its_node_and_c_ends_the_run_normally",
        ),
    ),
    Mutation(
        "cluster-nodes-drop-post-mortem",
        "post_mortem=True reaches a cluster node's ranks (launch and pool)",
        (
            Edit(
                "launch/node_process/process.py",
                "plan, post_mortem=settings.post_mortem,",
                "plan, post_mortem=False,",
            ),
        ),
        (
            "tests/test_debugger_cluster_kernel_integration.py::"
            "test_post_mortem_opens_pdb_in_the_failing_frame_of_a_nodes_rank_and_q_ends_the_run",
            "tests/test_cluster.py::test_each_setting_given_to_a_cluster_launch_is_honoured_or_"
            "refused_before_start",
        ),
    ),
    Mutation(
        "profiler-notes-shown-as-rank-output",
        "torch's profiler notes to itself on a rank's stderr are not shown as its output",
        (
            Edit(
                "launch/line_reader.py",
                'if self.stream == "stderr" and _PROFILER_NOTES.match(line):',
                "if False:",
            ),
        ),
        (
            "tests/test_line_reader.py::"
            "test_the_profilers_notes_to_itself_on_stderr_are_not_a_ranks_output",
            "tests/test_view_buttons_kernel_integration.py::"
            "test_clicking_profile_mid_run_shows_each_ranks_operators_and_timeline_and_keeps_them",
        ),
    ),
    Mutation(
        "cluster-profiles-never-reach-the-request",
        "profile() during a cluster run gets every node's ranks' profiles",
        (
            Edit(
                "launch/cluster/attempt.py",
                "self.stacks.on_node_profiles(event)",
                "pass",
            ),
        ),
        (
            "tests/test_stacks_cluster_integration.py::"
            "test_profile_of_a_cluster_run_comes_from_every_node",
        ),
    ),
    Mutation(
        "node-ignores-the-profile-ask",
        "a node task passes the kernel's profile() request on to its node process",
        (
            Edit(
                "node/task.py",
                "        if control.profile is not None:\n"
                "            self.profile = control.profile\n",
                "",
            ),
        ),
        (
            "tests/test_stacks_cluster_integration.py::"
            "test_profile_of_a_cluster_run_comes_from_every_node",
        ),
    ),
    Mutation(
        "nodes-keep-torchs-collective-timeout-under-pdb",
        "a cluster node's ranks wait in collectives as long as the kernel's cell can answer pdb",
        (
            Edit(
                "launch/node_process/process.py",
                "collective_timeout=settings.collective_timeout",
                "collective_timeout=plan.collective_timeout",
            ),
        ),
        (
            "tests/test_cluster.py::"
            "test_the_nodes_ranks_wait_in_collectives_as_long_as_the_kernels_cell_can_answer_pdb",
        ),
    ),
    Mutation(
        "shield-ends-with-the-cells-code",
        "a repeat press after the cell's code, before its reply, is absorbed too",
        (
            Edit(
                "launch/interrupts.py",
                "    signal.signal(signal.SIGINT, absorb)\n",
                "    signal.signal(signal.SIGINT, absorb)\n"
                "    _ipython().events.register(\n"
                "        'post_execute', lambda: signal.signal(signal.SIGINT, original)\n"
                "    )\n",
            ),
        ),
        (
            "tests/test_interrupt_presses_integration.py::"
            "test_a_repeat_landing_after_the_cells_code_still_gets_the_cell_its_reply",
        ),
    ),
    Mutation(
        "next-launch-forgets-the-repeats",
        "a launch that a cell starts right after catching an interrupt absorbs its repeats",
        (
            Edit(
                "launch/interrupts.py",
                'getattr(previous, "until", 0.0))',
                "0.0)",
            ),
        ),
        (
            "tests/test_interrupt_presses_integration.py::"
            "test_a_launch_right_after_a_caught_interrupt_absorbs_its_repeats_but_not_a_new_press",
        ),
    ),
    Mutation(
        "stall-never-reported",
        "a run in which no rank makes progress shows where each rank waits",
        (
            Edit(
                "launch/stall_watch.py",
                "            if now - self._last >= self.seconds:\n",
                "            if False:\n",
            ),
        ),
        (
            "tests/test_stall_integration.py::test_a_stalled_run_shows_where_each_rank_waits_and_goes_on",
        ),
    ),
    Mutation(
        "output-is-not-progress",
        "no stall report while the ranks keep printing",
        (
            Edit(
                "launch/supervisor.py",
                "                    self.stall.progress()\n                    reader.read(",
                "                    reader.read(",
            ),
        ),
        ("tests/test_stall_integration.py::test_a_run_that_keeps_printing_is_never_reported",),
    ),
    Mutation(
        "stop-vote-not-named",
        "the collective a rank waits in names should_stop()'s vote as such",
        (
            Edit(
                "runtime/waiting.py",
                '    if any(PurePath(file) == _STOPPING and name == "_vote"'
                " for file, name in frames):",
                "    if not frames:",
            ),
        ),
        (
            "tests/test_stall_integration.py::"
            "test_a_rank_that_returns_during_the_stop_vote_is_blamed_and_the_vote_named",
        ),
    ),
    Mutation(
        "pool-commands-interleave",
        "a pool serves one command at a time; callers of other threads wait in order",
        (
            Edit(
                "launch/pool/turns.py",
                "        with interrupt_latch(), self._turns.take(what):\n",
                "        with interrupt_latch():\n",
            ),
        ),
        (
            "tests/test_pool_turns_integration.py::test_commands_from_threads_never_interleave",
            "tests/test_pool_turns_integration.py::test_waiting_callers_are_served_in_the_order_they_called",
        ),
    ),
    Mutation(
        "pool-timeout-said-as-a-stop",
        "a pool run past its timeout raises TimeoutError naming it, also when workers are stopped",
        (
            Edit(
                "launch/pool/results.py",
                "    if outcome.timed_out:\n        raise TimeoutError(\n"
                '            f"The run did not finish within timeout={timeout} s. It was',
                "    if False:\n        raise TimeoutError(\n"
                '            f"The run did not finish within timeout={timeout} s. It was',
            ),
        ),
        (
            "tests/test_pool_turns_integration.py::"
            "test_a_timeout_the_workers_cannot_stop_for_is_a_timeout_error_that_says_they_were_stopped",
        ),
    ),
    Mutation(
        "interrupted-send-unsaid",
        "an interrupted push says in its own cell that the workers were stopped",
        (
            Edit(
                "launch/pool/results.py",
                "    if isinstance(error, KeyboardInterrupt):\n        print(",
                "    if False:\n        print(",
            ),
        ),
        (
            "tests/test_pool_turns_integration.py::test_an_interrupted_push_says_in_its_own_call_that_the_workers_were_stopped",
        ),
    ),
    Mutation(
        "group-check-blind-to-pending-collectives",
        "the pool's group check finds a collective one rank left pending, every time",
        (
            Edit(
                "worker/pool/command_loop.py",
                "        calls = _default_group_calls()\n",
                "        calls = 0\n",
            ),
        ),
        (
            "tests/test_pool_integration.py::"
            "test_a_group_left_out_of_step_is_found_and_the_workers_restarted",
        ),
    ),
    # -- the GPU paths (tests/test_gpu_paths*.py) ----------------------------------------------
    Mutation(
        "log-reads-tensors-on-the-training-thread",
        "accelerator.log never waits for the device",
        (
            Edit(
                "runtime/metrics.py",
                "        return value.detach().clone()\n    return value\n",
                "        return value.detach().item()\n    return value\n",
            ),
        ),
        (f"{_GPU_PATHS}test_accelerator_log_of_tensors_never_reads_them_on_the_training_thread",),
    ),
    Mutation(
        "accelerator-history-unbounded",
        "an Accelerator keeps a bounded history of what it logged",
        (
            Edit(
                "runtime/log_values.py",
                "            maxlen=capacity\n",
                "            maxlen=None\n",
            ),
        ),
        (f"{_GPU_PATHS}test_the_history_an_accelerator_keeps_is_bounded",),
    ),
    Mutation(
        "sender-dies-on-a-bad-value",
        "nothing a user logs can stop the metrics sender",
        (
            Edit(
                "runtime/messages.py",
                "        except Exception:  # a sender that raised",
                "        except (TypeError, ValueError):  # a sender that raised",
            ),
        ),
        (f"{_GPU_PATHS}test_nothing_logged_can_stop_the_sender_or_fail_the_end_of_the_run",),
    ),
    Mutation(
        "log-takes-a-number-no-float-can-hold",
        "a value log cannot send is refused where log is called, naming its key",
        (Edit("runtime/log_values.py", "        return float(value)\n", "        return value\n"),),
        (f"{_GPU_PATHS}test_both_log_calls_refuse_the_same_values_naming_the_key",),
    ),
    Mutation(
        "fused-overflow-not-a-skip",
        "an fp16 overflow with a fused optimizer is a skipped step",
        (Edit("accelerator/optimizer.py", 'getattr(optimizer, "found_inf", None)', "None"),),
        (
            f"{_GPU_PATHS}test_fp16_overflow_with_a_fused_optimizer_is_a_skipped_step_and_holds"
            "_the_scheduler",
        ),
    ),
    Mutation(
        "driver-error-not-said",
        "a run on the CPU of a GPU machine says why",
        (
            Edit(
                "config/forked_probe.py",
                "    meaning = _CUDA_ERRORS.get(",
                "    return None\n    meaning = _CUDA_ERRORS.get(",
            ),
        ),
        (f"{_GPU_PATHS}test_a_driver_that_fails_to_start_is_named_in_the_banner_of_the_cpu_run",),
    ),
    Mutation(
        "probe-child-waited-for-ever",
        "no wait for a probe child is unbounded",
        (
            Edit(
                "config/forked_probe.py",
                "    if _exited_within(pid, _EXIT_GRACE_S):\n        return\n",
                "    os.waitpid(pid, 0)\n    return\n",
            ),
        ),
        (f"{_GPU_PATHS}test_a_probe_child_that_survives_sigkill_is_given_up_after_a_deadline",),
    ),
    Mutation(
        "report-misses-a-foreign-context",
        "environment() and the launch agree on fork safety",
        (
            Edit(
                "config/environment.py",
                "cuda_context_elsewhere=kernel.cuda_bad_fork and not torch.cuda.is_initialized(),",
                "cuda_context_elsewhere=False,",
            ),
        ),
        (
            f"{_GPU_PATHS}test_the_report_and_the_launch_agree_after_a_cuda_context_made_behind_torch",
        ),
    ),
    Mutation(
        "gpu-generator-pickled-as-is",
        "nothing that comes home initialises CUDA in the kernel",
        (
            Edit(
                "worker/host_pickling.py",
                "        return _generator_on_host(obj)\n",
                "        return NotImplemented\n",
            ),
        ),
        (f"{_GPU_PATHS}test_a_returned_gpu_generator_comes_home_as_a_cpu_generator_with_its_seed",),
    ),
    Mutation(
        "torchrun-group-before-device",
        "under torchrun the GPU is current and bound before the nccl group",
        (
            Edit(
                "runtime/process_group.py",
                '        bound["device_id"] = device\n',
                "        pass\n",
            ),
        ),
        (
            f"{_GPU_PATHS}test_under_torchrun_the_gpu_is_made_current_before_the_nccl_group_is_created",
        ),
    ),
    Mutation(
        "cpu-group-per-cell",
        "a pool under nccl does not pile up a gloo group per cell",
        (Edit("runtime/process_group.py", " and known[1] in _live_groups():", " and False:"),),
        (f"{_GPU_POOL}test_the_group_count_stays_flat_over_fifty_pool_cells",),
    ),
    Mutation(
        "orphaned-collective-unseen",
        "a collective issued on some ranks only stops the pool's workers",
        (
            Edit(
                "worker/pool/command_loop.py",
                "        if int(ballot[2]) != -int(ballot[3]):",
                "        if False:",
            ),
        ),
        (
            f"{_GPU_POOL}test_a_collective_one_rank_left_unmatched_is_found_and_the_workers_restarted",
        ),
    ),
    Mutation(
        "restart-skips-fork-safety",
        "WorkerPool.restart() refuses a kernel that can no longer fork",
        (
            Edit(
                "launch/pool/worker_pool.py",
                "        self._backend.check_start(self._plan)  # before stopping",
                "        pass  # before stopping",
            ),
        ),
        (
            f"{_GPU_POOL}test_restart_refuses_a_kernel_that_can_no_longer_fork_and_keeps_the_workers",
        ),
    ),
    Mutation(
        "fsdp-optimizer-not-remapped",
        "an optimizer built before sharding is pointed at the sharded parameters, so it trains",
        (
            Edit(
                "accelerator/strategies/fsdp_wrap.py",
                '        group["params"] = renamed\n',
                "",
            ),
        ),
        (f"{_FSDP}test_sharded_training_equals_the_unsharded_loop_and_the_weights_come_home[2]",),
    ),
    Mutation(
        "fsdp-accumulation-syncs",
        "under FSDP, accumulating micro-steps do not reduce their gradients",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                "        model.set_requires_gradient_sync(requires)\n",
                "",
            ),
        ),
        (f"{_FSDP}test_sharded_training_equals_the_unsharded_loop_and_the_weights_come_home[2]",),
    ),
    Mutation(
        "fsdp-weights-not-gathered-home",
        "after an FSDP run the kernel's model holds the full trained weights",
        (
            Edit(
                "worker/entry.py",
                "                    context.gather_weights(spec.home_model_ids)",
                "                    pass",
            ),
            Edit(
                "runtime/weights_file.py",
                "items = _gathered_items(model) if gathered else",
                "items = model.state_dict().items() if gathered else",
            ),
        ),
        (f"{_FSDP}test_sharded_training_equals_the_unsharded_loop_and_the_weights_come_home[2]",),
    ),
    Mutation(
        "one-rank-collective-hangs",
        "a collective only some ranks enter fails within seconds, naming the call and ranks",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                "        self.guard.enter(call)\n        return full_model_state(model)",
                "        return full_model_state(model)",
            ),
        ),
        (f"{_FSDP}test_a_collective_entered_by_one_rank_fails_within_seconds",),
    ),
    Mutation(
        "sharded-checkpoint-skips-optimizer",
        "save_state under FSDP resumes exactly (model and optimizer shards)",
        (
            Edit(
                "accelerator/strategies/fsdp_state.py",
                '            states[f"optimizer_{index}"] = {"optimizer": state}',
                "            pass",
            ),
        ),
        (f"{_FSDP}test_checkpoints_resume_exactly_and_save_model_output_reloads",),
    ),
    Mutation(
        "trainer-fsdp-silently-unsharded",
        "a Trainer asked for FSDP trains sharded or refuses, never silently unsharded",
        (Edit("integrations/trainer_launch.py", "        _check_sharded(trainer)\n", ""),),
        (f"{_FSDP}test_a_trainer_asked_for_fsdp_on_cpu_refuses_instead_of_training_unsharded",),
    ),
    Mutation(
        "taken-interrupt-raises-again",
        "once the launch has taken Ctrl-C, a later press never raises a second KeyboardInterrupt",
        (
            Edit(
                "launch/interrupts.py",
                "        return self.taken or time.monotonic() < self.repeats_until\n",
                "        return time.monotonic() < self.repeats_until\n",
            ),
        ),
        (
            "tests/test_interrupt_latch.py::"
            "test_once_the_interrupt_is_taken_every_later_press_is_absorbed",
        ),
    ),
    Mutation(
        "press-during-clean-up-lost",
        "Ctrl-C during the workers' clean-up is delivered when it ends, never lost",
        (
            Edit(
                "launch/interrupts.py",
                "    finally:\n        latch.holding -= 1\n    latch.deliver_pending()\n",
                "    finally:\n        latch.holding -= 1\n",
            ),
        ),
        (
            "tests/test_interrupt_latch.py::"
            "test_a_press_during_a_clean_up_is_delivered_once_when_it_ends",
        ),
    ),
    Mutation(
        "kernel-queues-not-reset-in-workers",
        "a multiprocessing.Queue made in the kernel takes a worker's put, even locked at the fork",
        (
            Edit(
                "worker/entry.py",
                "    _die_with_parent(parent_pid)\n    _reset_multiprocessing()\n",
                "    _die_with_parent(parent_pid)\n",
            ),
        ),
        (f"{_MP_OBJECTS}test_a_queue_locked_at_the_fork_takes_each_ranks_put_and_delivers_it",),
    ),
    Mutation(
        "worker-queues-not-flushed",
        "what a worker put on a multiprocessing.Queue reaches the kernel, even as the worker ends",
        (Edit("worker/entry.py", "            util._exit_function()\n", "            pass\n"),),
        (f"{_MP_OBJECTS}test_a_queue_locked_at_the_fork_takes_each_ranks_put_and_delivers_it",),
    ),
    Mutation(
        "cluster-node-keeps-the-nannys-malloc-trim",
        "a cluster run's ranks start without what Dask's nanny tuned for its worker process",
        (
            Edit(
                "node/probe.py",
                """        if env.get(name) == value:
            del env[name]""",
                """        pass""",
            ),
        ),
        (
            f"{_CLUSTER}test_all_reduce_metrics_result_and_weights_come_home",
            "tests/test_cluster_checks.py::"
            "test_a_node_process_starts_without_what_the_nanny_tuned_for_its_worker",
        ),
    ),
    Mutation(
        "cluster-nodes-on-one-host-each-take-all-cores",
        "nodes that share a host share its cores as the ranks of one launch would",
        (
            Edit(
                "launch/node_process/process.py",
                " * max(order.host_nodes, 1)\n",
                "\n",
            ),
        ),
        (
            "tests/test_cluster_checks.py::"
            "test_nodes_that_share_a_host_share_its_cores_as_ranks_of_one_launch_would",
        ),
    ),
    Mutation(
        "workers-terminate-the-kernels-children",
        "a local launch leaves the kernel's own multiprocessing children (a LocalCluster) running",
        (Edit("worker/entry.py", "    process._children = set()\n", ""),),
        (f"{_CLUSTER}test_a_local_launch_in_the_kernel_leaves_its_local_clusters_workers_running",),
    ),
    Mutation(
        "cluster-run-blocks-the-event-loop",
        "awaiting a cluster run leaves the kernel's event loop free: Stop is served during it",
        (
            Edit(
                "launch/cluster/run.py",
                "            yield [attempt.wake], _TICK_SECONDS\n",
                "            attempt.step(_TICK_SECONDS)\n",
            ),
        ),
        (f"{_CLUSTER}test_the_await_form_runs_on_the_cluster_and_its_event_loop_serves_stop",),
    ),
    Mutation(
        "cluster-pool-node-runs-once",
        "a cluster pool's node processes stay and serve every run (pids unchanged)",
        (
            Edit(
                "launch/node_process/process.py", "        if order.pool:\n", "        if False:\n"
            ),
        ),
        (
            f"{_CLUSTER}test_a_cluster_pool_keeps_its_nodes_and_ranks_between_runs_and_after_a_failure",
        ),
    ),
    Mutation(
        "cluster-pool-thinks-nodes-hold-the-kernel",
        "a notebook global a cluster pool's cell uses is sent to the nodes, which hold nothing",
        (
            Edit(
                "launch/cluster/pool.py",
                "        holdings.forget_all()  # a node holds nothing",
                "        holdings.remember_all()  # a node holds nothing",
            ),
        ),
        (f"{_CLUSTER_POOL}test_cells_push_and_pull_work_with_global_ranks",),
    ),
    Mutation(
        "cluster-pool-failure-leaves-other-nodes-running",
        "a rank failing on one node interrupts the other nodes' ranks; the pool stays usable",
        (
            Edit(
                "launch/cluster/pool.py",
                "settle.fault(now, lambda: self._attempt.command(Interrupt(seq)))",
                "settle.fault(now, lambda: None)",
            ),
        ),
        (
            f"{_CLUSTER}test_a_cluster_pool_keeps_its_nodes_and_ranks_between_runs_and_after_a_failure",
        ),
    ),
    Mutation(
        "cluster-pool-close-leaves-nodes",
        "closing a cluster pool leaves nothing on any Dask worker",
        (
            Edit(
                "launch/cluster/pool.py",
                "self._attempt.command(RunCommand(self._seq + 1, PoolClose(), (), ()))",
                "None",
            ),
            Edit(
                "launch/cluster/pool.py",
                "            self._attempt.finish(grace=_CLOSE_SECONDS if close else 2.0)\n",
                "",
            ),
        ),
        (
            f"{_CLUSTER}test_a_cluster_pool_keeps_its_nodes_and_ranks_between_runs_and_after_a_failure",
        ),
    ),
    Mutation(
        "cluster-pool-stop-not-relayed",
        "the Stop button ends a cluster pool's run on every node at the same step",
        (
            Edit(
                "launch/node_process/pooling.py",
                "                if order.seq == self.current:\n"
                "                    self.stop_flag.set()\n",
                "                if order.seq == self.current:\n                    pass\n",
            ),
        ),
        (f"{_CLUSTER_POOL}test_the_stop_button_ends_the_run_on_every_node_at_the_same_step",),
    ),
    Mutation(
        "cluster-pool-accepts-send-limit",
        "a cluster pool refuses a setting it cannot honour before any node starts",
        (
            Edit(
                "launch/pool/options.py",
                "    if send_limit != DEFAULT_SEND_LIMIT:",
                "    if False:",
            ),
        ),
        (f"{_CLUSTER}test_a_cluster_pool_refuses_what_it_cannot_honour_before_anything_starts",),
    ),
    Mutation(
        "fsdp-ignored-modules-sharded",
        "FSDP leaves ignored_modules whole: plain parameters, not DTensor shards",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                '            "ignored_params": ignored or None,',
                '            "ignored_params": None,',
            ),
        ),
        (f"{_FSDP}test_ignored_modules_stay_whole_and_still_train_like_the_unsharded_loop",),
    ),
    Mutation(
        "fsdp-ignored-gradients-not-averaged",
        "ignored_modules still train like the unsharded loop: their gradients are averaged",
        (
            Edit(
                "accelerator/strategies/fsdp_wrap.py",
                "            dist.all_reduce(parameter.grad, group=self.group)",
                "            pass",
            ),
        ),
        (f"{_FSDP}test_ignored_modules_stay_whole_and_still_train_like_the_unsharded_loop",),
    ),
    Mutation(
        "fsdp-rank0-weights-not-broadcast",
        "with cpu_ram_efficient_loading every rank holds rank 0's weights after prepare",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                "                load_full_model_state(model, full, from_rank0=True)",
                "                pass",
            ),
        ),
        (f"{_FSDP}test_cpu_ram_efficient_loading_gives_every_rank_rank_0s_weights",),
    ),
    Mutation(
        "fsdp-fp16-unscaled",
        "under FSDP, fp16 losses are scaled and an overflow in one rank's shard skips every rank",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                '        if self.mixed_precision != "fp16":\n            return None\n',
                "        return None\n",
            ),
        ),
        (
            f"{_FSDP}test_fp16_and_bf16_follow_the_unsharded_half_precision_loop"
            "_and_an_overflow_skips_everywhere",
        ),
    ),
    Mutation(
        "fsdp-half-precision-without-autocast",
        "Accelerator(mixed_precision='fp16'/'bf16') with FSDP trains like the unsharded loop",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                "            patch_forward(model, self.mixed_precision, self.device, **autocast)",
                "            pass",
            ),
        ),
        (
            f"{_FSDP}test_fp16_and_bf16_follow_the_unsharded_half_precision_loop"
            "_and_an_overflow_skips_everywhere",
        ),
    ),
    Mutation(
        "fsdp-fp16-ignored-modules-unscaled",
        "under FSDP, fp16 also scales and checks the whole gradients of ignored_modules",
        (
            Edit(
                "accelerator/strategies/fsdp.py",
                "        if not (sharded and whole):\n            return super()._unscale_grads_(",
                "        if True:\n            return super()._unscale_grads_(",
            ),
        ),
        (
            f"{_FSDP}test_fp16_and_bf16_follow_the_unsharded_half_precision_loop"
            "_and_an_overflow_skips_everywhere",
        ),
    ),
    Mutation(
        "launch-use-fsdp-takes-a-value",
        "notebook-kit launch --use-fsdp is a plain flag, as accelerate launch --use_fsdp",
        (
            Edit(
                "config/schema.py",
                '        bool, alias="fsdp", widget="choice", switch=True,',
                '        bool, alias="fsdp", widget="choice",',
            ),
        ),
        (
            "tests/test_fsdp_plugin.py::"
            "test_launch_use_fsdp_is_a_plain_flag_that_reaches_the_scripts_workers",
        ),
    ),
    Mutation(
        "fsdp-benchmark-measures-unsharded",
        "the FSDP benchmark runs and measures sharded models (half the bytes at 2 ranks)",
        (
            Edit("accelerator/strategies/fsdp.py", "        fully_shard(model, **options)\n", ""),
            Edit(
                "accelerator/strategies/fsdp.py",
                "            fully_shard(module, **options)\n",
                "            pass\n",
            ),
        ),
        (
            "tests/test_fsdp_benchmark.py::"
            "test_the_fsdp_benchmark_runs_quickly_and_writes_every_section",
        ),
    ),
    Mutation(
        "launch-use-fsdp-value-unexplained",
        "notebook-kit launch --use-fsdp yes says the flag takes no value and how to write it",
        (
            Edit(
                "cli/script_launch.py",
                "        _check_switch_value(script, script_args, given)\n",
                "",
            ),
        ),
        ("tests/test_fsdp_plugin.py::test_launch_use_fsdp_with_a_value_says_it_takes_none",),
    ),
    Mutation(
        "x-axis-switch-ignored",
        "the plot is drawn against the logged epoch when the user or the code chooses it",
        (
            Edit(
                "live/plot_widget.py",
                'epoch = self.controls_widget.x_axis == "epoch" and self.x_metric is not None',
                "epoch = False",
            ),
        ),
        (
            "tests/test_live.py::"
            "test_a_logged_epoch_offers_an_x_axis_switch_and_the_plot_follows_it",
            "tests/test_live.py::test_the_x_axis_is_chosen_in_code_and_is_the_step_by_default",
        ),
    ),
    Mutation(
        "x-axis-switch-never-offered",
        "a logged epoch offers an x-axis switch in the view",
        (Edit("live/plot_widget.py", "    if x_metric is not None:\n", "    if False:\n"),),
        (
            "tests/test_live.py::"
            "test_a_logged_epoch_offers_an_x_axis_switch_and_the_plot_follows_it",
        ),
    ),
    Mutation(
        "plot-controls-published-mid-run",
        "the plot's controls are served while the cell runs: never published from the main thread",
        (
            Edit(
                "live/plot_widget.py",
                "        points = self.feed.take()\n",
                "        self.controls_widget.send_state()\n        points = self.feed.take()\n",
            ),
        ),
        (
            "tests/test_live.py::"
            "test_a_logged_epoch_offers_an_x_axis_switch_and_the_plot_follows_it",
        ),
    ),
    Mutation(
        "epoch-axis-drawn-by-step",
        "against the epoch, each point is drawn at the epoch its step fell on",
        (
            Edit(
                "live/plot.py",
                "                xs = epoch_positions(xs, along)\n",
                "                pass\n",
            ),
        ),
        (
            "tests/test_live.py::"
            "test_a_logged_epoch_offers_an_x_axis_switch_and_the_plot_follows_it",
        ),
    ),
    Mutation(
        "view-models-not-shared",
        "the live view's widgets share their layout and style: few models per launch",
        (
            Edit(
                "live/shared_models.py",
                "layout=self.layout if layout is None else layout,\n            style=",
                "layout=widgets.Layout() if layout is None else layout,\n            style=",
            ),
        ),
        ("tests/test_live.py::test_the_live_view_opens_few_widget_models_and_closes_them_all",),
    ),
    Mutation(
        "route-made-every-launch",
        "the Stop button's subshell is made once per kernel, not in every launch",
        (Edit("live/kernel_status.py", "        route = _KEPT\n", "        route = None\n"),),
        (
            "tests/test_live_kernel_integration.py::"
            "test_the_launchs_own_requests_never_show_idle_while_the_cell_runs",
        ),
    ),
    Mutation(
        "import-cell-loads-fsdp",
        "the import cell does not pay for torch.distributed.fsdp, which only FSDP runs use",
        (
            Edit(
                "accelerator/strategies/fsdp_plugin.py",
                "\nif TYPE_CHECKING:  # torch.distributed.fsdp costs",
                "\nfrom torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy\n\n"
                "if TYPE_CHECKING:  # torch.distributed.fsdp costs",
            ),
        ),
        (
            "tests/test_import.py::"
            "test_the_import_cell_leaves_fsdp_dask_and_widgets_to_the_runs_that_use_them",
        ),
    ),
    Mutation(
        "busy-keeper-trusts-the-last-status",
        "an idle published before the busy keeper started is undone by the cell's busy",
        (
            Edit(
                "live/kernel_status.py",
                "        keeper._publish_busy()  # an idle published before",
                "        pass  # an idle published before",
            ),
        ),
        (_FRONT_END_IDLE,),
    ),
    Mutation(
        "busy-keeper-starts-with-the-route",
        "the kernel reads Busy from the live view's display, not from the Stop button's route",
        (
            Edit(
                "live/notebook_view.py",
                "        self._keeper = BusyKeeper.start()\n\n",
                "\n",
            ),
            Edit(
                "live/notebook_view.py",
                "        self._shown_at = None\n        hold",
                "        self._shown_at = None\n"
                "        self._keeper = BusyKeeper.start()\n        hold",
            ),
        ),
        (_FRONT_END_IDLE,),
    ),
    Mutation(
        "press-inside-a-fork-raised-there",
        "Ctrl-C that arrives inside a fork's at-fork hooks stops the launch after the fork",
        (
            Edit(
                "launch/interrupts.py",
                "    global _forks_under_way\n    _forks_under_way += 1\n",
                "    global _forks_under_way\n    _forks_under_way += 0\n",
            ),
            Edit(
                "launch/launchers/forked.py",
                "        with interrupts_deferred():\n            started = time.monotonic()\n",
                "        if True:\n            started = time.monotonic()\n",
            ),
        ),
        (
            "tests/test_interrupts_integration.py::"
            "test_an_interrupt_inside_the_fork_stops_the_launch",
        ),
    ),
    Mutation(
        "headless-view-loads-the-widgets",
        "importing the package loads no widgets: scripts and live=False runs never pay for them",
        (
            Edit(
                "live/headless.py",
                "from notebook_kit.live.record import RunRecorder\n",
                "from notebook_kit.live.record import RunRecorder\n"
                "from notebook_kit.live.shared_models import SharedModels  # noqa: F401\n",
            ),
        ),
        (
            "tests/test_import.py::"
            "test_the_import_cell_leaves_fsdp_dask_and_widgets_to_the_runs_that_use_them",
        ),
    ),
    Mutation(
        "cluster-pool-interrupt-not-sent",
        "Ctrl-C during a cluster pool's run interrupts every rank, which keeps its state",
        (
            Edit(
                "launch/cluster/pool.py",
                "lambda: self._attempt.command(Interrupt(seq))",
                "lambda: outcome.answers and self._attempt.command(Interrupt(seq))",
            ),
        ),
        (
            f"{_CLUSTER}"
            "test_ctrl_c_during_a_cluster_pool_run_raises_once_and_the_ranks_keep_their_state",
        ),
    ),
    Mutation(
        "cluster-topics-dropped-before-unsubscribed",
        "a cluster run leaves no event topic on the scheduler, even one unsubscribed late",
        (
            Edit(
                "launch/cluster/engines/dask.py",
                "    while time.monotonic() < deadline and any(\n",
                "    while False and any(\n",
            ),
        ),
        (f"{_CLUSTER}test_an_unsubscribe_that_arrives_after_the_clean_up_leaves_no_topic",),
    ),
    Mutation(
        "kernel-objects-walked-by-workers",
        "a worker's garbage collections never walk the objects it inherited from the kernel",
        (Edit("launch/forking.py", "    gc.freeze()\n", "    pass\n"),),
        (f"{_LAUNCHER}test_workers_garbage_collection_leaves_the_kernels_objects_alone",),
    ),
    Mutation(
        "warm-up-done-taken-from-an-interrupted-join",
        "an interrupt while a launch waits for the warm-up never makes a later fork copy it",
        (
            Edit(
                "launch/warmup.py",
                "        while not _done.wait(0.05):\n            pass\n    wait_for_imports()\n",
                "        thread.join()\n",
            ),
            Edit(
                "launch/warmup.py",
                "            if _thread is not None and _thread is not threading.current_thread()"
                ":\n                _done.wait(max(deadline - time.monotonic(), 0.0))\n"
                "            if not wait_for_imports(max(deadline - time.monotonic(), 0.0)):\n",
                "            if _thread is not None and _thread.is_alive():\n"
                "                _thread.join()\n"
                "            if False:\n",
            ),
        ),
        (
            "tests/test_warmup_integration.py::"
            "test_an_interrupt_while_a_launch_waits_for_the_warm_up_never_poisons_the_kernel",
        ),
    ),
    Mutation(
        "fork-ignores-other-threads-imports",
        "no fork copies a module that another thread of the kernel is still importing",
        (
            Edit(
                "launch/warmup.py",
                "        if owner is not None and owner != me and owner not in blocked:\n",
                "        if False:\n",
            ),
        ),
        ("tests/test_warmup_integration.py::test_a_fork_waits_for_an_import_in_another_thread",),
    ),
    Mutation(
        "raw-checkpoint-exception-from-a-sharded-load",
        "a damaged sharded checkpoint is a CheckpointError naming the file",
        (
            Edit(
                "accelerator/strategies/fsdp_state.py",
                "        raise sharded_load_error(error, path) from error\n",
                "        raise\n",
            ),
        ),
        (
            "tests/test_checkpoint_faults_integration.py::"
            "test_a_damaged_shard_is_a_checkpoint_error_naming_the_file[missing]",
        ),
    ),
    Mutation(
        "truncated-shard-not-named",
        "a shard cut short is named as the file at fault",
        (
            Edit(
                "accelerator/checkpoint_files.py",
                "        if path.stat().st_size < end:\n",
                "        if False:\n",
            ),
        ),
        (
            "tests/test_checkpoint_faults_integration.py::"
            "test_a_damaged_shard_is_a_checkpoint_error_naming_the_file[truncated]",
        ),
    ),
    Mutation(
        "merge-weights-traceback-on-a-damaged-checkpoint",
        "notebook-kit merge-weights says in one line what is wrong with a damaged checkpoint",
        (
            Edit(
                "cli/main.py",
                "    except (FileNotFoundError, CheckpointError) as error:\n",
                "    except FileNotFoundError as error:\n",
            ),
        ),
        (
            "tests/test_checkpoint_faults_integration.py::"
            "test_merge_weights_of_a_checkpoint_missing_a_shard_says_so_in_one_line",
        ),
    ),
    Mutation(
        "worker-reads-setting-variables-its-own-way",
        "a worker reads each NOTEBOOK_KIT_ variable as the schema declares it",
        (
            Edit(
                "accelerator/state.py",
                "        return parse_text(name, raw)\n",
                "        return type(setting.default)(raw)\n",
            ),
        ),
        (
            "tests/test_accelerator.py::"
            "test_a_worker_reads_each_setting_variable_as_the_launcher_does",
        ),
    ),
    Mutation(
        "weights-home-kernel-full-copy",
        "the kernel's memory rises by at most 1.25 times the model as its weights come home",
        (
            Edit(
                "launch/kernel_models.py",
                "from notebook_kit.runtime.weights_file import load_states\n",
                "from notebook_kit.runtime.weights_file import load_states, read_states\n",
            ),
            Edit(
                "launch/kernel_models.py",
                "    load_states(weights_fd, wanted, load)\n",
                "    load_states(None, read_states(weights_fd, wanted), load)\n",
            ),
        ),
        (f"{_WEIGHTS_HOME}[ddp-0.5]",),
    ),
    Mutation(
        "weights-home-rank0-full-copy",
        "rank 0 sends the weights home without a second copy of the model",
        (
            Edit(
                "runtime/weights_file.py",
                "if gathered else model.state_dict().items()",
                "if gathered else [(k, v.clone()) for k, v in model.state_dict().items()]",
            ),
        ),
        (f"{_WEIGHTS_HOME}[ddp-0.5]",),
    ),
    Mutation(
        "cluster-non-zero-rank-reports-home",
        "on a cluster only global rank 0's value and weights go home: another rank's value is "
        "never pickled, and FSDP's weights come home whole",
        (
            Edit(
                "launch/node_process/launch.py",
                "    if plan.node_rank != 0:\n"
                "        call = (OffHomeCall(function), args, kwargs)\n",
                "",
            ),
        ),
        (
            "tests/test_cluster_faults_integration.py::"
            "test_fsdp_on_two_nodes_brings_global_rank_0s_whole_weights_home_once",
        ),
    ),
    Mutation(
        "cluster-drops-fsdp",
        "fsdp=True (or in config=, or NOTEBOOK_KIT_USE_FSDP) shards the model on a cluster too",
        (
            Edit(
                "config/schema.py",
                'switch=True, scope=("node", "worker"),',
                'switch=True, scope=("kernel", "worker"),',
            ),
        ),
        (
            "tests/test_cluster.py::test_fsdp_from_a_config_or_the_environment_reaches_every_node",
            "tests/test_cluster_faults_integration.py::"
            "test_fsdp_on_two_nodes_brings_global_rank_0s_whole_weights_home_once",
        ),
    ),
    Mutation(
        "cluster-takes-a-configs-master-addr-silently",
        "an address the cluster chooses is refused from config= and the environment too",
        (
            Edit(
                "launch/cluster/cluster_plan.py",
                "        if stored[name] != setting.default:",
                "        if False:",
            ),
        ),
        (
            "tests/test_cluster.py::"
            "test_an_address_the_cluster_chooses_is_refused_from_the_environment_too",
        ),
    ),
    Mutation(
        "cluster-restart-count-stays-zero",
        "NOTEBOOK_KIT_RESTART_COUNT counts a cluster's restarts as a local launch's",
        (
            Edit(
                "launch/launchers/forked.py",
                "                self.restarts_before + restart_count,\n",
                "                restart_count,\n",
            ),
        ),
        (f"{_CLUSTER}test_max_restarts_starts_every_node_again",),
    ),
    Mutation(
        "cluster-stall-report-stays-on-the-node",
        "a node's stall report is printed in the kernel",
        (
            Edit(
                "launch/node_process/launch.py",
                "                self._relay.send(NodePrint(line))\n",
                "                pass\n",
            ),
        ),
        (
            "tests/test_cluster_faults_integration.py::"
            "test_the_stall_report_of_every_node_shows_in_the_kernel",
        ),
    ),
    Mutation(
        "cluster-lost-node-blamed-on-rank-0",
        "a lost node is named by its first global rank, its node and its Dask worker",
        (
            Edit(
                "launch/cluster/attempt.py",
                "        worker = self.reports[node].worker\n"
                "        rank = node * self.settings.num_processes\n",
                "        worker = self.reports[node].worker\n        rank = 0\n",
            ),
        ),
        (f"{_CLUSTER}test_a_killed_dask_worker_is_node_lost_and_never_retrains",),
    ),
    Mutation(
        "cluster-stop-not-forwarded",
        "Stop ends every node of a cluster run at the same step",
        (
            Edit(
                "node/task.py",
                "        if self.control.stop_requested and self.master_sent"
                " and not self.stop_sent:",
                "        if False:",
            ),
        ),
        (f"{_CLUSTER}test_stop_ends_every_node_at_the_same_step_and_output_has_global_ranks",),
    ),
    Mutation(
        "cluster-pool-loss-says-run-again",
        "a cluster pool that lost a node says only that it was closed (create a new WorkerPool)",
        (
            Edit(
                "errors.py",
                "        return [*lines, self.aftermath]\n",
                '        return [*lines, "The other workers were stopped; the kernel is still'
                ' usable.", self.aftermath]\n',
            ),
        ),
        (
            "tests/test_cluster_faults_integration.py::"
            "test_a_pool_that_loses_a_dask_worker_says_one_true_thing_about_what_remains",
        ),
    ),
    Mutation(
        "cluster-probe-rebuilds-in-the-dask-worker",
        "the probe rebuilds the payload in a process started as a node's, not in the Dask worker",
        (
            Edit(
                "node/probe.py",
                '    answer = _in_node_like_process(("probe", (payload, count_gpus)))\n',
                '    answer = __import__("notebook_kit.node.probe_child", fromlist=["answer"])'
                '.answer(("probe", (payload, count_gpus)))\n',
            ),
        ),
        (
            "tests/test_cluster_shipping_integration.py::"
            "test_the_probes_verdict_is_the_nodes_outcome_for_a_module_they_cannot_import",
        ),
    ),
    Mutation(
        "cluster-modules-never-sent-by-value",
        "a module the nodes cannot import is sent by value",
        (
            Edit(
                "launch/cluster/code_shipping.py",
                "        sendable = {name for name in missing if _sendable_by_value(name)}\n",
                "        sendable: set[str] = set()\n",
            ),
        ),
        (
            "tests/test_cluster_shipping_integration.py::"
            "test_code_from_a_cell_the_working_folder_a_run_time_path_and_a_package_runs",
            "tests/test_cluster_shipping_integration.py::"
            "test_a_module_sent_with_upload_file_runs_on_every_node",
        ),
    ),
    Mutation(
        "cluster-busy-worker-waited-for",
        "a worker with no free thread is named at once",
        (
            Edit(
                "launch/cluster/engines/dask.py",
                "        if len(running) >= threads:\n",
                "        if len(running) > threads:\n",
            ),
        ),
        (
            "tests/test_cluster_probe_integration.py::"
            "test_a_worker_busy_with_the_users_own_task_is_named_at_once_and_alone",
        ),
    ),
    Mutation(
        "cluster-probe-ipv4-only",
        "the probe finds the interface to node 0 over IPv6 too",
        (
            Edit(
                "node/probe.py",
                '    family = socket.AF_INET6 if ":" in target else socket.AF_INET\n',
                "    family = socket.AF_INET\n",
            ),
        ),
        ("tests/test_cluster_probe_integration.py::test_an_ipv6_cluster_trains",),
    ),
    Mutation(
        "local-cluster-in-the-kernels-group",
        "local_cluster's processes are out of the kernel's process group, so an interrupt "
        "leaves its workers running",
        (
            Edit(
                "launch/cluster/engines/dask_local.py",
                "        start_new_session=True,",
                "        start_new_session=False,",
            ),
        ),
        (
            "tests/test_local_cluster_integration.py::"
            "test_an_interrupt_during_a_cluster_run_leaves_the_cluster_ready_for_the_next",
        ),
    ),
    Mutation(
        "cluster-rendezvous-ipv4-only",
        "node 0 binds its rendezvous socket on an IPv6 address too",
        (
            Edit(
                "launch/node_process/process.py",
                '    if ":" not in host:\n        return open_rendezvous_socket(host, None)\n',
                "    return open_rendezvous_socket(host, None)\n",
            ),
        ),
        ("tests/test_cluster_probe_integration.py::test_an_ipv6_cluster_trains",),
    ),
    Mutation(
        "speed-loader-samples-not-counted",
        "a prepared loader counts the samples of every batch it hands out, with no user code",
        (
            Edit(
                "accelerator/prepared_loader.py",
                "                    counter.count_loader_batch(batch)\n",
                "                    pass\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_prepared_loader_counts_every_sample_of_every_rank_with_no_user_code",
        ),
    ),
    Mutation(
        "speed-evaluation-samples-counted",
        "only the training loader counts: an evaluation pass adds no samples",
        (
            Edit(
                "runtime/throughput.py",
                "        return self.source == id(loader)\n",
                "        return True\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_prepared_loader_counts_every_sample_of_every_rank_with_no_user_code",
        ),
    ),
    Mutation(
        "speed-padding-counted",
        "tokens/s counts the non-padding tokens of the attention mask",
        (
            Edit(
                "runtime/throughput.py",
                "        return mask\n",
                "        return int(mask.numel())\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_tokens_are_the_non_padding_tokens_of_the_attention_mask",
        ),
    ),
    Mutation(
        "speed-log-samples-ignored",
        "log(samples=n) counts n samples for a hand-written loop",
        (
            Edit(
                "runtime/loop.py",
                "        count_samples(current_launch(), int(samples))\n",
                "        int(samples)\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_hand_written_loop_counts_the_samples_given_to_log",
        ),
    ),
    Mutation(
        "speed-memory-peak-not-read",
        "each rank's peak resident memory is read and kept in last_run().speed",
        (
            Edit(
                "runtime/throughput.py",
                "            peak_memory_bytes=peak_resident_bytes(),\n",
                "            peak_memory_bytes=None,\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_the_peak_resident_memory_of_each_rank_shows_a_big_allocation",
        ),
    ),
    Mutation(
        "speed-line-not-in-the-live-view",
        "the live view shows the speed line under the plot while the run goes",
        (Edit("live/notebook_view.py", "        self._show_panels()\n\n", "\n"),),
        (
            "tests/test_speed.py::"
            "test_the_live_view_shows_the_speed_line_under_the_plot_and_in_the_summary",
        ),
    ),
    Mutation(
        "speed-line-not-in-the-summary",
        "the summary that replaces the live view (and the saved notebook) keeps the speed line",
        (
            Edit(
                "live/notebook_view.py",
                "for panel in panels if (text := panel.summary())]",
                'for panel in panels if (text := panel.summary()) and panel.place != "line"]',
            ),
        ),
        (
            "tests/test_speed_kernel_integration.py::"
            "test_the_speed_line_shows_under_the_plot_mid_run_and_stays_in_the_summary",
        ),
    ),
    Mutation(
        "argument-and-variable-for-one-setting-collide",
        "an explicit argument wins over the NOTEBOOK_KIT_ variable of the same setting",
        (
            Edit(
                "config/launch_config.py",
                "base.replace(**{**from_environ, **given})",
                "base.replace(**from_environ, **given)",
            ),
        ),
        ("tests/test_config.py::test_an_argument_wins_over_the_same_setting_s_variable",),
    ),
    Mutation(
        "cluster-pool-timeout-ignored",
        "a cluster pool's timeout interrupts every node and keeps the pool",
        (
            Edit(
                "launch/cluster/pool.py",
                "and ran >= deadline and not outcome.timed_out:",
                "and ran >= deadline and not outcome.timed_out and False:",
            ),
        ),
        (f"{_CLUSTER_POOL}test_a_timeout_interrupts_every_node_and_keeps_the_pool",),
    ),
    Mutation(
        "cluster-pool-lines-lose-their-node",
        "a cluster pool's cell output names each rank's node",
        (Edit("launch/pool/view.py", "        self.text.nodes = info.node_of()\n", ""),),
        (f"{_CLUSTER_POOL}test_cells_push_and_pull_work_with_global_ranks",),
    ),
    Mutation(
        "sigterm-kills-the-node",
        "SIGTERM to a node process lets its ranks save: should_stop() on every rank at one step",
        (
            Edit(
                "launch/node_process/process.py",
                "        signal.signal(signal.SIGTERM, lambda signum, frame: relay.preempt())\n",
                "",
            ),
        ),
        (f"{_SURVIVAL}test_sigterm_to_a_node_process_stops_every_rank_at_the_same_step_to_save",),
    ),
    Mutation(
        "stop-vote-drops-the-cause",
        "stop_reason() names the node that received SIGTERM, on every rank",
        (
            Edit(
                "runtime/stopping.py",
                "    ballot = torch.tensor([cause, -proposal, node], dtype=torch.int32)",
                "    ballot = torch.tensor([min(cause, 1), -proposal, node], dtype=torch.int32)",
            ),
        ),
        (f"{_SURVIVAL}test_sigterm_to_a_node_process_stops_every_rank_at_the_same_step_to_save",),
    ),
    Mutation(
        "restart-keeps-replayed-steps",
        "steps a restarted attempt logs again replace the old points instead of adding to them",
        (Edit("live/record.py", "                    self.metrics.drop_from(resumed)\n", ""),),
        (
            "tests/test_live.py::"
            "test_a_restart_goes_on_in_one_plot_its_replayed_steps_replacing_the_old",
        ),
    ),
    Mutation(
        "restart-forgets-its-mark",
        "the live plot marks where each restart resumed and on how many ranks",
        (
            Edit(
                "live/plot_widget.py",
                '            spec["marks"] = self.marks\n',
                "            pass\n",
            ),
        ),
        (
            "tests/test_live.py::"
            "test_a_restart_goes_on_in_one_plot_its_replayed_steps_replacing_the_old",
        ),
    ),
    Mutation(
        "restart-waits-without-bound",
        "a restart with fewer workers than min_nodes ends at rendezvous_timeout with the fix",
        (
            Edit(
                "launch/cluster/run.py",
                "        if time.monotonic() >= deadline:\n",
                "        if time.monotonic() >= deadline + 3600:\n",
            ),
        ),
        (f"{_SURVIVAL}test_a_restart_with_fewer_workers_than_min_nodes_ends_at_the_bound",),
    ),
    Mutation(
        "restart-on-the-lost-worker",
        "a restart never chooses the lost node's worker again, even while it is listed",
        (
            Edit(
                "launch/cluster/run.py",
                "            chosen = engine.choose(min(usable, most), least, exclude=lost)\n",
                "            chosen = engine.choose(min(usable, most), least)\n",
            ),
        ),
        (
            "tests/test_cluster.py::"
            "test_a_restart_never_chooses_the_lost_nodes_worker_even_while_it_is_listed",
        ),
    ),
    Mutation(
        "min-nodes-ignored-locally",
        "min_nodes without cluster= is refused, not ignored",
        (
            Edit(
                "launch/launcher.py",
                '    if options.get("min_nodes") is not None:\n',
                "    if False:\n",
            ),
        ),
        ("tests/test_cluster.py::test_min_nodes_without_a_cluster_is_refused_with_the_fix",),
    ),
    Mutation(
        "local-attempts-unrecorded",
        "last_run().attempts lists every attempt of a launch, the failing rank named",
        (
            Edit(
                "live/record.py",
                '        failure = f"rank {first.rank}: {first.summary()}"',
                "        failure = None",
            ),
        ),
        (
            "tests/test_fault_tolerance_integration.py::"
            "test_launcher_restart_resumes_bit_identically_and_through_the_cli",
        ),
    ),
    Mutation(
        "ranks-die-on-a-machines-sigterm",
        "SIGTERM to every process of a launch (a VM's shutdown) lets the ranks save first",
        (
            Edit(
                "worker/entry.py",
                "        signal.signal(signal.SIGTERM, _sigterm_handler(stop_flag))\n",
                "",
            ),
        ),
        (
            f"{_PREEMPTION}test_sigterm_to_the_ranks_and_guardian_lets_every_rank_save_at_the_same_step",
        ),
    ),
    Mutation(
        "guardian-stops-on-a-machines-sigterm",
        "SIGTERM to the guardian marks the run preempted instead of killing its ranks",
        (
            Edit(
                "worker/guardian.py",
                "signal.SIGTERM, lambda signum, frame: self.stop_flag.preempt())",
                "signal.SIGTERM, self._request_stop)",
            ),
        ),
        (
            f"{_PREEMPTION}test_sigterm_to_the_ranks_and_guardian_lets_every_rank_save_at_the_same_step",
        ),
    ),
    Mutation(
        "launch-sigterm-taken-for-preemption",
        "the launch's own SIGTERM still ends a worker at once, not after the grace",
        (
            Edit(
                "worker/guardian.py",
                "        self.stop_flag.end()  # the workers'",
                "        pass  # the workers'",
            ),
        ),
        (f"{_PREEMPTION}test_the_launchs_own_sigterm_still_ends_a_worker_at_once",),
    ),
    Mutation(
        "cluster-restart-hides-the-rank",
        "a cluster restart is announced with the failing rank and its node",
        (
            Edit(
                "launch/cluster/failures.py",
                "        if node in self.lost_nodes:\n",
                "        if True:\n",
            ),
        ),
        (
            "tests/test_cluster.py::test_a_cluster_restart_is_announced_with_the_rank_and_node_or_the_lost_node",
        ),
    ),
    Mutation(
        "dask-worker-dies-on-sigterm",
        "SIGTERM to a Dask worker lets its node save before the worker ends",
        (
            Edit(
                "node/links/dask.py",
                '        loop = getattr(self._worker.loop, "asyncio_loop", None)\n',
                "        loop = None\n",
            ),
        ),
        (f"{_SURVIVAL}test_sigterm_to_a_dask_worker_lets_its_node_save_then_ends_the_worker",),
    ),
    Mutation(
        "speed-data-wait-not-timed",
        "each step's data wait is the time spent in the loader's __next__",
        (
            Edit(
                "runtime/step_clock.py",
                "        self._next_step(now - asked if asked is not None else 0.0, now)\n",
                "        self._next_step(0.0, now)\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_slower_rank_is_named_as_the_straggler_with_its_cause[data]",
        ),
    ),
    Mutation(
        "speed-ddp-wait-not-timed",
        "the collective wait of a DDP step runs from its last gradient to the end of backward",
        (
            Edit(
                "runtime/step_clock.py",
                "    last.register_post_accumulate_grad_hook(_first_gradient)\n",
                "    pass\n",
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_the_wait_begins_when_the_last_gradient_is_computed_before_ddps_own_callback",
            "tests/test_speed_integration.py::"
            "test_a_slower_rank_is_named_as_the_straggler_with_its_cause[compute]",
        ),
    ),
    Mutation(
        "speed-prepared-model-never-watched",
        "the Accelerator watches a DDP model's gradients, or its steps show no wait",
        (
            Edit(
                "accelerator/accelerator.py",
                "                watch_gradients(model)\n",
                "                pass\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_slower_rank_is_named_as_the_straggler_with_its_cause[compute]",
        ),
    ),
    Mutation(
        "speed-straggler-named-for-a-passing-lag",
        "a straggler must lag over its latest steps too, not only on average",
        (
            Edit(
                "live/speed.py",
                "        if recent is None or recent[0] != whole[0]:\n",
                "        if False:\n",
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_a_straggler_lags_over_the_run_and_its_latest_window_and_is_drawn_with_its_cause",
        ),
    ),
    Mutation(
        "speed-straggler-cause-swapped",
        "a straggler is named with the part, data or compute, in which it lags",
        (
            Edit(
                "live/speed.py",
                '    return slowest, "data" if data > compute else "compute"\n',
                '    return slowest, "compute" if data > compute else "data"\n',
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_slower_rank_is_named_as_the_straggler_with_its_cause[data]",
        ),
    ),
    Mutation(
        "mfu-without-the-attention-term",
        "a transformer's FLOPs per token include the attention term of the published formula",
        (
            Edit(
                "runtime/throughput.py",
                "        return 6 * self.params + 12 * self.layers * self.width * sequence\n",
                "        return 6 * self.params\n",
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_the_published_flops_of_a_transformer_and_a_given_flops_per_sample",
        ),
    ),
    Mutation(
        "mfu-counts-the-position-table",
        "the FLOPs count leaves out embedding lookup tables",
        (
            Edit(
                "runtime/throughput.py",
                "        if isinstance(m, torch.nn.Embedding) and id(m.weight) not in multiplied\n",
                "        if False\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::"
            "test_a_transformers_model_counts_its_flops_and_a_cpu_run_shows_no_mfu",
        ),
    ),
    Mutation(
        "set-flops-per-sample-ignored",
        "notebook_kit.set_flops_per_sample gives the FLOPs of a model without a config",
        (
            Edit(
                "runtime/loop.py",
                "        counter.flops_per_sample = float(flops)\n",
                "        float(flops)\n",
            ),
        ),
        (
            "tests/test_speed_integration.py::test_a_hand_written_loop_counts_the_samples_given_to_log",
        ),
    ),
    Mutation(
        "speed-png-without-its-lines",
        "the final PNG carries the speed lines",
        (
            Edit(
                "live/plot_widget.py",
                'footer = "\\n".join(line for line in lines if line)',
                'footer = ""',
            ),
        ),
        (
            "tests/test_speed.py::"
            "test_the_live_view_shows_the_speed_line_under_the_plot_and_in_the_summary",
        ),
    ),
    Mutation(
        "speed-no-line-per-node",
        "a cluster run's speed figures have a line per node",
        (
            Edit(
                "live/speed.py",
                "        return speed_line(speed, self.nodes)\n",
                "        return speed_line(speed)\n",
            ),
        ),
        ("tests/test_speed.py::test_the_view_of_a_cluster_run_adds_a_line_per_node",),
    ),
    Mutation(
        "hsdp-replicas-never-sync",
        "HSDP (dp_replicate x dp_shard) trains exactly like one process on the global batch",
        (
            Edit(
                "accelerator/strategies/parallel.py",
                "            mesh = fsdp_mesh(self.device_mesh, self.flat, config.fsdp_dim_names)",
                '            mesh = self.flat["dp_shard_cp"]',
            ),
        ),
        (_HSDP,),
    ),
    Mutation(
        "tp-group-reads-different-batches",
        "every rank of a TP group reads the same batch",
        (
            Edit(
                "accelerator/parallel_methods.py",
                "        return data_parallel()",
                "        return self.num_processes, self.process_index",
            ),
        ),
        (_TP_FSDP,),
    ),
    Mutation(
        "mesh-tp-outermost",
        "ranks are laid out as Accelerate's mesh: tp innermost, dp_replicate outermost",
        (
            Edit(
                "config/mesh_layout.py",
                'MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "tp")',
                'MESH_ORDER = ("tp", "cp", "dp_shard", "dp_replicate")',
            ),
        ),
        (
            _PARALLEL_UNIT
            + "test_the_layout_is_row_major_with_tp_innermost_and_names_the_flattened_dims",
        ),
    ),
    Mutation(
        "hsdp-shard-group-spans-nodes",
        "a mesh whose dp_shard group would span nodes under HSDP is refused before training",
        (
            Edit(
                "config/mesh_layout.py",
                '    if num_nodes == 1 or layout.size("dp_replicate") == 1:',
                "    if True:",
            ),
        ),
        (_PARALLEL_UNIT + "test_hsdp_across_nodes_keeps_each_shard_group_on_one_node",),
    ),
    Mutation(
        "world-size-mismatch-accepted",
        "sizes that do not multiply to the world size are refused, naming each",
        (
            Edit(
                "accelerator/parallelism_config.py",
                "        if self.total_size != world_size:",
                "        if False:",
            ),
        ),
        (_PARALLEL_UNIT + "test_the_accelerator_refuses_what_the_world_and_fsdp_cannot_hold",),
    ),
    Mutation(
        "failure-without-mesh-coordinates",
        "a failure names the rank's mesh coordinates as well as its rank",
        (
            Edit(
                "worker/entry.py",
                "[__file__]), mesh=mesh)",
                '[__file__]), mesh="")',
            ),
        ),
        (_TP_PLAIN,),
    ),
    Mutation(
        "launch-parallelism-sizes-dropped",
        "the parallelism_config_* launch settings reach every worker's Accelerator",
        (
            Edit(
                "config/launch_plan.py",
                "        value = getattr(plan, name)\n",
                '        value = getattr(plan, name) if "parallelism" not in name else 1\n',
            ),
        ),
        (_TP_PLAIN,),
    ),
    Mutation(
        "users-tp-plan-ignored",
        "a plain torch model splits by the plan the user gives",
        (
            Edit(
                "accelerator/strategies/tensor_parallel.py",
                "    plan = plan if plan is not None else _model_plan(model)",
                "    plan = _model_plan(model)",
            ),
        ),
        (_TP_PLAIN,),
    ),
    Mutation(
        "context-parallel-on-cpu",
        "context parallel on CPU is refused, saying what it needs",
        (
            Edit(
                "accelerator/strategies/parallel.py",
                '    if cp_size > 1 and device.type != "cuda":',
                "    if False:",
            ),
        ),
        (_PARALLEL_UNIT + "test_context_parallel_on_cpu_is_refused_saying_what_it_needs", _TP_FSDP),
    ),
    Mutation(
        "weights-home-on-one-mesh-dim-only",
        "the weights of a model sharded on a 2-D mesh (HSDP, TP x FSDP) come home whole",
        (
            Edit(
                "runtime/weights_file.py",
                "            groups = value.device_mesh.get_all_groups()",
                "            groups = [value.device_mesh.get_group()]",
            ),
        ),
        (_HSDP,),
    ),
    Mutation(
        "speed-tp-group-counts-its-batch-on-every-rank",
        "a batch a tp/cp group reads together counts once in the samples/s",
        (
            Edit(
                "accelerator/accelerator.py",
                "            counter.repeats = not reads_for_its_group()",
                "            counter.repeats = False",
            ),
        ),
        (_TP_FSDP,),
    ),
    Mutation(
        "ray-group-left-behind",
        "a run on Ray leaves no placement group behind",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                """        if run.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(run.group)
""",
                "",
            ),
        ),
        (_RAY + "test_all_reduce_metrics_result_and_weights_come_home",),
    ),
    Mutation(
        "ray-events-dropped",
        "the nodes' events reach the kernel on Ray (metrics, output, the final step)",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                """        for batch in batches:
            events(batch)
""",
                """        for batch in batches:
            pass
""",
            ),
        ),
        (_RAY + "test_all_reduce_metrics_result_and_weights_come_home",),
    ),
    Mutation(
        "ray-lost-node-unnamed",
        "a node whose Ray worker process died is named lost with the cause",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                """    if isinstance(error, exceptions.WorkerCrashedError):
        return "its Ray worker process died"
""",
                "",
            ),
        ),
        (_RAY + "test_a_killed_node_is_node_lost_and_max_restarts_trains_again",),
    ),
    Mutation(
        "ray-missing-without-install-hint",
        "without ray, cluster='ray' says how to install it",
        (
            Edit(
                "launch/cluster/engines/ray.py",
                """runs the launch on a Ray cluster, which needs ray: {INSTALL_HINT}."
""",
                """runs the launch on a Ray cluster, which needs ray."
""",
            ),
        ),
        (
            "tests/test_ray_engine.py::"
            "test_without_ray_cluster_ray_says_how_to_install_it_before_anything_starts",
        ),
    ),
    Mutation(
        "ray-node-process-deaf-to-sigint",
        "on Ray, a node asked to end (another node lost) ends with its outcome, not lost itself",
        (
            Edit(
                "launch/node_process/process.py",
                "    _take_signals()\n",
                "",
            ),
        ),
        (_RAY + "test_a_killed_node_is_node_lost_and_max_restarts_trains_again",),
    ),
    Mutation(
        "ray-pool-commands-dropped",
        "a pool on Ray hears every command, in order (its ranks keep their state between cells)",
        (
            Edit(
                "node/links/ray.py",
                """            for command in commands:
                commanded(command)
""",
                """            for command in commands[1:]:
                commanded(command)
""",
            ),
        ),
        (_RAY + "test_a_ray_pool_keeps_its_ranks_between_cells_and_leaves_nothing",),
    ),
    Mutation(
        "press-raised-on-a-line-less-instruction",
        "a press is raised where IPython can format the traceback (a frame with a line)",
        (
            Edit(
                "launch/interrupts.py",
                "        if _unformattable(frame) and self.moved < _MOVES:",
                "        if False:",
            ),
        ),
        (
            "tests/test_interrupt_latch.py::"
            "test_a_press_on_an_instruction_without_a_line_is_raised_a_step_later",
        ),
    ),
    Mutation(
        "press-coming-back-inside-the-handler-raised-there",
        "a handed-on press that comes back while the handler runs is handed on again",
        (
            Edit(
                "launch/interrupts.py",
                "(frame.f_lineno is None or frame.f_code is _HANDLE_CODE)",
                "(frame.f_lineno is None)",
            ),
        ),
        (
            "tests/test_interrupt_latch.py::"
            "test_a_handed_on_press_that_comes_back_inside_the_handler_is_handed_on_again",
        ),
    ),
    Mutation(
        "ray-hub-keeps-forgotten-runs",
        "the kernel's hub drops a run's state when the run ends",
        (
            Edit(
                "node/links/ray.py",
                "        state = self._runs.pop(run, None)\n",
                "        state = self._runs.get(run)\n",
            ),
        ),
        (
            "tests/test_ray_engine.py::test_the_hub_serves_each_run_until_it_is_forgotten",
            _RAY + "test_all_reduce_metrics_result_and_weights_come_home",
        ),
    ),
    Mutation(
        "ray-late-publish-holds-a-forgotten-run",
        "a control value published as the run ends does not bring the run back into the hub",
        (
            Edit(
                "node/links/ray.py",
                "            if run in self._forgotten:  # a publish that crossed",
                "            if False:  # a publish that crossed",
            ),
        ),
        ("tests/test_ray_engine.py::test_the_hub_serves_each_run_until_it_is_forgotten",),
    ),
    Mutation(
        "ray-early-claim-refused",
        "a node's claim that reaches the hub before the kernel's first call for the run asks again",
        (
            Edit(
                "node/links/ray.py",
                "            return False if run in self._forgotten else None\n",
                "            return False\n",
            ),
        ),
        ("tests/test_ray_engine.py::test_the_hub_serves_each_run_until_it_is_forgotten",),
    ),
    Mutation(
        "ray-hub-made-per-run",
        "one hub per kernel serves every run: its process is not started again for each",
        (
            Edit(
                "launch/cluster/engines/ray_actors.py",
                "    if made is not None:\n        try:",
                "    if False:\n        try:",
            ),
        ),
        (_RAY + "test_a_killed_node_is_node_lost_and_max_restarts_trains_again",),
    ),
    Mutation(
        "ray-worker-sigterm-not-held",
        "SIGTERM to a node's Ray worker lets the node's ranks save before the worker ends",
        (
            Edit(
                "node/links/ray.py",
                "        previous = signal.signal(signal.SIGTERM, on_sigterm)\n",
                "        previous = signal.getsignal(signal.SIGTERM)\n",
            ),
        ),
        (_RAY + "test_sigterm_to_a_ray_worker_lets_its_node_save_then_ends_the_worker",),
    ),
)

# Breakages kept in files beside this one, one per subject; each holds a tuple MUTATIONS.
from tests import (  # noqa: E402  (they import Edit and Mutation from here)
    mutations_arch_d,
    mutations_arch_e,
    mutations_arch_l,
    mutations_arch_m,
    mutations_arch_p,
    mutations_arch_s,
    mutations_b53,
    mutations_b54,
    mutations_c53,
    mutations_events,
    mutations_export,
    mutations_f53,
    mutations_g53,
    mutations_k53,
    mutations_l53,
    mutations_l59,
    mutations_live,
    mutations_m53,
    mutations_p53,
    mutations_parallel,
    mutations_pool,
    mutations_r53,
    mutations_r59,
    mutations_s55,
    mutations_storage,
    mutations_t54,
    mutations_ti59,
    mutations_tp59,
    mutations_v55,
    mutations_w54,
    mutations_z54,
)

MUTATIONS = (
    MUTATIONS
    + mutations_arch_e.MUTATIONS
    + mutations_events.MUTATIONS
    + mutations_storage.MUTATIONS
    + mutations_pool.MUTATIONS
    + mutations_live.MUTATIONS
    + mutations_export.MUTATIONS
    + mutations_parallel.MUTATIONS
    + mutations_arch_s.MUTATIONS
    + mutations_arch_p.MUTATIONS
    + mutations_arch_m.MUTATIONS
    + mutations_arch_l.MUTATIONS
    + mutations_arch_d.MUTATIONS
    + mutations_g53.MUTATIONS
    + mutations_k53.MUTATIONS
    + mutations_l53.MUTATIONS
    + mutations_p53.MUTATIONS
    + mutations_b53.MUTATIONS
    + mutations_w54.MUTATIONS
    + mutations_c53.MUTATIONS
    + mutations_r53.MUTATIONS
    + mutations_m53.MUTATIONS
    + mutations_f53.MUTATIONS
    + mutations_t54.MUTATIONS
    + mutations_v55.MUTATIONS
    + mutations_z54.MUTATIONS
    + mutations_b54.MUTATIONS
    + mutations_s55.MUTATIONS
    + mutations_r59.MUTATIONS
    + mutations_tp59.MUTATIONS
    + mutations_ti59.MUTATIONS
    + mutations_l59.MUTATIONS
)
