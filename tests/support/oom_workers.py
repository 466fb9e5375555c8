"""Real out-of-memory errors on CPU, one process each (run through ``tests.support.distributed``).

The process caps its own data segment (``RLIMIT_DATA``) a little above what it
uses, so a big tensor allocation fails inside torch's CPU allocator with the
real "DefaultCPUAllocator: can't allocate memory" error, raised from the real
frame.  The cap must never touch pytest itself: hence a process per case.

Each worker records the OOM with a real ``Probe`` (as the callback does),
re-raises it, checks that what reached the top is the very same exception,
and returns what it saw.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shardtop.probe.names import module_names
from shardtop.probe.session import Probe
from shardtop.probe.tracker import ModuleTracker

MiB = 1 << 20
D = 32
BATCH = 512
WIDE = 65536
"""Block 2's MLP is this wide: its activations are BATCH x WIDE floats (128 MiB)."""


class Mlp(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = Mlp(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    """Four blocks; only ``blocks.2.mlp`` is big."""

    def __init__(self, wide: int = WIDE, d: int = D) -> None:
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, wide if i == 2 else 64) for i in range(4))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def vm_data() -> int:
    """Bytes in this process's data segment (what ``RLIMIT_DATA`` limits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


@contextlib.contextmanager
def data_cap(headroom: int) -> Iterator[None]:
    """Allow only ``headroom`` more bytes of data segment while inside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _record(probe: Probe, work: Callable[[], Any], headroom: int) -> dict[str, Any]:
    """Run ``work`` under the cap as training would: record the OOM, re-raise, catch at the top."""
    raised: list[BaseException] = []

    def training() -> None:
        try:
            with data_cap(headroom):
                work()
        except BaseException as e:
            raised.append(e)
            probe.record_oom(e)
            raise

    try:
        training()
    except BaseException as top:  # noqa: BLE001 - what reached the top is what we check
        probe.exit(1, top)
        probe.close()
        return {
            "same_object": bool(raised) and top is raised[0],
            "type": type(top).__name__,
            "message": str(top).split("\n", 1)[0],
            "traceback_intact": top.__traceback__ is not None,
        }
    probe.close()
    return {"same_object": False, "type": None, "message": "no error", "traceback_intact": False}


def _probe(
    out_dir: Path, rank: int, world_size: int, model: nn.Module | None, phase: str, snapshot: bool = False
) -> Probe:
    probe = Probe(Path(out_dir) / "run", rank, world_size)
    probe.hello(device="cpu", engine="plain")
    if model is not None:
        probe.learn_names(model)
        if snapshot:  # the tree before the OOM, and the model a memory census reads
            probe.snapshot(model, stage="setup")
    probe.phase(phase, 1)
    return probe


def forward_oom(rank: int, world_size: int, out_dir: Path) -> dict[str, Any]:
    """``blocks.2.mlp.fc1`` asks for 128 MiB of activations; 64 MiB are left."""
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(BATCH, D)
    probe = _probe(out_dir, rank, world_size, model, "forward", snapshot=True)
    return _record(probe, lambda: model(x), 64 * MiB)


def setup_oom(rank: int, world_size: int, out_dir: Path, learn_names: bool = True) -> dict[str, Any]:
    """``model.double()`` needs 16 MiB for ``blocks.2.mlp.fc1.weight`` in float64; 8 MiB are left."""
    model = Net()
    probe = _probe(out_dir, rank, world_size, model if learn_names else None, "setup", snapshot=True)
    return _record(probe, model.double, 8 * MiB)


def backward_oom(rank: int, world_size: int, out_dir: Path, track: str = "graph") -> dict[str, Any]:
    """The forward fits; backward needs 128 MiB for the gradient of ``blocks.2.mlp``'s activations.

    ``track``: ``graph`` (a tracker without hooks: it reads the failed graph),
    ``hooks`` (a tracker with hooks) or ``none`` (no tracker, no module frame).
    """
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(BATCH, D)
    probe = _probe(out_dir, rank, world_size, model, "forward")
    probe.tracker = None  # learn_names gave the probe one; ``none`` is a probe without
    if track != "none":
        probe.tracker = ModuleTracker(model, probe.names, hooks=track == "hooks")
        probe.tracker.install()
    loss = model(x).square().mean()
    probe.phase("backward")
    return _record(probe, loss.backward, 64 * MiB)


def fsdp1_forward_oom(rank: int, world_size: int, out_dir: Path, learn_names: bool = True) -> dict[str, Any]:
    """Raw FSDP1 on gloo, one unit per block: the OOM names the user's path, not the wrappers'."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    x = torch.randn(BATCH, D)
    probe = _probe(out_dir, rank, world_size, model if learn_names else None, "forward")
    result = _record(probe, lambda: model(x), 64 * MiB)
    result["wrapped_paths"] = sorted(n for n in module_names(model).values() if "fsdp" in n.lower())
    return result


def deepspeed_setup_oom(rank: int, world_size: int, out_dir: Path, learn_names: bool = False) -> dict[str, Any]:
    """``deepspeed.initialize`` with bf16 casts every parameter; ``blocks.2.mlp.fc1``'s cast does not fit.

    ``blocks.2.mlp`` is made wide enough that its weights dominate (2 x 32 MiB
    in float32, 16 MiB each in bfloat16), and 8 MiB are left.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    model = Net(wide=WIDE * 4)
    probe = _probe(out_dir, rank, world_size, model if learn_names else None, "setup")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 0},
    }
    deepspeed.init_distributed(dist_backend="gloo")
    return _record(probe, lambda: deepspeed.initialize(model=model, config=config), 8 * MiB)


def fsdp1_backward_oom(rank: int, world_size: int, out_dir: Path, track: str = "graph") -> dict[str, Any]:
    """Raw FSDP1, a backward OOM: FSDP1 owns the parameters (flat), so a unit is the finest answer."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    x = torch.randn(BATCH, D)
    probe = _probe(out_dir, rank, world_size, model, "forward")
    if track != "none":
        probe.tracker = ModuleTracker(model, probe.names, hooks=track == "hooks")
        probe.tracker.install()
    loss = model(x).square().mean()
    probe.phase("backward")
    return _record(probe, loss.backward, 64 * MiB)


def zero_init_oom(rank: int, world_size: int, out_dir: Path, headroom_mib: int = 24) -> dict[str, Any]:
    """Building layers under ``deepspeed.zero.Init`` (story 2's fix) on one rank: each layer is
    partitioned as it is made, and one rank's partition is the whole layer; the cap runs out mid-build.

    A layer's weight is 16 MiB and its partition another 16 MiB: with 24 MiB left the partition
    (``Init._post_init_method``) fails; with 8 MiB the weight itself (``Linear.__init__``) does.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    root = nn.Module()  # the user's wrapper (a LightningModule), known to the probe before its layers exist
    probe = _probe(out_dir, rank, world_size, root, "setup")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}

    def build() -> None:
        with deepspeed.zero.Init(config_dict_or_path=config):
            root.net = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(4)))  # 64 MiB in all

    return _record(probe, build, headroom_mib * MiB)
