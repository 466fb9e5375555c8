"""FSDP1, FSDP2 and DDP training scripts as people write them, one scenario each, for the rules
that read how the engine holds the model after it is done.

Every scenario named on the command line runs in turn in the same processes (torch and the
process group start once) and records into a run directory of its own, named after it:

    torchrun --nproc-per-node 2 tests/diagnose_scripts/more_fsdp.py fsdp2-layers-own-roots fsdp2-root-forward

- ``fsdp2-layers-own-roots``: ``fully_shard`` on every block and on the model, but the loop
  calls the blocks one by one, so the model's forward never runs: each block becomes a root of
  its own and keeps its parameters gathered from its forward to its backward.
- ``fsdp2-root-forward``: the same model trained through ``model(x)``.
- ``fsdp2-optimizer-before-wrap`` / ``fsdp1-optimizer-before-wrap``: the optimizer is made from
  ``model.parameters()`` before the model is sharded.
- ``ddp-optimizer-before-wrap``: the same order under DDP, which keeps the model's parameters.
- ``fsdp2-hybrid-2x1`` / ``fsdp2-hybrid-1x2``: ``fully_shard`` on a (replicate, shard) mesh.
- ``fsdp1-lora-one-unit``: LoRA adapters on frozen layers, each block one FSDP unit
  (``use_orig_params=True``); ``fsdp1-lora-split``: the adapters in units of their own.
- ``fsdp2-one-big-layer``: ``fully_shard`` on each of three ``Linear`` layers and on the model,
  one of them 95 % of the bytes: already its own unit, as finely as FSDP can wrap.
- ``fsdp2-oom-in-unit``: a block's forward pre-hook asks for more host memory than there is,
  where FSDP2's own all-gather of the block's parameters would run out: the rank records the
  OOM, and the script goes on to the next scenario.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

import shardtop.probe as st
from tests.diagnose_scripts.scenarios import record_each

DIM = 384
DEPTH = 8
LORA_DIM = 1024
LORA_DEPTH = 3
LORA_RANK = 8
STEPS = 2
CPU = torch.device("cpu")


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


def mlp() -> nn.Sequential:
    return nn.Sequential(*(Block() for _ in range(DEPTH)))


class Adapter(nn.Module):
    """LoRA's low-rank update."""

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(rank, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class LoraLinear(nn.Module):
    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.base = nn.Linear(dim, dim)
        self.base.requires_grad_(False)
        self.adapter = Adapter(dim, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.adapter(x)


class LoraBlock(nn.Module):
    def __init__(self, dim: int = LORA_DIM, rank: int = LORA_RANK) -> None:
        super().__init__()
        self.q = LoraLinear(dim, rank)
        self.ff = LoraLinear(dim, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(torch.relu(self.q(x)))


def batches(dim: int) -> Iterator[tuple[int, torch.Tensor]]:
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(1, STEPS + 1):
        yield step, torch.randn(8, dim, generator=generator)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, dim: int = DIM) -> None:
    """The usual loop; a snapshot after the first step, with the gradients still in place."""
    for step, x in batches(dim):
        st.phase("forward", step)
        loss = model(x).square().mean()
        st.phase("backward")
        loss.backward()
        st.phase("optimizer")
        optimizer.step()
        if step == 1:
            st.attach(model, optimizer=optimizer, stage="step")
        optimizer.zero_grad(set_to_none=True)
        st.step(step, loss=loss.item())


# -- FSDP2 ---------------------------------------------------------------------------------------


def _fsdp2_blocks_and_model() -> tuple[nn.Sequential, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    st.attach(model, optimizer=optimizer, strategy="fully_shard")
    return model, optimizer


def _train_looking_after_forward(
    model: nn.Sequential, optimizer: torch.optim.Optimizer, forward: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """The usual loop, with the snapshot taken between the first forward and its backward."""
    for step, x in batches(DIM):
        st.phase("forward", step)
        out = forward(x)
        if step == 1:
            st.attach(model, optimizer=optimizer, stage="step")  # what each rank holds after forward
        st.phase("backward")
        loss = out.square().mean()
        loss.backward()
        st.phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        st.step(step, loss=loss.item())


def fsdp2_layers_own_roots() -> None:
    model, optimizer = _fsdp2_blocks_and_model()

    def layer_by_layer(x: torch.Tensor) -> torch.Tensor:
        for block in model:  # the model's own forward never runs
            x = block(x)
        return x

    _train_looking_after_forward(model, optimizer, layer_by_layer)


def fsdp2_root_forward() -> None:
    model, optimizer = _fsdp2_blocks_and_model()
    _train_looking_after_forward(model, optimizer, model)


def fsdp2_optimizer_before_wrap() -> None:
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # before fully_shard
    for block in model:
        fully_shard(block)
    fully_shard(model)
    st.attach(model, optimizer=optimizer, strategy="fully_shard")
    train(model, optimizer)


def _fsdp2_hybrid(shape: tuple[int, int]) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    model = mlp()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    st.attach(model, optimizer=optimizer, strategy="fully_shard")
    train(model, optimizer)


# -- FSDP1 ---------------------------------------------------------------------------------------


def fsdp1_optimizer_before_wrap() -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # before FSDP
    wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=CPU)
    st.attach(wrapped, optimizer=optimizer, strategy="FullyShardedDataParallel")
    train(wrapped, optimizer)


def _fsdp1_lora(wrap: set[type[nn.Module]]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = nn.Sequential(*(LoraBlock() for _ in range(LORA_DEPTH)))
    wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy(wrap), device_id=CPU, use_orig_params=True)
    optimizer = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=1e-3)
    st.attach(wrapped, optimizer=optimizer, strategy="FullyShardedDataParallel")
    train(wrapped, optimizer, LORA_DIM)


def fsdp2_one_big_layer() -> None:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(DIM, 16), nn.Linear(16, 16), nn.Linear(16, 8192))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    st.attach(model, optimizer=optimizer, strategy="fully_shard")
    train(model, optimizer)


def fsdp2_oom_in_unit() -> None:
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for block in model:
        fully_shard(block)
    fully_shard(model)
    st.attach(model, strategy="fully_shard")

    def gather_too_much(module: nn.Module, args: object) -> None:
        torch.empty(1 << 44, dtype=torch.uint8)  # 16 TiB: no host has it

    model[2].register_forward_pre_hook(gather_too_much)
    st.phase("forward", 1)
    model(torch.randn(8, DIM))


# -- DDP -----------------------------------------------------------------------------------------


def ddp_optimizer_before_wrap() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # DDP keeps these very parameters
    wrapped = DDP(model)
    st.attach(wrapped, optimizer=optimizer, strategy="DistributedDataParallel")
    train(wrapped, optimizer)


SCENARIOS: dict[str, Callable[[], None]] = {
    "fsdp2-layers-own-roots": fsdp2_layers_own_roots,
    "fsdp2-root-forward": fsdp2_root_forward,
    "fsdp2-optimizer-before-wrap": fsdp2_optimizer_before_wrap,
    "fsdp2-hybrid-2x1": lambda: _fsdp2_hybrid((2, 1)),
    "fsdp2-hybrid-1x2": lambda: _fsdp2_hybrid((1, 2)),
    "fsdp1-optimizer-before-wrap": fsdp1_optimizer_before_wrap,
    "fsdp1-lora-one-unit": lambda: _fsdp1_lora({LoraBlock}),
    "fsdp1-lora-split": lambda: _fsdp1_lora({LoraBlock, Adapter}),
    "ddp-optimizer-before-wrap": ddp_optimizer_before_wrap,
    "fsdp2-oom-in-unit": fsdp2_oom_in_unit,
    "fsdp2-one-big-layer": fsdp2_one_big_layer,
}


def main(names: list[str]) -> None:
    dist.init_process_group("gloo")
    record_each(names, SCENARIOS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
