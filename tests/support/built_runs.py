"""Runs built from event types, for what no recording covers: two GPUs, a run that streams, 100 000 modules.

The TUI tests and the screenshots use real recordings (``recorded.py``); these
builders serve the diagnosis tests (story 2 on two H200s: no 2-GPU machine was
recorded), the benchmarks (``bench/bench_tui.py`` appends to a run as it "runs")
and the report's size test.  They write the same event types, field for field,
as the probe; timestamps, pids and hosts are fixed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from shardtop.rundir.event_files import event_file
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Event, Exit, Hello, Memory, Oom, Phase, Shards, Step, Tree, Unit
from shardtop.rundir.memory_figures import GpuMemory

T0 = 1795960000.0
"""2026-11-29 13:46:40 UTC: every built run starts here."""
GIB = 1024**3
H200 = 150_754_820_096
HOSTNAME = "gpu-box"
PIDS = (4_194_401, 4_194_402)
"""Above Linux's largest pid (2**22), so no live process ever has them."""


def stamp(event: Event, rank: int, t: float, host: str = HOSTNAME) -> Event:
    return msgspec.structs.replace(event, rank=rank, host=host, t=T0 + t)


def write_run(
    root: Path,
    run_id: str,
    preset: str,
    config: dict[str, Any],
    events: Sequence[Event],
    exit: dict[str, Any] | None,
    logs: dict[str, str] | None = None,
) -> Path:
    """A run directory as ``RunDirectory.create`` + the runner leave it."""
    path = root / run_id
    (path / "events").mkdir(parents=True, mode=0o700)
    (path / "logs").mkdir(mode=0o700)
    meta = {
        "id": run_id,
        "preset": preset,
        "created": T0,
        "host": HOSTNAME,
        "user": "trainer",
        "config": {"preset": preset, **config},
        "command": ["shardtop", "launch", f"preset={preset}"],
        "pid": 4_194_400,
        "pgid": 4_194_400,
        "pid_started": T0,
    }
    (path / "run.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    by_rank: dict[int, list[bytes]] = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(encode(e))
    for rank, lines in by_rank.items():
        event_file(path / "events", rank).write_bytes(b"".join(lines))
    for name, text in (logs or {}).items():
        target = path / "runner.log" if name == "runner" else path / "logs" / f"{name}.log"
        target.write_text(text)
    if exit is not None:
        (path / "exit.json").write_text(json.dumps({"ended": T0 + 60, **exit}))
    os.chmod(path, 0o700)
    return path


def linear_stack_tree(n_layers: int, tree_id: int = 0) -> Tree:
    """Story 2's model: ``Tel`` holding ``net``, an ``nn.Sequential`` of ``Linear(512, 512)``."""
    per = 512 * 512 + 512
    return Tree(
        tree_id=tree_id,
        names=["", "net", *map(str, range(n_layers))],
        parents=[-1, 0, *([1] * n_layers)],
        types=[0, 1, *([2] * n_layers)],
        type_names=["Tel", "Sequential", "Linear"],
        params=[0, 0, *([per] * n_layers)],
        bytes=[0, 0, *([per * 4] * n_layers)],
    )


def gpus_at(used: Sequence[int], pids: Sequence[int] = PIDS) -> list[GpuMemory]:
    return [
        GpuMemory(
            index=i,
            name="NVIDIA H200",
            uuid=f"GPU-{i:04d}",
            used=u,
            total=H200,
            util=97 if u > 2 * GIB else 0,
            temperature=41 + i,
            power_w=310.5 - 40 * i,
            pids=[pids[i]],
        )
        for i, u in enumerate(used)
    ]


def zero3_oom_run(root: Path, n_layers: int = 4000, culprit: int = 3406) -> Path:
    """Story 2 on 2 × H200 with a 3.5 GiB cap: the whole model moved to each GPU, OOM in ``net.<culprit>``."""
    tree = linear_stack_tree(n_layers)
    n = len(tree.names)
    per_layer = tree.bytes[2]
    limit = int(3.5 * GIB)
    events: list[Event] = []
    for rank in (0, 1):
        events.append(
            stamp(
                Hello(
                    pid=PIDS[rank],
                    world_size=2,
                    local_rank=rank,
                    device=f"cuda:{rank}",
                    engine="zero3",
                    strategy="deepspeed_stage_3",
                    program="zero3-linear",
                    versions={"python": "3.12.3", "torch": "2.11.0", "lightning": "2.6.6", "deepspeed": "0.19.8"},
                ),
                rank,
                1.0 + rank * 0.01,
            )
        )
        events.append(stamp(Phase(phase="setup"), rank, 1.1))
        if rank == 0:
            events.append(stamp(tree, 0, 2.0))
        events.append(
            stamp(
                Shards(
                    tree_id=0,
                    engine="plain",
                    stage="setup",
                    devices=["cpu"],
                    states=["plain"],
                    bytes=list(tree.bytes),
                    device=[-1, -1, *([0] * n_layers)],
                    state=[-1, -1, *([0] * n_layers)],
                    unit=[-1] * n,
                    info={"precision": "32-true", "zero_init": False},
                ),
                rank,
                2.1,
            )
        )
        for i, frac in enumerate((0.05, 0.3, 0.62, 0.91, 0.998)):
            used = int(limit * frac)
            events.append(
                stamp(
                    Memory(
                        device=f"cuda:{rank}",
                        allocated=used,
                        reserved=used + 2 * 2**20,
                        peak=used + 2 * 2**20,
                        limit=limit,
                        host_rss=3_100_000_000,
                        gpus=gpus_at([used + 520 * 2**20] * 2) if rank == 0 else None,
                    ),
                    rank,
                    3.0 + i,
                )
            )
        at = per_layer * culprit
        events.append(
            stamp(
                Oom(
                    phase="setup",
                    module=f"net.{culprit}",
                    module_type="Linear",
                    attributed_by="apply-frame",
                    engine_step="DeepSpeedEngine._configure_distributed_model",
                    module_stack=["", "net", f"net.{culprit}"],
                    requested_bytes=512 * 512 * 4,
                    device=f"cuda:{rank}",
                    allocated=at,
                    reserved=at + 2 * 2**20,
                    limit=limit,
                    total=H200,
                    gpus=gpus_at([at + 520 * 2**20] * 2),
                    message=f"CUDA out of memory. Tried to allocate 1.00 MiB. GPU {rank} has a total "
                    "capacity of 140.40 GiB of which 136.4 GiB is free. Of the allocated memory "
                    "3.49 GiB is allocated by PyTorch",
                    traceback=[
                        "deepspeed/runtime/engine.py:1234 in _configure_distributed_model",
                        "torch/nn/modules/module.py:942 in _apply",
                    ],
                ),
                rank,
                8.2 + rank * 0.05,
            )
        )
        events.append(
            stamp(
                Exit(code=1, status="oom", error="torch.OutOfMemoryError: CUDA out of memory."), rank, 8.4 + rank * 0.05
            )
        )
    logs = {
        "runner": "started 2 rank(s): 4194401, 4194402\nrank 0 failed (exit 1); stopping the others\n",
        "rank-0": "[rank0] building Tel with 4000 Linear(512, 512)\n[rank0] deepspeed: stage 3\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 MiB.\n",
        "rank-1": "[rank1] building Tel with 4000 Linear(512, 512)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 MiB.\n",
    }
    return write_run(
        root,
        "20261129-122640-zero3-linear-0a0e",
        "zero3-linear",
        {
            "program": "zero3-linear",
            "engine": "zero3",
            "accelerator": "cuda",
            "devices": 2,
            "world_size": 2,
            "gpu_mem_limit": limit,
            "model": {"n_layers": n_layers},
        },
        events,
        {"code": 1, "signal": None, "reason": "rank 0 failed"},
        logs,
    )


def fsdp2_cpu_run(root: Path, steps: int = 3, n_layers: int = 8, hidden: int = 1024) -> Path:
    """``fsdp2-mlp`` on 2 CPU processes, finished: every Linear an FSDP2 unit, sharded in two."""
    per = hidden * hidden + hidden
    names = ["", "layers", *map(str, range(n_layers)), "head"]
    parents = [-1, 0, *([1] * n_layers), 0]
    tree = Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=[0, 1, *([2] * n_layers), 2],
        type_names=["MLP", "ModuleList", "Linear"],
        params=[0, 0, *([per] * n_layers), hidden * 10 + 10],
        bytes=[0, 0, *([per * 4] * n_layers), (hidden * 10 + 10) * 4],
    )
    units = [
        Unit(
            module=0,
            kind="fsdp2",
            numel=hidden * 10 + 10,
            local_numel=(hidden * 10 + 10) // 2,
            strategy="FULL_SHARD",
            dtype="float32",
            params=2,
        )
    ]
    units += [
        Unit(
            module=2 + i,
            kind="fsdp2",
            numel=per,
            local_numel=per // 2,
            strategy="FULL_SHARD",
            dtype="float32",
            params=2,
        )
        for i in range(n_layers)
    ]
    events: list[Event] = []
    for rank in (0, 1):
        events.append(
            stamp(
                Hello(
                    pid=PIDS[rank],
                    world_size=2,
                    local_rank=rank,
                    device="cpu",
                    engine="fsdp2",
                    strategy="ModelParallelStrategy",
                    program="fsdp2-mlp",
                    versions={"python": "3.11.7", "torch": "2.13.0+cpu", "lightning": "2.6.6"},
                ),
                rank,
                0.5,
                "laptop",
            )
        )
        if rank == 0:
            events.append(stamp(tree, 0, 1.0, "laptop"))
        events.append(
            stamp(
                Shards(
                    tree_id=0,
                    engine="fsdp2",
                    stage="engine",
                    devices=["cpu"],
                    states=["sharded"],
                    bytes=[b // 2 for b in tree.bytes],
                    device=[-1, -1, *([0] * n_layers), 0],
                    state=[-1, -1, *([0] * n_layers), 0],
                    unit=[-1, -1, *range(1, n_layers + 1), 0],
                    units=units,
                    info={"data_parallel": 2, "mesh": "dp=2"},
                ),
                rank,
                1.2,
                "laptop",
            )
        )
        for step in range(1, steps + 1):
            events.append(stamp(Phase(phase="forward", step=step), rank, 1.5 + step, "laptop"))
            events.append(
                stamp(Memory(device="cpu", host_rss=410_000_000 + step * 3_000_000), rank, 1.6 + step, "laptop")
            )
            events.append(stamp(Step(step=step, loss=2.5 / step, seconds=0.41), rank, 2.0 + step, "laptop"))
        events.append(stamp(Exit(code=0, status="ok"), rank, 6.0, "laptop"))
    logs = {
        "runner": "started 2 rank(s): 4194401, 4194402\n",
        "rank-0": "step 1 loss 2.5\nstep 2 loss 1.25\nstep 3 loss 0.833\n",
    }
    return write_run(
        root,
        "20261129-122640-fsdp2-mlp-1b2c",
        "fsdp2-mlp",
        {
            "program": "fsdp2-mlp",
            "engine": "fsdp2",
            "accelerator": "cpu",
            "devices": 2,
            "world_size": 2,
            "max_steps": steps,
            "model": {"n_layers": n_layers, "hidden": hidden},
        },
        events,
        {"code": 0, "signal": None, "reason": ""},
        logs,
    )


def big_tree_run(root: Path, n_modules: int = 100_000, run_id: str = "20261129-122640-zero3-linear-big0") -> Path:
    """A 100 000-module model (blocks of 4 Linear) on 2 ranks, ZeRO-3 partitioned."""
    names, parents, types, params = [""], [-1], [0], [0]
    blocks = (n_modules - 1) // 5
    for b in range(blocks):
        block = len(names)
        names += [str(b), *(f"fc{j}" for j in range(4))]
        parents += [0, *([block] * 4)]
        types += [1, 2, 2, 2, 2]
        params += [0, *([65_792] * 4)]
    tree = Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=types,
        type_names=["Sequential", "Block", "Linear"],
        params=params,
        bytes=[p * 2 for p in params],
    )
    n = len(names)
    events: list[Event] = []
    for rank in (0, 1):
        events.append(
            stamp(
                Hello(
                    pid=PIDS[rank],
                    world_size=2,
                    local_rank=rank,
                    device=f"cuda:{rank}",
                    engine="zero3",
                    strategy="deepspeed_stage_3",
                ),
                rank,
                0.5,
            )
        )
        if rank == 0:
            events.append(stamp(tree, 0, 1.0))
        events.append(
            stamp(
                Shards(
                    tree_id=0,
                    engine="zero3",
                    stage="engine",
                    devices=[f"cuda:{rank}"],
                    states=["partitioned"],
                    bytes=[b // 2 for b in tree.bytes],
                    device=[0 if p else -1 for p in params],
                    state=[0 if p else -1 for p in params],
                    unit=[-1] * n,
                ),
                rank,
                1.5,
            )
        )
    return write_run(
        root,
        run_id,
        "zero3-linear",
        {"program": "zero3-linear", "world_size": 2},
        events,
        {"code": 0, "signal": None, "reason": ""},
    )
