"""axolotl's own ``axolotl.cli.train``, unchanged, on CPU processes with gloo.

``torchrun --nproc_per_node 2 axolotl_cpu.py config.yml`` is what ``axolotl
train config.yml --launcher torchrun -- --nproc_per_node 2`` runs
(``torchrun -m axolotl.cli.train config.yml``), with one change made first:

- accelerate takes gloo for CPU processes whether or not it is told it is
  on the CPU.  With DeepSpeed asked for and no accelerator, accelerate
  1.13's ``PartialState()`` (which axolotl makes before the trainer, with
  no ``cpu`` argument) finds no backend: DeepSpeed's comm starts the process
  group over both processes, but accelerate counts one, and DeepSpeed
  refuses the batch size it is given (``train_batch_size`` 2, a micro-batch
  of 2 on one process, where it sees 2 processes).  Given gloo, accelerate
  does on the CPU what it does on GPUs with NCCL: DeepSpeed's comm starts
  the process group and accelerate counts both processes.  (Making the state
  with ``cpu=True`` instead, as ``TrainingArguments(use_cpu=True)`` would,
  counts both but starts the group without DeepSpeed's comm, and ZeRO-3's
  ``zero.Init`` then reads a world of one.)  axolotl has no option that
  passes ``use_cpu`` to the trainer's arguments.
"""

from __future__ import annotations

import runpy
from typing import Any

from accelerate.state import PartialState

_prepare_backend = PartialState._prepare_backend


def _gloo_on_the_cpu(self: PartialState, cpu: bool = False, sagemaker_dp: bool = False,
                     backend: str | None = None) -> Any:
    return _prepare_backend(self, True, sagemaker_dp, backend)


PartialState._prepare_backend = _gloo_on_the_cpu  # type: ignore[method-assign]

if __name__ == "__main__":
    runpy.run_module("axolotl.cli.train", run_name="__main__", alter_sys=True)
