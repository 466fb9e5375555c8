"""The probe inside one training rank: everything it knows ends up as events.

One ``Probe`` per process (``current.py`` says which).  The Lightning callback
and the raw-engine API (``attach``/``watch``) both drive it; neither writes
events themselves.  Its memory part (the samples, what fills the memory, the
tensors kept across steps) is a ``MemoryProbe`` (``memory_probe.py``).

The probe is a guest in the training process and never raises into it; only
the user's own exception goes on, untouched.  Each of its parts runs under a
guard (``faults.py``): a part that fails is logged once to the rank's log,
written as a ``Fault`` event and switched off.  Everything that recording an
OOM needs is imported with this module, and memory is kept aside for it
(``cap.py``): a CPU rank under a memory cap imports the probe before its
cap applies.  The rank's ending is recorded however it comes (``exits.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from shardtop.probe.allocator_cap import armed_cap
from shardtop.probe.cap import OOM_RESERVE, starved_of_memory
from shardtop.probe.exits import RUN_ENDING, ExitRecord, exit_record, received_signal
from shardtop.probe.faults import Faults, say
from shardtop.probe.hello import hello_event
from shardtop.probe.memory_explain import MemoryExplainer
from shardtop.probe.memory_probe import MemoryProbe
from shardtop.probe.names import module_names
from shardtop.probe.oom import install_cuda_oom_observer, model_being_built, stack_of
from shardtop.probe.oom_errors import is_out_of_memory
from shardtop.probe.oom_event import oom_event
from shardtop.probe.shards import read_shards
from shardtop.probe.tracker import ModuleTracker
from shardtop.rundir.event_files import EventWriter, event_file
from shardtop.rundir.events import Exit, Fault, Phase, Shards, SnapshotStage, Step, Tree
from shardtop.rundir.run_directory import RunDirectory

try:
    import pynvml  # noqa: F401 - an OOM record asks NVML about every GPU: importing it then could fail
except ImportError:  # pragma: no cover - a declared dependency
    pass


class Probe:
    """Writes one rank's events into a run directory (``run_dir=None``: nowhere, it could not be made)."""

    def __init__(
        self,
        run_dir: Path | None,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        node_rank: int = 0,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node_rank = node_rank
        self.faults = Faults(rank, self._write_fault)
        path = event_file(self.run_dir / "events", rank) if self.run_dir is not None else None
        self.writer = EventWriter(path, rank, on_stop=self._events_stopped)
        if self.writer.stopped is not None and self.run_dir is not None:
            self.faults.report("events", self.writer.stopped, then="nothing is recorded")
        self.names: dict[int, str] = {}
        self.phase_name = "setup"
        self.step_index = 0
        self.device = "cpu"
        self._tree_key: tuple[Any, ...] | None = None
        self._tree_id = -1
        self._oom_written = False
        self._exited = False
        self.tracker: ModuleTracker | None = None
        self.program = ""
        self.extra_info: dict[str, str | int | float | bool | None] = {}
        """Facts only the driver knows (Trainer precision, loss scaling), added to every Shards.info."""
        self.said_hello = False
        self.pending_hello: dict[str, str] | None = None
        """Hello fields known before the engine is: written with the first snapshot."""
        self._last_target: Any = None
        """The model the last snapshot read (or, before any, whose names were learnt): what an OOM reads."""
        self.memory_probe = MemoryProbe(
            self.faults, self.writer.write, run_dir=self.run_dir, device=lambda: self.device,
            target=lambda: self._last_target, rank=rank,
        )
        """This rank's memory sampler, explainer and kept tracker (``memory_probe.py``)."""

    @property
    def exited(self) -> bool:
        return self._exited

    def _write_fault(self, fault: Fault) -> None:
        self.writer.write(fault)

    def _events_stopped(self, reason: str) -> None:
        self.faults.report("events", reason, then="only the OOM and exit records are still written")

    # -- lifecycle -----------------------------------------------------------

    def hello(self, device: str, engine: str = "", strategy: str = "", program: str = "") -> None:
        self.device = device
        self.memory_probe.use_device(device)
        if device.startswith("cuda"):
            with self.faults.guard("oom"):
                install_cuda_oom_observer()
        self.memory_probe.explain(lambda explainer: explainer.start())
        self.said_hello = True
        self.pending_hello = None
        self.writer.write(hello_event(self.world_size, self.local_rank, self.node_rank, device, engine=engine,
                                      strategy=strategy, program=program))

    def phase(self, phase: str, step: int | None = None, graph: Any = None) -> None:
        """A new phase begins.  ``graph``: the tensor about to be backpropagated (a loss), where the caller
        has it: what its autograd graph holds is read from it."""
        if step is not None:
            self.step_index = step
        if phase == self.phase_name:
            if phase == "forward":  # a forward after a forward, as an evaluation loop runs them
                self.memory_probe.forward_again(self.step_index)
            return
        self.phase_name = phase
        self._say_pending_hello()  # training has begun: the engine, if any, is in place
        self.writer.write(Phase(phase=phase, step=self.step_index))
        self.memory_probe.at_phase(phase, self.step_index, graph)

    def step(self, step: int, loss: float | None = None, seconds: float | None = None) -> None:
        self.step_index = step
        self.writer.write(Step(step=step, loss=loss, seconds=seconds))
        if self.memory_probe.explain(lambda explainer: explainer.on_step(step)):
            self.memory_probe.sample()

    # -- memory ------------------------------------------------------------------

    def start_memory(self, interval: float = 0.5) -> None:
        """Sample this rank's memory in the background (and the node's GPUs on local rank 0)."""
        self.memory_probe.start(interval, sample_gpus=self.local_rank == 0)

    def set_memory_limit(self, limit: int | None) -> None:
        """The per-process cap the rank runs under, once it applies: every record says it."""
        self.memory_probe.set_limit(limit)

    def memory(self) -> MemoryExplainer | None:
        """What fills this rank's memory (``memory_explain.py``), for the current device; None once it failed."""
        return self.memory_probe.current_explainer()

    # -- the model -------------------------------------------------------------

    def learn_names(self, root: Any) -> None:
        """Map module objects to clean paths once, for OOM attribution later."""
        if not self.faults.working("names"):
            return
        with self.faults.guard("names"):
            self.names.update(module_names(root))
            # No hooks: backward OOMs are read off the failed autograd graph, at no cost per step.
            self.tracker = ModuleTracker(root, self.names)
        self.memory_probe.follow_kept(self.names)
        if self._last_target is None:  # before any snapshot (modules still being built): what an OOM reads
            self._last_target = root
            self.memory_probe.explain(lambda explainer: explainer.set_target(root))

    def snapshot(self, target: Any, stage: SnapshotStage, optimizer: Any = None) -> tuple[Tree, Shards] | None:
        """Write how the model is held now: the tree (only when it changed) and this rank's shards.

        None when the shard reader failed (now or before): the run goes on without shards.
        """
        read: tuple[Tree, Shards] | None = None
        self._last_target = target

        def aimed(explainer: MemoryExplainer) -> dict[int, int] | None:
            explainer.set_target(target, optimizer)
            return explainer.act_bytes()

        activations = self.memory_probe.explain(aimed)
        if self.faults.working("shards"):
            with self.faults.guard("shards"):
                read = read_shards(
                    target, tree_id=self._tree_id + 1, stage=stage, optimizer=optimizer, activations=activations
                )
        if read is not None:
            tree_read, shards_read = read
            annotated = self.memory_probe.explain(lambda explainer: explainer.annotate(tree_read, shards_read))
            if annotated is not None:
                read = tree_read, annotated
        if not (stage == "setup" and self._engine_may_move_it()):
            self._say_pending_hello(read[1].engine if read is not None else "")
        if read is None:
            return None
        tree, shards = read
        key = (tuple(tree.names), tuple(tree.parents), tuple(tree.types), tuple(tree.type_names), tuple(tree.params))
        if key != self._tree_key:
            self._tree_id += 1
            self._tree_key = key
            self.writer.write(tree)
        else:
            tree = msgspec.structs.replace(tree, tree_id=self._tree_id)
        shards = msgspec.structs.replace(shards, tree_id=self._tree_id, info={**shards.info, **self.extra_info})
        self.writer.write(shards)
        self.memory_probe.explain(lambda explainer: explainer.on_snapshot(stage, self.step_index))
        self.memory_probe.sample()
        return tree, shards

    def _engine_may_move_it(self) -> bool:
        """Before the engine, a model on the CPU of a machine with a GPU: the engine may put it there
        (a raw DeepSpeed script builds it on the CPU and ``deepspeed.initialize`` moves it)."""
        if self.device != "cpu":
            return False
        torch = sys.modules.get("torch")
        try:
            return bool(torch is not None and torch.cuda.is_available())
        except Exception:  # noqa: BLE001
            return False

    def _say_pending_hello(self, engine: str = "") -> None:
        """The hello held back for the engine, written now with the device the rank is on."""
        if self.said_hello or self.pending_hello is None:
            return
        pending = dict(self.pending_hello)
        self.hello(self.device, engine=pending.pop("engine", "") or engine, **pending)

    # -- endings -----------------------------------------------------------------

    def record_oom(self, exc: BaseException) -> bool:
        """Write the OOM event if ``exc`` is an out-of-memory error; True if it was.

        The memory reserve is given back first, so that attributing the OOM
        has room; if attributing fails all the same, the OOM is written with
        what is known without it (phase, step, message).
        """
        if self._oom_written or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return False
        starved = False
        try:
            if not is_out_of_memory(exc):
                starved = starved_of_memory(exc)  # measured before the reserve is given back
                if not starved:
                    return False
        except MemoryError:
            pass  # even looking at the error needs memory that is not there: it is an OOM
        except Exception:  # noqa: BLE001
            return False
        OOM_RESERVE.release()
        cap = armed_cap()
        if cap is not None:  # the allocator cap's room for the record, as the reserve is under RLIMIT_DATA
            cap.widen(OOM_RESERVE.size)
        with self.faults.guard("run"):
            self._say_pending_hello()
        event = oom_event(exc, self.faults, names=self.names, phase=self.phase_name, step=self.step_index,
                          device=self.device, tracker=self.tracker, limit=self.memory_probe.limit, starved=starved)
        explained = self.memory_probe.explain(lambda explainer: explainer.on_oom(event, exc))
        self.writer.write(explained if explained is not None else event)
        self._oom_written = True
        self._snapshot_at_oom(exc)
        return True

    def _snapshot_at_oom(self, exc: BaseException) -> None:
        """How the model was held at the OOM: during a set-up move, which modules had reached the device;
        while the model was being built (no model read yet), which of its modules it had allocated.

        Nothing when the model holds no parameter yet (an OOM while its modules were being built, as under
        ``deepspeed.zero.Init``): a tree of an empty root would say less than the OOM alone.
        """
        target = self._last_target
        if target is None:
            with self.faults.guard("oom"):
                target = model_being_built(stack_of(exc))
        if target is not None and holds_parameters(target):
            self.snapshot(target, stage="oom")  # guarded inside: a failure is the shards' fault

    def exit(self, code: int, error: BaseException | None = None) -> None:
        """Record how the rank ends (once): ``exits.exit_record`` says ok, error, oom or interrupted."""
        if self._exited:
            return
        self._exited = True
        with self.faults.guard("run"):
            self._say_pending_hello()
        self.memory_probe.stop()
        try:
            record = exit_record(code, error, oom=self._oom_written, received=received_signal())
        except Exception:  # noqa: BLE001
            record = ExitRecord(code, "ok" if code == 0 and error is None else "error")
        self.writer.write(Exit(code=record.code, status=record.status, error=record.error, signal=record.signal))
        with self.faults.guard("run"):
            self._record_exit_of_external_run(record)

    def _record_exit_of_external_run(self, record: ExitRecord) -> None:
        """A script's run has no supervisor to write ``exit.json``: its ranks do.

        A failing rank writes it at once; rank 0 writes success. The first
        record wins, so a rank that failed before rank 0 finished is what stays.
        """
        if self.run_dir is None:
            return
        run = RunDirectory(self.run_dir)
        if (record.code != 0 or self.rank == 0) and run.read_meta().external:
            run.write_exit(record.code, signal=record.signal, reason=f"rank {self.rank}: {record.status}",
                           ending=RUN_ENDING[record.status])

    def register(self) -> None:
        """Tell the run directory this process is one of its ranks (scripts' runs only)."""
        if self.run_dir is not None:
            with self.faults.guard("run"):
                RunDirectory(self.run_dir).register_rank(self.rank)

    def close(self) -> None:
        self.memory_probe.close()
        self.writer.close()


def holds_parameters(target: Any) -> bool:
    """Whether ``target`` has a parameter yet (none while ``zero.Init`` or ``configure_model`` still builds it)."""
    try:
        return next(iter(target.parameters()), None) is not None
    except Exception:  # noqa: BLE001  (not a module: let the shard reader say what it is)
        return True


def unavailable(rank: int, world_size: int, why: str, local_rank: int = 0) -> Probe:
    """A probe that records nothing, for a rank whose run directory could not be made; says why once."""
    say(f"shardtop: nothing is recorded on rank {rank}: {why}. Training goes on.")
    return Probe(None, rank, world_size, local_rank=local_rank)
