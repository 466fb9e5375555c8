"""litgpt's own command line, unchanged, on CPU processes with gloo.

``python litgpt_cpu.py finetune_full CHECKPOINT --devices 2 ...`` is
``litgpt finetune_full CHECKPOINT --devices 2 ...`` with three changes made
first, since litgpt 0.5.13 trains on more than one device through Lightning
Fabric's ``FSDPStrategy`` (FSDP1), which expects GPUs:

- Fabric's connector lets the FSDP strategy run on the CPU (it refuses
  anything but CUDA);
- FSDP1 keeps its shards on the CPU where it is given no device (Fabric
  passes the device's index, which the CPU does not have);
- the full state dict Fabric saves at the end is gathered without
  "offloading" it to the CPU it is already on (FSDP1 then frees the gathered
  parameters that the copy still reads: a segmentation fault).

Fabric starts the other processes by running this same command again.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.connector import _Connector
from lightning.fabric.strategies import fsdp as fabric_fsdp
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

_check_strategy_and_fallback = _Connector._check_strategy_and_fallback
_fsdp_init = FSDP.__init__


def allow_fsdp_on_cpu(self: _Connector) -> None:
    """Fabric's own check, with the CPU counted as a device FSDP may run on."""
    asked = self._accelerator_flag
    if asked == "cpu":
        self._accelerator_flag = "cuda"
    try:
        _check_strategy_and_fallback(self)
    finally:
        self._accelerator_flag = asked


def fsdp_on_cpu(self: FSDP, module: torch.nn.Module, *args: Any, device_id: Any = None, **kwargs: Any) -> None:
    """FSDP1 as Fabric builds it, its shards on the CPU where there is no accelerator."""
    if device_id is None and not torch.cuda.is_available():
        device_id = torch.device("cpu")
    _fsdp_init(self, module, *args, device_id=device_id, **kwargs)


def full_state_dict_on_cpu(module: torch.nn.Module, world_size: int, rank0_only: bool = True) -> Any:
    """Fabric's full state dict context, without the offload to the CPU."""
    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
    )


_Connector._check_strategy_and_fallback = allow_fsdp_on_cpu  # type: ignore[method-assign]
FSDP.__init__ = fsdp_on_cpu  # type: ignore[method-assign]
fabric_fsdp._get_full_state_dict_context = full_state_dict_on_cpu

if __name__ == "__main__":
    from litgpt.__main__ import main

    main()
