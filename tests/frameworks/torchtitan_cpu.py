"""torchtitan's own trainer, unchanged, on CPU processes with gloo.

``torchrun --nproc_per_node 2 torchtitan_cpu.py --module llama3 --config
llama3_debugmodel ...`` is ``torchrun ... -m torchtitan.train ...`` with the
changes CPU needs made first, since torchtitan 0.3.0 trains on accelerators
only:

- the device is the CPU: ``torchtitan.tools.utils`` names ``cpu`` (so the
  process group is gloo and the model is materialised on the CPU) and a
  device module whose ``set_device`` does nothing and whose memory figures
  are empty;
- attention runs through ``scaled_dot_product_attention`` with the same
  block-causal mask, made dense (FlexAttention has no backward on the CPU);
- FSDP2 reduces gradients with a plain sum (gloo has no ``PREMUL_SUM``): the
  same figures, since torchtitan divides the gradients itself;
- the process groups keep the timeout they started with (torchtitan shortens
  it after the first step through ``torch.distributed.set_timeout``, which
  torch 2.13 does not have).

Run with ``--parallelism.spmd-backend partial_dtensor``.
"""

from __future__ import annotations

import os
import types
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import torchtitan.tools.utils as titan_utils


class CpuProperties(NamedTuple):
    name: str
    total_memory: int


def cpu_device_module() -> types.SimpleNamespace:
    """What torchtitan asks of ``torch.cuda``, answered for the CPU."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(
        set_device=lambda device: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        is_available=lambda: True,
        synchronize=lambda device=None: None,
        empty_cache=lambda: None,
        reset_peak_memory_stats=lambda device=None: None,
        memory_stats=lambda device=None: {},
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: CpuProperties("cpu", memory),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
    )


# Before any other torchtitan module imports these two names.
titan_utils.device_type = "cpu"
titan_utils.device_module = cpu_device_module()

import torchtitan.distributed.utils as titan_distributed  # noqa: E402
import torchtitan.models.common.attention as attention  # noqa: E402
import torchtitan.models.common.decoder as decoder  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

_set_gradient_divide_factor = FSDPModule.set_gradient_divide_factor


def dense_mask(mask_mod: Any, batch: int, _heads: Any, q_len: int, kv_len: int, **_options: Any) -> torch.Tensor:
    """The mask ``create_block_mask`` would make, as a ``[batch, 1, q_len, kv_len]`` boolean tensor."""
    b = torch.arange(batch).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    q = torch.arange(q_len).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len).view(1, 1, 1, kv_len)
    mask: torch.Tensor = mask_mod(b, h, q, kv)
    return mask.expand(batch, 1, q_len, kv_len)


def sdpa_attention(
    self: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attention_masks: torch.Tensor,
    score_mod: Any = None, scale: float | None = None, enable_gqa: bool = False, out_transform: Any = None,
    **_kwargs: Any,
) -> torch.Tensor:
    """FlexAttention's forward (``[batch, length, heads, dim]`` in and out) through SDPA."""
    if score_mod is not None or out_transform is not None:
        raise NotImplementedError("the CPU attention takes a mask only")
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=attention_masks, scale=scale, enable_gqa=enable_gqa,
    )
    return out.transpose(1, 2)


def set_gradient_divide_factor(self: FSDPModule, factor: float) -> None:
    _set_gradient_divide_factor(self, factor)
    self.set_force_sum_reduction_for_comms(True)


decoder.create_attention_mask = dense_mask
attention.FlexAttention.forward = sdpa_attention
FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor  # type: ignore[method-assign]
titan_distributed.set_pg_timeouts = lambda **_kwargs: None

if __name__ == "__main__":
    from torchtitan.train import main

    main()
