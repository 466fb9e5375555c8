"""The probe for raw PyTorch and DeepSpeed loops (no Lightning).

    import shardtop.probe as st

    with st.watch():                       # records an OOM (and any failure), then re-raises
        st.attach(model, stage="setup")    # optional: how the model is held before the engine
        engine, opt, *_ = deepspeed.initialize(model=model, config=cfg)
        st.attach(engine, optimizer=opt)   # the shard tree as the engine holds it
        for step, batch in enumerate(loader, 1):
            st.phase("forward"); loss = engine(batch)
            st.phase("backward"); engine.backward(loss)
            st.phase("optimizer"); engine.step()
            st.step(step, loss=loss.item())

Run it under ``shardtop launch`` or on its own: it writes into
``$SHARDTOP_RUN_DIR`` when set, else rank 0 creates a run directory and
broadcasts it to the other ranks, so ``shardtop runs`` and ``shardtop
attach`` find it like any preset run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardtop.probe.session import Probe, current, set_current
from shardtop.runs import RUN_DIR_ENV, RunDirectory, runs_root


def _rank_world() -> tuple[int, int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    except ImportError:  # pragma: no cover
        pass
    rank = int(os.environ.get("RANK", 0))
    return rank, int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", rank))


def _shared_run_dir(rank: int, world_size: int, runs_dir: str | None, name: str) -> Path:
    env = os.environ.get(RUN_DIR_ENV)
    if env:
        return Path(env)
    created: list[str | None] = [None]
    if rank == 0:
        run = RunDirectory.create(
            runs_root(runs_dir),
            name,
            {"config": {"program": name, "world_size": world_size}, "command": list(sys.argv), "external": True},
        )
        created[0] = str(run.path)
    if world_size > 1:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "shardtop: with several ranks, call attach()/watch() after init_process_group(), "
                f"or set {RUN_DIR_ENV} to one directory for all ranks."
            )
        dist.broadcast_object_list(created, src=0)
    assert created[0] is not None
    return Path(created[0])


def probe(run_dir: str | os.PathLike[str] | None = None, *, runs_dir: str | None = None, name: str | None = None) -> Probe:
    """This process's probe, created on first use."""
    existing = current()
    if existing is not None:
        return existing
    rank, world_size, local_rank = _rank_world()
    program = name or (Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "script")
    path = Path(run_dir) if run_dir else _shared_run_dir(rank, world_size, runs_dir, program)
    p = Probe(path, rank, world_size, local_rank=local_rank)
    p.program = program
    p.device = f"cuda:{local_rank}" if _cuda_in_use() else "cpu"
    set_current(p)
    RunDirectory(path).register_rank(rank)
    return p


def attach(
    target: Any,
    *,
    optimizer: Any = None,
    stage: str = "engine",
    strategy: str = "",
    engine: str = "",
    run_dir: str | os.PathLike[str] | None = None,
    runs_dir: str | None = None,
    name: str | None = None,
) -> Probe:
    """Record how ``target`` (a module, an FSDP/DDP wrapper or a DeepSpeed engine) holds the model.

    ``engine`` names the engine the run is for when the first snapshot is taken
    before it exists (``stage="setup"``); otherwise the snapshot tells.
    """
    p = probe(run_dir, runs_dir=runs_dir, name=name)
    p.learn_names(target)
    if not p.said_hello:
        p.device = _device_of(target)
        p.pending_hello = {"strategy": strategy, "program": p.program, "engine": engine}
    p.snapshot(target, stage=stage, optimizer=optimizer)
    p.start_memory()
    return p


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


def _device_of(target: Any) -> str:
    device = getattr(target, "device", None)
    if device is not None and not callable(device):
        return str(device)
    devices = [p.device for p in getattr(target, "parameters", lambda: [])()]
    real = [d for d in devices if d.type != "meta"]  # a meta parameter stores nothing anywhere
    return str(real[0]) if real else "cpu"


def phase(name: str, step: int | None = None) -> None:
    """Enter a phase: forward, backward, optimizer, validation..."""
    p = current()
    if p is not None:
        p.phase(name, step)


def step(index: int, loss: float | None = None, seconds: float | None = None) -> None:
    p = current()
    if p is not None:
        p.step(index, loss=loss, seconds=seconds)


@contextlib.contextmanager
def watch(
    run_dir: str | os.PathLike[str] | None = None, *, runs_dir: str | None = None, name: str | None = None
) -> Iterator[Probe]:
    """Record an OOM (or any failure) and the rank's exit; the exception always goes on."""
    p = probe(run_dir, runs_dir=runs_dir, name=name)
    try:
        yield p
    except BaseException as e:
        p.record_oom(e)
        p.exit(1, e)
        raise
    else:
        p.phase("teardown")
        p.exit(0)
