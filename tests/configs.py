"""Launch configs shared by tests."""

from __future__ import annotations

from notebook_kit.config.launch_config import LaunchConfig

# Every field differs from the built-in default, and the whole is valid.
EVERY_FIELD_SET = LaunchConfig(
    num_processes=2,
    mixed_precision="bf16",
    gradient_accumulation_steps=4,
    backend="gloo",
    seed=7,
    master_addr="10.0.0.5",
    master_port=29600,
    num_nodes=3,
    node_rank=2,
    threads_per_process=1,
    live=False,
    max_restarts=1,
)
