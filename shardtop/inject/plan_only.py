"""``shardtop plan -- CMD``: the engines' entry points, patched to plan the model instead of running it.

The bootstrap installs ``PATCHES`` in place of ``engines.PATCHES`` when
``PLAN_ONLY_ENV`` names a directory.  In every rank of the command:

- the engines hand the model back unwrapped and note what they were asked
  (``asked.Asked``): ``deepspeed.initialize`` returns a stand-in engine that
  calls the model, ``FullyShardedDataParallel(...)`` and
  ``DistributedDataParallel(...)`` return the module itself, ``fully_shard``
  returns its module unsharded.  No engine partitions, moves or allocates
  anything: story 2's model, built whole, is never copied to a GPU;
- the optimizers are noted as they are made (their state per parameter); Fabric's
  check that no optimizer holds meta-device parameters passes (FSDP would have
  materialised a model built on the meta device; the stand-in does not);
- at the first call of the model, or of a module inside it (Lightning's
  ``training_step`` calls its submodules), the model on the meta
  device is traced at the shapes and dtypes of the batch just passed: the
  activations it saves for backward, nothing allocated (``plan_trace.py``:
  the model's own tensors are swapped for meta ones while it is traced);
- rank 0 writes the ``ScriptPlan``; every rank waits for the others (a
  barrier, when torch.distributed is up) and leaves with exit code 0 before
  the forward runs: no training step.

This module holds the patches and what they put in place of the engines;
what they note, and the planning at the first call, are ``plan_first_call.py``'s.

At ``deepspeed.initialize`` rank 0 already writes the plan without
activations, so a script that never reaches a forward (its loop needs more of
the engine than the stand-in has) is still planned, and says what it missed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from typing_extensions import Unpack

    from shardtop.inject.plan_first_call import HandedFacts

from shardtop.inject.plan_first_call import (
    STATE,
    global_rank,
    on_module_call,
    on_root_call,
    plan_at_exit,
    write_untraced,
)

# -- the hand-over -----------------------------------------------------------------------------


def _take(module: Any, engine: str, entry: str, policy_classes: tuple[type, ...] = (),
          **facts: Unpack[HandedFacts]) -> None:
    """An engine got ``module``: it becomes the root if it holds the one before (wrapping from the inside out)."""
    if not hasattr(module, "parameters"):
        return
    from shardtop.inject.model_hooks import contains

    if STATE.root is None:
        import atexit

        atexit.register(plan_at_exit)
        STATE.handed_on = {p.device.type for p in module.parameters()}
    if STATE.root is None or contains(module, STATE.root):
        if STATE.root_hook is not None:
            STATE.root_hook.remove()
        STATE.root = module
        STATE.root_hook = module.register_forward_pre_hook(on_root_call, with_kwargs=True)
    STATE.engine, STATE.entry = engine, entry
    STATE.facts.update(facts)
    if policy_classes:
        STATE.policy_classes = policy_classes


def _deepspeed_initialize(original: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        from shardtop.inject.engines import deepspeed_config, read_config, zero_stage

        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        config = read_config(deepspeed_config(args, kwargs)) or {}
        stage = zero_stage(config) or 0
        partitioned = any(hasattr(p, "ds_id") for p in model.parameters()) if model is not None else False
        _take(model, f"zero{stage}" if stage else "ddp", "deepspeed.initialize", deepspeed=config,
              partitioned=partitioned)
        if model is not None and global_rank() == 0:  # the stand-in may not carry the script to a forward
            write_untraced(model, "the command stopped before calling the model it handed to deepspeed.initialize")
        return _stand_in(model), kwargs.get("optimizer"), None, None

    return initialize


def _stand_in(model: Any) -> Any:
    """What ``deepspeed.initialize`` hands back while planning: calls go to the model itself."""
    import torch

    class PlanningEngine(torch.nn.Module):
        def __init__(self, module: Any) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

        @property
        def local_rank(self) -> int:
            return int(os.environ.get("LOCAL_RANK", "0") or 0)

        @property
        def device(self) -> Any:
            return next((p.device for p in self.module.parameters()), torch.device("cpu"))

    return PlanningEngine(model)


def _dtype_words(dtype: Any) -> str:
    name = str(dtype)
    return "fp16-mixed" if name.endswith("float16") and "b" not in name else "bf16-mixed" if "bfloat16" in name else ""


def _policy(policy: Any) -> tuple[tuple[type, ...], str]:
    """The module classes an FSDP1 auto-wrap policy wraps; or, for a policy not read here, its name."""
    if policy is None:
        return (), ""
    classes = getattr(policy, "_module_classes", None)
    if classes is None:
        keywords = getattr(policy, "keywords", None) or {}
        classes = keywords.get("transformer_layer_cls")
    if classes:
        return tuple(classes), ""
    return (), (
        getattr(policy, "__name__", None)
        or getattr(getattr(policy, "func", None), "__name__", "")
        or type(policy).__name__
    )


def _fsdp1_new(cls: type) -> Callable[..., Any]:
    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        module = kwargs.get("module", args[0] if args else None)
        sharding = kwargs.get("sharding_strategy")
        classes, unknown = _policy(kwargs.get("auto_wrap_policy"))
        STATE.units.append(module)
        facts: HandedFacts = {"sharding": getattr(sharding, "name", "") or "FULL_SHARD"}
        if kwargs.get("cpu_offload") is not None:
            facts["offload_params"] = bool(getattr(kwargs["cpu_offload"], "offload_params", False))
        mp = kwargs.get("mixed_precision")
        if mp is not None:
            facts["half"] = _dtype_words(getattr(mp, "param_dtype", None))
        if unknown:
            facts["policy_unknown"] = unknown
        _take(module, "fsdp1", "FullyShardedDataParallel", classes, **facts)
        return module

    return __new__


def _ddp_new(klass: type, *args: Any, **kwargs: Any) -> Any:
    module = kwargs.get("module", args[0] if args else None)
    _take(module, "ddp", "DistributedDataParallel")
    return module


def _fully_shard(original: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    @functools.wraps(original)
    def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        modules = list(module) if isinstance(module, (list, tuple)) else [module]
        facts: HandedFacts = {}
        mp = kwargs.get("mp_policy")
        if mp is not None and getattr(mp, "param_dtype", None) is not None:
            facts["half"] = _dtype_words(mp.param_dtype)
        if type(kwargs.get("offload_policy")).__name__ == "CPUOffloadPolicy":
            facts["offload_params"] = True
        mesh = kwargs.get("mesh")
        if mesh is not None:
            facts["mesh_dims"] = int(getattr(mesh, "ndim", 1))
            STATE.mesh_device = str(getattr(mesh, "device_type", "") or "")
        for m in modules:
            STATE.units.append(m)
            STATE.reshard[id(m)] = kwargs.get("reshard_after_forward", None) is not False
            _take(m, "fsdp2", "fully_shard", **facts)
        return module

    return fully_shard


# -- patches -----------------------------------------------------------------------------------


def _note_optimizer(original: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    @functools.wraps(original)
    def __init__(self: Any, params: Any, defaults: Any, *args: Any, **kwargs: Any) -> None:
        original(self, params, defaults, *args, **kwargs)
        if not STATE.optimizer:
            STATE.optimizer = type(self).__name__
            momentum = defaults.get("momentum", 0.0) if isinstance(defaults, dict) else 0.0
            STATE.momentum = float(momentum or 0.0)

    return __init__


def patch_torch(module: ModuleType) -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import Optimizer

    register_module_forward_pre_hook(on_module_call)
    Optimizer.__init__ = _note_optimizer(Optimizer.__init__)  # type: ignore[method-assign]


def patch_deepspeed(module: ModuleType) -> None:
    module.initialize = _deepspeed_initialize(module.initialize)  # type: ignore[attr-defined]


def patch_fsdp1(module: ModuleType) -> None:
    cls = module.FullyShardedDataParallel
    cls.__new__ = _fsdp1_new(cls)


def patch_ddp(module: ModuleType) -> None:
    module.DistributedDataParallel.__new__ = _ddp_new


def patch_fully_shard(module: ModuleType) -> None:
    if hasattr(module, "fully_shard"):
        module.fully_shard = _fully_shard(module.fully_shard)  # type: ignore[attr-defined]


def patch_trainer(module: ModuleType) -> None:
    import functools

    trainer = module.Trainer
    original = trainer.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        STATE.trainer_precision = str(kwargs.get("precision", "32-true"))
        original(self, *args, **kwargs)

    trainer.__init__ = __init__


def patch_fabric(module: ModuleType) -> None:
    """Fabric refuses an optimizer over meta-device parameters: FSDP would have materialised them, and the plan's
    stand-in hands the model back as it was given.  While planning, such a model is what the plan traces."""

    def no_meta_check(*args: Any, **kwargs: Any) -> bool:
        return False

    if hasattr(module, "_has_meta_device_parameters_or_buffers"):
        module._has_meta_device_parameters_or_buffers = no_meta_check  # type: ignore[attr-defined]


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "torch": patch_torch,
    "torch.nn.parallel.distributed": patch_ddp,
    "torch.distributed.fsdp.fully_sharded_data_parallel": patch_fsdp1,
    "torch.distributed.fsdp._fully_shard": patch_fully_shard,
    "torch.distributed._composable.fsdp": patch_fully_shard,
    "deepspeed": patch_deepspeed,
    "lightning.pytorch.trainer.trainer": patch_trainer,
    "lightning.fabric.fabric": patch_fabric,
}
"""Module name -> what to do once it loaded, while planning."""
