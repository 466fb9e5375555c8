"""The model, its phases and its steps, read off the job's own calls.

- Until the job's first optimizer step, a global forward pre-hook looks once
  at every module called: the first with parameters becomes the *root*, and a
  later one replaces it when it contains it (an engine's wrapper around the
  model) or, where no engine wraps it, holds more parameters.  The root's tree
  and shards are read then: how the engine holds the model, before the first
  forward (which could run out of memory).
- On the root, a forward pre-hook (phase ``forward``) and a forward hook that
  hangs a hook on the output's gradient (phase ``backward`` when it arrives).
- Global optimizer step hooks: phase ``optimizer``, then a step for every step
  of the first optimizer that steps, once per forward: HF's Trainer under
  DeepSpeed steps the engine's optimizer twice a step (accelerate's wrapper,
  then the engine), and that is one step.  After the first, the shards are read
  again with the optimizer (gradients and its state exist only then) and the
  global forward hook goes.  A DeepSpeed engine steps its inner optimizer once
  per parameter group (a ``Trainer`` makes two: with and without weight
  decay), so there the shards are read when the engine's own ``step`` returns,
  once every group has its optimizer state.
- Optimizers stepped inside backward (one per parameter, each from its
  parameter's post-accumulate-grad hook: torch's "optimizer step in backward"
  recipe) make the backward they stepped in one step, told and read when that
  backward ends (an autograd engine callback), with every optimizer that
  stepped in it: while the gradients arrive, FSDP2 still holds units gathered
  and most optimizers have not stepped yet.

Per step that is three Python calls and one event each.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from shardtop.inject.this_rank import STATE, guarded, is_rank, rank_probe

if TYPE_CHECKING:
    from shardtop.rundir.events import PhaseName, SnapshotStage


def install_global_hooks() -> None:
    """Once torch has loaded (cheap: nothing runs until a module or an optimizer is called)."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    global _compiling
    import torch

    _compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _not_compiling)

    STATE.global_hooks = [
        register_module_forward_pre_hook(_on_module_call),
        register_optimizer_step_pre_hook(_before_optimizer_step),
        register_optimizer_step_post_hook(_after_optimizer_step),
    ]


def _stop_looking_for_root() -> None:
    if STATE.global_hooks:
        STATE.global_hooks[0].remove()  # the forward pre-hook; the optimizer hooks stay


# -- the root -------------------------------------------------------------------------


def parameter_count(module: Any) -> int:
    """Full-size parameter count (a ZeRO-3 parameter is empty locally; ``ds_numel`` is its size)."""
    return sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in module.parameters())


def contains(outer: Any, inner: Any) -> bool:
    return outer is not inner and any(m is inner for m in outer.modules())


def _is_engine_wrapper(module: Any) -> bool:
    from shardtop.probe.names import is_wrapper

    return is_wrapper(module) or hasattr(module, "_get_fsdp_state") or type(module).__name__.startswith("FSDP")


def _not_compiling() -> bool:
    return False


_compiling = _not_compiling
"""``torch.compiler.is_compiling`` once torch has loaded: a compiled model's own modules are not looked at
(its wrapper was, eagerly)."""


def _on_module_call(module: Any, args: Any) -> None:
    if _compiling() or id(module) in STATE.seen:  # a compiled model's own modules: its wrapper was seen eagerly
        return
    STATE.seen.add(id(module))
    _consider(module)


@guarded("looking for the model")
def _consider(module: Any) -> None:
    if not is_rank():
        if STATE.off or STATE.lightning:
            _stop_looking_for_root()
        return
    count = parameter_count(module)
    if not count:
        return
    root = STATE.root
    if root is None or contains(module, root) or (count > STATE.root_params and not _is_engine_wrapper(root)):
        set_root(module, count, stage="engine")
        _forward_started()


def set_root(module: Any, count: int | None = None, *, stage: SnapshotStage) -> None:
    """Read ``module`` as the job's model from now on, and hook its calls."""
    from shardtop.probe.api import attach

    if rank_probe() is None:
        return
    for handle in STATE.root_hooks:
        handle.remove()
    STATE.root = module
    STATE.root_params = parameter_count(module) if count is None else count
    STATE.root_hooks = [
        module.register_forward_pre_hook(_as_hook(_root_forward)),
        module.register_forward_hook(_as_hook(_root_output)),
    ]
    attach(module, stage=stage, engine=STATE.engine, strategy=STATE.strategy)


DYNAMO = "torch._dynamo"
"""What ``torch.compile`` loads; loading it costs a rank about a second of CPU, so the probe never does."""


def _as_hook(fn: Any) -> Any:
    """``fn`` made eager (``probe/eager.py``) where dynamo has loaded; as it is where it has not, since nothing
    can trace it then: ``dynamo_loaded`` makes it eager in place if dynamo loads later."""
    if DYNAMO not in sys.modules:
        return fn
    from shardtop.probe.eager import eager

    return eager(fn)


def dynamo_loaded(_module: Any) -> None:
    """``torch._dynamo`` has just loaded (``torch.compile``, most often): the root's hooks, registered while it
    had not, become eager where they stand among the module's hooks."""
    for handle, fn in zip(STATE.root_hooks, (_root_forward, _root_output), strict=False):
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            hooks[handle.id] = _as_hook(fn)


# -- phases and steps -------------------------------------------------------------------


def _root_forward(module: Any, args: Any) -> None:
    _forward_started()


@guarded("following the forward pass")
def _forward_started() -> None:
    p = rank_probe()
    if p is None:
        return
    if STATE.step_started is None:
        STATE.step_started = time.perf_counter()
    p.phase("forward", STATE.steps + 1)


@guarded("following the backward pass")
def _root_output(module: Any, args: Any, output: Any) -> None:
    for tensor in _grad_tensors(output):
        tensor.register_hook(_backward_started)


MAX_WATCHED_OUTPUTS = 8
"""Output tensors whose gradient tells that backward began: the loss may come from any of them (TRL
computes it from the hidden states, not from the logits the model returns)."""


def _grad_tensors(output: Any) -> list[Any]:
    """The tensors of the output that gradients may flow into: at its top level and one level down."""
    found: list[Any] = []
    for value in _values(output):
        for item in _values(value) if isinstance(value, (tuple, list, dict)) else (value,):
            if getattr(item, "grad_fn", None) is not None and len(found) < MAX_WATCHED_OUTPUTS:
                found.append(item)
    return found


def _values(value: Any) -> Any:
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, (tuple, list)) else (value,)


def _backward_started(grad: Any) -> None:
    _enter("backward")


@guarded("following the steps")
def _enter(phase: PhaseName) -> None:
    p = rank_probe()
    if p is not None:
        p.phase(phase)


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if STATE.in_engine_step and STATE.engine_steps is STATE.root:
        return  # the engine's step began the phase, before its own preparations
    if _in_backward():
        return  # a step inside backward: the phase stays backward
    if STATE.optimizer is None or STATE.optimizer == id(optimizer):
        _enter("optimizer")


def _in_backward() -> bool:
    """The autograd engine is running a backward on this thread (a hook inside it stepped the optimizer).

    Called unguarded before every step of the user's optimizer: a torch without the query, or one whose
    query fails, answers no."""
    import torch

    graph_task = getattr(torch._C, "_current_graph_task_id", None)
    try:
        return graph_task is not None and graph_task() != -1
    except Exception:  # noqa: BLE001 - a private query: never raise into the user's step
        return False


@guarded("counting steps")
def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    p = rank_probe()
    if p is None:
        return
    if _in_backward():
        _stepped_in_backward(optimizer)
        return
    if STATE.optimizer is None:
        STATE.optimizer = id(optimizer)
    elif STATE.optimizer != id(optimizer):
        return
    _count_step(p, optimizer)


def _stepped_in_backward(optimizer: Any) -> None:
    """The first optimizer step of a backward has the step told when the backward ends; the optimizers
    that stepped in it are kept for the step's snapshot until that has been read."""
    if STATE.backward_optimizers is None:
        from torch.autograd import Variable

        STATE.backward_optimizers = []
        Variable._execution_engine.queue_callback(_after_backward_steps)
    if not STATE.stepped_snapshot:
        STATE.backward_optimizers.append(optimizer)


@guarded("counting steps taken in backward")
def _after_backward_steps() -> None:
    optimizers, STATE.backward_optimizers = STATE.backward_optimizers, None
    p = rank_probe()
    if p is not None:
        _count_step(p, optimizers)


def _count_step(p: Any, optimizer: Any) -> None:
    """One step of the job: told, and read with ``optimizer`` (one, or a list) after the first."""
    if STATE.steps and STATE.step_started is None and STATE.root is not None:
        return  # no forward since the last step: this step's optimizer stepped again (a wrapper's, then the engine's)
    STATE.steps += 1
    started, STATE.step_started = STATE.step_started, None
    if STATE.in_engine_step and STATE.engine_steps is STATE.root:
        STATE.step_pending = (STATE.steps, started)  # the engine still holds the step's buffers: told on return
        return
    p.step(STATE.steps, seconds=time.perf_counter() - started if started is not None else None)
    if STATE.engine_steps is None or STATE.engine_steps is not STATE.root:
        _stepped_snapshot(p, optimizer)


def _stepped_snapshot(p: Any, optimizer: Any) -> None:
    if not STATE.stepped_snapshot and STATE.root is not None:
        STATE.stepped_snapshot = True
        _stop_looking_for_root()
        p.snapshot(STATE.root, stage="step", optimizer=_engine_optimizer(STATE.root) or optimizer)


def read_after_engine_steps(engine: Any) -> None:
    """The step's snapshot of a DeepSpeed engine once its ``step`` has returned: its optimizer has stepped
    every parameter group by then."""
    import functools

    step = engine.step

    @functools.wraps(step)
    def engine_step(*args: Any, **kwargs: Any) -> Any:
        outer = STATE.in_engine_step
        if not outer:
            _enter("optimizer")  # before the engine makes its step's copies (ZeRO-3's fp32 gradient partition)
        STATE.in_engine_step = True
        try:
            result = step(*args, **kwargs)
        finally:
            STATE.in_engine_step = outer
        if not outer:
            _after_engine_step()
        return result

    engine.step = engine_step
    STATE.engine_steps = engine


@guarded("reading the shards after the engine's step")
def _after_engine_step() -> None:
    """The step is told, and its shards read, once the engine's ``step`` returned: ZeRO-3 frees the fp32
    copy of its gradient partition only after the optimizer stepped, inside the engine's ``step``."""
    p = rank_probe()
    pending, STATE.step_pending = STATE.step_pending, None
    if p is None or STATE.engine_steps is not STATE.root:
        return
    if pending is not None:
        step, started = pending
        p.step(step, seconds=time.perf_counter() - started if started is not None else None)
    if STATE.steps:
        _stepped_snapshot(p, None)


def _engine_optimizer(root: Any) -> Any:
    """A DeepSpeed engine's own (ZeRO) optimizer: what its partitions are read from."""
    if any(c.__name__ == "DeepSpeedEngine" for c in type(root).__mro__):
        return getattr(root, "optimizer", None)
    return None
