"""Which of Accelerate's shipped test functions are run against notebook_kit, and how.

Each :class:`Case` makes the call the script's own ``main()`` makes (same arguments, same set-up
around it). ``bindings`` names what is rebound in each script for our implementation; everything
else the scripts import (their fixtures such as ``RegressionModel``, ``assert_exception``) stays
Accelerate's. ``OUT_OF_SCOPE`` lists the tests that check Accelerate's internals rather than its
public API, each with the reason.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate

from tests.accelerate_parity_runner import Case, Implementation, _ours

# -- bindings --------------------------------------------------------------------------------

_OURS_BY_SCRIPT: dict[str, tuple[str, ...]] = {
    "test_sync": (
        "Accelerator", "DataLoaderConfiguration", "GradientAccumulationPlugin",
        "DistributedType", "set_seed",
    ),
    "test_ops": (
        "PartialState", "DistributedType", "DistributedOperationException", "broadcast",
        "gather", "gather_object", "pad_across_processes", "reduce",
    ),
    "test_distributed_data_loop": ("Accelerator", "DataLoaderConfiguration", "DistributedType"),
    "test_script": (
        "Accelerator", "AcceleratorState", "prepare_data_loader", "DataLoaderConfiguration",
        "DistributedType", "gather", "gather_object", "set_seed", "synchronize_rng_states",
    ),
    "test_notebook": ("PartialState", "notebook_launcher"),
}  # fmt: skip


# What a script ported by changing one import still takes from Accelerate ("one-import").
ACCELERATES_CONFIG = frozenset(
    {"DataLoaderConfiguration", "GradientAccumulationPlugin", "DistributedType"}
)


class _NoSharedState:
    """``GradientState._reset_state()`` clears Accelerate's process-wide singleton between tests;
    notebook_kit keeps its gradient state in each Accelerator, so there is nothing to clear."""

    @staticmethod
    def _reset_state() -> None:
        return None


def _are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Accelerate's test helper of that name, on our gather (its own reads Accelerate's state)."""
    from notebook_kit import gather

    gathered = gather(tensor[None].clone())
    return all(torch.equal(row, tensor) for row in gathered)


def bindings(implementation: Implementation) -> Any:
    """``script -> {name: object}`` to rebind before its tests run (empty for Accelerate)."""

    def of(script: str) -> dict[str, Any]:
        if implementation == "accelerate":
            return {}
        names = _OURS_BY_SCRIPT[script]
        if implementation == "one-import":
            names = tuple(name for name in names if name not in ACCELERATES_CONFIG)
        bound = {name: _ours(name) for name in names}
        if script == "test_sync":
            bound["GradientState"] = _NoSharedState
        if script == "test_script":
            bound["are_the_same_tensors"] = _are_the_same_tensors
        if script == "test_notebook":
            bound["ChildFailedError"] = _ours("WorkerError")
        return bound

    return of


# -- what is not compared --------------------------------------------------------------------

OUT_OF_SCOPE: dict[str, str] = {
    "test_script::check_seedable_sampler_in_batch_sampler_shard": (
        "asserts that the prepared loader's batch_sampler.batch_sampler.sampler is an instance "
        "of Accelerate's SeedableRandomSampler class (a sampler class, not behaviour; the "
        "seedable order itself is checked by check_seedable_sampler* and the parity loop)"
    ),
    "test_script::test_reinstantiated_state": (
        "asserts the AttributeError Accelerate raises after AcceleratorState._reset_state() "
        "broke its process-wide singleton; notebook_kit has no singleton to break"
    ),
}

# Cases whose script builds Accelerate's DataLoaderConfiguration or GradientAccumulationPlugin
# or compares with its DistributedType: run "one-import" as well, as a script that changed only
# ``from accelerate import Accelerator`` runs them. All such cases pass that way
# (``PARITY_IMPL=one-import python -m tests.accelerate_parity_runner``); these few stay in the
# suite, one of each kind.
ONE_IMPORT_CASES: tuple[tuple[str, int], ...] = (
    ("test_sync::test_gradient_accumulation_with_opt_and_scheduler(False, True, False)", 1),
    ("test_distributed_data_loop::test_can_disable_even_batches", 2),
    ("test_script::check_seedable_sampler_with_data_seed", 1),
    ("test_script::training_check(use_seedable_sampler=True)", 1),
)

# (case id, processes) -> why Accelerate 1.15.0 itself fails it on CPU (ours is still run).
ACCELERATE_FAILS: dict[tuple[str, int], str] = {
    **{
        (f"test_distributed_data_loop::{name}", 2): (
            "Accelerate joins uneven inputs only on GPUs; on CPU processes join_uneven_inputs "
            "does nothing (the uneven loop deadlocks, the even_batches override is not applied)"
        )
        for name in (
            "test_can_join_uneven_inputs",
            "test_join_can_override_even_batches",
            "test_join_can_override_for_mixed_type_dataloaders",
            "test_join_raises_warning_for_iterable_when_overriding_even_batches",
        )
    },
    **{
        (f"test_distributed_data_loop::{name}", 2): (
            "use_stateful_dataloader=True needs torchdata, which the bench extra does not install"
        )
        for name in ("test_stateful_dataloader", "test_stateful_dataloader_save_state")
    },
}

# (case id, processes) -> why the case's own outcome varies from run to run, whichever
# Accelerator runs it: it says nothing either way, so it is not run.
RACY: dict[tuple[str, int], str] = {
    ("test_notebook::test_fault_tolerant", 2): (
        "its function checks queue.empty() and then calls queue.get() on a queue both ranks "
        "share: when both ranks see its last item, one takes it and the other waits in get() "
        "forever, under Accelerate's launcher as under ours (a stall report shows rank 1 in "
        "queue.get); how often depends only on how close together the ranks start"
    ),
}

# (case id, processes) -> why ours fails a test that Accelerate fails too.
OURS_FAILS: dict[tuple[str, int], str] = {
    ("test_distributed_data_loop::test_stateful_dataloader_save_state", 2): (
        "each rank saves into a temporary folder of its own; notebook_kit checkpoints are one "
        "folder every rank shares, and a save into folders that differ is refused"
    ),
}

# -- cases -----------------------------------------------------------------------------------


_SYNC = "test_distributed_sync"


def _sync(name: str, *args: Any, processes: tuple[int, ...] = (1, 2)) -> Case:
    label = name + (f"{args}" if args else "")

    def call(module: ModuleType, api: SimpleNamespace) -> None:
        function = getattr(module, name)
        if name in ("test_noop_sync", "test_distributed_sync", f"{_SYNC}_multiple_fwd"):
            function(api.Accelerator())
        else:
            function(*args)

    return Case("test_sync", label, call, processes)


def _accumulation_variants() -> list[Case]:
    cases = []
    for split in (True, False):
        for dispatch in (True, False):
            for each in (True, False):
                # Without sync_each_batch it asserts gradients that differ between syncs, which
                # one process never has (the script runs it on several devices only).
                processes = (1, 2) if each else (2,)
                name = "test_gradient_accumulation"
                cases.append(_sync(name, split, dispatch, each, processes=processes))
                name = "test_gradient_accumulation_with_opt_and_scheduler"
                cases.append(_sync(name, split, dispatch, each))
    return cases


def _ops(name: str) -> Case:
    return Case("test_ops", name, lambda module, api: getattr(module, name)(api.state()))


def _loop(name: str, call: Any = None) -> Case:
    """test_distributed_data_loop: its helpers assert exactly 2 processes."""

    def run(module: ModuleType, api: SimpleNamespace) -> None:
        accelerator = module.create_accelerator()
        torch.manual_seed(accelerator.process_index)  # as the script's main() does
        if call is None:
            getattr(module, name)()
        else:
            call(module, api, accelerator)

    return Case("test_distributed_data_loop", name, run, processes=(2,))


def _non_ddp_warning(module: ModuleType, api: SimpleNamespace, accelerator: Any) -> None:
    original = accelerator.state.distributed_type
    accelerator.state.distributed_type = api.DistributedType.FSDP
    try:
        module.test_join_raises_warning_for_non_ddp_distributed(accelerator)
    finally:
        accelerator.state.distributed_type = original


def _loader_case(kind: str) -> Case:
    def call(module: ModuleType, api: SimpleNamespace, accelerator: Any) -> None:
        dataset = module.DummyDataset()
        workers, size = module.NUM_WORKERS, module.BATCH_SIZE
        if kind in ("shuffle=False", "shuffle=True"):
            loader = DataLoader(
                dataset, shuffle=kind.endswith("True"), batch_size=size, num_workers=workers
            )
        elif kind == "batch_sampler":
            sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
            loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
        else:
            sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
            loader = DataLoader(
                dataset, sampler=sampler, batch_size=None, collate_fn=default_collate,
                num_workers=workers,
            )  # fmt: skip
        module.test_data_loader(loader, accelerator)

    return _loop(f"test_data_loader({kind})", call)


def _script(name: str, *args: Any, processes: tuple[int, ...] = (1, 2), **kwargs: Any) -> Case:
    shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    label = f"{name}({shown})" if shown else name

    def call(module: ModuleType, api: SimpleNamespace) -> None:
        api.Accelerator()  # the script's main() builds one before any test
        getattr(module, name)(*args, **kwargs)

    return Case("test_script", label, call, processes)


def _notebook(name: str, processes: tuple[int, ...] = (2,)) -> Case:
    def call(module: ModuleType, api: SimpleNamespace) -> None:
        getattr(module, name)()

    return Case("test_notebook", name, call, processes, in_driver=True)


_OPS = (
    "test_gather", "test_gather_object", "test_gather_non_contiguous", "test_broadcast",
    "test_pad_across_processes", "test_reduce_sum", "test_reduce_mean", "test_reduce_max",
    "test_op_checker", "test_copy_tensor_to_devices",
)  # fmt: skip

CASES: list[Case] = [
    _sync("test_dataloader_break"),
    _sync("test_noop_sync", processes=(1,)),
    _sync("test_distributed_sync", processes=(2,)),
    _sync("test_distributed_sync_multiple_fwd", processes=(2,)),
    *_accumulation_variants(),
    *(_ops(name) for name in _OPS),
    _loop("test_default_ensures_even_batch_sizes"),
    _loop("test_can_disable_even_batches"),
    _loop("test_can_join_uneven_inputs"),
    _loop("test_join_raises_warning_for_non_ddp_distributed", _non_ddp_warning),
    _loop("test_join_can_override_even_batches"),
    _loop("test_join_can_override_for_mixed_type_dataloaders"),
    _loop("test_join_raises_warning_for_iterable_when_overriding_even_batches"),
    _loop("test_pickle_accelerator"),
    *(_loader_case(kind) for kind in ("shuffle=False", "shuffle=True", "batch_sampler", "sampler")),
    _loop("test_stateful_dataloader", lambda module, _, acc: module.test_stateful_dataloader(acc)),
    _loop(
        "test_stateful_dataloader_save_state",
        lambda module, _, acc: module.test_stateful_dataloader_save_state(acc),
    ),
    _script("init_state_check"),
    _script("process_execution_check"),
    _script("test_split_between_processes_list"),
    _script("test_split_between_processes_nested_dict"),
    _script("test_split_between_processes_tensor"),
    _script("test_split_between_processes_evenly"),
    _script("rng_sync_check"),
    _script("dl_preparation_check"),
    _script("central_dl_preparation_check"),
    _script("custom_sampler_check"),
    _script("check_seedable_sampler"),
    _script("check_seedable_sampler_with_data_seed"),
    _script("check_seedable_sampler_in_batch_sampler_shard", processes=(2,)),
    _script("training_check", use_seedable_sampler=False),
    _script("training_check", use_seedable_sampler=True),
    _script("test_trigger"),
    _script("test_reinstantiated_state"),
    _notebook("test_can_initialize", processes=(1, 2)),
    _notebook("test_clean_cuda_fork"),
    _notebook("test_static_rdzv_backend"),
    _notebook("test_c10d_rdzv_backend"),
    _notebook("test_fault_tolerant"),
    _notebook("test_monitoring"),
]
