"""Deliberate breakages of checkpoints on object storage.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_S3 = "tests/test_object_storage_integration.py::"
_FAULTS = "tests/test_checkpoint_faults_integration.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "dcp-storage-options-dropped",
        "sharded checkpoints on object storage go where storage_options say",
        (
            Edit(
                "accelerator/storage.py",
                "    return FsspecReader(str(path), **dict(path.storage_options))",
                "    return FsspecReader(str(path))",
            ),
            Edit(
                "accelerator/storage.py",
                '    return {"storage_writer": FsspecWriter(str(path), '
                "**dict(path.storage_options))}",
                '    return {"storage_writer": FsspecWriter(str(path))}',
            ),
        ),
        (f"{_S3}test_a_sharded_checkpoint_on_s3_goes_where_storage_options_say",),
    ),
    Mutation(
        "abandoned-async-save-committed",
        "a save pending when every rank raises is never committed",
        (
            Edit(
                "accelerator/checkpointing.py",
                "    if stop is not None and stop.is_set():\n        raise SaveAbandoned",
                "    if False:\n        raise SaveAbandoned",
            ),
        ),
        (
            "tests/test_async_save_integration.py::"
            "test_a_save_pending_when_every_rank_raises_is_never_committed",
        ),
    ),
    Mutation(
        "silent-storage-unbounded",
        "a save on storage that stops answering fails within storage_timeout",
        (
            Edit(
                "accelerator/storage.py",
                "    if is_local(path):\n        return call()\n",
                "    if True:\n        return call()\n",
            ),
        ),
        (
            f"{_S3}test_storage_that_stops_answering_fails_each_save_in_bounded_time_keeping_the_last",
        ),
    ),
    Mutation(
        "silent-storage-fails-one-rank",
        "a rank whose storage is silent does not leave the others waiting: every rank raises",
        (
            Edit(
                "accelerator/save_agreement.py",
                "    value, problem = broadcast_object((value, problem))\n",
                "    if problem is not None:\n        raise error_here\n"
                "    value, problem = broadcast_object((value, problem))\n",
            ),
        ),
        (f"{_S3}test_two_ranks_saving_to_storage_that_never_answers_both_raise_within_the_bound",),
    ),
    Mutation(
        "save-creates-the-bucket",
        "a save never creates a bucket or container: a missing one is named",
        (
            Edit(
                "accelerator/storage.py",
                "    if is_local(path):\n        return\n    root =",
                "    if True:\n        return\n    root =",
            ),
        ),
        (f"{_S3}test_a_missing_bucket_is_named_and_never_created",),
    ),
    Mutation(
        "credentials-cached-after-a-failed-save",
        "credentials set after a failed save are used by the next save",
        (
            Edit(
                "accelerator/storage.py",
                "            fsspec.get_filesystem_class(protocol).clear_instance_cache()",
                "            fsspec.get_filesystem_class(protocol)",
            ),
        ),
        (f"{_S3}test_credentials_set_after_a_failed_save_are_used_by_the_next_one",),
    ),
    Mutation(
        "second-writer-not-refused",
        "a second run saving numbered checkpoints into one project_dir is refused",
        (
            Edit(
                "accelerator/writer_lease.py",
                '        if holder and holder.get("token") != self.token and not _lapsed(holder):',
                "        if False:",
            ),
        ),
        (
            f"{_FAULTS}test_a_second_run_saving_into_the_same_project_dir_is_refused_until_the"
            "_first_is_gone",
        ),
    ),
    Mutation(
        "dead-writer-holds-its-lease",
        "the lease of a writer that is gone is taken over",
        (
            Edit(
                "accelerator/writer_lease.py",
                "    return pid in _this_process_and_its_ancestors() or not _running(pid)",
                "    return False",
            ),
        ),
        (
            f"{_FAULTS}test_a_second_run_saving_into_the_same_project_dir_is_refused_until_the"
            "_first_is_gone",
        ),
    ),
    Mutation(
        "missing-state-folder-unnamed",
        "a checkpoint whose state folder is gone is a CheckpointError, and load_state() "
        "falls back past it",
        (
            Edit(
                "accelerator/checkpoint_files.py",
                "    if not staging.is_dir():\n        raise CheckpointError(",
                "    if False:\n        raise CheckpointError(",
            ),
        ),
        (
            "tests/test_checkpointing.py::"
            "test_a_missing_state_folder_is_named_and_load_state_falls_back_to_the_newest_whole_one",
        ),
    ),
    Mutation(
        "unshared-save-leaves-its-folder",
        "a save refused on separate disks leaves nothing behind",
        (
            Edit(
                "accelerator/checkpointing.py",
                "        if self.rank != 0 and not self.private:",
                "        if self.rank != 0:",
            ),
        ),
        (f"{_S3}test_a_folder_that_is_not_shared_by_every_rank_is_refused_at_the_first_save",),
    ),
)
