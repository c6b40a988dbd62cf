"""Accelerate's configuration objects and public names, in one plain process."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, default_collate

from notebook_kit import (
    Accelerator,
    AcceleratorState,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    PartialState,
    notebook_launcher,
    prepare_data_loader,
    set_seed,
)
from notebook_kit.accelerator.optimizer import AcceleratedScheduler, GradientState
from notebook_kit.launch.rendezvous_options import translate_rendezvous_options


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: DataLoaderConfiguration(split_batches="yes"), TypeError, "split_batches"),
        (lambda: DataLoaderConfiguration(data_seed=-1), ValueError, "data_seed"),
        (lambda: GradientAccumulationPlugin(num_steps=0), ValueError, "num_steps"),
        (lambda: GradientAccumulationPlugin(sync_each_batch=1), TypeError, "sync_each_batch"),
        (
            lambda: Accelerator(dataloader_config=DataLoaderConfiguration(), split_batches=True),
            ValueError,
            "inside dataloader_config",
        ),
        (
            lambda: Accelerator(
                gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
                gradient_accumulation_steps=3,
            ),
            ValueError,
            "only one of gradient_accumulation_steps",
        ),
        (
            lambda: Accelerator(kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()]),
            ValueError,
            "more than one GradScalerKwargs",
        ),
        (lambda: Accelerator(kwargs_handlers=[object()]), TypeError, "kwargs_handlers takes"),
        (lambda: Accelerator(rng_types=["xla"]), ValueError, "rng_types"),
    ],
)
def test_bad_configuration_names_the_field(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_configuration_reaches_the_accelerator():
    config = DataLoaderConfiguration(split_batches=True, even_batches=False, non_blocking=True)
    plugin = GradientAccumulationPlugin(num_steps=3, adjust_scheduler=False, sync_each_batch=True)
    accelerator = Accelerator(dataloader_config=config, gradient_accumulation_plugin=plugin)
    assert (accelerator.split_batches, accelerator.even_batches) == (True, False)
    assert accelerator.non_blocking and accelerator.gradient_accumulation_steps == 3
    assert accelerator.gradient_state.plugin_kwargs == {
        "num_steps": 3,
        "adjust_scheduler": False,
        "sync_with_dataloader": True,
        "sync_each_batch": True,
    }
    assert Accelerator(split_batches=True).dataloader_config.split_batches  # older spelling


def test_kwargs_handlers_list_only_changed_fields():
    assert DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs() == {
        "find_unused_parameters": True
    }
    assert GradScalerKwargs().to_kwargs() == {}
    assert InitProcessGroupKwargs(backend="gloo").timeout.total_seconds() == 1800


def test_grad_scaler_and_autocast_options_are_used():
    scaled = Accelerator(
        mixed_precision="fp16", cpu=True, kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)]
    )
    assert scaled.scaler.get_scale() == 1024.0
    bf16 = Accelerator(mixed_precision="bf16", cpu=True)
    with bf16.autocast():
        assert torch.is_autocast_enabled("cpu")
    off = Accelerator(mixed_precision="bf16", cpu=True, kwargs_handlers=[AutocastKwargs(False)])
    with off.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_state_and_distributed_type_in_one_process():
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.NO == "NO"
    state = accelerator.state
    assert isinstance(state, AcceleratorState) and state.mixed_precision == "no"
    assert (state.num_processes, state.process_index, state.is_main_process) == (1, 0, True)
    assert PartialState().device == accelerator.device or not torch.cuda.is_available()
    assert "Num processes: 1" in repr(PartialState(cpu=True))
    AcceleratorState._reset_state()  # ported test suites call it: nothing to reset here
    copy = pickle.loads(pickle.dumps(accelerator))
    assert copy.state.__dict__ == state.__dict__


def test_debug_flag_follows_the_environment_until_set(monkeypatch):
    state = PartialState()
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    assert state.debug
    state.debug = False
    try:
        assert not state.debug
    finally:
        from notebook_kit.accelerator.operations import set_debug_mode

        set_debug_mode(None)
    assert state.debug


def test_sync_with_dataloader_and_adjust_scheduler():
    state = GradientState(4, adjust_scheduler=False, sync_with_dataloader=False)

    class _Last:
        end_of_dataloader, remainder = True, -1

    state.begin(_Last())
    state.advance()
    assert not state.sync_gradients, "the end of the data does not force a sync"
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    before = scheduler._step_count
    AcceleratedScheduler(scheduler, [], state, 1, False).step()
    assert scheduler._step_count == before, "adjust_scheduler=False: micro-steps not counted"


def test_default_shuffle_is_the_dataloaders_own_order_every_epoch():
    def epochs(loader):
        return [[batch.tolist() for batch in loader] for _ in range(3)]

    set_seed(11)
    plain = epochs(DataLoader(list(range(10)), batch_size=3, shuffle=True))
    set_seed(11)
    prepared = prepare_data_loader(DataLoader(list(range(10)), batch_size=3, shuffle=True))
    assert epochs(prepared) == plain
    generator = torch.Generator().manual_seed(5)
    with_generator = DataLoader(list(range(10)), batch_size=3, shuffle=True, generator=generator)
    expected = epochs(with_generator)
    generator.manual_seed(5)
    assert epochs(prepare_data_loader(with_generator)) == expected


def test_seedable_shuffle_depends_only_on_data_seed_and_epoch():
    loader = DataLoader(list(range(10)), batch_size=5, shuffle=True)

    def first_epoch(seed):
        torch.manual_seed(seed)  # the global seed must not matter once data_seed is given
        prepared = prepare_data_loader(loader, use_seedable_sampler=True, data_seed=3)
        return [batch.tolist() for batch in prepared]

    assert first_epoch(0) == first_epoch(1)
    other = prepare_data_loader(loader, use_seedable_sampler=True, data_seed=4)
    assert [batch.tolist() for batch in other] != first_epoch(0)


class _WholeBatchReader(torch.utils.data.Dataset):
    """Reads a whole list of indices at once, as datasets given a BatchSampler sampler do."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, indices: list[int]) -> list[int]:
        return list(indices)


def test_batch_sampler_given_as_sampler_is_sharded():
    data = _WholeBatchReader()
    sampler = BatchSampler(SequentialSampler(data), batch_size=2, drop_last=False)
    loader = DataLoader(data, sampler=sampler, batch_size=None, collate_fn=default_collate)
    shards = [
        [batch.tolist() for batch in prepare_data_loader(loader, None, 2, rank)] for rank in (0, 1)
    ]
    assert shards == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_rendezvous_arguments_translate_or_say_why_not():
    assert translate_rendezvous_options(
        {"rdzv_backend": "c10d", "rdzv_endpoint": "10.0.0.1:29400", "num_nodes": 2}
    ) == {"num_nodes": 2, "master_addr": "10.0.0.1", "use_port": 29400}
    assert translate_rendezvous_options({"rdzv_conf": {"timeout": 90}}) == {
        "rendezvous_timeout": 90.0
    }
    with pytest.raises(ValueError, match="rdzv_backend must be 'static' or 'c10d'"):
        notebook_launcher(print, num_processes=2, rdzv_backend="etcd")
    with pytest.raises(ValueError, match="membership"):
        translate_rendezvous_options({"rdzv_conf": {"last_call_timeout": 5}})
    with pytest.raises(ValueError, match="monitor_interval"):
        translate_rendezvous_options({"monitor_interval": 0})
    with pytest.raises(ValueError, match="use_port=29500"):
        translate_rendezvous_options({"rdzv_endpoint": "host:29400", "use_port": 29500})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        translate_rendezvous_options({"rdzv_id": "job", "log_line_prefix_template": "[{rank}]"})
    assert len(caught) == 2 and "no effect" in str(caught[0].message)


def test_autocast_kwargs_reach_the_prepared_models_forward() -> None:
    model = torch.nn.Linear(2, 2)
    seen: list[torch.dtype] = []
    model.register_forward_hook(lambda _m, _i, output: seen.append(output.dtype))
    accelerator = Accelerator(
        mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)]
    )
    prepared = accelerator.prepare(model)
    prepared(torch.randn(1, 2))
    assert prepared is model and seen == [torch.float32], "autocast was turned off by the handler"


def test_accelerates_own_configuration_objects_are_read_field_by_field(tmp_path):
    theirs = pytest.importorskip("accelerate.utils", reason="compares with Accelerate's classes")
    hook = theirs.DDPCommunicationHookType.FP16
    accelerator = Accelerator(
        dataloader_config=theirs.DataLoaderConfiguration(
            even_batches=False, use_seedable_sampler=True, data_seed=3
        ),
        gradient_accumulation_plugin=theirs.GradientAccumulationPlugin(
            num_steps=2, sync_each_batch=True
        ),
        project_config=theirs.ProjectConfiguration(project_dir=str(tmp_path), total_limit=2),
        kwargs_handlers=[
            theirs.DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook=hook),
            theirs.GradScalerKwargs(init_scale=1024.0),
            theirs.AutocastKwargs(cache_enabled=True),
        ],
    )
    assert accelerator.dataloader_config == DataLoaderConfiguration(
        even_batches=False, use_seedable_sampler=True, data_seed=3
    )
    assert accelerator.gradient_accumulation_steps == 2
    assert accelerator.gradient_state.sync_each_batch
    assert (accelerator.project_dir, accelerator.total_limit) == (tmp_path, 2)
    assert accelerator.handlers.ddp_options() == {"find_unused_parameters": True}
    assert accelerator.handlers.ddp is not None and accelerator.handlers.ddp.comm_hook == "fp16"
    assert accelerator.handlers.scaler_options() == {"init_scale": 1024.0}
    assert accelerator.handlers.autocast_options() == {"cache_enabled": True}


@pytest.mark.parametrize(
    ("argument", "make", "message"),
    [
        (
            "project_config",
            lambda u: u.ProjectConfiguration(project_dir="runs", save_on_each_node=True),
            r"project_config: notebook_kit does not support ProjectConfiguration"
            r"\.save_on_each_node \(got True\)",
        ),
        (
            "project_config",
            lambda u: u.ProjectConfiguration(project_dir="runs", iteration=3),
            r"ProjectConfiguration\.iteration \(got 3\); leave it at Accelerate's default \(0\)",
        ),
        (
            "kwargs_handlers",
            lambda u: [u.TorchDynamoPlugin()],
            r"no equivalent of Accelerate's TorchDynamoPlugin",
        ),
    ],
)
def test_an_accelerate_field_notebook_kit_lacks_is_an_error_naming_it(argument, make, message):
    theirs = pytest.importorskip("accelerate.utils", reason="compares with Accelerate's classes")
    with pytest.raises((ValueError, TypeError), match=message):
        Accelerator(**{argument: make(theirs)})


def test_distributed_type_is_accelerates_own_member_where_accelerate_is_imported():
    theirs = pytest.importorskip("accelerate.utils", reason="compares with Accelerate's enum")
    kind = Accelerator(cpu=True).distributed_type
    assert kind is theirs.DistributedType.NO and isinstance(kind, theirs.DistributedType)
    assert kind == DistributedType.NO and kind in {theirs.DistributedType.NO}
    assert PartialState(cpu=True).distributed_type is theirs.DistributedType.NO
