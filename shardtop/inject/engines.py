"""The engines' entry points, patched the moment their modules load (``PATCHES``).

- ``torch``: the global hooks that find the model, its phases and steps
  (``model_hooks.py``), for every engine and for a plain loop.
- Lightning's ``Trainer``: ``ShardtopCallback`` is added (unless it has one);
  the callback then drives the probe, and every other hook here stands aside
  in that process.
- ``deepspeed.initialize``, FSDP1's ``FullyShardedDataParallel``, FSDP2's
  ``fully_shard``, DDP's ``DistributedDataParallel``: the model is read as it
  is handed over (stage ``setup``: how the rank holds it before the engine
  does), the engine is named for the rank's hello, and an out-of-memory error
  raised inside is recorded before it goes on.  A DeepSpeed engine is read as
  soon as ``initialize`` returns it; the others when the model is first called.

Patching replaces one attribute; the wrapped functions keep their names,
signatures and attributes (``fully_shard.state``), and call straight through
where the probe is off.
"""

from __future__ import annotations

import os

from shardtop.inject.this_rank import (
    STATE,
    guarded,
    is_rank,
    rank_probe,
    record_failure,
)

TYPE_CHECKING = False  # no typing at start-up (see this_rank.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Handover = tuple[Any, str, str]
    """What an entry point is given: (the model or None, engine, strategy)."""

WRAPPED = "__shardtop_wrapped__"


def _wrap_entry(
    fn: Callable[..., Any],
    handover: Callable[[tuple[Any, ...], dict[str, object]], Handover],
    after: Callable[[Any], None] | None = None,
) -> Callable[..., Any]:
    import functools  # only where an engine loaded: no start-up cost elsewhere

    if getattr(fn, WRAPPED, False):
        return fn

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if STATE.off or STATE.lightning:
            return fn(*args, **kwargs)
        outermost = STATE.depth == 0  # FSDP1 builds its nested units inside its own __init__
        if outermost:
            _before(handover, args, kwargs)
        STATE.depth += 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            if outermost:
                record_failure(e)
            raise
        finally:
            STATE.depth -= 1
        if outermost and after is not None:
            after(result)
        return result

    setattr(entry, WRAPPED, True)
    return entry


@guarded("reading the model as the engine got it")
def _before(
    handover: Callable[[tuple[Any, ...], dict[str, object]], Handover],
    args: tuple[Any, ...],
    kwargs: dict[str, object],
) -> None:
    from shardtop.inject.model_hooks import contains, parameter_count
    from shardtop.probe.api import attach

    model, engine, strategy = handover(args, kwargs)
    if not STATE.strategy:
        STATE.engine, STATE.strategy = engine, strategy
    p = rank_probe()
    if p is None or model is None or not hasattr(model, "parameters") or not parameter_count(model):
        return
    if STATE.setup_root is None or contains(model, STATE.setup_root):
        STATE.setup_root = model
        attach(model, stage="setup", engine=STATE.engine, strategy=STATE.strategy)


def _module_arg(args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
    """``module`` of ``Wrapper.__init__(self, module, ...)``."""
    return kwargs.get("module", args[1] if len(args) > 1 else None)


# -- DeepSpeed --------------------------------------------------------------------------


def read_config(config: Any) -> dict[str, Any] | None:
    """A DeepSpeed config as a dict (given as one, or as a JSON file); None if it cannot be read."""
    if isinstance(config, (str, os.PathLike)):
        import json

        try:
            with open(config) as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
    return config if isinstance(config, dict) else None


def zero_stage(config: Any) -> int | None:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file), None if it cannot be read."""
    config = read_config(config)
    if config is None:
        return None
    try:
        return int(config.get("zero_optimization", {}).get("stage", 0))
    except (TypeError, ValueError, AttributeError):
        return None


def deepspeed_config(args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
    """The config ``deepspeed.initialize`` was given: ``config``, ``config_params`` or ``args.deepspeed_config``."""
    config = kwargs.get("config") or kwargs.get("config_params")
    if config is None:
        ds_args = kwargs.get("args", args[0] if args else None)
        config = getattr(ds_args, "deepspeed_config", None)
    return config


def _deepspeed_handover(args: tuple[Any, ...], kwargs: dict[str, object]) -> Handover:
    model = kwargs.get("model", args[1] if len(args) > 1 else None)
    stage = zero_stage(deepspeed_config(args, kwargs))
    if stage is None:
        return model, "", "deepspeed.initialize"
    return model, f"zero{stage}" if stage else "", f"deepspeed_stage_{stage}"


@guarded("reading the DeepSpeed engine")
def _after_deepspeed(result: Any) -> None:
    from shardtop.inject.model_hooks import read_after_engine_steps, set_root

    engine = result[0] if isinstance(result, tuple) and result else None
    if engine is not None and hasattr(engine, "parameters"):
        set_root(engine, stage="engine")
        if callable(getattr(engine, "step", None)):
            read_after_engine_steps(engine)


def patch_deepspeed(module: ModuleType) -> None:
    module.initialize = _wrap_entry(module.initialize, _deepspeed_handover, _after_deepspeed)  # type: ignore[attr-defined]


# -- torch: FSDP1, FSDP2, DDP, and the model's own calls -----------------------------------


def _patch_init(cls: type, engine: str) -> None:
    original = cls.__dict__["__init__"]
    cls.__init__ = _wrap_entry(  # type: ignore[misc]
        original, lambda args, kwargs: (_module_arg(args, kwargs), engine, cls.__name__)
    )


def patch_fsdp1(module: ModuleType) -> None:
    _patch_init(module.FullyShardedDataParallel, "fsdp1")


def patch_ddp(module: ModuleType) -> None:
    _patch_init(module.DistributedDataParallel, "ddp")


def patch_fully_shard(module: ModuleType) -> None:
    """``fully_shard`` shards one module per call: the model is read at its first call instead."""
    if hasattr(module, "fully_shard"):
        module.fully_shard = _wrap_entry(  # type: ignore[attr-defined]
            module.fully_shard, lambda args, kwargs: (None, "fsdp2", "fully_shard")
        )


@guarded("hooking torch")
def patch_torch(module: ModuleType) -> None:
    from shardtop.inject.model_hooks import install_global_hooks

    install_global_hooks()


# -- Lightning -------------------------------------------------------------------------------


@guarded("adding ShardtopCallback to the Trainer")
def _with_callback(callbacks: Any) -> list[Any] | None:
    """The Trainer's callbacks with ShardtopCallback added; None to leave them as they are."""
    if not is_rank():
        return None
    from shardtop.probe.callback import ShardtopCallback

    given = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    STATE.lightning = True
    if any(isinstance(c, ShardtopCallback) for c in given):
        return None
    return [*given, ShardtopCallback()]


def patch_trainer(module: ModuleType) -> None:
    import functools

    trainer = module.Trainer
    original = trainer.__init__
    if getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        callbacks = _with_callback(kwargs.get("callbacks"))
        if callbacks is not None:
            kwargs["callbacks"] = callbacks
        original(self, *args, **kwargs)

    setattr(__init__, WRAPPED, True)
    trainer.__init__ = __init__


def patch_dynamo(module: ModuleType) -> None:
    from shardtop.inject.model_hooks import dynamo_loaded

    dynamo_loaded(module)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "torch": patch_torch,
    "torch.nn.parallel.distributed": patch_ddp,
    "torch.distributed.fsdp.fully_sharded_data_parallel": patch_fsdp1,
    "torch.distributed.fsdp._fully_shard": patch_fully_shard,  # torch >= 2.6
    "torch.distributed._composable.fsdp": patch_fully_shard,  # torch 2.4-2.5 (and its re-export later)
    "deepspeed": patch_deepspeed,
    "lightning.pytorch.trainer.trainer": patch_trainer,
    "torch._dynamo": patch_dynamo,
}
"""Module name -> what to do once it loaded."""
