"""torchtune's own ``full_finetune_distributed`` recipe, unchanged, on CPU processes with gloo.

``tune run --nproc_per_node 2 torchtune_cpu --config llama3_2/1B_full
device=cpu dtype=fp32 ...`` (this file in the working directory, as a custom
recipe) is ``tune run ... full_finetune_distributed ...`` with one change
made first.  With ``device=cpu`` the recipe already takes gloo, leaves peak
memory out of its step logs and refuses activation offloading; two calls are
left that torchtune 0.6.1 makes of the accelerator whatever the device:

- the memory it logs after loading the model is empty on the CPU, and logged
  as nothing: ``training.get_memory_stats`` raises for a CPU device, and the
  recipe calls it on rank 0 after the model is sharded and loaded whatever
  ``log_peak_memory_stats`` says;
- the clean-up before the first step only collects garbage on the CPU:
  ``training.cleanup_before_training`` also empties the accelerator's cache
  and resets its peak, through ``torch.cpu``, which has neither.
"""

from __future__ import annotations

import gc
import runpy
from pathlib import Path
from typing import Any

import torch
import torchtune
from torchtune import training

RECIPE = Path(torchtune.__file__).parent.parent / "recipes" / "full_finetune_distributed.py"

_get_memory_stats = training.get_memory_stats
_log_memory_stats = training.log_memory_stats


def get_memory_stats(device: torch.device, reset_stats: bool = True) -> dict[str, float]:
    return {} if device.type == "cpu" else _get_memory_stats(device, reset_stats)


def log_memory_stats(stats: dict[str, float], *args: Any, **kwargs: Any) -> None:
    if stats:
        _log_memory_stats(stats, *args, **kwargs)


def cleanup_before_training() -> None:
    gc.collect()


training.get_memory_stats = get_memory_stats
training.log_memory_stats = log_memory_stats
training.cleanup_before_training = cleanup_before_training

if __name__ == "__main__":
    runpy.run_path(str(RECIPE), run_name="__main__")
