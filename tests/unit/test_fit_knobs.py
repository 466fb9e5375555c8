"""What fit may change in a user's stack, and only that: the flags its command line carries, the DeepSpeed
config file it names, a preset's keys; what it asked about is read as the user typed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardtop.config import ConfigError, resolve, split_overrides
from shardtop.fit.command_line import command_at, deepspeed_config_at, read_command
from shardtop.fit.configuration import Configuration
from shardtop.fit.request import allowance, read_fit_request
from shardtop.fit.stacks import CommandStack, PresetStack
from shardtop.plan.cards import NON_PYTORCH_BYTES, parse_gpu
from shardtop.units import GiB, MiB

TORCHRUN = ["torchrun", "--nproc_per_node", "8", "train.py", "--batch-size", "4", "--steps", "500"]
HF = ["torchrun", "--nproc_per_node", "8", "run_clm.py", "--output_dir", "out", "--per_device_train_batch_size=8",
      "--deepspeed", "ds.json"]


def test_a_scripts_batch_and_steps_flags_are_set_and_the_launchers_left_alone() -> None:
    shape = read_command(TORCHRUN)
    assert shape.batch is not None and shape.batch.number == 4 and not shape.trainer
    rehearsed = command_at(shape, Configuration(), 13, deepspeed_file=None)
    assert rehearsed == ["torchrun", "--nproc_per_node", "8", "train.py", "--batch-size", "13", "--steps", "2"]
    used = command_at(shape, Configuration(), 13, deepspeed_file=None, rehearsed=False)
    assert used[-4:] == ["--batch-size", "13", "--steps", "500"], "the pick keeps the user's own steps"


def test_training_arguments_on_the_line_take_steps_and_checkpointing() -> None:
    shape = read_command([*HF, "--gradient_checkpointing"])
    assert shape.trainer and shape.checkpointing_given
    off = command_at(shape, Configuration(checkpointing=False), 3, deepspeed_file="/fit/ds-zero2.json")
    assert "--per_device_train_batch_size=3" in off and off.count("--gradient_checkpointing") == 1
    assert off[-4:] == ["--max_steps", "2", "--gradient_checkpointing", "false"]
    assert off[off.index("--deepspeed") + 1] == "/fit/ds-zero2.json"
    assert command_at(shape, Configuration(checkpointing=True), 3, deepspeed_file=None).count(
        "--gradient_checkpointing") == 1, "checkpointing as given: the flag stays as it was"


def test_a_deepspeed_config_copy_at_another_stage() -> None:
    given: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 64,
             "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "overlap_comm": True}}
    copy = deepspeed_config_at(given, Configuration(zero_stage=2, offload_optimizer=True), 11)
    assert copy["zero_optimization"] == {"stage": 2, "overlap_comm": True,
                                         "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert copy["train_micro_batch_size_per_gpu"] == 11 and "train_batch_size" not in copy
    assert given["zero_optimization"]["stage"] == 3, "the user's config is not touched"
    auto = deepspeed_config_at({"train_micro_batch_size_per_gpu": "auto"}, Configuration(zero_stage=1), 11)
    assert auto["train_micro_batch_size_per_gpu"] == "auto", "the Trainer fills in what it says is auto"


def test_a_commands_set_ups_on_cpu_and_on_a_gpu(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    stack = CommandStack.of(HF, tmp_path)
    on_cpu = stack.configurations(cuda=False, env={})
    assert on_cpu[0].as_given and on_cpu[0].zero_stage == 3 and on_cpu[0].checkpointing is False
    assert {(c.zero_stage, c.checkpointing) for c in on_cpu} == {
        (s, c) for s in (1, 2, 3) for c in (False, True)}
    assert not any(c.offload_level or c.expandable_segments for c in on_cpu), "no offload, no CUDA allocator on CPU"
    on_gpu = stack.configurations(cuda=True, env={})
    assert any(c.offload_params and c.zero_stage == 3 for c in on_gpu)
    assert not any(c.offload_params and c.zero_stage != 3 for c in on_gpu), "parameter offload is ZeRO-3's"
    assert on_gpu[1].as_given is False and on_gpu[1].expandable_segments and on_gpu[1].zero_stage == 3
    knobs = {k.kind: k for k in stack.knobs(cuda=False)}
    assert knobs["micro-batch"].where == "--per_device_train_batch_size" and knobs["sharding"].found
    assert not knobs["offload"].found and not knobs["allocator"].found


def test_a_plain_scripts_knobs_are_said_not_guessed(tmp_path: Path) -> None:
    stack = CommandStack.of(["python", "train.py"], tmp_path)
    knobs = {k.kind: k for k in stack.knobs(cuda=True)}
    assert not knobs["micro-batch"].found and "no micro-batch flag" in knobs["micro-batch"].where
    assert not knobs["activation checkpointing"].found and not knobs["sharding"].found
    assert knobs["allocator"].found and stack.given_batch is None


def test_a_preset_searches_its_batch_only() -> None:
    stack = PresetStack.of(("fsdp-auto-wrap", "model.image=96", "batch_size=3", "max_steps=50"),
                           {"batch_size": 3}, "FSDP FULL_SHARD, fp32")
    assert stack.overrides == ("model.image=96",)
    assert stack.settings_at(Configuration(), 17, 64 * MiB) == [
        "fsdp-auto-wrap", "model.image=96", "batch_size=17", "max_steps=2", f"gpu_mem_limit={64 * MiB}"]
    knobs = {k.kind: k for k in stack.knobs(cuda=False)}
    assert knobs["micro-batch"].found and not knobs["sharding"].found
    assert "runs FSDP FULL_SHARD, fp32" in knobs["sharding"].where
    line, changes = stack.use(Configuration(), 17, 8)
    assert line == "shardtop launch fsdp-auto-wrap model.image=96 devices=8 batch_size=17"
    assert changes == ["batch_size=17"]
    on_gpu = {k.kind: k for k in stack.knobs(cuda=True)}["offload"]
    assert not on_gpu.found and on_gpu.where == "fsdp-auto-wrap has no key for it", "no FSDP preset has one"
    assert [c.label for c in stack.configurations(cuda=True)] == [
        "as given (FSDP FULL_SHARD, fp32)", "expandable segments"]


def _zero_stack(*settings: str) -> PresetStack:
    preset, pairs = split_overrides(settings)
    assert preset is not None
    return PresetStack.of(settings, resolve(preset, pairs), "ZeRO-3, fp32")


def test_a_zero_presets_offload_keys_are_its_offload_knob_on_a_gpu() -> None:
    stack = _zero_stack("zero3-linear-fixed", "model.n_layers=64", "batch_size=3")
    knob = {k.kind: k for k in stack.knobs(cuda=True)}["offload"]
    assert knob.found and knob.where == "zero.offload_optimizer=cpu, zero.offload_param=cpu"
    on_cpu = {k.kind: k for k in stack.knobs(cuda=False)}["offload"]
    assert not on_cpu.found and "not on CPU processes" in on_cpu.where
    assert len(stack.configurations(cuda=False)) == 1, "on CPU only the set-up as given"
    given, _, optimizer, both = stack.configurations(cuda=True)
    assert [c.label for c in (given, optimizer, both)] == [  # on a GPU each other set-up with expandable segments
        "as given (ZeRO-3, fp32)", "ZeRO-3, optimizer offload, expandable segments",
        "ZeRO-3, param + optimizer offload, expandable segments"]
    assert stack.settings_at(given, 5, None)[:4] == [
        "zero3-linear-fixed", "model.n_layers=64", "zero.offload_optimizer=none", "zero.offload_param=none"]
    assert stack.settings_at(both, 5, None)[2:4] == ["zero.offload_optimizer=cpu", "zero.offload_param=cpu"]
    line, changes = stack.use(optimizer, 5, 6)
    assert line == ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True shardtop launch zero3-linear-fixed "
                    "model.n_layers=64 zero.offload_optimizer=cpu devices=6 batch_size=5")
    assert changes == ["zero.offload_optimizer=cpu", "batch_size=5"]


def test_an_offload_as_typed_is_the_set_up_as_given() -> None:
    stack = _zero_stack("zero3-linear", "zero.offload_optimizer=cpu")
    assert stack.overrides == (), "fit sets the offload keys of each set-up itself"
    given, *others = stack.configurations(cuda=True)
    assert given.as_given and given.offload_optimizer and not given.offload_params
    none = next(c for c in others if c.offload_level == 0).but(expandable_segments=False)
    line, changes = stack.use(none, 2, 6)
    assert line == "shardtop launch zero3-linear devices=6 batch_size=2", "the preset's own none"
    assert changes == ["zero.offload_optimizer=none", "batch_size=2"]
    assert stack.use(given, 2, 6)[1] == ["batch_size=2"], "the offload as typed is no change"
    (on_cpu,) = stack.configurations(cuda=False)
    assert "zero.offload_optimizer=cpu" in stack.settings_at(on_cpu, 2, None), "kept as typed where not searched"


@pytest.mark.parametrize(("words", "command", "said"), [
    ([], False, "how many GPUs has the job?"),
    (["devices=2,4"], False, "fit searches one job size"),
    (["devices=8", "budget=soon"], False, "budget=soon: expected a time"),
    (["devices=8", "gpu=H900"], False, "gpu=H900: expected a size"),
    (["devices=8", "batch_size=4"], True, "fitting your own command takes devices=N"),
])
def test_bad_settings_say_what_to_type(words: list[str], command: bool, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        read_fit_request(words, command=command)


def test_what_a_rank_may_hold() -> None:
    request = read_fit_request(["zero3-linear-fixed", "devices=6", "gpu=16GiB", "budget=90s"], command=False)
    assert request.devices == 6 and request.budget_s == 90 and request.settings == ("zero3-linear-fixed",)
    assert request.gpu is not None
    on_cpu = allowance(request.gpu, "cpu", None)
    assert on_cpu.cap == on_cpu.limit == 16 * GiB, "on CPU the size caps the rank"
    on_h100 = allowance(request.gpu, "cuda", 80 * GiB)
    assert on_h100.cap == 16 * GiB - NON_PYTORCH_BYTES, "PyTorch's share of a 16 GiB card"
    same = allowance(parse_gpu("H100"), "cuda", 80 * GiB)
    assert same.cap is None and same.limit == 80 * GiB - NON_PYTORCH_BYTES, "the card here is the card asked for"
    card_on_cpu = allowance(parse_gpu("A100-80GB"), "cpu", None)
    assert card_on_cpu.cap == 80 * GiB - NON_PYTORCH_BYTES
    capped = read_fit_request(["fsdp2-mlp", "devices=2", "gpu_mem_limit=200MiB"], command=False)
    assert capped.gpu is not None and allowance(capped.gpu, "cpu", None).cap == 200 * MiB
    assert capped.settings == ("fsdp2-mlp", "gpu_mem_limit=200MiB")


@pytest.mark.parametrize(("words", "said"), [
    (["fit", "fsdp-auto-wrap", "gpu=64MiB"], "how many GPUs has the job?"),
    (["fit", "fsdp-auto-wrap", "devices=2"], "which GPUs has the job?"),
    (["fit", "manual-placement", "devices=2", "gpu=64MiB"], "has no rank to rehearse"),
    (["fit", "zero3-linear-fixed", "devices=6", "gpu=16GiB", "zero.offload_param=disk"],
     "zero.offload_param=disk: expected one of none, cpu"),
    (["fit", "devices=2", "gpu=64MiB", "--", "python", "-c", "pass"], "nothing to search in this command"),
    (["fit", "devices=2", "gpu=64MiB", "--", "no-such-launcher", "train.py"], "cannot run 'no-such-launcher'"),
])
def test_bad_input_is_exit_2_and_makes_nothing(words: list[str], said: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine (no GPU): a job without its size, a GPU to fit on a machine without one, a preset with
    no rank, a command with nothing fit can change, a command that is not there."""
    from shardtop import cli, gpus

    monkeypatch.setattr(gpus, "gpu_count", lambda: 0)
    runs = tmp_path / "runs"
    assert cli.main(["--runs-dir", str(runs), *words]) == 2
    assert said in capsys.readouterr().err
    assert not runs.exists(), "nothing is made for bad input"
