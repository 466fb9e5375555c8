"""Rank functions for test_shards.py: real engines on gloo, each returns what ``read_shards`` saw.

Every worker returns ``{"tree": ..., "shards": ..., "ref": ...}``: the two
events as plain data, and ``ref``, numbers taken from the engine's own
bookkeeping on this rank (FlatParameter sizes, ``to_local()``, ``ds_tensor``,
optimizer state), for the test to hold the reader against.

The training workers also run their forward under the probe's activation
tracker and take memory censuses (``kinds``), so one process checks both the
shard readers and the memory split of the same engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
from torch import nn

from shardtop.probe.activations import SavedActivations
from shardtop.probe.memory_kinds import MemoryCensus
from shardtop.probe.shards import read_shards

DIM = 6
VOCAB = 11


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.ff = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.relu(self.ff(x)))


class TinyNet(nn.Module):
    """Nested blocks, an odd total size (padding), and a head tied to the embedding."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.act = nn.ReLU()
        self.head = nn.Linear(DIM, VOCAB)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.act(x))


def tokens(batch: int = 4, length: int = 5) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(dist.get_rank()))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """One forward/backward (and step), leaving the gradients in place for the reader.

    Returns the memory censuses around it and what each module saved (``explained_forward``).
    """
    loss, saved = explained_forward(model, optimizer, lambda: model(tokens()).float().pow(2).mean())
    loss.backward()
    saved["kinds"]["backward"] = kinds(model, optimizer)
    if optimizer is not None:
        optimizer.step()
        saved["kinds"]["step"] = kinds(model, optimizer)
    return saved


def kinds(target: Any, optimizer: Any = None, activations: SavedActivations | None = None) -> dict[str, Any]:
    census = MemoryCensus("cpu")
    census.set_target(target, optimizer)
    count = census.count(activations)
    assert count is not None
    return msgspec.to_builtins(count.kinds)


def explained_forward(target: Any, optimizer: Any, forward: Any) -> tuple[Any, dict[str, Any]]:
    """``forward()`` under the probe's activation tracker, as an explained step runs it.

    Returns its result and ``{"by_module": {id(module): bytes saved}, "kinds": {"engine", "forward"}}``.
    """
    before = kinds(target, optimizer)
    tracker = SavedActivations()
    assert tracker.start()
    try:
        out = forward()
    finally:
        tracker.stop()
    census = MemoryCensus("cpu")
    census.set_target(target, optimizer)
    found = census.count()
    assert found is not None
    by_module = tracker.by_module(torch.device("cpu"), found.addresses)
    return out, {"by_module": by_module, "kinds": {"engine": before, "forward": kinds(target, optimizer, tracker)}}


def result(
    target: Any, stage: str = "engine", optimizer: Any = None, activations: dict[int, int] | None = None, **ref: Any
) -> dict[str, Any]:
    tree, shards = read_shards(target, tree_id=0, stage=stage, optimizer=optimizer, activations=activations)
    return {"tree": msgspec.to_builtins(tree), "shards": msgspec.to_builtins(shards), "ref": ref}


def _init(backend: str = "gloo") -> None:
    if not dist.is_initialized():
        dist.init_process_group(backend)
    torch.manual_seed(0)


def _state_bytes(optimizer: Any) -> int:
    """What the optimizer's state occupies on this rank (a DTensor by its local shard)."""
    tensors = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


# -- FSDP1 ---------------------------------------------------------------------


def _flat_ref(model: nn.Module) -> dict[str, int]:
    """This rank's FlatParameter sizes, as FSDP1 itself keeps them."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
    flats = [h.flat_param for h in handles]
    return {
        "units": len(FSDP.fsdp_modules(model)),
        "local_numel": sum(f._sharded_size.numel() for f in flats),
        "stored_numel": sum(f.numel() for f in flats),
        "full_numel": sum(sum(f._numels) for f in flats),
        "shard_padded": sum(f._shard_numel_padded for f in flats),
    }


def fsdp1(
    rank: int,
    world_size: int,
    out_dir: Path,
    strategy: str = "FULL_SHARD",
    use_orig_params: bool = False,
    offload: bool = False,
    hybrid_mesh: list[int] | None = None,
    train: bool = True,
    mixed: bool = False,
) -> dict[str, Any]:
    """Raw FSDP1 with every Block its own unit under a wrapped root.

    Also reads the model from inside the root wrapper (as a LightningModule
    inside FSDP would be) and between forward and backward, when the
    FlatParameters point at the gathered (with ``mixed``, bfloat16) tensors.
    """
    _init()
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    kwargs: dict[str, Any] = {}
    if hybrid_mesh:
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["device_mesh"] = init_device_mesh("cpu", tuple(hybrid_mesh), mesh_dim_names=("replicate", "shard"))
    model = FSDP(
        TinyNet(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
        sharding_strategy=getattr(ShardingStrategy, strategy),
        use_orig_params=use_orig_params,
        cpu_offload=CPUOffload(offload_params=offload),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16) if mixed else None,
        **kwargs,
    )
    ref = _flat_ref(model)
    if not train:  # CPUOffload pins memory at the first forward, which needs an accelerator
        return result(model, **ref)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss, saved = explained_forward(model, optimizer, lambda: model(tokens()).float().pow(2).mean())
    forward = result(model, stage="forward", activations=saved["by_module"])
    loss.backward()
    saved["kinds"]["backward"] = kinds(model, optimizer)
    optimizer.step()
    saved["kinds"]["step"] = kinds(model, optimizer)
    out = result(model, stage="step", optimizer=optimizer, optim_state_bytes=_state_bytes(optimizer), **ref)
    out["forward"] = forward
    out["inner"] = result(model.module, stage="step")
    out["kinds"] = saved["kinds"]
    return out


def fsdp1_hand_wrapped(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Story 1: two blocks wrapped by hand, the root and everything else left alone on the CPU."""
    _init()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = TinyNet()
    model.blocks[0] = FSDP(model.blocks[0], device_id=torch.device("cpu"))
    model.blocks[1] = FSDP(model.blocks[1], device_id=torch.device("cpu"))
    return result(model, stage="setup", **_flat_ref(model))


# -- FSDP2 ---------------------------------------------------------------------


def _local_ref(model: nn.Module) -> dict[str, int]:
    """Bytes of the local shards, as the DTensors themselves report them."""
    with torch.no_grad():
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        return {"local_bytes": sum(t.numel() * t.element_size() for t in local)}


def fsdp2(
    rank: int, world_size: int, out_dir: Path, mesh: list[int] | None = None, offload: bool = False
) -> dict[str, Any]:
    """Raw ``fully_shard`` on a CPU mesh, one unit per Block and one at the root."""
    _init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    shape = tuple(mesh or [world_size])
    names = ("replicate", "shard")[-len(shape) :]
    device_mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    policy = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
    model = TinyNet()
    for block in model.blocks:
        fully_shard(block, mesh=device_mesh, offload_policy=policy)
    fully_shard(model, mesh=device_mesh, offload_policy=policy)
    ref = _local_ref(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved = train_step(model, optimizer)
    out = result(model, stage="step", optimizer=optimizer, activations=saved["by_module"],
                 optim_state_bytes=_state_bytes(optimizer), **ref)
    out["kinds"] = saved["kinds"]
    return out


def fsdp2_accumulating(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Two micro-steps under ``fully_shard``, the first with the gradient sync off (as the Trainers
    accumulate): read after each backward."""
    _init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = TinyNet()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out = {}
    for micro, sync in enumerate((False, True)):
        model.set_requires_gradient_sync(sync)
        model(tokens()).float().pow(2).mean().backward()
        out[f"micro{micro}"] = result(model, stage="step")
    return out


class Titan(nn.Module):
    """torchtitan's Llama in small: embeddings, blocks in a ModuleDict, a final norm and an output head."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(blocks)})
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x))


def torchtitan_style(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """FSDP2 as torchtitan applies it: built on the meta device, each block wrapped for activation
    checkpointing, then ``fully_shard`` on the embeddings, on each block, on ``[norm, output]`` together
    and on the root (which owns no parameter of its own), then materialised and initialised."""
    _init()
    from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    with torch.device("meta"):
        model = Titan()
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, checkpoint_wrapper(block))
    fully_shard(model.tok_embeddings, mesh=mesh)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard([model.norm, model.output], mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    ref = _local_ref(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # one buffer the size of the shard
    model(tokens()).float().pow(2).mean().backward()
    optimizer.step()
    return result(model, stage="step", optimizer=optimizer, **ref)


class LitTiny:
    """Built lazily so that importing this file does not import Lightning."""

    @staticmethod
    def make(apply: str) -> Any:
        import lightning.pytorch as pl

        class Lit(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = TinyNet()

            def configure_model(self) -> None:
                if apply == "fully_shard":
                    from torch.distributed.fsdp import fully_shard

                    mesh = self.device_mesh["data_parallel"]
                    for block in self.net.blocks:
                        fully_shard(block, mesh=mesh)
                    fully_shard(self.net, mesh=mesh)

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                return self.net(batch[0]).float().pow(2).mean()

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

        return Lit()


def _lightning_fit(strategy: Any, apply: str, out_dir: Path) -> dict[str, Any]:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    seen: dict[str, Any] = {}

    class Snapshot(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            target = trainer.strategy.model
            seen["wrapped"] = result(target, stage="step", optimizer=trainer.optimizers[0], **_local_ref(module))
            seen["module"] = result(module, stage="step")
            mesh = getattr(trainer.strategy, "device_mesh", None)
            seen["mesh"] = None if mesh is None else {"shape": list(mesh.shape), "dims": list(mesh.mesh_dim_names)}

    data = TensorDataset(torch.randint(0, VOCAB, (8, 5)))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Snapshot()],
        default_root_dir=str(out_dir),
    )
    trainer.fit(LitTiny.make(apply), DataLoader(data, batch_size=2))
    return seen


def lightning_fsdp2(rank: int, world_size: int, out_dir: Path, data_parallel_size: int | None = None) -> dict[str, Any]:
    """Lightning ``ModelParallelStrategy``: dp=2 shards; the default mesh puts both ranks on tp."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if data_parallel_size is None:
        strategy = ModelParallelStrategy()
    else:
        strategy = ModelParallelStrategy(data_parallel_size=data_parallel_size, tensor_parallel_size=1)
    return _lightning_fit(strategy, "fully_shard", out_dir)


def lightning_probe(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Lightning ``ModelParallelStrategy`` (FSDP2 applied in ``configure_model``) with ``ShardtopCallback``:
    the test reads the events it wrote."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from shardtop.probe.callback import ShardtopCallback

    data = TensorDataset(torch.randint(0, VOCAB, (8, 5)))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ShardtopCallback(out_dir / "run")],
        default_root_dir=str(out_dir),
    )
    trainer.fit(LitTiny.make("fully_shard"), DataLoader(data, batch_size=2))
    return {}


def lightning_ddp(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """Lightning ``strategy="ddp"``: DDP around Lightning's own wrapper around the module."""
    return _lightning_fit("ddp", "", out_dir)


# -- DDP -----------------------------------------------------------------------


def ddp(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    _init()
    model = nn.parallel.DistributedDataParallel(TinyNet())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    saved = train_step(model, optimizer)
    out = result(model, stage="step", optimizer=optimizer, activations=saved["by_module"],
                 optim_state_bytes=_state_bytes(optimizer))
    out["kinds"] = saved["kinds"]
    return out


# -- DeepSpeed -----------------------------------------------------------------


def probe_zero(rank: int, world_size: int, out_dir: Path, stage: int = 2) -> dict[str, Any]:
    """Raw ``deepspeed.initialize`` driven through the probe's API, as a user's loop would: the test
    reads the events."""
    import deepspeed

    from shardtop.probe.session import Probe

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = _ds_config(stage)
    probe = Probe(out_dir / "run", rank, world_size)
    probe.hello(device="cpu", engine=f"zero{stage}")
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine, zero_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    probe.snapshot(engine, stage="engine", optimizer=zero_optimizer)
    probe.start_memory(interval=60.0)
    for step in (1, 2, 3):
        probe.phase("forward", step)
        loss = engine(tokens()).float().pow(2).mean()
        probe.phase("backward")
        engine.backward(loss)
        probe.phase("optimizer")
        engine.step()
        probe.step(step)
        if step == 1:
            probe.snapshot(engine, stage="step", optimizer=zero_optimizer)
    probe.exit(0)
    probe.close()
    return {}


def zero_oom_on_stack(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """An OOM raised from a method of a ZeRO optimizer that no engine or snapshot leads to (as in
    ``_configure_zero_optimizer``, before the engine holds it): the census finds it on the stack."""
    import deepspeed

    from shardtop.probe.session import Probe

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _, zero_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=_ds_config(2))
    probe = Probe(out_dir / "run", rank, world_size)
    probe.hello(device="cpu", engine="zero2")
    probe.snapshot(model, stage="setup")  # the bare model: its parameters, no optimizer

    def allocate_buckets(self: Any) -> None:
        raise MemoryError("no room for the reduce buckets")

    try:
        allocate_buckets(zero_optimizer)
    except MemoryError as error:
        probe.record_oom(error)
    probe.close()
    masters = zero_optimizer.single_partition_of_fp32_groups
    return {"master_bytes": sum(t.numel() * t.element_size() for t in masters)}


def _ds_config(
    stage: int, offload_param: str = "none", persist: bool = True, bf16: bool = False, offload_optimizer: str = "none"
) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        if not persist:  # by default ZeRO-3 keeps parameters under 100 000 elements gathered
            zero["stage3_param_persistence_threshold"] = 0
        if offload_param != "none":
            zero["offload_param"] = {"device": offload_param}
    if offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": offload_optimizer}
    return {
        "train_micro_batch_size_per_gpu": 4,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        **({"data_types": {"grad_accum_dtype": "fp32"}} if bf16 else {}),
        # DeepSpeed steps torch's Adam on offloaded state only when told to leave its own CPU Adam
        **({"zero_force_ds_cpu_optimizer": False} if offload_optimizer != "none" else {}),
    }


def _ds_ref(model: nn.Module) -> dict[str, int]:
    params = list(model.parameters())
    if not params or not hasattr(params[0], "ds_tensor"):
        return {"stored_bytes": sum(p.numel() * p.element_size() for p in params)}
    return {"stored_bytes": sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params)}


def deepspeed_zero(
    rank: int,
    world_size: int,
    out_dir: Path,
    stage: int = 3,
    zero_init: bool = False,
    offload_param: str = "none",
    persist: bool = True,
    bf16: bool = False,
    offload_optimizer: str = "none",
) -> dict[str, Any]:
    """Raw ``deepspeed.initialize``: snapshots before the engine, after it, and after one step."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = _ds_config(stage, offload_param, persist, bf16, offload_optimizer)
    if zero_init:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = TinyNet()
    else:
        model = TinyNet()
    out: dict[str, Any] = {"setup": result(model, stage="setup", **_ds_ref(model))}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine, zero_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    out["engine"] = result(engine, **_ds_ref(engine.module))
    loss, saved = explained_forward(engine, zero_optimizer, lambda: engine(tokens()).float().pow(2).mean())
    engine.backward(loss)
    saved["kinds"]["backward"] = kinds(engine, zero_optimizer)
    out["backward"] = result(engine, stage="backward", activations=saved["by_module"])
    engine.step()
    saved["kinds"]["step"] = kinds(engine, zero_optimizer)
    out["step"] = result(engine, stage="step", **_ds_ref(engine.module))
    out["step_passed_optimizer"] = result(engine, stage="step", optimizer=zero_optimizer)
    out["kinds"] = saved["kinds"]
    return out
