"""A preset or a user's command as fit drives it: the knobs it exposes, the set-ups they make, each set-up
at a micro-batch as a rehearsal's settings, and the lines that use the pick.

A preset exposes its keys: ``batch_size`` and ``max_steps``, and on a GPU a ZeRO preset's
``zero.offload_optimizer`` / ``zero.offload_param``; its program fixes its engine, so its sharding is said,
not searched.  A command exposes what its line carries (``command_line.py``) and the
DeepSpeed config file it names.  On a GPU, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is an
environment variable of any stack; on CPU there is no CUDA allocator to set.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardtop.config import ConfigError, ZeroOffload, load_preset, split_overrides, zero_offload
from shardtop.fit.command_line import (
    FIT_STEPS,
    CommandShape,
    command_at,
    deepspeed_config_at,
    micro_batch,
    offloaded,
    read_command,
    zero_stage,
)
from shardtop.fit.configuration import EXPANDABLE, Configuration, Knob

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
NOT_ON_CPU = "not on CPU processes: the memory an offload frees is the memory it moves to"
CUDA_ONLY = "CUDA only: CPU processes have no CUDA allocator"


def expandable_given(env: Mapping[str, str]) -> bool:
    return "expandable_segments:true" in env.get(ALLOC_CONF, "").replace(" ", "").lower()


def _allocator_knob(cuda: bool) -> Knob:
    return Knob("allocator", True, f"{ALLOC_CONF}={EXPANDABLE}") if cuda else Knob("allocator", False, CUDA_ONLY)


def _with_expandable(given: Configuration, others: list[Configuration], cuda: bool) -> tuple[Configuration, ...]:
    """On a GPU the set-up as given is also tried with expandable segments, and every other set-up with them."""
    if not cuda:
        return (given, *others)
    more = [] if given.expandable_segments else [given.but(expandable_segments=True)]
    return (given, *more, *(c.but(expandable_segments=True) for c in others))


def alloc_env(conf: Configuration, env: Mapping[str, str]) -> dict[str, str]:
    """The environment changes a set-up makes: expandable segments added to what the user's env asks."""
    if not conf.expandable_segments or expandable_given(env):
        return {}
    given = env.get(ALLOC_CONF, "")
    return {ALLOC_CONF: ",".join(p for p in (given, EXPANDABLE) if p)}


OFFLOAD_KEYS = ("zero.offload_optimizer", "zero.offload_param")
"""A ZeRO preset's offload keys (``config.CHOICE_KEYS``): fit sets them per set-up."""
OFFLOADED = "cpu"


@dataclass(frozen=True)
class PresetStack:
    """A preset: its keys are its knobs."""

    preset: str
    overrides: tuple[str, ...]
    """The overrides as typed, without the keys fit sets itself."""
    batch_size: int
    engine_words: str
    """What the preset's program runs, in the plan's words (``FSDP2, fp32``)."""
    offload: ZeroOffload | None = None
    """The preset's ZeRO offload as given (its keys and the user's); None: the preset has no offload keys."""
    default_offload: ZeroOffload = ZeroOffload()
    """The preset's own offload, which a ``shardtop launch`` line need not repeat."""

    @classmethod
    def of(cls, settings: tuple[str, ...], config: Mapping[str, Any], engine_words: str) -> PresetStack:
        preset, pairs = split_overrides(settings)
        set_by_fit = ("batch_size", "max_steps", "gpu_mem_limit", *OFFLOAD_KEYS)
        kept = tuple(f"{k}={v}" for k, v in pairs if k not in set_by_fit)
        has_keys = isinstance(config.get("zero"), Mapping)
        return cls(preset=preset or "", overrides=kept, batch_size=int(config["batch_size"]),
                   engine_words=engine_words, offload=zero_offload(config) if has_keys else None,
                   default_offload=zero_offload(load_preset(preset).defaults) if has_keys and preset else ZeroOffload())

    def knobs(self, cuda: bool) -> tuple[Knob, ...]:
        if not cuda:
            offload = Knob("offload", False, NOT_ON_CPU)
        elif self.offload is None:
            offload = Knob("offload", False, f"{self.preset} has no key for it")
        else:
            offload = Knob("offload", True, ", ".join(f"{key}={OFFLOADED}" for key in OFFLOAD_KEYS))
        return (
            Knob("micro-batch", True, "batch_size="),
            Knob("steps", True, f"max_steps={FIT_STEPS}"),
            Knob("activation checkpointing", False, f"{self.preset} has no key for it"),
            Knob("sharding", False,
                 f"{self.preset} runs {self.engine_words}; its program fixes that, no key changes it"),
            offload,
            _allocator_knob(cuda),
        )

    def configurations(self, cuda: bool) -> tuple[Configuration, ...]:
        """The set-up as given; on a GPU, for a ZeRO preset, also with optimizer and with param + optimizer offload.

        Only there is the ZeRO stage named, so that the plan's strategy takes each set-up's offload: on CPU
        processes the plan counts what an offload moves on the rank, as it stays there."""
        if self.offload is None or not cuda:
            return _with_expandable(Configuration(given=self.engine_words), [], cuda)
        offload = self.offload
        given = Configuration(zero_stage=3, offload_optimizer=offload.optimizer == OFFLOADED,
                              offload_params=offload.param == OFFLOADED, given=self.engine_words)
        others = [given.but(offload_optimizer=opt, offload_params=par, given="")
                  for opt, par in ((False, False), (True, False), (True, True))
                  if (opt, par) != (given.offload_optimizer, given.offload_params)]
        return _with_expandable(given, others, cuda)

    def offload_at(self, conf: Configuration) -> ZeroOffload | None:
        """The offload keys' values for ``conf``; None for a preset without them."""
        if self.offload is None:
            return None
        if conf.zero_stage is None:  # not searched here: as given
            return self.offload
        return ZeroOffload(optimizer=OFFLOADED if conf.offload_optimizer else "none",
                           param=OFFLOADED if conf.offload_params else "none")

    def _offload_settings(self, conf: Configuration, all_keys: bool) -> list[str]:
        """``zero.offload_*=`` for ``conf``: every key (a rehearsal), or those the preset's own values do not say."""
        offload = self.offload_at(conf)
        if offload is None:
            return []
        pairs = zip(OFFLOAD_KEYS, offload, self.default_offload, strict=True)
        return [f"{key}={value}" for key, value, default in pairs if all_keys or value != default]

    def settings_at(self, conf: Configuration, batch: int, cap: int | None) -> list[str]:
        """``shardtop rehearse``'s settings for ``conf`` at ``batch``: the preset, its overrides, the offload,
        the batch, the steps, the cap."""
        limit = [f"gpu_mem_limit={cap}"] if cap is not None else []
        return [self.preset, *self.overrides, *self._offload_settings(conf, all_keys=True), f"batch_size={batch}",
                f"max_steps={FIT_STEPS}", *limit]

    def use(self, conf: Configuration, batch: int, devices: int) -> tuple[str, list[str]]:
        """The command that runs the pick, and the lines to change: here the overrides (an offload key where the
        pick's differs from the one given)."""
        env = f"{ALLOC_CONF}={EXPANDABLE} " if conf.expandable_segments else ""
        offload = self._offload_settings(conf, all_keys=False)
        line = env + shlex.join(["shardtop", "launch", self.preset, *self.overrides, *offload, f"devices={devices}",
                                 f"batch_size={batch}"])
        picked, given = self.offload_at(conf), self.offload
        changed = [] if picked is None or given is None else [
            f"{key}={value}" for key, value, was in zip(OFFLOAD_KEYS, picked, given, strict=True) if value != was]
        return line, [*changed, f"batch_size={batch}"]


@dataclass(frozen=True)
class CommandStack:
    """A user's command: the flags on its line, the DeepSpeed config it names."""

    shape: CommandShape
    deepspeed: Mapping[str, Any] | None
    """The DeepSpeed config file the command names, as read."""
    strategy_words: str = ""

    @classmethod
    def of(cls, command: list[str], cwd: Path) -> CommandStack:
        shape = read_command(command)
        config: Mapping[str, Any] | None = None
        if shape.deepspeed is not None and shape.deepspeed.value is not None:
            path = cwd / shape.deepspeed.value
            try:
                config = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise ConfigError(f"{shape.deepspeed.written}: cannot read it as a DeepSpeed config ({e}).") from None
            if not isinstance(config, Mapping) or zero_stage(config) is None:
                raise ConfigError(f"{shape.deepspeed.written}: expected a DeepSpeed config (a JSON object; "
                                  "zero_optimization.stage 0 to 3).")
        return cls(shape=shape, deepspeed=config)

    @property
    def batch_flag(self) -> bool:
        return self.shape.batch is not None and self.shape.batch.number is not None

    @property
    def sets_steps(self) -> bool:
        """The line can say how many steps a rehearsal runs: a steps flag, or TrainingArguments' --max_steps."""
        return (self.shape.steps is not None and self.shape.steps.number is not None) or self.shape.trainer

    @property
    def given_batch(self) -> int | None:
        """The micro-batch the command runs as given; None where fit found none to change."""
        if self.batch_flag:
            assert self.shape.batch is not None
            return self.shape.batch.number
        return micro_batch(self.deepspeed) if self.deepspeed is not None else None

    def knobs(self, cuda: bool) -> tuple[Knob, ...]:
        shape, ds = self.shape, self.deepspeed
        file = shape.deepspeed.value if shape.deepspeed is not None else ""
        if self.batch_flag:
            assert shape.batch is not None
            batch = Knob("micro-batch", True, shape.batch.flag)
        elif ds is not None and micro_batch(ds) is not None:
            batch = Knob("micro-batch", True, f"train_micro_batch_size_per_gpu in {file} (the script's batches "
                                              "must follow it)")
        else:
            batch = Knob("micro-batch", False, "the command carries no micro-batch flag "
                                               "(--per_device_train_batch_size, --batch-size, ...) and names no "
                                               "DeepSpeed config that sets one")
        if shape.steps is not None and shape.steps.number is not None:
            steps = Knob("steps", True, f"{shape.steps.flag} {FIT_STEPS}")
        elif shape.trainer:
            steps = Knob("steps", True, f"--max_steps {FIT_STEPS} (a TrainingArguments flag)")
        else:
            steps = Knob("steps", False, "no steps flag on the line: each rehearsal runs the script's own steps")
        checkpointing = (
            Knob("activation checkpointing", True, "--gradient_checkpointing (a TrainingArguments flag)")
            if shape.trainer else
            Knob("activation checkpointing", False, "no TrainingArguments on the line; the script's own calls "
                                                    "(torch.utils.checkpoint, an FSDP policy) are not changed")
        )
        if ds is not None:
            sharding = Knob("sharding", True, f"zero_optimization.stage in a copy of {file}")
            offload = (Knob("offload", True, f"zero_optimization.offload_optimizer / offload_param in a copy of {file}")
                       if cuda else Knob("offload", False, NOT_ON_CPU))
        else:
            sharding = Knob("sharding", False, "no DeepSpeed config on the line; FSDP's sharding strategy and FSDP2's "
                                               "reshard_after_forward are arguments of the script's own calls")
            offload = Knob("offload", False, "no DeepSpeed config on the line" if cuda else NOT_ON_CPU)
        return batch, steps, checkpointing, sharding, offload, _allocator_knob(cuda)

    def configurations(self, cuda: bool, env: Mapping[str, str]) -> tuple[Configuration, ...]:
        ds = self.deepspeed
        stage = zero_stage(ds) if ds is not None else None
        given = Configuration(
            zero_stage=stage,
            offload_optimizer=ds is not None and offloaded(ds, "offload_optimizer"),
            offload_params=ds is not None and offloaded(ds, "offload_param"),
            checkpointing=self.shape.checkpointing_given if self.shape.trainer else None,
            expandable_segments=cuda and expandable_given(env),
            given=self.strategy_words,
        )
        stages: list[int | None] = [*sorted({stage or 0, 1, 2, 3})] if ds is not None else [None]
        offloads = [(False, False), (True, False), (True, True)] if cuda and ds is not None else [(False, False)]
        checkpoints: list[bool | None] = [False, True] if self.shape.trainer else [None]
        others = []
        for s, (opt, par), c in itertools.product(stages, offloads, checkpoints):
            if par and s != 3 or opt and not s:
                continue
            conf = given.but(zero_stage=s, offload_optimizer=opt, offload_params=par, checkpointing=c, given="")
            if (s, opt, par, c) != (given.zero_stage, given.offload_optimizer, given.offload_params,
                                    given.checkpointing):
                others.append(conf)
        return _with_expandable(given, others, cuda)

    def deepspeed_path(self, conf: Configuration, batch: int | None, directory: Path) -> Path | None:
        """Where the set-up's copy of the DeepSpeed config goes; None for a command that names none."""
        if self.deepspeed is None:
            return None
        return directory / f"deepspeed-{deepspeed_name(conf)}-{batch or 'given'}.json"

    def write_deepspeed(self, conf: Configuration, batch: int | None, directory: Path) -> Path | None:
        """The set-up's copy of the DeepSpeed config, written whole."""
        path = self.deepspeed_path(conf, batch, directory)
        if path is None or self.deepspeed is None:
            return None
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(deepspeed_config_at(self.deepspeed, conf, batch), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def command_at(self, conf: Configuration, batch: int | None, directory: Path, rehearsed: bool = True) -> list[str]:
        """The command at ``conf`` and ``batch``, naming its DeepSpeed config's copy in ``directory``."""
        path = self.deepspeed_path(conf, batch, directory)
        return command_at(self.shape, conf, batch if self.batch_flag else None,
                          deepspeed_file=str(path) if path is not None else None, rehearsed=rehearsed)

    def use(self, conf: Configuration, batch: int, directory: Path) -> tuple[str, list[str]]:
        """The command that runs the pick, and the lines that change in it and in its DeepSpeed config."""
        line = shlex.join(self.command_at(conf, batch, directory, rehearsed=False))
        env = alloc_env(conf, {})
        changes: list[str] = []
        if self.batch_flag:
            assert self.shape.batch is not None
            changes.append(f"{self.shape.batch.flag} {batch}")
        if conf.checkpointing is not None and conf.checkpointing != self.shape.checkpointing_given:
            changes.append(f"--gradient_checkpointing {'true' if conf.checkpointing else 'false'}")
        if self.deepspeed is not None:
            changed = deepspeed_config_at(self.deepspeed, conf, batch)
            changes += [f'"zero_optimization": {json.dumps(changed["zero_optimization"])}']
            if micro_batch(changed) is not None:
                changes.append(f'"train_micro_batch_size_per_gpu": {batch}')
        changes += [f"{k}={v}" for k, v in env.items()]
        return " ".join([*(f"{k}={v}" for k, v in env.items()), line]), changes


def deepspeed_name(conf: Configuration) -> str:
    """A file name's part for a set-up: ``zero2-offload-ckpt``."""
    parts = [f"zero{conf.zero_stage}" if conf.zero_stage is not None else "ds"]
    parts += ["offload"] if conf.offload_optimizer else []
    parts += ["params"] if conf.offload_params else []
    parts += ["ckpt"] if conf.checkpointing else []
    return "-".join(parts)
