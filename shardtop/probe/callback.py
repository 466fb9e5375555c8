"""``ShardtopCallback``: the probe for any Lightning script.

Add it to a ``Trainer`` and the run is recorded like a preset run: ``shardtop
runs`` lists it, ``shardtop attach`` opens it, ``shardtop report`` explains it.
It writes into ``$SHARDTOP_RUN_DIR`` when set (preset runs set it), else into a
run directory it makes under the runs root, which rank 0 creates and
broadcasts, so every launcher (Lightning's own, torchrun, SLURM) ends up with
one directory per run.

Like every part of the probe it never raises into training: what goes wrong
in it is logged once, written as a ``Fault`` event, and that part stops.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from shardtop.probe.current import current, set_current
from shardtop.probe.faults import describe
from shardtop.probe.session import Probe, holds_parameters, unavailable
from shardtop.rundir.events import SnapshotStage
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RUN_DIR_ENV, RunDirectory, RunError, runs_root
from shardtop.rundir.run_meta import RunMeta

STRATEGY_ENGINES = {
    "FSDPStrategy": "fsdp1",
    "ModelParallelStrategy": "fsdp2",
    "DDPStrategy": "ddp",
    "SingleDeviceStrategy": "plain",
}


def engine_of(strategy: Any) -> str:
    """The engine a Lightning strategy drives (``zero3`` for DeepSpeed stage 3)."""
    name = type(strategy).__name__
    if name == "DeepSpeedStrategy":
        stage = getattr(strategy, "config", {}).get("zero_optimization", {}).get("stage", 0)
        return f"zero{stage}" if stage else "deepspeed"
    return STRATEGY_ENGINES.get(name, name)


def strategy_name(trainer: Any) -> str:
    strategy = trainer.strategy
    name = type(strategy).__name__
    if name == "DeepSpeedStrategy":
        stage = getattr(strategy, "config", {}).get("zero_optimization", {}).get("stage", 0)
        return f"deepspeed_stage_{stage}"
    return name


class ShardtopCallback(Callback):
    """Records how the model is sharded, memory, steps and OOMs into a run directory."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        runs_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        memory_interval: float = 0.5,
        program: str = "",
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir else None
        self.runs_dir = runs_dir
        self.name = name
        self.memory_interval = memory_interval
        self.program = program
        self.probe: Probe | None = None
        self._step_started = 0.0
        self._snapshots_after_step = 0
        self._failed = False
        self._no_run_dir = ""
        self._wrapped_setup: Any = None

    # -- where to write --------------------------------------------------------

    def _resolve_run_dir(self, trainer: Any) -> Path | None:
        """The run directory; rank 0 makes it and broadcasts it (None everywhere when it could not)."""
        if self.run_dir is None and os.environ.get(RUN_DIR_ENV):
            self.run_dir = Path(os.environ[RUN_DIR_ENV])
        if self.run_dir is not None:
            return self.run_dir
        created: str | None = None
        if trainer.global_rank == 0:
            name = self.name or _script_name()
            try:
                config = RunConfig(program=name, world_size=trainer.world_size)
                meta = RunMeta(preset=name, config=config, command=tuple(sys.argv), external=True)
                run = RunDirectory.create(runs_root(self.runs_dir), name, meta)
                created = str(run.path)
            except (RunError, OSError) as e:
                self._no_run_dir = f"cannot make a run directory: {e}"
        created = trainer.strategy.broadcast(created, src=0)  # every rank takes part, made or not
        self.run_dir = Path(created) if created else None
        return self.run_dir

    # -- Lightning hooks -------------------------------------------------------
    # Each hook runs the probe's parts, which never raise (session.py); what the
    # hooks read of the trainer themselves is guarded here.

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.probe is not None:
            return
        try:
            run_dir = self._resolve_run_dir(trainer)
        except Exception as e:  # noqa: BLE001 - the probe never raises into training
            run_dir, self._no_run_dir = None, describe(e)
        probe = current()
        if probe is None or probe.run_dir != run_dir or run_dir is None:
            if run_dir is None:
                probe = unavailable(trainer.global_rank, trainer.world_size,
                                    self._no_run_dir or "rank 0 could not make a run directory (its log says why)")
            else:
                probe = Probe(run_dir, trainer.global_rank, trainer.world_size, trainer.local_rank, trainer.node_rank)
            set_current(probe)
        self.probe = probe
        probe.register()
        device, engine, strategy = probe.device, "", ""
        with probe.faults.guard("shards"):  # reading the strategy is reading the engine
            device, engine = str(trainer.strategy.root_device), engine_of(trainer.strategy)
            strategy = strategy_name(trainer)
            probe.extra_info.update(
                {
                    "precision": str(trainer.precision),
                    "loss_scaling": getattr(trainer.precision_plugin, "scaler", None) is not None,
                    "driver": f"Lightning {strategy}",
                }
            )
        probe.hello(device=device, engine=engine, strategy=strategy, program=self.program or _script_name())
        probe.start_memory(self.memory_interval)
        probe.phase("setup")
        probe.learn_names(pl_module)
        with probe.faults.guard("shards"):
            if holds_parameters(pl_module):
                probe.snapshot(pl_module, stage="setup")
            if _builds_model_later(pl_module):
                self._snapshot_when_configured(trainer, pl_module)

    def _snapshot_when_configured(self, trainer: Any, pl_module: Any) -> None:
        """Snapshot the model ``configure_model`` built (under ``zero.Init`` for ZeRO-3), before the engine.

        No callback hook runs between ``configure_model`` and the strategy's
        set-up (where DeepSpeed and FSDP wrap and move the model, and where
        set-up OOMs happen), so the strategy's ``setup`` is wrapped, once, on
        this trainer's strategy object only.
        """
        strategy = trainer.strategy
        original = strategy.setup

        def setup(*args: Any, **kwargs: Any) -> Any:
            strategy.__dict__.pop("setup", None)  # back to the class's method: this runs once
            probe = self.probe
            if probe is not None and probe.faults.working("shards"):
                with probe.faults.guard("shards"):
                    probe.learn_names(pl_module)
                    if holds_parameters(pl_module):
                        probe.snapshot(pl_module, stage="setup")
            return original(*args, **kwargs)

        strategy.setup = setup
        self._wrapped_setup = setup

    def _engine_snapshot(self, trainer: Any, pl_module: Any, stage: SnapshotStage) -> None:
        """Read the model as the strategy holds it (the engine), with its optimizer."""
        probe = self.probe
        if probe is None or not probe.faults.working("shards"):
            return
        with probe.faults.guard("shards"):
            model = trainer.strategy.model if trainer.strategy.model is not None else pl_module
            optimizer = _first_optimizer(trainer)
            if stage == "engine":
                probe.learn_names(model)
            probe.snapshot(model, stage=stage, optimizer=optimizer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._engine_snapshot(trainer, pl_module, "engine")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.probe is not None:
            self._step_started = time.perf_counter()
            with self.probe.faults.guard("steps"):
                self.probe.phase("forward", trainer.global_step + 1)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.probe is not None:
            self.probe.phase("backward", graph=loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.probe is not None:
            self.probe.phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        probe = self.probe
        if probe is None:
            return
        if probe.faults.working("steps"):
            with probe.faults.guard("steps"):
                loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
                value = float(loss.detach().float().item()) if loss is not None and hasattr(loss, "detach") else None
                probe.step(trainer.global_step, loss=value, seconds=time.perf_counter() - self._step_started)
        if self._snapshots_after_step == 0:
            # Gradients and optimizer state exist only after the first step.
            self._snapshots_after_step += 1
            self._engine_snapshot(trainer, pl_module, "step")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.probe is not None:
            self.probe.phase("validation")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.probe is None:
            return
        self._failed = True
        self.probe.record_oom(exception)
        self.probe.exit(1, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._wrapped_setup is not None and trainer.strategy.__dict__.get("setup") is self._wrapped_setup:
            trainer.strategy.__dict__.pop("setup", None)  # the strategy's set-up never ran
        if self.probe is not None and not self._failed:
            self.probe.phase("teardown")
            self.probe.exit(0)


def _builds_model_later(pl_module: Any) -> bool:
    """Does the LightningModule build (part of) its model in ``configure_model``?"""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    try:
        return any(is_overridden(name, pl_module) for name in ("configure_model", "configure_sharded_model"))
    except Exception:  # noqa: BLE001
        return False


def _first_optimizer(trainer: Any) -> Any:
    optimizers = getattr(trainer, "optimizers", None) or []
    return optimizers[0] if optimizers else None


def _script_name() -> str:
    name = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "script"
    return name if name not in ("", "-c", "__main__") else "script"
