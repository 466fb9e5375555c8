"""Plan-only mode's planning: what a rank has seen of the engine and model, and the plan made at its first call.

``plan_only.py``'s patches note what the engines were asked in ``STATE``; the
pre-hooks here (``on_module_call`` for every module, ``on_root_call`` for the
model the engine got) plan at the first call of the model, or of a module
inside it: the model is traced at the batch just passed (``plan_trace.py``),
rank 0 writes the ``ScriptPlan`` (``write_plan``), and every rank waits for
the others and leaves with exit code 0 before the forward runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any, TypedDict

from shardtop.inject import PLAN_ONLY_ENV
from shardtop.rundir.engines import FSDP1, FSDP2, ZERO_ENGINES


class HandedFacts(TypedDict, total=False):
    """What the script handed its engine beside the model, as ``plan.asked.Asked`` takes it."""

    deepspeed: Mapping[str, Any]
    """The DeepSpeed config as given (decoded JSON)."""
    partitioned: bool
    sharding: str
    offload_params: bool
    half: str
    policy_unknown: str
    mesh_dims: int


class PlanState:
    """What this process has seen of the script's engine and model."""

    def __init__(self) -> None:
        self.root: Any = None
        """The model the engine got (the outermost one, for FSDP wrapped by hand or fully_shard per module)."""
        self.entry = ""
        self.engine = "single"
        self.facts: HandedFacts = {}
        """Keyword facts for ``asked.Asked`` taken at the hand-over (config, sharding, offload...)."""
        self.policy_classes: tuple[type, ...] = ()
        """The module classes FSDP1's auto-wrap policy makes units of."""
        self.units: list[Any] = []
        """Modules handed to FSDP1 or fully_shard, in call order."""
        self.optimizer = ""
        self.momentum = 0.0
        self.trainer_precision = ""
        self.root_hook: Any = None
        self.reshard: dict[int, bool] = {}
        """id(module) -> whether ``fully_shard`` was asked to reshard it after forward."""
        self.mesh_device = ""
        """The device type of the mesh ``fully_shard`` was given ("" for its default mesh)."""
        self.planning = False
        self.seen: set[int] = set()
        self.written: Any = None
        """The ``ScriptPlan`` written last (at a hand-over or at the first call); None before one is."""
        self.handed_on: set[str] | None = None
        """The device types the model's parameters were on when first handed to an engine (``meta`` for a
        model built on the meta device and materialised after sharding, as torchtitan does)."""


STATE = PlanState()


def _say(text: str) -> None:
    sys.stderr.write(f"shardtop plan: {text}\n")
    sys.stderr.flush()


def global_rank() -> int:
    """This process's rank in the job: torch.distributed's once it is up, else ``RANK``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0") or 0)


def _world_size() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


# -- the first forward -------------------------------------------------------------------------


def on_module_call(module: Any, args: Any) -> None:
    """Every module's pre-hook: the first call of the model, or of a module inside it, plans and leaves."""
    if STATE.planning or id(module) in STATE.seen:
        return
    STATE.seen.add(id(module))
    from shardtop.inject.model_hooks import contains, parameter_count
    from shardtop.inject.this_rank import is_rank

    if not is_rank() or not parameter_count(module):
        return
    root = STATE.root
    if module is root:
        return  # its own pre-hook plans it, with the keyword arguments this hook does not get
    if root is not None and not contains(root, module):
        return  # the stand-in engine, a loss with weights: the model itself comes next
    _plan_and_leave(root if root is not None else module, module, args, _call_kwargs(module))


CALL_FRAMES = 4
"""How far up from a global pre-hook the module's ``_call_impl`` frame is looked for (torch calls the
hooks from a closure inside it)."""


def _call_kwargs(module: Any) -> dict[str, Any]:
    """The keyword arguments ``module`` is being called with, which a global forward pre-hook is not given:
    read from the frame of torch's ``Module._call_impl`` that runs the hooks (its ``self`` and ``kwargs``).
    A model called with keywords alone (``model(input_ids=..., labels=...)``, in a loop with no engine) is
    traced at them; {} where that frame is not found."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(CALL_FRAMES):
        if frame is None:
            break
        names = frame.f_locals
        kwargs = names.get("kwargs")
        if names.get("self") is module and isinstance(kwargs, dict):
            return kwargs
        frame = frame.f_back
    return {}


def on_root_call(module: Any, args: Any, kwargs: Any) -> None:
    """The root's own pre-hook, with the keyword arguments a global hook does not get."""
    from shardtop.inject.this_rank import is_rank

    if STATE.planning or module is not STATE.root or not is_rank():
        return
    _plan_and_leave(module, module, args, kwargs)


def _plan_and_leave(root: Any, called: Any, args: Any, kwargs: Any) -> None:
    """Plan at this call and leave; eagerly, outside ``torch.compile``: under a compiled model the hooks
    run while dynamo traces its forward, and the meta trace must not be compiled with it."""
    import torch

    compiler = getattr(torch, "compiler", None)
    compiling = getattr(compiler, "is_compiling", None)
    compiled = bool(compiling is not None and compiling()) or getattr(root, "_compiled_call_impl", None) is not None
    disable = getattr(compiler, "disable", None)
    (disable(_plan_now) if disable is not None else _plan_now)(root, called, args, kwargs, compiled)


COMPILED_NOTE = ("the model runs compiled (torch.compile): its activations are traced as its eager forward saves "
                 "them; a compiled graph can save other tensors for the backward, more or fewer, which the plan "
                 "does not see")


def _plan_now(root: Any, called: Any, args: Any, kwargs: Any, compiled: bool = False) -> None:
    from shardtop.inject.plan_trace import describe_call, path_in

    STATE.planning = True
    try:
        if global_rank() == 0:
            description, notes = describe_call(root, called, args, kwargs)
            write_plan((description, [*notes, *([COMPILED_NOTE] if compiled else [])]), complete=True)
            path = path_in(root, called)
            _say(f"planned at the first call of {type(called).__name__}"
                 + (f" ({path})" if path else "") + "; stopping before training")
    except Exception as e:  # noqa: BLE001 - said, and planned without activations, saying why
        why = f"could not trace the first forward ({type(e).__name__}: {e}{_where(e)})"
        _say(why)
        if global_rank() == 0 and (STATE.written is None or not STATE.written.complete):
            try:
                write_untraced(root, why)
            except Exception as again:  # noqa: BLE001 - a plan written at the hand-over stands, if there is one
                _say(f"could not plan the model without its forward either ({type(again).__name__}: {again})")
    _leave()


def write_untraced(root: Any, why: str) -> None:
    """The plan of ``root`` without activations, saying ``why`` no forward was traced."""
    from shardtop.inject.plan_trace import describe_call

    write_plan(describe_call(root, None, None, None, not_traced=why), complete=False, not_traced=why)


def plan_at_exit() -> None:
    """Rank 0 of a script that handed its model to an engine and then ended before calling it (its next
    step needs what the engine would have done: Fabric builds its optimizer after FSDP materialised the
    model): the plan of what it saw, without activations, said as such."""
    if STATE.written is not None or STATE.planning or STATE.root is None or global_rank() != 0:
        return
    STATE.planning = True
    try:
        why = f"the command ended after handing its model to {STATE.entry}, before calling it"
        write_untraced(STATE.root, why)
        _say(f"{why}: planned without activations")
    except Exception as e:  # noqa: BLE001 - the command's own exit code and output say the rest
        _say(f"could not plan the model handed to {STATE.entry} ({type(e).__name__}: {e})")


def _where(error: BaseException) -> str:
    """`` in FILE:LINE`` of the innermost frame outside torch: the code that asked for what meta tensors lack."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torch/" not in f.filename]
    return f" in {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()  # rank 0 writes before any rank leaves: no peer sees a closed connection first
        except Exception:  # noqa: BLE001, S110 - leaving anyway
            pass
    os._exit(0)


def _accelerator(root: Any) -> str:
    devices = {p.device.type for p in root.parameters() if p.device.type != "meta"}
    if "cuda" in devices:
        return "cuda"
    torch = sys.modules.get("torch")
    wanted = os.environ.get("DS_ACCELERATOR", "")
    if STATE.engine in ZERO_ENGINES and wanted != "cpu" and torch is not None and torch.cuda.is_available():
        return "cuda"  # DeepSpeed moves the model to the GPU itself
    if STATE.engine == FSDP1 and torch is not None and torch.cuda.is_available():
        return "cuda"
    if STATE.engine == FSDP2 and torch is not None and torch.cuda.is_available():
        return "cpu" if STATE.mesh_device == "cpu" else "cuda"  # fully_shard moves each unit to its mesh's device
    return "cpu"


def fsdp2_sharding(reshard: dict[int, bool], root: Any) -> str:
    """``SHARD_GRAD_OP`` where the units that run in turn keep their parameters whole after forward, else "".

    The root's own setting says nothing about the blocks: accelerate and torchtitan keep the root whole
    (``reshard_after_forward=False``, it runs first in backward) and reshard every block.  The plan's
    FULL_SHARD already keeps the root whole; only blocks that stay whole make it SHARD_GRAD_OP.
    """
    blocks = [keep for key, keep in reshard.items() if key != id(root)]
    if blocks:
        return "" if any(blocks) else "SHARD_GRAD_OP"
    return "SHARD_GRAD_OP" if reshard.get(id(root)) is False else ""


def write_plan(described: tuple[Any, list[str]], *, complete: bool, not_traced: str = "") -> None:
    """The ``ScriptPlan`` of ``described`` (``plan_trace.describe_call``) and ``STATE``, into ``PLAN_ONLY_ENV``;
    ``not_traced``: why it has no forward traced, where it is not ``complete``."""
    from shardtop.plan.asked import Asked, strategy_of
    from shardtop.plan.script import ScriptPlan, write_script_plan
    from shardtop.trace.describe import walk

    desc, notes = described
    root = STATE.root if STATE.root is not None else None
    rows: dict[int, int] = {}
    if root is not None:
        rows = {id(m): i for i, m in enumerate(walk(root)[0])}
    facts = STATE.facts.copy()
    if STATE.engine == FSDP2 and fsdp2_sharding(STATE.reshard, root):
        facts["sharding"] = fsdp2_sharding(STATE.reshard, root)
    classes = STATE.policy_classes
    units = [rows[id(m)] for m in STATE.units if id(m) in rows]
    kept = [rows[id(m)] for m in STATE.units if id(m) in rows and STATE.reshard.get(id(m)) is False]
    if classes and root is not None:
        units += [i for i, m in enumerate(walk(root)[0]) if isinstance(m, classes)]
    accelerator = _accelerator(root) if root is not None else "cpu"
    handed = STATE.handed_on if STATE.handed_on is not None else {p.device.type for p in root.parameters()} if (
        root is not None) else set()
    on_device = accelerator in handed
    asked = Asked(
        engine=STATE.engine, entry=STATE.entry, units=tuple(sorted(set(units))), on_device=on_device,
        kept_whole=tuple(sorted(set(kept) - {0})) if STATE.engine == FSDP2 else (),
        optimizer=STATE.optimizer, momentum=STATE.momentum, trainer_precision=STATE.trainer_precision, **facts,
    )
    strategy, assumed = strategy_of(asked)
    plan = ScriptPlan(description=desc, strategy=strategy, devices=_world_size(), accelerator=accelerator,
                      entry=STATE.entry, notes=[*notes, *assumed], complete=complete, not_traced=not_traced)
    write_script_plan(Path(os.environ[PLAN_ONLY_ENV]), plan)
    STATE.written = plan
