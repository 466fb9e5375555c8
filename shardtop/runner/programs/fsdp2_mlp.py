"""fsdp2-mlp: an MLP sharded with FSDP2 through Lightning's ModelParallelStrategy."""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from shardtop.runner.context import RankContext
from shardtop.runner.lightning_run import RegressionModule, fit
from shardtop.runner.models import MLP


class ShardedMLP(RegressionModule):
    model: MLP

    def __init__(self, n_layers: int, hidden: int) -> None:
        super().__init__()
        self.model = MLP(n_layers, hidden)

    def configure_model(self) -> None:
        if self.device_mesh is None:  # ModelParallelStrategy sets it before it calls configure_model
            raise RuntimeError("configure_model() ran without ModelParallelStrategy's device mesh")
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def run(ctx: RankContext) -> None:
    m = ctx.config["model"]
    strategy = ModelParallelStrategy(data_parallel_size=ctx.world_size, tensor_parallel_size=1)
    fit(ctx, ShardedMLP(m["n_layers"], m["hidden"]), strategy, features=m["hidden"])
