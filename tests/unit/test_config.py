"""Presets and overrides: what a user types and what they are told."""

from __future__ import annotations

import pytest

from shardtop.config import (
    ConfigError,
    ZeroOffload,
    parse_size,
    preset_names,
    resolve,
    split_overrides,
    zero_offload,
)
from shardtop.launch import resolve_devices
from shardtop.units import format_bytes


def test_every_preset_resolves_with_a_description() -> None:
    names = preset_names()
    assert "fsdp2-mlp" in names
    for name in names:
        cfg = resolve(name)
        assert cfg["preset"] == name
        assert cfg["description"] and cfg["program"]


def test_dotted_overrides_are_typed() -> None:
    _, pairs = split_overrides(["preset=fsdp2-mlp", "model.n_layers=64", "devices=2", "max_steps=3"])
    cfg = resolve("fsdp2-mlp", pairs)
    assert cfg["model"]["n_layers"] == 64 and cfg["devices"] == 2 and cfg["max_steps"] == 3


def test_bare_first_word_is_the_preset() -> None:
    preset, pairs = split_overrides(["fsdp2-mlp", "max_steps=3"])
    assert preset == "fsdp2-mlp" and pairs == [("max_steps", "3")]


def test_unknown_preset_names_the_closest() -> None:
    with pytest.raises(ConfigError, match="Did you mean: fsdp2-mlp"):
        resolve("fsdp2-mpl")


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as e:
        resolve("fsdp2-mlp", [("model.n_layer", "3")])
    assert "Did you mean model.n_layers" in str(e.value)
    assert "Valid keys:" in str(e.value) and "max_steps" in str(e.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max_steps", "three", "expected an integer"),
        ("max_steps", "0", "positive integer"),
        ("devices", "-1", "expected a number of devices"),
        ("gpu_mem_limit", "lots", "expected a size such as 15GiB"),
        ("accelerator", "tpu", "expected one of auto, cpu, cuda"),
        ("model.hidden", "1.5", "expected an integer"),
    ],
)
def test_wrong_types_say_what_was_expected(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        resolve("fsdp2-mlp", [(key, value)])


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("zero.offload_optimizer", "gpu", "zero.offload_optimizer=gpu: expected one of none, cpu"),
        ("zero.offload_optimizer", "true", "expected one of none, cpu"),
        ("zero.offload_optimizer", "", "expected one of none, cpu"),
        ("zero.offload_param", "CPU", "expected one of none, cpu"),
        ("zero.offload_param", "nvme", "NVMe needs a path for DeepSpeed's nvme_path"),
        ("zero.offload_params", "cpu", "Did you mean zero.offload_param"),
    ],
)
def test_a_zero_presets_offload_keys_take_none_or_cpu(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        resolve("zero3-linear-fixed", [(key, value)])
    config = resolve("zero3-linear", [("zero.offload_optimizer", "cpu")])
    assert zero_offload(config) == ZeroOffload(optimizer="cpu", param="none")
    assert zero_offload(resolve("fsdp2-mlp")) == ZeroOffload(), "a preset without the keys offloads nothing"
    with pytest.raises(ConfigError, match="unknown key 'zero.offload_optimizer' for preset fsdp2-mlp"):
        resolve("fsdp2-mlp", [("zero.offload_optimizer", "cpu")])


def test_fixed_keys_cannot_be_overridden() -> None:
    with pytest.raises(ConfigError, match="cannot be overridden"):
        resolve("fsdp2-mlp", [("program", "x")])


def test_malformed_argument() -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        split_overrides(["fsdp2-mlp", "max_steps"])


def test_sizes() -> None:
    assert parse_size("15GiB") == 15 * 2**30
    assert parse_size("15G") == 15 * 2**30
    assert parse_size("16GB") == 16 * 10**9
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size(1024) == 1024
    with pytest.raises(ValueError):
        parse_size("15 potatoes")
    assert resolve("fsdp2-mlp", [("gpu_mem_limit", "15GiB")])["gpu_mem_limit"] == 15 * 2**30
    assert format_bytes(2 * 2**30) == "2 GiB"
    assert format_bytes(1536 * 2**20) == "1.5 GiB"


def test_devices_resolve_against_the_gpus_present() -> None:
    cfg = resolve("fsdp2-mlp")
    cpu = resolve_devices(cfg, lambda: 0)
    assert (cpu["accelerator"], cpu["world_size"]) == ("cpu", 2)
    gpu = resolve_devices(cfg, lambda: 8)
    assert (gpu["accelerator"], gpu["world_size"]) == ("cuda", 8)
    with pytest.raises(ConfigError, match="this machine has 2 GPU"):
        resolve_devices({**cfg, "devices": 6}, lambda: 2)
    with pytest.raises(ConfigError, match="no NVIDIA GPU is visible"):
        resolve_devices({**cfg, "accelerator": "cuda"}, lambda: 0)
