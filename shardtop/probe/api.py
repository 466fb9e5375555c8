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

None of these raises into training: ``watch()`` passes the training's own
exception on untouched, and a probe with nowhere to write (no run directory)
says so once in the rank's log and records nothing.  Without ``watch()``
the rank's ending is still recorded, at interpreter exit (``exits.py``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardtop.probe.current import current, set_current
from shardtop.probe.faults import describe
from shardtop.probe.session import Probe, unavailable
from shardtop.rundir.events import SnapshotStage
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RUN_DIR_ENV, RunDirectory, RunError, runs_root
from shardtop.rundir.run_meta import RunMeta


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
    """The run directory of all ranks: ``$SHARDTOP_RUN_DIR``, or one rank 0 makes and broadcasts.

    Raises ``NoRunDirectory`` when there is none; rank 0 still takes part in
    the broadcast, so the other ranks are not left waiting for it.
    """
    env = os.environ.get(RUN_DIR_ENV)
    if env:
        return Path(env)
    if world_size > 1:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise NoRunDirectory(
                "with several ranks, call attach()/watch() after init_process_group(), "
                f"or set {RUN_DIR_ENV} to one directory for all ranks"
            )
    created: list[str | None] = [None]
    failure = ""
    if rank == 0:
        try:
            config = RunConfig(program=name, world_size=world_size)
            meta = RunMeta(preset=name, config=config, command=tuple(sys.argv), external=True)
            run = RunDirectory.create(runs_root(runs_dir), name, meta)
            created[0] = str(run.path)
        except (RunError, OSError) as e:
            failure = f"cannot make a run directory: {e}"
    if world_size > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(created, src=0)
    if created[0] is None:
        raise NoRunDirectory(failure or "rank 0 could not make a run directory (its log says why)")
    return Path(created[0])


class NoRunDirectory(Exception):
    """There is no run directory to write to: the probe records nothing, training goes on."""


def probe(
    run_dir: str | os.PathLike[str] | None = None, *, runs_dir: str | None = None, name: str | None = None
) -> Probe:
    """This process's probe, created on first use; it never raises into training."""
    existing = current()
    if existing is not None:
        if name and not existing.program:
            existing.program = name
        return existing
    program = name or (Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "script")
    rank, world_size, local_rank = 0, 1, 0
    try:
        rank, world_size, local_rank = _rank_world()
        path = Path(run_dir) if run_dir else _shared_run_dir(rank, world_size, runs_dir, program)
        p = Probe(path, rank, world_size, local_rank=local_rank)
    except NoRunDirectory as e:
        p = unavailable(rank, world_size, str(e), local_rank)
    except Exception as e:  # noqa: BLE001 - the probe never raises into training
        p = unavailable(rank, world_size, describe(e), local_rank)
    p.program = program
    p.device = f"cuda:{local_rank}" if _cuda_in_use() else "cpu"
    set_current(p)
    p.register()
    return p


def prepare(
    run_dir: str | os.PathLike[str],
    *,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    device: str = "cpu",
    program: str = "",
    memory_interval: float = 0.5,
    engine: str = "",
) -> Probe:
    """This process's probe, made before training starts; the callback and ``watch()`` pick it up.

    ``engine``: the engine the program will hand its model to, said in the rank's hello even where the
    rank fails before it does (an OOM while the model is built).

    A preset's rank makes it before its memory cap applies, so that the event
    file (with the room it keeps for the last records), the memory thread and
    the exit hooks come out of the memory the rank had before the cap
    (``Probe.set_memory_limit`` then tells it the cap).
    """
    existing = current()
    if existing is not None:
        return existing
    try:
        p = Probe(Path(run_dir), rank, world_size, local_rank=local_rank)
    except Exception as e:  # noqa: BLE001 - the probe never raises into training
        p = unavailable(rank, world_size, describe(e), local_rank)
    p.program = program
    p.device = device
    if engine:
        p.pending_hello = {"strategy": "", "program": program, "engine": engine}
    set_current(p)
    p.register()
    p.start_memory(memory_interval)
    return p


def finish(code: int, error: BaseException | None = None) -> None:
    """A runner's last word for its rank: the OOM record if ``error`` is one, the exit, then close."""
    p = current()
    if p is None:
        return
    if error is not None:
        p.record_oom(error)
    p.exit(code, error)
    p.close()


def attach(
    target: Any,
    *,
    optimizer: Any = None,
    stage: SnapshotStage = "engine",
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
        with p.faults.guard("shards"):
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
    """Record an OOM (or any failure) and the rank's exit; the exception always goes on, untouched."""
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
