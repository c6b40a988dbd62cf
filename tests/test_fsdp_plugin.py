"""The FSDP plugin's settings, wrap policies and model files, without starting processes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from notebook_kit import FullyShardedDataParallelPlugin
from notebook_kit.accelerator.model_files import parse_shard_size, write_model_files
from notebook_kit.accelerator.strategies.fsdp_plugin import as_plugin
from notebook_kit.accelerator.strategies.fsdp_wrap import wrap_targets
from tests.fsdp_models import Block, TinyLM


def test_fsdp_version_1_is_refused_with_the_way_to_version_2(monkeypatch):
    with pytest.raises(
        ValueError, match=r"fsdp_version=1.*FullyShardedDataParallelPlugin\(fsdp_version=2\)"
    ):
        FullyShardedDataParallelPlugin(fsdp_version=1)
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="FSDP_VERSION=2"):
        FullyShardedDataParallelPlugin()


def test_unset_fields_come_from_accelerates_environment_variables(monkeypatch):
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "Block, Other")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Other"]
    assert plugin.state_dict_type == "FULL_STATE_DICT"
    assert plugin.activation_checkpointing and plugin.cpu_offload
    assert plugin.reshard_after_forward is False
    assert FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT").state_dict_type == (
        "SHARDED_STATE_DICT"  # given beats the environment
    )


def test_bad_settings_name_the_field_and_the_choices():
    with pytest.raises(ValueError, match="auto_wrap_policy must be one of"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="layer_wrap")
    with pytest.raises(ValueError, match="min_num_params"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap")
    with pytest.raises(ValueError, match="state_dict_type must be one of"):
        FullyShardedDataParallelPlugin(state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="mixed_precision_policy='fp8'"):
        FullyShardedDataParallelPlugin(mixed_precision_policy="fp8")
    with pytest.raises(TypeError, match="fsdp_plugin must be a FullyShardedDataParallelPlugin"):
        as_plugin({"fsdp_version": 2})


def test_accelerates_own_plugin_is_read_field_by_field():
    from accelerate.utils import FullyShardedDataParallelPlugin as AcceleratePlugin

    theirs = AcceleratePlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="FULL_STATE_DICT",
        activation_checkpointing=True,
        reshard_after_forward=False,
    )
    ours = as_plugin(theirs)
    assert ours.auto_wrap_policy == "transformer_based_wrap"
    assert ours.transformer_cls_names_to_wrap == ["Block"]
    assert ours.state_dict_type == "FULL_STATE_DICT"
    assert ours.activation_checkpointing and ours.reshard_after_forward is False
    theirs.forward_prefetch = True  # an FSDP1 field: never dropped silently
    with pytest.raises(ValueError, match="forward_prefetch=True"):
        as_plugin(theirs)


def test_transformer_wrap_picks_the_blocks_and_names_unknown_classes():
    model = TinyLM()
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    assert wrap_targets(model, plugin) == [model.blocks[1], model.blocks[0]]  # from _no_split
    plugin.transformer_cls_names_to_wrap = ["Decoder"]
    with pytest.raises(ValueError, match=r"\['Decoder'\].*Block, Embedding"):
        wrap_targets(model, plugin)
    plain = nn.Sequential(Block())
    with pytest.raises(ValueError, match="transformer_cls_names_to_wrap"):
        wrap_targets(
            plain, FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
        )


def test_size_wrap_keeps_tied_weights_with_their_common_ancestor():
    model = TinyLM()
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=50)
    targets = wrap_targets(model, plugin)
    assert model.embed not in targets and model.head not in targets  # they share a weight
    assert model.blocks[0] in targets and model.blocks[0].up in targets
    assert model.blocks not in targets  # a ModuleList has no forward to shard around


def test_model_files_are_sharded_with_an_index_that_transformers_reads(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
    )  # fmt: skip
    model = transformers.BertForMaskedLM(config)
    written = write_model_files(model.state_dict(), tmp_path, max_shard_size="8KB")
    config.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == len(written) - 1 > 1
    loaded = transformers.BertForMaskedLM.from_pretrained(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_shard_sizes_parse_and_bad_ones_say_how_to_write_them():
    assert parse_shard_size("10GB") == 10**10
    assert parse_shard_size("2MiB") == 2 * 2**20
    assert parse_shard_size(1234) == 1234
    with pytest.raises(ValueError, match=r"max_shard_size='ten'.*'10GB'"):
        parse_shard_size("ten")


def test_launch_use_fsdp_is_a_plain_flag_that_reaches_the_scripts_workers():
    from notebook_kit import LaunchConfig
    from notebook_kit.cli.main import build_parser, config_from_arguments
    from notebook_kit.config.command_line import launch_command_line
    from notebook_kit.config.launch_plan import worker_environment

    parser = build_parser()
    args = parser.parse_args(["launch", "--use-fsdp", "train.py"])
    assert args.script == "train.py"
    config = config_from_arguments(args, base=LaunchConfig())
    assert config.use_fsdp is True
    environment = worker_environment(config, 1)
    assert environment["NOTEBOOK_KIT_USE_FSDP"] == "yes"
    off = parser.parse_args(["launch", "--no-use-fsdp", "train.py"])  # over a saved default
    assert config_from_arguments(off, base=config).use_fsdp is False
    assert "use_fsdp" not in vars(parser.parse_args(["launch", "train.py"]))
    rendered = launch_command_line(config)
    assert rendered == "notebook-kit launch --use-fsdp train.py"
    again = parser.parse_args(rendered.split()[1:])
    assert config_from_arguments(again, base=LaunchConfig()) == config
    assert launch_command_line(LaunchConfig(), baseline=config).split()[2] == "--no-use-fsdp"


def test_launch_use_fsdp_with_a_value_says_it_takes_none(tmp_path, monkeypatch):
    from notebook_kit.cli.main import build_parser
    from notebook_kit.cli.script_launch import LaunchInputError, plan_script_launch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = build_parser().parse_args(["launch", "--use-fsdp", "yes", "train.py"])
    with pytest.raises(
        LaunchInputError,
        match=r"--use-fsdp takes no value \('yes' was read as the script\): write "
        r"`notebook-kit launch --use-fsdp train.py`, or --no-use-fsdp",
    ):
        plan_script_launch(args.script, args.script_args, {"use_fsdp": args.use_fsdp}, None, {})
