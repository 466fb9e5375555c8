"""The probe inside one training rank: everything it knows ends up as events.

One ``Probe`` per process.  The Lightning callback and the raw-engine API
(``attach``/``watch``) both drive it; neither writes events themselves.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from shardtop.cluster import SlurmIds
from shardtop.events import EventWriter, Exit, Hello, Phase, Shards, Step, Tree, event_file
from shardtop.probe.host import host_facts
from shardtop.probe.names import module_names
from shardtop.runs import RunDirectory


class Probe:
    """Writes one rank's events into a run directory."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        node_rank: int = 0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node_rank = node_rank
        self.writer = EventWriter(event_file(self.run_dir / "events", rank), rank)
        self.names: dict[int, str] = {}
        self.phase_name = "setup"
        self.step_index = 0
        self.device = "cpu"
        limit = os.environ.get("SHARDTOP_MEM_LIMIT")
        self.memory_limit: int | None = int(limit) if limit and limit.isdigit() else None
        self._tree_key: tuple[Any, ...] | None = None
        self._tree_id = -1
        self._sampler: Any = None
        self._oom_written = False
        self._exited = False
        self.tracker: Any = None
        self.program = ""
        self.extra_info: dict[str, str | int | float | bool | None] = {}
        """Facts only the driver knows (Trainer precision, loss scaling), added to every Shards.info."""
        self.said_hello = False
        self.pending_hello: dict[str, str] | None = None
        """Hello fields known before the engine is: written with the first snapshot."""

    # -- lifecycle -----------------------------------------------------------

    def hello(self, device: str, engine: str = "", strategy: str = "", program: str = "") -> None:
        self.device = device
        if device.startswith("cuda"):
            from shardtop.probe.oom import install_cuda_oom_observer

            install_cuda_oom_observer()
        self.said_hello = True
        self.pending_hello = None
        slurm = SlurmIds.from_env()
        host = host_facts()
        self.writer.write(
            Hello(
                pid=os.getpid(),
                world_size=self.world_size,
                local_rank=self.local_rank,
                node_rank=self.node_rank,
                device=device,
                engine=engine,
                strategy=strategy,
                program=program,
                versions=_versions(),
                slurm_job_id=slurm.job_id,
                slurm_step_id=slurm.step_id,
                slurm_node=slurm.node,
                host_memory=host.memory,
                host_memory_limit=host.memory_limit,
                alloc_conf=host.alloc_conf,
            )
        )

    def start_memory(self, interval: float = 0.5) -> None:
        """Sample this rank's memory in the background (and the node's GPUs on local rank 0)."""
        from shardtop.probe.memory import MemorySampler

        if self._sampler is None:
            self._sampler = MemorySampler(
                self.writer.write,
                device=self.device,
                interval=interval,
                sample_gpus=self.local_rank == 0,
                limit=self.memory_limit,
            )
            self._sampler.start()

    def sample_memory(self) -> None:
        if self._sampler is not None:
            self._sampler.sample_now()

    def phase(self, phase: str, step: int | None = None) -> None:
        if step is not None:
            self.step_index = step
        if phase == self.phase_name:
            return
        self.phase_name = phase
        self.writer.write(Phase(phase=phase, step=self.step_index))
        self.sample_memory()

    def step(self, step: int, loss: float | None = None, seconds: float | None = None) -> None:
        self.step_index = step
        self.writer.write(Step(step=step, loss=loss, seconds=seconds))

    # -- the model -------------------------------------------------------------

    def learn_names(self, root: Any) -> None:
        """Map module objects to clean paths once, for OOM attribution later."""
        from shardtop.probe.tracker import ModuleTracker

        self.names.update(module_names(root))
        # No hooks: backward OOMs are read off the failed autograd graph, at no cost per step.
        self.tracker = ModuleTracker(root, self.names)

    def snapshot(self, target: Any, stage: str, optimizer: Any = None) -> tuple[Tree, Shards]:
        """Write how the model is held now: the tree (only when it changed) and this rank's shards."""
        from shardtop.probe.shards import read_shards

        tree, shards = read_shards(target, tree_id=self._tree_id + 1, stage=stage, optimizer=optimizer)
        if not self.said_hello and self.pending_hello is not None:
            pending = dict(self.pending_hello)
            engine = pending.pop("engine", "") or shards.engine
            self.hello(self.device, engine=engine, **pending)
        key = (tuple(tree.names), tuple(tree.parents), tuple(tree.types), tuple(tree.type_names), tuple(tree.params))
        if key != self._tree_key:
            self._tree_id += 1
            self._tree_key = key
            self.writer.write(tree)
        else:
            tree.tree_id = self._tree_id
        shards.tree_id = self._tree_id
        shards.info = {**shards.info, **self.extra_info}
        self.writer.write(shards)
        self.sample_memory()
        return tree, shards

    # -- endings -----------------------------------------------------------------

    def record_oom(self, exc: BaseException) -> bool:
        """Write the OOM event if ``exc`` is an out-of-memory error; True if it was."""
        from shardtop.probe.oom import attribute, is_out_of_memory

        if self._oom_written or not is_out_of_memory(exc):
            return False
        event = attribute(
            exc,
            names=self.names,
            phase=self.phase_name,
            step=self.step_index,
            device=self.device,
            tracker=self.tracker,
            limit=self.memory_limit,
        )
        self.writer.write(event)
        self._oom_written = True
        return True

    def exit(self, code: int, error: BaseException | None = None) -> None:
        if self._exited:
            return
        self._exited = True
        if self._sampler is not None:
            self._sampler.stop()
        if error is None:
            status = "ok" if code == 0 else "error"
            message = None
        else:
            status = "oom" if self._oom_written else (
                "interrupted" if isinstance(error, KeyboardInterrupt) else "error"
            )
            message = "".join(traceback.format_exception_only(type(error), error)).strip()[:2000]
        self.writer.write(Exit(code=code, status=status, error=message))
        self._record_exit_of_external_run(code, status)

    def _record_exit_of_external_run(self, code: int, status: str) -> None:
        """A script's run has no supervisor to write ``exit.json``: its ranks do.

        A failing rank writes it at once; rank 0 writes success. The first
        record wins, so a rank that failed before rank 0 finished is what stays.
        """
        run = RunDirectory(self.run_dir)
        if (code != 0 or self.rank == 0) and run.read_meta().get("external"):
            run.write_exit(code, reason=f"rank {self.rank}: {status}")

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self.writer.close()


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "lightning", "deepspeed"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "__version__"):
            out[name] = str(mod.__version__)
    return out


_current: Probe | None = None


def current() -> Probe | None:
    return _current


def set_current(probe: Probe | None) -> None:
    global _current
    _current = probe


def now() -> float:
    return time.perf_counter()
