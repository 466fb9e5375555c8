"""Out-of-memory capture: which module, which engine step, how many bytes.

Nothing here runs per step.  At an OOM the exception's traceback already
holds the answer for forward and set-up failures: the innermost frame whose
``self`` is an ``nn.Module`` and whose code is a module call (``forward``,
``_call_impl``...) or a conversion (``_apply`` under ``.to()``/``.half()``...)
is the module that asked for the memory; where an engine casts parameter by
parameter (DeepSpeed's ``p.data = p.data.to(dtype)``), the parameter in hand
names it.  Engine frames (``DeepSpeedEngine._configure_distributed_model``,
FSDP's lazy init...) say which step of the engine was running.  A backward
OOM has no module frames (autograd runs in C++): ``tracker.py`` reads the
failed graph instead, or, honestly, only the phase is known.

On CUDA, ``install_cuda_oom_observer`` adds the exact requested size, the
NVML picture and the running autograd node at the moment the allocator gave
up (it fires before the exception is raised).

Which errors are OOMs, and what their messages say, is in ``oom_errors.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from shardtop.probe.allocator_cap import armed_cap
from shardtop.probe.memory import (
    ObservedOom,
    allocator_state,
    cuda_device_index,
    gpus_now,
    install_cuda_oom_observer,
    observation_matches,
    take_observation,
)
from shardtop.probe.names import module_names, user_type_name
from shardtop.probe.oom_errors import first_line, oom_path, parse_requested_bytes
from shardtop.probe.tracker import TrackedModule, blame_backward
from shardtop.rundir.events import AttributedBy, Oom

__all__ = [
    "ObservedOom", "attribute", "install_cuda_oom_observer", "observation_matches", "pick_culprit",
    "pick_engine_step",
]

FORWARD_FRAMES = frozenset({"forward", "_call_impl", "_wrapped_call_impl", "inner"})
"""Code names of the frames a module call runs through."""
APPLY_FRAMES = frozenset({
    "_apply", "to", "to_empty", "_to_empty", "cuda", "cpu", "xpu", "mtia", "half", "float", "double",
    "bfloat16", "type", "share_memory", "_load_from_state_dict",
})
"""Code names of the frames that convert or move a module's tensors."""

CASTING_STEPS = frozenset({"DeepSpeedEngine._configure_distributed_model"})
"""Engine steps that move or cast parameters one by one: the parameter in hand is the culprit.
Elsewhere (``_configure_zero_optimizer`` allocating its buckets) it is only the loop's last item."""

INIT_FRAMES = frozenset({"_post_init_method"})
"""deepspeed.zero.Init's hook run as each module is constructed; its ``module`` is not in any tree yet."""
INIT_WRAPPER = ("deepspeed/runtime/zero/partition_parameters.py", "wrapper")
"""The wrapper zero.Init puts around every module class's ``__init__``: its ``module`` is being built
(an OOM allocating the module's own parameters strikes there, before ``_post_init_method``)."""

ENGINE_STEPS = (
    "DeepSpeedEngine._configure_distributed_model", "DeepSpeedEngine._configure_zero_optimizer",
    "DeepSpeedEngine._configure_bf16_optimizer", "DeepSpeedEngine._configure_fp16_optimizer",
    "DeepSpeedEngine._configure_basic_optimizer", "DeepSpeedEngine._configure_optimizer",
    "DeepSpeedEngine._broadcast_model", "DeepSpeedEngine.backward", "DeepSpeedEngine.step",
    "DeepSpeedEngine.__init__", "FullyShardedDataParallel.__init__", "_init_param_handle_from_module",
    "_move_module_to_device", "_materialize_meta_module", "_materialize_with_param_init_fn", "_lazy_init",
    "fully_shard", "FSDPParamGroup.lazy_init",
)
"""Engine-level steps, named as users and diagnoses know them (``co_qualname``)."""
ENGINE_INTERNALS = (
    "DeepSpeedZeroOptimizer_Stage3.__init__", "DeepSpeedZeroOptimizer.__init__", "DeepSpeedZeRoOffload.__init__",
    "BF16_Optimizer.__init__", "Init.__init__", "DeepSpeedZeroOptimizer_Stage3.step", "DeepSpeedZeroOptimizer.step",
    "FlatParamHandle.__init__", "FlatParamHandle.unshard", "_unshard", "_pre_forward_unshard",
    "_pre_backward_hook", "_post_backward_hook", "_reduce_grad", "FSDPParamGroup.unshard",
    "FSDPParamGroup.post_backward", "foreach_all_gather", "foreach_reduce",
)
"""Finer engine steps, used when no engine-level step is on the stack."""
ENGINE_PATHS = ("/deepspeed/", "/torch/distributed/fsdp/", "/torch/distributed/_composable/", "/torch/nn/parallel/")
PLUMBING = frozenset({"wrapped_fn", "wrapper", "inner", "decorate_context", "_fn", "__call__", "__enter__", "__exit__"})
"""Decorator and context-manager frames that say nothing about the engine step."""
BACKWARD_FRAMES = {
    ("torch/autograd/graph.py", "_engine_run_backward"): "t_outputs",
    ("torch/autograd/__init__.py", "backward"): "tensors",
    ("torch/_tensor.py", "backward"): "self",
}
"""Frames showing that a backward ran, whatever the phase said, and the local holding its outputs."""

MAX_TRACEBACK = 40


# -- the failing stack ---------------------------------------------------------------------


@dataclass(frozen=True)
class StackFrame:
    """One frame of the failing stack, reduced to what attribution needs."""

    filename: str
    lineno: int
    name: str
    """``co_name``: what frame kinds are recognised by."""
    qualname: str
    """``Class.method`` (``co_qualname``; before Python 3.11, the class of ``self`` plus the name)."""
    module: Any = None
    """The frame's ``self`` when it is an ``nn.Module``."""
    params: tuple[Any, ...] = ()
    """``nn.Parameter`` locals: what a per-parameter cast was converting."""
    outputs: tuple[Any, ...] = ()
    """The tensors a backward frame was differentiating (the loss)."""
    being_built: Any = None
    """The module being constructed: the ``self`` of an ``nn.Module``'s ``__init__``, or the module
    ``deepspeed.zero.Init`` was partitioning as it was constructed."""
    zero_init: bool = False
    """``being_built`` is zero.Init's (its wrapper or its hook), not a plain ``__init__``."""


def _describe(frame: FrameType, lineno: int, torch: Any) -> StackFrame:
    code = frame.f_code
    try:
        local_values = dict(frame.f_locals)
    except Exception:  # noqa: BLE001 - a broken frame must not break attribution
        local_values = {}
    this = local_values.get("self")
    module = this if torch is not None and isinstance(this, torch.nn.Module) else None
    params = tuple(v for v in local_values.values() if torch is not None and isinstance(v, torch.nn.Parameter))
    outputs: tuple[Any, ...] = ()
    local = backward_local(code.co_filename, code.co_name)
    if local is not None and torch is not None:
        value = local_values.get(local)
        values = value if isinstance(value, (tuple, list)) else (value,)
        outputs = tuple(v for v in values if isinstance(v, torch.Tensor))
    qualname = getattr(code, "co_qualname", None)
    if qualname is None:
        qualname = f"{type(this).__name__}.{code.co_name}" if this is not None else code.co_name
    builds = code.co_name in INIT_FRAMES or (
        code.co_name == INIT_WRAPPER[1] and code.co_filename.replace("\\", "/").endswith(INIT_WRAPPER[0])
    )
    constructs = code.co_name == "__init__" and not _in_engine(code.co_filename)  # an engine's is no model's
    built = local_values.get("module") if builds else module if constructs else None
    being_built = built if torch is not None and isinstance(built, torch.nn.Module) else None
    return StackFrame(code.co_filename, lineno, code.co_name, qualname, module, params, outputs, being_built, builds)


def stack_of(exc: BaseException) -> list[StackFrame]:
    """The failing stack, outermost first, across the chain from ``exc`` to the OOM it wraps."""
    torch = sys.modules.get("torch")
    frames: list[StackFrame] = []
    last: FrameType | None = None
    for error in oom_path(exc) or [exc]:
        tb = error.__traceback__
        while tb is not None:
            if tb.tb_frame is not last:  # else: the frame that caught the inner error and raised this one
                frames.append(_describe(tb.tb_frame, tb.tb_lineno, torch))
                last = tb.tb_frame
            tb = tb.tb_next
    return frames


# -- pure attribution ------------------------------------------------------------------------


@dataclass(frozen=True)
class Culprit:
    index: int
    """Index of the frame in the stack."""
    attributed_by: AttributedBy
    """forward-frame or apply-frame."""


def frame_kind(name: str) -> AttributedBy | None:
    """forward-frame, apply-frame or None, from a frame's ``co_name``."""
    if name in FORWARD_FRAMES:
        return "forward-frame"
    return "apply-frame" if name in APPLY_FRAMES else None


def pick_culprit(frames: Sequence[tuple[str, object | None]]) -> Culprit | None:
    """The innermost module frame among ``(co_name, module or None)`` pairs, outermost first."""
    for index in range(len(frames) - 1, -1, -1):
        name, module = frames[index]
        kind = frame_kind(name)
        if module is not None and kind is not None:
            return Culprit(index, kind)
    return None


def pick_engine_step(frames: Sequence[tuple[str, str]]) -> str | None:
    """The most telling engine step among ``(qualname, filename)`` pairs, outermost first.

    Engine-level steps (``DeepSpeedEngine._configure_zero_optimizer``) beat
    engine internals (``DeepSpeedZeroOptimizer_Stage3.__init__``), which beat
    any other frame in an engine's files but decorators and the wrappers'
    ``forward`` (a module call, not a step); the innermost of a tier wins.
    """
    for tier in (ENGINE_STEPS, ENGINE_INTERNALS):
        for qualname, filename in reversed(frames):
            if _in_engine(filename) and any(qualname == n or qualname.endswith("." + n) for n in tier):
                return qualname
    for qualname, filename in reversed(frames):
        name = qualname.rsplit(".", 1)[-1]
        if _in_engine(filename) and "<" not in qualname and name not in PLUMBING and name not in FORWARD_FRAMES:
            return qualname
    return None


def _in_engine(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return any(marker in path for marker in ENGINE_PATHS)


def backward_local(filename: str, name: str) -> str | None:
    """For a frame that runs a backward, the local holding what it differentiates; else None."""
    path = filename.replace("\\", "/")
    for (suffix, frame_name), local in BACKWARD_FRAMES.items():
        if name == frame_name and path.endswith(suffix):
            return local
    return None


def short_file(filename: str) -> str:
    """``…/site-packages/torch/nn/modules/module.py`` -> ``torch/nn/modules/module.py``."""
    path = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return "/".join(path.split("/")[-3:])


def format_stack(frames: Sequence[StackFrame], limit: int = MAX_TRACEBACK) -> list[str]:
    """``file:line in qualname``, outermost first; the middle is elided beyond ``limit``."""
    lines = [f"{short_file(f.filename)}:{f.lineno} in {f.qualname}" for f in frames]
    if len(lines) <= limit:
        return lines
    head, tail = 5, limit - 6
    return [*lines[:head], f"… {len(lines) - head - tail} frames …", *lines[-tail:]]


def unique_paths(paths: Sequence[str | None]) -> list[str]:
    """Paths in order, each once, ``None`` dropped."""
    return list(dict.fromkeys(p for p in paths if p is not None))


def resolve_paths(modules: Sequence[Any], names: dict[int, str]) -> list[str | None]:
    """Clean paths of ``modules`` (outermost first), guessing those ``names`` lacks.

    ``names`` is learnt at set-up; an OOM inside an engine's init can strike
    before that.  A missing module is looked up under the nearest outer module
    on the stack whose path is known, else under the outermost one, taken as
    the root (in every stack seen so far, the user's model).
    """
    paths: list[str | None] = [names.get(id(m)) for m in modules]
    below: dict[int, dict[int, str]] = {}
    for i, module in enumerate(modules):
        for j in range(i - 1, -2, -1):
            if paths[i] is not None:
                break
            anchor, base = (modules[j], paths[j]) if j >= 0 else (modules[0], "")
            if base is None:
                continue
            if id(anchor) not in below:
                below[id(anchor)] = module_names(anchor)
            relative = below[id(anchor)].get(id(module))
            if relative is not None:
                paths[i] = f"{base}.{relative}" if base and relative else base or relative
    return paths


@dataclass(frozen=True)
class Blame:
    """A module named from the stack."""

    path: str
    type_name: str
    attributed_by: AttributedBy


def blame_from_stack(
    frames: Sequence[StackFrame], names: dict[int, str], engine_step: str | None = None
) -> tuple[Blame | None, list[str]]:
    """The module the stack names, and the paths of the modules called on it (outermost first).

    The innermost module call or conversion frame names it; failing that, the
    parameter an engine frame holds (an engine casting or moving parameters
    one by one), found under the modules whose methods are on the stack.  An
    optimizer's parameter loop is not such a frame: its OOM is the phase's.
    """
    indices = [i for i, f in enumerate(frames) if f.module is not None and frame_kind(f.name)]
    built = model_being_built(frames)  # where the model's own construction is on the stack: its root
    anchors = [built] if built is not None else []
    paths = resolve_paths([*anchors, *(frames[i].module for i in indices)], names)[len(anchors):]
    culprit = pick_culprit([(f.name, f.module) for f in frames])
    if culprit is not None:
        path = paths[indices.index(culprit.index)]
        if path is not None:
            return Blame(path, user_type_name(frames[culprit.index].module), culprit.attributed_by), unique_paths(paths)
    holder = next((f for f in reversed(frames) if f.params), None)
    if holder is not None and _in_engine(holder.filename) and engine_step in CASTING_STEPS:
        for anchor in _unique(f.module for f in frames if f.module is not None):
            owner = next(
                (m for m in anchor.modules() if any(p is holder.params[-1] for p in m.parameters(False))), None
            )
            path = resolve_paths([anchor, owner], names)[1] if owner is not None else None
            if path is not None:  # a cast or move like _apply's, done parameter by parameter
                return Blame(path, user_type_name(owner), "apply-frame"), unique_paths([*paths, path])
    return None, unique_paths(paths)


def model_being_built(frames: Sequence[StackFrame]) -> Any:
    """The outermost module under construction on the stack (the model whose ``__init__`` was running)."""
    return next((f.being_built for f in frames if f.being_built is not None), None)


def built_path(frames: Sequence[StackFrame], names: dict[int, str]) -> tuple[str | None, StackFrame | None]:
    """The path of the innermost module under construction where it is already attached to the model
    being built (else None), and its frame."""
    frame = next((f for f in reversed(frames) if f.being_built is not None), None)
    if frame is None:
        return None, None
    model = model_being_built(frames)
    if model is frame.being_built:  # built on its own (a layer made in a loop): no model to name it in
        return None, frame
    return resolve_paths([model, frame.being_built], names)[1], frame


def _unique(items: Iterable[Any]) -> list[Any]:
    return list({id(item): item for item in items}.values())


# -- the event ----------------------------------------------------------------------------------


def attribute(
    exc: BaseException,
    *,
    names: dict[int, str],
    phase: str,
    step: int,
    device: str,
    tracker: Any = None,
    limit: int | None = None,
) -> Oom:
    """The ``Oom`` event for ``exc``; reads the exception, never changes it.

    Precedence: a module frame (or a parameter being cast) on the stack; in a
    backward, the tracker (also over the root module's own frame); else the
    engine step alone; else only the phase.
    """
    message = str((oom_path(exc) or [exc])[-1])
    frames = stack_of(exc)
    engine_step = pick_engine_step([(f.qualname, f.filename) for f in frames])
    blame, module_stack = blame_from_stack(frames, names, engine_step)
    index = cuda_device_index(device)
    parsed = parse_requested_bytes(message)
    observation = take_observation(index, parsed)
    tracked: TrackedModule | None = None
    if phase == "backward" or any(f.outputs for f in frames):
        outermost = next((f.module for f in frames if f.module is not None), None)  # a LightningModule's backward
        roots = _unique(m for m in (getattr(tracker, "root", None), outermost) if m is not None)
        node = observation.autograd_node if observation is not None else None
        outputs = [t for f in frames for t in f.outputs]
        tracked = blame_backward(roots, outputs, names, tracker, node)

    module: str | None = None
    module_type: str | None = None
    attributed_by: AttributedBy = "engine-step" if engine_step else "phase"
    if blame is not None and not (blame.path == "" and tracked is not None):
        module, module_type, attributed_by = blame.path, blame.type_name, blame.attributed_by
    elif tracked is not None:
        module, module_type, attributed_by = tracked.path, tracked.type_name or None, "tracker"
    else:
        path, built = built_path(frames, names)
        if built is not None:  # no path where it is not attached to its parent yet
            module, module_type = path, user_type_name(built.being_built)
            attributed_by = "init-frame" if any(f.zero_init for f in frames) else "build-frame"
    allocated: int | None = None
    reserved: int | None = None
    total: int | None = None
    if index is not None:
        state = allocator_state(index)
        if state is not None:
            allocated, reserved, total = state
    elif (cap := armed_cap()) is not None:  # gpu_mem_limit on CPU, kept by the allocator
        allocated = cap.held()
        if observation is not None and limit is None and total and observation.device_total < total:
            limit = observation.device_total
    return Oom(
        phase=phase,
        step=step,
        module=module,
        module_type=module_type,
        attributed_by=attributed_by,
        engine_step=engine_step,
        module_stack=module_stack,
        requested_bytes=observation.requested if observation is not None else parsed,
        device=device,
        allocated=allocated,
        reserved=reserved,
        total=total,
        limit=limit,
        gpus=observation.gpus if observation is not None and observation.gpus is not None else gpus_now(),
        message=first_line(message),
        traceback=format_stack(frames),
    )
