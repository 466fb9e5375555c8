"""axolotl's own ``axolotl.cli.train``, unchanged, on CPU processes with gloo.

``torchrun --nproc_per_node 2 axolotl_cpu.py config.yml`` is what ``axolotl
train config.yml --launcher torchrun -- --nproc_per_node 2`` runs
(``torchrun -m axolotl.cli.train config.yml``), with one change made first:

- accelerate takes gloo for CPU processes whether or not it is told it is
  on the CPU.  With DeepSpeed asked for and no accelerator, accelerate
  1.13's ``PartialState()`` (which axolotl makes before the trainer, with
  no ``cpu`` argument) finds no backend: it starts no process group of its
  own, counts one process where there are two, and leaves DeepSpeed's comm
  to be started later, after ZeRO-3's ``zero.Init`` has already read a world
  of one (DeepSpeed then refuses the batch size: ``train_batch_size`` 4 for a
  micro-batch of 2 on 1 process).  Given gloo, it does on the CPU what it
  does on GPUs with NCCL: DeepSpeed's comm starts the process group and
  accelerate counts both processes.  axolotl has no option that passes
  ``use_cpu`` to the trainer's arguments.
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
