"""A user's command as fit reads it: where its knobs are, and the same command at another set-up.  Pure.

Fit changes a command only where its line says so, never the script: a micro-batch flag it carries
(``--per_device_train_batch_size 8``, ``--batch-size 8``), a steps flag (set to two steps), Hugging
Face ``TrainingArguments`` on the line (``--gradient_checkpointing``, ``--max_steps``), and a DeepSpeed
config file it names (``--deepspeed ds.json``), rewritten into a copy per set-up.  A flag the command
does not carry is not guessed at: the script may not take it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.fit.configuration import Configuration
from shardtop.rundir.json_files import JsonObject

BATCH_FLAGS = (
    "--per_device_train_batch_size", "--per-device-train-batch-size", "--train_micro_batch_size_per_gpu",
    "--micro_batch_size", "--micro-batch-size", "--batch_size", "--batch-size", "--training.local_batch_size",
    "--training.local-batch-size",
)
"""Flags that set a rank's micro-batch, as HF ``TrainingArguments``, scripts and torchtitan spell them."""
STEPS_FLAGS = ("--max_steps", "--max-steps", "--steps", "--num_steps", "--num-steps", "--training.steps")
DEEPSPEED_FLAGS = ("--deepspeed", "--deepspeed_config", "--deepspeed-config", "--ds_config", "--deepspeed_config_file")
"""Flags that name a DeepSpeed config file: HF ``TrainingArguments``, ``deepspeed.add_config_arguments``,
accelerate launch."""
TRAINER_FLAG = "--per_device_train_batch_size"
"""A command that carries it gives HF ``TrainingArguments`` on its line (``HfArgumentParser``)."""
CHECKPOINTING_FLAG = "--gradient_checkpointing"
TRUE_WORDS = ("true", "1", "yes")
BOOL_WORDS = (*TRUE_WORDS, "false", "0", "no")
FIT_STEPS = 2
"""Optimizer steps each rehearsal runs: set-up, then a first and a second step."""


@dataclass(frozen=True)
class FlagAt:
    """A flag on the command line and its value."""

    flag: str
    index: int
    value: str | None
    inline: bool
    """``--flag=value`` (one word) rather than ``--flag value`` (two)."""

    @property
    def words(self) -> int:
        return 1 if self.inline or self.value is None else 2

    @property
    def number(self) -> int | None:
        return int(self.value) if self.value is not None and self.value.isdigit() else None

    @property
    def written(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


@dataclass(frozen=True)
class CommandShape:
    """Where a command's knobs are."""

    argv: tuple[str, ...]
    batch: FlagAt | None
    steps: FlagAt | None
    deepspeed: FlagAt | None
    trainer: bool
    """HF ``TrainingArguments`` on the line: ``--gradient_checkpointing`` and ``--max_steps`` may be added."""
    checkpointing: FlagAt | None

    @property
    def checkpointing_given(self) -> bool:
        flag = self.checkpointing
        return flag is not None and (flag.value is None or flag.value.lower() in TRUE_WORDS)


def _flag(argv: Sequence[str], names: Sequence[str], takes_bool: bool = False) -> FlagAt | None:
    """The last occurrence of one of ``names`` (argparse keeps the last)."""
    found: FlagAt | None = None
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name not in names:
            continue
        if eq:
            found = FlagAt(name, i, value, inline=True)
            continue
        following = argv[i + 1] if i + 1 < len(argv) else None
        if takes_bool:
            bool_value = following if following is not None and following.lower() in BOOL_WORDS else None
            found = FlagAt(name, i, bool_value, inline=False)
        else:
            found = FlagAt(name, i, following if following is not None and not following.startswith("--") else None,
                           inline=False)
    return found


def read_command(argv: Sequence[str]) -> CommandShape:
    words = tuple(argv)
    return CommandShape(
        argv=words,
        batch=_flag(words, BATCH_FLAGS),
        steps=_flag(words, STEPS_FLAGS),
        deepspeed=_flag(words, DEEPSPEED_FLAGS),
        trainer=any(w.partition("=")[0] == TRAINER_FLAG for w in words),
        checkpointing=_flag(words, (CHECKPOINTING_FLAG,), takes_bool=True),
    )


def _set(argv: list[str | None], flag: FlagAt, value: str) -> None:
    """``flag``'s value replaced by ``value`` in place, in the form it was written."""
    if flag.inline or flag.value is None:
        argv[flag.index] = f"{flag.flag}={value}"
    else:
        argv[flag.index + 1] = value


def command_at(
    shape: CommandShape, conf: Configuration, batch: int | None, *, deepspeed_file: str | None, rehearsed: bool = True
) -> list[str]:
    """The command at set-up ``conf`` and micro-batch ``batch`` (None: as given); ``deepspeed_file``: the
    set-up's copy of its DeepSpeed config; ``rehearsed``: for ``FIT_STEPS`` steps, where the line can say so."""
    argv: list[str | None] = list(shape.argv)
    added: list[str] = []
    if batch is not None and shape.batch is not None:
        _set(argv, shape.batch, str(batch))
    if rehearsed and shape.steps is not None and shape.steps.number is not None:
        _set(argv, shape.steps, str(FIT_STEPS))
    elif rehearsed and shape.trainer:
        added += ["--max_steps", str(FIT_STEPS)]
    if deepspeed_file is not None and shape.deepspeed is not None:
        _set(argv, shape.deepspeed, deepspeed_file)
    if conf.checkpointing is not None and conf.checkpointing != shape.checkpointing_given:
        flag = shape.checkpointing
        if flag is not None:
            argv[flag.index] = None
            if flag.value is not None and not flag.inline:
                argv[flag.index + 1] = None
        added += [CHECKPOINTING_FLAG, "true" if conf.checkpointing else "false"]
    return [w for w in argv if w is not None] + added


def zero_stage(config: Mapping[str, Any]) -> int | None:
    """The ZeRO stage a DeepSpeed config asks for (0 without ``zero_optimization``)."""
    zero = config.get("zero_optimization")
    if zero is None:
        return 0
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else None
    return stage if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3 else None


def offloaded(config: Mapping[str, Any], key: str) -> bool:
    zero = config.get("zero_optimization")
    section = zero.get(key) if isinstance(zero, Mapping) else None
    return isinstance(section, Mapping) and section.get("device") in ("cpu", "nvme")


def micro_batch(config: Mapping[str, Any]) -> int | None:
    """``train_micro_batch_size_per_gpu`` where it is a number ("auto": the Trainer fills it in)."""
    value = config.get("train_micro_batch_size_per_gpu")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def deepspeed_config_at(config: Mapping[str, Any], conf: Configuration, batch: int | None) -> JsonObject:
    """A copy of a DeepSpeed config at set-up ``conf``; its micro-batch set to ``batch`` where it holds a
    number, and a global ``train_batch_size`` number dropped (DeepSpeed works it out from the micro-batch)."""
    out = copy.deepcopy(dict(config))
    zero = dict(out.get("zero_optimization") or {})
    if conf.zero_stage is not None:
        zero["stage"] = conf.zero_stage
    for key, wanted in (("offload_optimizer", conf.offload_optimizer),
                        ("offload_param", conf.offload_params and conf.zero_stage == 3)):
        if wanted:
            zero[key] = {"device": "cpu", "pin_memory": True}
        else:
            zero.pop(key, None)
    out["zero_optimization"] = zero
    if batch is not None and micro_batch(out) is not None:
        out["train_micro_batch_size_per_gpu"] = batch
    if isinstance(out.get("train_batch_size"), int):
        del out["train_batch_size"]
    return out
