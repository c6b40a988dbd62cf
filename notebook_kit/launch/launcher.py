"""``notebook_launcher``: run a training function on N forked processes from a notebook."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from notebook_kit.config import arguments
from notebook_kit.config.arguments import takes_arguments_of
from notebook_kit.config.launch_config import LaunchConfig, resolve_launch_config
from notebook_kit.config.launch_plan import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    DEFAULT_STALL_SECONDS,
    LaunchPlan,
)
from notebook_kit.config.schema import SETTINGS
from notebook_kit.integrations import activation as integrations
from notebook_kit.launch.cluster.cluster_plan import ClusterPlan, resolve_cluster_plan
from notebook_kit.launch.interrupts import interrupt_latch, interrupts_survive_forks
from notebook_kit.launch.launchers import run_awaitable, run_blocking, select_launcher
from notebook_kit.launch.plan import Call, check_explicit_settings, make_plan
from notebook_kit.launch.preflight import check_not_in_a_launch
from notebook_kit.launch.rendezvous_options import translate_rendezvous_options
from notebook_kit.launch.template_choice import chosen_start_method
from notebook_kit.launch.warmup import start_warmup
from notebook_kit.live.observer import LaunchObserver

__all__ = ["notebook_launcher", "notebook_launcher_async", "resolve_plan"]

start_warmup()  # from the import cell on, workers' one-time imports are paid here, once
integrations.register()  # every launch turns on the Trainer and Accelerate integrations


def _launch_arguments(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    mixed_precision: arguments.MixedPrecision | None = None,
    gradient_accumulation_steps: int | None = None,
    backend: arguments.Backend | None = None,
    seed: int | None = None,
    master_addr: str | None = None,
    use_port: int | None = None,
    num_nodes: int | None = None,
    node_rank: int | None = None,
    threads_per_process: int | None = None,
    live: bool | None = None,
    max_restarts: int | None = None,
    fsdp: bool | None = None,
    parallelism_config_dp_replicate_size: int | None = None,
    parallelism_config_dp_shard_size: int | None = None,
    parallelism_config_tp_size: int | None = None,
    parallelism_config_cp_size: int | None = None,
    storage_timeout: int | None = None,
    memory_history: bool | None = None,
    start_method: arguments.StartMethod | None = None,
    timeout: float | None = None,
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT,
    isolate: bool = False,
    stall_seconds: float | None = DEFAULT_STALL_SECONDS,
    min_nodes: int | None = None,
    post_mortem: bool = False,
    config: LaunchConfig | None = None,
    observer: LaunchObserver | None = None,
    rdzv_backend: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_conf: Mapping[str, Any] | None = None,
    rdzv_id: str | None = None,
    monitor_interval: float | None = None,
    log_line_prefix_template: str | None = None,
    cluster: Any = None,
) -> Any:
    """The arguments of :func:`notebook_launcher` and :func:`notebook_launcher_async`."""
    raise NotImplementedError  # only a signature: takes_arguments_of gives it to both


@takes_arguments_of(_launch_arguments)
def notebook_launcher(options: dict[str, Any]) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` forked workers and return rank 0's
    result.

    Each worker has ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set and an initialised default process group (gloo on
    CPU, nccl when every local rank has a GPU). The function is never pickled, so functions
    defined in notebook cells, closures and lambdas work. Models created in the kernel and
    given to ``Accelerator.prepare`` come back holding rank 0's trained weights.

    Settings left as None come from ``config``, else from ``NOTEBOOK_KIT_<SETTING>``
    environment variables, else from the saved default (``notebook-kit config``), else from
    the built-in defaults below (each declared in :mod:`notebook_kit.config.schema`).

    Args:
        function: The training function.
        args: Positional arguments for ``function``.
        num_processes: Workers on this node; 1 runs in the calling process. Default: one per
            GPU when CUDA is available, else 1.
        kwargs: Keyword arguments for ``function``.
        mixed_precision: "no", "fp16" or "bf16"; every worker's ``Accelerator`` inherits it.
        use_port: Rendezvous port; default: a free port (single node) or 29500 (multi-node).
        master_addr: Address of node 0 (multi-node only; one node always uses loopback).
        node_rank: Index of this node in a multi-node job (default 0).
        num_nodes: Number of nodes (default 1); the world size is ``num_nodes * num_processes``.
        backend: "gloo" or "nccl"; default: chosen from the hardware.
        threads_per_process: torch threads per worker; default: cores // processes.
        timeout: Seconds after which the run is stopped and TimeoutError raised.
        stall_seconds: Seconds without progress on any rank (no step, log or output) after
            which the cell shows, once, which collective each rank waits in and its stack;
            the run goes on. None: never.
        gradient_accumulation_steps: Inherited by every worker's ``Accelerator``.
        rendezvous_timeout: Seconds to wait for the other nodes to join.
        max_restarts: Times all workers are started again after a rank fails (default 0); a
            function that calls ``accelerator.load_state()`` first resumes from its checkpoint.
            On a cluster a lost node counts as a failure too.
        min_nodes: With ``cluster=``: the fewest nodes an attempt runs on (default
            ``num_nodes``). A restart uses the workers there are then, from ``min_nodes`` to
            ``num_nodes`` of them, waiting up to ``rendezvous_timeout`` for enough; the world
            size may change between attempts (``load_state()`` resumes on any).
        post_mortem: A rank that raises opens pdb in its failing frame, at the cell's prompt,
            before it reports: ``p`` its locals, then ``q`` (or ``c``) and the failure goes on
            as usual (docs/guarantees.md, "Debugging a rank"). Where the frontend allows no
            input, one line says the post-mortem was skipped. Refused with ``cluster=``.
        fsdp: Every ``Accelerator`` made in the workers without an ``fsdp_plugin`` shards its
            model with FSDP2 (a default plugin, tuned by the ``FSDP_*`` variables).
        parallelism_config_dp_replicate_size, parallelism_config_dp_shard_size,
            parallelism_config_tp_size, parallelism_config_cp_size: The sizes of the
            ``ParallelismConfig`` every worker's ``Accelerator`` builds when it is given none
            (HSDP, tensor and context parallel; docs/parallelism.md). Their product must be
            the world size; refused before anything starts otherwise.
        storage_timeout: Seconds (default 60) a checkpoint save to object storage may wait
            for an answer before it fails, on every rank, as ``CheckpointSaveError``.
        memory_history: Each GPU rank records the CUDA allocator's history; a rank that
            raises ``torch.OutOfMemoryError`` saves a snapshot (for pytorch.org/memory_viz),
            and its traceback ends with the largest live allocations, the line that made
            each, and the snapshot's path. Refused when the ranks would train on the CPU.
        start_method: "auto" (default) forks the workers from this kernel when that is safe,
            else starts them from its clean template process (made at ``import notebook_kit``
            in a kernel); "fork" always forks (``ForkSafetyError`` on a kernel holding a CUDA
            context or a process group); "template" always uses the clean process. Unset:
            ``config=``'s, else ``set_start_method()``'s, else ``NOTEBOOK_KIT_START_METHOD``.
        seed: Seeds torch, numpy and random in every worker before the function starts.
        live: Show live plots, progress and a Stop button (None: when a notebook front end
            is there); False shows nothing but errors.
        isolate: Run a single process in a forked worker instead of this kernel, so that
            training on the GPU leaves the kernel free of CUDA and later launches can still
            fork (``num_processes=1`` otherwise runs here, where ``%debug`` works).
        config: A ``LaunchConfig`` (e.g. ``ConfigPanel().config``) for the settings not given.
        observer: Receives worker output and messages instead of the default display.
        rdzv_backend, rdzv_endpoint, rdzv_conf, rdzv_id, monitor_interval,
            log_line_prefix_template: Accelerate's torch-elastic arguments, accepted: the
            endpoint gives ``master_addr``/``use_port``, ``rdzv_conf["timeout"]`` the
            ``rendezvous_timeout``; what has no meaning here is said in
            :mod:`notebook_kit.launch.rendezvous_options`.
        cluster: The cluster to run on: a Dask ``Client`` (or a cluster with
            ``.get_client()``), or ``"ray"`` / ``"ray://head:10001"`` for a Ray cluster
            (any engine of :mod:`notebook_kit.launch.cluster.engines`): run
            ``num_processes`` ranks on each of ``num_nodes`` of its workers (default: one
            per host), shown live here like a local launch (docs/cluster.md).

    Returns:
        What ``function`` returned on rank 0 (in a multi-node job: on this node's first rank).

    Raises:
        WorkerError: A rank raised or died; the message holds its traceback.
        TimeoutError: ``timeout`` passed; all workers were stopped.
        ForkSafetyError: start_method is "fork" and CUDA or a process group is already
            initialised in the kernel (with "auto" the workers start from a clean process).
        PortInUseError: ``use_port`` is taken.

    Example::

        def train(lr):
            import torch.distributed as dist
            return dist.get_world_size() * lr
        notebook_launcher(train, args=(0.1,), num_processes=2)
        # 0.2
    """
    with interrupt_latch():  # however often Ctrl-C is pressed, one KeyboardInterrupt
        call, plan, observer = _resolve_any(options)
        return run_blocking(select_launcher(plan).run(call, observer))


@takes_arguments_of(_launch_arguments)
async def notebook_launcher_async(options: dict[str, Any]) -> Any:
    """``await`` form of :func:`notebook_launcher`, with the same arguments and result.

    While the workers run, the kernel's event loop stays free, so widget events (a Stop
    button click) are handled during the run, not after it.

    Example::

        result = await notebook_launcher_async(train, num_processes=2)
    """
    with interrupt_latch():  # however often Ctrl-C is pressed, one KeyboardInterrupt
        call, plan, observer = _resolve_any(options)
        return await run_awaitable(select_launcher(plan).run(call, observer))


def _resolve_any(
    options: dict[str, Any],
) -> tuple[Call, LaunchPlan | ClusterPlan, LaunchObserver | None]:
    """The call, the plan and the observer of a launch here, or on a cluster when ``cluster`` is
    given; nothing has been started when this raises. What remains of ``options`` are the
    settings: explicit ones win over ``config``, which wins over the saved default."""
    observer, cluster = options.pop("observer"), options.pop("cluster")
    settings = options if cluster is not None else translate_rendezvous_options(options)
    function = arguments.check_function(settings.pop("function"))
    args, kwargs = arguments.check_args(settings.pop("args"), settings.pop("kwargs"))
    if cluster is not None:
        return (function, args, kwargs), resolve_cluster_plan(cluster, settings), observer
    with interrupts_survive_forks():  # the kernel probe may fork
        return (function, args, kwargs), resolve_plan(settings, "notebook_launcher"), observer


def resolve_plan(
    options: Mapping[str, Any], caller: str, *, isolate: bool | None = None
) -> LaunchPlan:
    """The plan for ``options`` (the launcher's keyword arguments, bound against its signature,
    so none unknown), checked before any fork.

    ``caller`` names the API in the error for a launch inside a launch; ``isolate`` overrides
    the option of that name (a worker pool always forks, even for one process).

    Example:
        >>> resolve_plan({"num_processes": 2}, "WorkerPool").world_size
        2
    """
    check_not_in_a_launch(caller)
    if options.get("min_nodes") is not None:
        raise ValueError(
            f"min_nodes={options['min_nodes']!r} needs cluster=: a cluster run restarts on "
            "the nodes it still has. The nodes of a launch without one are started by hand on "
            "each machine and cannot change (for scripts, torchrun's --nnodes MIN:MAX does this). "
            "Leave min_nodes out, or pass cluster=."
        )
    config = options.get("config")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}.")
    explicit = {name: options.get(setting.keyword) for name, setting in SETTINGS.items()}
    if explicit["start_method"] is None and config is None:  # above the variable, not config=
        explicit["start_method"] = chosen_start_method()
    settings = resolve_launch_config(config, **check_explicit_settings(explicit))
    if isolate is None:
        isolate = arguments.check_bool("isolate", options.get("isolate", False))
    plan = make_plan(
        settings,
        timeout=options.get("timeout"),
        rendezvous_timeout=options.get("rendezvous_timeout", DEFAULT_RENDEZVOUS_TIMEOUT),
        isolate=isolate,
        stall_seconds=options.get("stall_seconds", DEFAULT_STALL_SECONDS),
    )
    post_mortem = arguments.check_bool("post_mortem", options.get("post_mortem", False))
    return dataclasses.replace(plan, post_mortem=post_mortem)
