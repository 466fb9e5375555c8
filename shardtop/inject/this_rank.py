"""Is this process a rank of the job, and if so, its probe.

A rank is a process that calls an engine's entry point or trains a model:
torchrun's and deepspeed's workers, Lightning's rank processes, srun's tasks,
or the single process of ``python train.py``.  Launchers (torchrun's agent,
the deepspeed runner) import torch but never call a model, so they never get
this far.  Dataloader workers do call modules (transforms), and are told apart
here: a worker of ``torch.utils.data``, or a multiprocessing child without a
process group, stays quiet.  The decision is made at that first call, not at
start-up, so a launcher pays nothing for it.

Nothing the probe does may hurt training: every hook runs under ``guarded``,
and the first failure turns the probe off in this process with one line on
stderr.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs every launcher and helper process milliseconds at start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])


class InjectState:
    """What the hooks of this process know; one per process (a plain class: dataclasses cost a launcher
    milliseconds at start-up)."""

    def __init__(self, pid: int, lightning: bool = False) -> None:
        self.pid = pid
        self.off = False
        """The probe failed: the hooks do nothing more in this process."""
        self.lightning = lightning
        """A Lightning ``Trainer`` got the callback: the engine hooks leave the work to it."""
        self.engine = ""
        """The engine of the first entry point called (``zero3``, ``fsdp1``...), for the rank's hello."""
        self.strategy = ""
        """That entry point: ``deepspeed_stage_3``, ``FullyShardedDataParallel``, ``fully_shard``..."""
        self.setup_root: Any = None
        """The model as handed to the engine (read at stage ``setup``)."""
        self.depth = 0
        """Engine entry points running now (FSDP1 builds nested FSDP1 units inside its own __init__)."""
        self.root: Any = None
        """The model as the job calls it (the engine's wrapper once there is one)."""
        self.root_params = 0
        self.root_hooks: list[Any] = []
        self.global_hooks: list[Any] = []
        self.seen: set[int] = set()
        """Modules already looked at as a possible root (by id)."""
        self.optimizer: int | None = None
        """id of the optimizer whose steps are the job's steps (the first one that stepped)."""
        self.backward_optimizers: list[Any] | None = None
        """Optimizers that stepped inside the backward running now, until it ends (None: none stepped)."""
        self.steps = 0
        self.step_started: float | None = None
        self.stepped_snapshot = False
        self.engine_steps: Any = None
        """A DeepSpeed engine whose ``step`` takes the step's snapshot once it returns (see ``model_hooks``)."""
        self.in_engine_step = False
        """That engine's ``step`` is running: a step its optimizer finished is told once it returns."""
        self.step_pending: tuple[int, float | None] | None = None
        """(step, when its forward began) of such a step, until the engine's ``step`` returns."""

    def remove_hooks(self) -> None:
        """Take out every hook ``model_hooks`` put in (the global ones and the root model's)."""
        for handle in (*self.global_hooks, *self.root_hooks):
            handle.remove()
        self.global_hooks, self.root_hooks = [], []


STATE = InjectState(pid=os.getpid())
DRIVER = "the script's own code, probed by shardtop run"
"""What drives the engine, as the report and the diagnosis say it (not Lightning: its callback says so)."""


def _torch_dist_ready() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return bool(data is not None and data.get_worker_info() is not None)


def _multiprocessing_child() -> bool:
    mp = sys.modules.get("multiprocessing")
    return bool(mp is not None and mp.parent_process() is not None)


def is_rank() -> bool:
    """Should this process be probed now?"""
    if os.getpid() != STATE.pid:
        # A fork: a dataloader worker (quiet), or a rank started by fork (mp.spawn with fork).
        if _dataloader_worker() or not _torch_dist_ready():
            return False
        from shardtop.probe.current import set_current

        set_current(None)  # the parent's probe writes the parent's file
        STATE.__init__(os.getpid(), lightning=STATE.lightning)  # type: ignore[misc]
    if STATE.off or STATE.lightning or _dataloader_worker():
        return False
    return not (_multiprocessing_child() and not _torch_dist_ready())


def rank_probe() -> Any:
    """This rank's probe (made on first use), or None in a process that stays quiet."""
    if not is_rank():
        return None
    from shardtop.probe.api import probe
    from shardtop.probe.current import current

    p = current()
    if p is None:
        p = probe()
        p.extra_info.setdefault("driver", DRIVER)
        _place(p, os.environ)
    return p


def _place(p: Any, env: Mapping[str, str]) -> None:
    """Where the rank sits among the hosts, where its launcher says it differently from torchrun.

    srun sets ``SLURM_LOCALID``/``SLURM_NODEID`` where torchrun sets
    ``LOCAL_RANK``/``GROUP_RANK``; each host's local rank 0 samples that host's GPUs.
    """
    local = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID")
    node = env.get("GROUP_RANK") or env.get("NODE_RANK") or env.get("SLURM_NODEID")
    if local and local.isdigit():
        p.local_rank = int(local)
    if node and node.isdigit():
        p.node_rank = int(node)


def give_up(what: str, error: BaseException) -> None:
    """Turn the probe off in this process, say so once; the job goes on untouched."""
    if STATE.off:
        return
    STATE.off = True
    sys.stderr.write(
        f"shardtop: the probe stopped in process {os.getpid()} after an error while {what} "
        f"({type(error).__name__}: {error}); training goes on without it.\n"
    )
    try:
        STATE.remove_hooks()
    except Exception:  # noqa: BLE001, S110 - already giving up; the job goes on
        pass


def guarded(what: str) -> Callable[[F], F]:
    """A hook that can never raise into the job: on error, ``give_up``."""

    def decorate(fn: F) -> F:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if STATE.off:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                give_up(what, e)
                return None

        # By hand, not functools.wraps: functools alone costs a launcher milliseconds at start-up.
        wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


@guarded("recording a failure")
def record_failure(error: BaseException) -> None:
    """An engine's set-up failed: if it ran out of memory, say where, now (the error then goes on)."""
    from shardtop.probe.current import current

    p = current()
    if p is not None and os.getpid() == STATE.pid:
        p.record_oom(error)


@guarded("recording the exit")
def record_uncaught(error: BaseException) -> None:
    """The job's own exception reached the top of a rank: its OOM and the rank's exit, before the traceback."""
    from shardtop.probe.current import current

    p = current()
    if p is None or os.getpid() != STATE.pid:
        return
    p.record_oom(error)
    p.exit(130 if isinstance(error, KeyboardInterrupt) else 1, error)
