"""A user's FSDP1 script that builds its model on the meta device and has FSDP materialise it, then
builds the optimizer and checks that no parameter is left on the meta device, as Lightning Fabric does
for litgpt.  Nothing of shardtop in it.

    torchrun --nproc_per_node 2 tests/own_scripts/fsdp1_from_meta.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def materialise(module: nn.Module) -> None:
    module.to_empty(device="cpu", recurse=False)
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Linear(64, 1))
    model = FSDP(model, device_id=torch.device("cpu"), param_init_fn=materialise)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if any(p.is_meta for p in model.parameters()):
        raise RuntimeError("The optimizer has references to the model's meta-device parameters")
    for step in range(1, 3):
        loss = model(torch.randn(8, 64)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
