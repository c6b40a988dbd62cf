"""FSDP2 through ``Accelerator(fsdp_plugin=...)`` on real forked ranks (CPU, gloo).

Each launch checks several things at once, so the file stays quick: training equals the
unsharded loop on the global batch (with accumulation and clipping), parameters are
``Shard(0)`` DTensors whose local bytes add up to the full model, the trained weights come
home whole, checkpoints resume exactly, ``save_model`` output reloads, and misuse is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from notebook_kit import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    WorkerError,
    notebook_launcher,
)
from tests.fsdp_models import TinyLM, batches, lm_loss, reference_run

pytestmark = pytest.mark.integration

STEPS, MICRO, MAX_NORM = 4, 2, 0.5


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _full_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()  # a DTensor's numel is the global one


def _byte_counts(model, optimizer) -> dict[str, tuple[int, int]]:
    params = list(model.parameters())
    states = [v for s in optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "parameters": (sum(map(_local_bytes, params)), sum(map(_full_bytes, params))),
        "gradients": (
            sum(_local_bytes(p.grad) for p in params),
            sum(_full_bytes(p.grad) for p in params),
        ),
        "optimizer": (sum(map(_local_bytes, states)), sum(map(_full_bytes, states))),
    }


def _train_sharded(model: TinyLM):
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    accelerator = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=MICRO)
    try:
        accelerator.prepare(TinyLM())
        alone = "no error"
    except ValueError as error:
        alone = str(error)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)  # built before sharding
    prepared, optimizer = accelerator.prepare(model, optimizer)
    rank, size = accelerator.process_index, accelerator.num_processes
    losses, norms, counts, unsynced = [], [], {}, False
    for tokens in batches(STEPS, MICRO):
        with accelerator.accumulate(prepared):
            loss = lm_loss(prepared, tokens[rank::size])
            accelerator.backward(loss)
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
            if not accelerator.sync_gradients:  # reduced only on the step that applies them
                unsynced = all(p.grad is None for p in prepared.parameters())
            if accelerator.sync_gradients:
                norms.append(accelerator.clip_grad_norm_(prepared.parameters(), MAX_NORM))
                counts = _byte_counts(prepared, optimizer) if optimizer.optimizer.state else {}
            optimizer.step()
            if accelerator.sync_gradients:
                counts = _byte_counts(prepared, optimizer)
            optimizer.zero_grad()
    placements = {str(p.placements) for p in prepared.parameters()}
    every_rank = [None] * size
    dist.all_gather_object(every_rank, counts)
    state = accelerator.get_state_dict(prepared)
    return {
        "kind": (accelerator.distributed_type.value, accelerator.is_fsdp2, type(norms[0]).__name__),
        "alone": alone,
        "losses": losses,
        "norms": norms,
        "placements": placements,
        "tied": prepared.head.weight is prepared.embed.weight,
        "unsynced": unsynced,
        "counts": every_rank,
        "state": state,
    }


@pytest.mark.parametrize("num_processes", [2, 4])
def test_sharded_training_equals_the_unsharded_loop_and_the_weights_come_home(num_processes):
    losses, norms, reference = reference_run(STEPS, MICRO, MAX_NORM)
    model = TinyLM()
    got = notebook_launcher(_train_sharded, args=(model,), num_processes=num_processes)

    assert got["kind"] == ("FSDP", True, "float")
    assert "prepare a model together with its optimizer" in got["alone"]
    assert got["placements"] == {"(Shard(dim=0),)"}
    assert got["tied"]
    assert got["unsynced"]  # accumulating micro-steps kept their gradients unreduced
    assert max(abs(a - b) for a, b in zip(got["losses"], losses, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(got["norms"], norms, strict=True)) < 1e-6
    assert min(norms) > MAX_NORM  # the clipping was active at every step
    for kind in ("parameters", "gradients", "optimizer"):
        local = [counts[kind][0] for counts in got["counts"]]
        full = got["counts"][0][kind][1]
        assert sum(local) == full, kind  # each element lives on exactly one rank
        assert max(local) <= full / num_processes * 1.5, (kind, local, full)
    for key, value in reference.items():  # gathered to rank 0, and loaded into the kernel's
        assert torch.allclose(got["state"][key], value, atol=1e-6), key
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key
    assert model.head.weight is model.embed.weight


def _resume_checks(folder: str):
    results = {}
    for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="size_based_wrap", min_num_params=100, state_dict_type=kind
        )
        accelerator = Accelerator(fsdp_plugin=plugin)
        model = TinyLM()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), 0.05))
        data = batches(6, 1)

        def step(tokens, model=model, optimizer=optimizer, accelerator=accelerator):
            rank, size = accelerator.process_index, accelerator.num_processes
            accelerator.backward(lm_loss(model, tokens[rank::size]))
            optimizer.step()
            optimizer.zero_grad()

        for tokens in data[:3]:
            step(tokens)
        saved = accelerator.save_state(f"{folder}/{kind}")
        for tokens in data[3:]:
            step(tokens)
        straight = [p.detach().full_tensor().clone() for p in model.parameters()]
        accelerator.load_state(saved)
        for tokens in data[3:]:
            step(tokens)
        resumed = [p.detach().full_tensor() for p in model.parameters()]
        results[kind] = all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))
    accelerator.save_model(model, f"{folder}/model", max_shard_size="1KB")
    return results, accelerator.get_state_dict(model)


def test_checkpoints_resume_exactly_and_save_model_output_reloads(tmp_path):
    results, state = notebook_launcher(_resume_checks, args=(str(tmp_path),), num_processes=2)
    assert results == {"SHARDED_STATE_DICT": True, "FULL_STATE_DICT": True}
    sharded = next((tmp_path / "SHARDED_STATE_DICT").glob("state-*"))
    assert (sharded / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (sharded / "optimizer_0" / ".metadata").is_file()

    from safetensors.torch import load_file

    index = json.loads((tmp_path / "model" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((tmp_path / "model" / name).is_file() for name in files)
    loaded = {}
    for name in files:
        loaded |= load_file(tmp_path / "model" / name)
    fresh = TinyLM(seed=5)
    fresh.load_state_dict(loaded)
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value), key


def _precision_and_recompute():
    losses = {}
    variants = {
        "plain": FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap"),
        "recompute": FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", activation_checkpointing=True
        ),
        "offload": FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", cpu_offload=True
        ),
        "bf16": FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", mixed_precision_policy="bf16"
        ),
    }
    for name, plugin in variants.items():
        accelerator = Accelerator(fsdp_plugin=plugin)
        model = TinyLM()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), 0.05))
        rank, size = accelerator.process_index, accelerator.num_processes
        run = []
        for tokens in batches(3, 1):
            loss = lm_loss(model, tokens[rank::size])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            run.append(accelerator.reduce(loss.detach().float(), "mean").item())
        losses[name] = run
    return losses


def test_recompute_and_cpu_offload_are_exact_and_bf16_stays_close():
    losses = notebook_launcher(_precision_and_recompute, num_processes=2)
    plain = losses["plain"]
    for variant in ("recompute", "offload"):  # offload: not pinned, as a CPU run needs
        assert max(abs(a - b) for a, b in zip(losses[variant], plain, strict=True)) < 1e-6
    bf16 = losses["bf16"]
    assert bf16 != plain  # it really ran in bfloat16
    assert max(abs(a - b) / abs(b) for a, b in zip(bf16, plain, strict=True)) < 2e-2


def _save_on_the_main_process_only():
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = TinyLM()
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), 0.1))
    if accelerator.is_main_process:
        accelerator.get_state_dict(model)
    else:
        time.sleep(60)  # the rank that never comes: the guard must not wait for it


def test_a_collective_entered_by_one_rank_fails_within_seconds(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_KIT_COLLECTIVE_CHECK_TIMEOUT", "2")
    started = time.monotonic()
    with pytest.raises(WorkerError) as raised:
        notebook_launcher(_save_on_the_main_process_only, num_processes=2)
    assert time.monotonic() - started < 20
    message = str(raised.value)
    assert "get_state_dict() is a collective" in message
    assert "only rank 0 of 2 entered it" in message and "rank 1 did not" in message
    assert "is_main_process" in message


def test_fsdp_without_a_launch_says_how_to_launch():
    with pytest.raises(ValueError, match=r"notebook_launcher\(train, num_processes=2\)"):
        Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())


def _trainer_asked_for_fsdp(output_dir: str):
    from tests.ladder_rungs import tiny_bert, train_with_trainer, training_arguments

    arguments = training_arguments(
        Path(output_dir), fsdp="full_shard", fsdp_config={"fsdp_version": 2}
    )
    return train_with_trainer(tiny_bert(), Path(output_dir), arguments=arguments)


def test_a_trainer_asked_for_fsdp_on_cpu_refuses_instead_of_training_unsharded(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(WorkerError, match=r"asks for FSDP, but on this CPU run.*fsdp_plugin"):
        notebook_launcher(_trainer_asked_for_fsdp, args=(str(tmp_path),), num_processes=2)


def _default_accelerator():
    accelerator = Accelerator()
    return accelerator.distributed_type.value, accelerator.is_fsdp2


def test_the_fsdp_launch_setting_turns_it_on_in_every_worker_and_needs_processes():
    assert notebook_launcher(_default_accelerator, num_processes=2, fsdp=True) == ("FSDP", True)
    with pytest.raises(ValueError, match="num_processes=1 runs in this kernel"):
        notebook_launcher(_default_accelerator, num_processes=1, fsdp=True)


def _pool_steps(model: TinyLM, first: int):
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    prepared, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), 0.5))
    for tokens in batches(first + 1, 1)[first:]:
        rank, size = accelerator.process_index, accelerator.num_processes
        accelerator.backward(lm_loss(prepared, tokens[rank::size]))
        optimizer.step()
        optimizer.zero_grad()
    return accelerator.is_fsdp2


def test_a_pool_keeps_the_sharded_model_and_sends_it_home_after_every_run():
    from notebook_kit import WorkerPool

    model = TinyLM()
    reference = TinyLM()
    optimizer = torch.optim.SGD(reference.parameters(), 0.5)
    with WorkerPool(num_processes=2, live=False) as pool:
        for step in range(2):  # the second run prepares the model the workers sharded before
            assert pool.run(_pool_steps, model, step)
            lm_loss(reference, batches(step + 1, 1)[step]).backward()
            optimizer.step()
            optimizer.zero_grad()
            for key, value in reference.state_dict().items():
                assert torch.allclose(model.state_dict()[key], value, atol=1e-6), (step, key)


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's full value: gathered from its shards, or itself where it is whole."""
    value = parameter.detach()
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _train_with_ignored_block():
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", ignored_modules=r"^blocks\.1$"
    )
    accelerator = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=MICRO)
    model = TinyLM()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=0.05))
    kinds = {name: type(p).__name__ for name, p in model.named_parameters()}
    rank, size = accelerator.process_index, accelerator.num_processes
    losses, norms = [], []
    for tokens in batches(STEPS, MICRO):
        with accelerator.accumulate(model):
            loss = lm_loss(model, tokens[rank::size])
            accelerator.backward(loss)
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
            if accelerator.sync_gradients:
                norms.append(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM))
            optimizer.step()
            optimizer.zero_grad()
    ignored = torch.cat([p.detach().flatten() for p in model.blocks[1].parameters()])
    every_rank = [torch.zeros_like(ignored) for _ in range(size)]
    dist.all_gather(every_rank, ignored)
    same = all(torch.equal(every_rank[0], other) for other in every_rank)
    return kinds, losses, norms, same, accelerator.get_state_dict(model)


def test_ignored_modules_stay_whole_and_still_train_like_the_unsharded_loop():
    losses, norms, reference = reference_run(STEPS, MICRO, MAX_NORM)
    kinds, got_losses, got_norms, same, state = notebook_launcher(
        _train_with_ignored_block, num_processes=2
    )
    ignored = {name for name in kinds if name.startswith("blocks.1.")}
    assert ignored and all(kinds[name] == "Parameter" for name in ignored), kinds
    assert all(kind == "DTensor" for name, kind in kinds.items() if name not in ignored), kinds
    assert same  # every rank's copy of the ignored block took the same (averaged) steps
    assert max(abs(a - b) for a, b in zip(got_losses, losses, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(got_norms, norms, strict=True)) < 1e-6
    for key, value in reference.items():
        assert torch.allclose(state[key], value, atol=1e-6), key


def _prepare_from_rank0_weights():
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap",
        cpu_ram_efficient_loading=True,
        ignored_modules=r"^blocks\.1$",
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    rank = accelerator.process_index
    results = {}
    for build in ("own seed", "meta"):
        if rank == 0:
            model = TinyLM(seed=0)
        elif build == "meta":
            with torch.device("meta"):
                model = TinyLM(seed=0)
        else:
            model = TinyLM(seed=rank + 6)  # a different random init: rank 0's must win
        model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        whole = {name: _whole(p) for name, p in model.named_parameters()}
        results[build] = (whole, model.head.weight is model.embed.weight)
    every_rank = [None] * accelerator.num_processes
    dist.all_gather_object(every_rank, results)
    return every_rank


def test_cpu_ram_efficient_loading_gives_every_rank_rank_0s_weights():
    expected = TinyLM(seed=0).state_dict()
    assert not torch.equal(TinyLM(seed=7).embed.weight, expected["embed.weight"])
    every_rank = notebook_launcher(_prepare_from_rank0_weights, num_processes=2)
    for rank, results in enumerate(every_rank):
        for build, (whole, tied) in results.items():
            assert tied, (rank, build)
            for name, value in whole.items():
                assert torch.equal(value, expected[name]), (rank, build, name)


def _half_precision_runs():
    results = {}
    for precision in ("fp16", "bf16"):
        ignored = r"^blocks\.1$" if precision == "fp16" else None  # whole gradients scaled too
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", ignored_modules=ignored
        )
        accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision=precision)
        model = TinyLM()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), 0.05))
        rank, size = accelerator.process_index, accelerator.num_processes
        losses = []
        for tokens in batches(3, 1):
            loss = lm_loss(model, tokens[rank::size])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
        results[precision] = losses
        if precision == "fp16":  # an overflow in rank 1's shard only must stop every rank
            accelerator.backward(lm_loss(model, batches(1, 1)[0][rank::size]))
            if rank == 1:
                model.blocks[0].up.weight.grad.to_local().view(-1)[0] = float("inf")
            before = [_whole(p).clone() for p in model.parameters()]
            scale = accelerator.scaler.get_scale()
            optimizer.step()
            after = [_whole(p) for p in model.parameters()]
            unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            verdict = (
                optimizer.step_was_skipped,
                unchanged,
                accelerator.scaler.get_scale() < scale,
            )
            every_rank = [None] * size
            dist.all_gather_object(every_rank, verdict)
            results["overflow"] = every_rank
    return results


def _unsharded_half_precision_loop(dtype: torch.dtype) -> list[float]:
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), 0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    losses = []
    for tokens in batches(3, 1):
        with torch.autocast("cpu", dtype=dtype):
            loss = lm_loss(model, tokens)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_fp16_and_bf16_follow_the_unsharded_half_precision_loop_and_an_overflow_skips_everywhere():
    results = notebook_launcher(_half_precision_runs, num_processes=2)
    for precision, dtype, tolerance in (
        ("fp16", torch.float16, 1e-3),  # relative: the same autocast, another summation order
        ("bf16", torch.bfloat16, 2e-2),
    ):
        reference = _unsharded_half_precision_loop(dtype)
        got = results[precision]
        assert max(abs(a - b) / abs(b) for a, b in zip(got, reference, strict=True)) < tolerance, (
            precision, got, reference,
        )  # fmt: skip
    assert results["overflow"] == [(True, True, True)] * 2, results["overflow"]
