"""TRL's ``SFTTrainer`` script as a user starts it with ``accelerate launch`` and one of TRL's own configs,
and the line it ends with."""

from __future__ import annotations

import re
from pathlib import Path

from tests.frameworks.environments import Environment
from tests.frameworks.runs import Finish
from tests.support.distributed import free_port

SCRIPT = Path(__file__).with_name("trl_sft.py")
STEPS = 3
BATCH = 2
"""``per_device_train_batch_size`` in the script."""
FINAL = re.compile(r"^final steps=(\d+) loss=(\S+) distributed_type=(\w+)$", re.MULTILINE)


def finish(output: str) -> Finish | None:
    found = FINAL.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def distributed_type(output: str) -> str | None:
    """How accelerate trained, as the script's last line says (``DEEPSPEED``, ``MULTI_CPU``)."""
    found = FINAL.findall(output)
    return found[-1][2] if found else None


def accelerate_launch(env: Environment, config: str, processes: int, *options: str) -> list[str]:
    """``accelerate launch --config_file <TRL's config> --num_processes N [options] trl_sft.py``, on a free port."""
    config_file = env.site_packages / "trl" / "accelerate_configs" / config
    return ["accelerate", "launch", "--config_file", str(config_file), "--num_processes", str(processes),
            *options, "--main_process_port", str(free_port()), str(SCRIPT)]
