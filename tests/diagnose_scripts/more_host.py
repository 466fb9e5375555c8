"""FSDP2 training scripts that build the model on every rank, one scenario each, for the rule
that weighs the whole copies in host memory against what the host (or the job's cgroup) has.

Every scenario named on the command line runs in turn in the same processes and records into a
run directory of its own, named after it:

    torchrun --nproc-per-node 2 tests/diagnose_scripts/more_host.py fsdp2-whole-on-every-rank fsdp2-meta-init

- ``fsdp2-whole-on-every-rank``: each rank builds the whole model on the CPU, then shards it.
- ``fsdp2-meta-init``: each rank builds it on the meta device, shards it, then materialises and
  initialises its own shards only.

``--mib`` sets the model's size (512 MiB by default, eight 4096 x 4096 layers).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import shardtop.probe as st
from tests.diagnose_scripts.scenarios import record_each

WIDTH = 4096
LAYER_MIB = WIDTH * (WIDTH + 1) * 4 / 2**20


def build(layers: int) -> nn.Sequential:
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(layers)))


def sharded(model: nn.Module) -> None:
    """How the ranks hold the model once it is sharded (training it would add nothing here)."""
    st.attach(model, strategy="fully_shard")


def whole_on_every_rank(layers: int) -> None:
    model = build(layers)  # every rank: the whole model, in host memory
    st.attach(model, stage="setup", strategy="fully_shard", engine="fsdp2")
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    sharded(model)


def meta_init(layers: int) -> None:
    with torch.device("meta"):
        model = build(layers)
    st.attach(model, stage="setup", strategy="fully_shard", engine="fsdp2")
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    for layer in model:
        assert isinstance(layer, nn.Linear)
        layer.reset_parameters()  # each rank initialises its own shards
    sharded(model)


SCENARIOS = {"fsdp2-whole-on-every-rank": whole_on_every_rank, "fsdp2-meta-init": meta_init}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--mib", type=int, default=512, help="the model's size")
    args = parser.parse_args()
    layers = max(1, round(args.mib / LAYER_MIB))
    dist.init_process_group("gloo")
    record_each(args.scenarios, {name: partial(SCENARIOS[name], layers) for name in args.scenarios})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
