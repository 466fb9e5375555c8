"""A rehearsal's fake process group, and the patches that let one process be rank R of N.

torch.distributed's fake backend (``torch.testing._internal.distributed.fake_pg``)
makes one process rank R of a world of N: every engine builds exactly rank R's
shards, partitions and buckets on the real device, and the collectives move no
data (an all-gather copies the input into every chunk, an all-reduce or a
reduce-scatter leaves its buffer as it is).  What is patched, the moment each
module loads (``PATCHES``), and only in a process that rehearses
(``rehearsal_env.this_process``):

- ``init_process_group``: whatever backend, store or rank the caller asks for,
  the group is the fake one, rank R of N.  ``new_group`` and ``split_group``
  make fake groups too (a gloo group beside NCCL would wait for peers that never
  come).  ``monitored_barrier`` returns at once, as the c10d function and as the
  group's own method (Fabric's ``rank_zero_first`` calls the method).
- object collectives (``broadcast_object_list``, ``all_gather_object``,
  ``gather_object``, ``scatter_object_list``, ``recv_object_list``) answer with
  this rank's own objects: through the fake group they would read lengths no peer
  ever sent, and unpickle garbage.
- DeepSpeed's checks that every rank agrees with rank 0 on a list pass (no peer exists).
  Its check that no parameter is in two optimizer groups is made in one pass: DeepSpeed
  0.19.8 makes it in time quadratic in the parameters, and story 2's 36 000 parameters
  spend minutes of set-up there on every rank, rehearsed or not, allocating nothing.
- DTensor's ``distribute_tensor`` cuts each rank's shard from the rank's own
  full tensor: its scatter from rank 0 brings nothing through the fake group.
- ZeRO-3's partitions are zero past the parameter's last element.  DeepSpeed
  leaves the padding of the last ranks' partitions as ``torch.empty`` left it,
  which a real all-gather drops; the fake one copies this rank's partition,
  padding and all, into every chunk of the gathered parameter.  With garbage
  there the forward overflows (loss inf), the overflow check skips every
  optimizer step, and the rehearsed rank never makes its optimizer state (rank
  7 of 8 with Adam: its fp32 master partition alone, a third of the bytes).
- DDP reduces its gradient buckets through a comm hook that hands each bucket
  back as it is.  DDP's own default (the reducer's all-reduce, run when no hook
  is registered) reads the collective's result from its future, and the fake
  group's futures hold None: without the hook the first backward fails with
  "expected the hook result is either a Tensor or a TensorList found None".
  The hook goes in at DDP's lazy set-up before the first forward, and only
  where the script registered none; a hook of the script's own (or a built-in
  one) reads that None too, and is left as it is.
- the launchers start one process instead of N: torchrun (and what runs through
  it, ``accelerate launch`` included) and the deepspeed launcher; that process
  is then given rank R's environment by its own bootstrap.
- Lightning's ``Trainer`` and ``Fabric`` are told ``devices=1, num_nodes=N``:
  rank R as the only process of node R, the one device there is.  A
  ``ModelParallelStrategy`` left to size its mesh itself gets the sizes the job
  it rehearses would give it, ``(num_nodes, devices)`` as the script asked.

What the Hugging Face clients (accelerate, the ``Trainer``) need besides is in
``rehearsal_clients.py``.

Everything here imports torch lazily: the patches run inside the modules'
own imports.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from shardtop.inject.patching import PATCHED, once, replace
from shardtop.inject.rehearsal_clients import CLIENT_PATCHES
from shardtop.inject.rehearsal_env import Rehearsed, this_process

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

def _rehearsed() -> Rehearsed:
    rehearsed = this_process()
    if rehearsed is None:  # pragma: no cover - the patches are installed only in a rehearsal
        raise RuntimeError("shardtop's rehearsal patches run outside a rehearsal")
    return rehearsed


# -- torch.distributed ------------------------------------------------------------------------


def _init_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the "fake" backend

        rehearsed = _rehearsed()
        timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
        extra = {"timeout": timeout} if timeout is not None else {}
        original(backend="fake", store=fake_pg.FakeStore(), rank=rehearsed.rank,
                 world_size=rehearsed.world_size, **extra)

    return init_process_group


def _fake_backend(original: Callable[..., Any], backend_at: int) -> Callable[..., Any]:
    """A group maker with its ``backend`` (positional at ``backend_at``) and options taken away: the
    group inherits the default group's backend, the fake one."""

    def make_group(*args: Any, **kwargs: Any) -> Any:
        args = args[:backend_at]
        kwargs.pop("backend", None)
        kwargs.pop("pg_options", None)
        return original(*args, **kwargs)

    return make_group


def _broadcast_object_list(original: Callable[..., Any]) -> Callable[..., Any]:
    def broadcast_object_list(object_list: list[Any], *args: Any, **kwargs: Any) -> None:
        return None  # every rank keeps its own objects: the fake group sends none

    return broadcast_object_list


def _all_gather_object(original: Callable[..., Any]) -> Callable[..., Any]:
    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        for i in range(len(object_list)):
            object_list[i] = obj

    return all_gather_object


def _gather_object(original: Callable[..., Any]) -> Callable[..., Any]:
    def gather_object(obj: Any, object_gather_list: list[Any] | None = None, *args: Any, **kwargs: Any) -> None:
        if object_gather_list is not None:
            for i in range(len(object_gather_list)):
                object_gather_list[i] = obj

    return gather_object


def _scatter_object_list(original: Callable[..., Any]) -> Callable[..., Any]:
    def scatter_object_list(
        output: list[Any], input: list[Any] | None = None, *args: Any, **kwargs: Any
    ) -> None:
        import torch.distributed as dist

        if input:
            group = kwargs.get("group")
            rank = dist.get_rank(group) if group is not None else dist.get_rank()
            output[0] = input[rank % len(input)]

    return scatter_object_list


def _recv_object_list(original: Callable[..., Any]) -> Callable[..., Any]:
    def recv_object_list(object_list: list[Any], *args: Any, **kwargs: Any) -> int:
        return _rehearsed().rank  # what arrives is what the list held

    return recv_object_list


def _monitored_barrier(original: Callable[..., Any]) -> Callable[..., Any]:
    def monitored_barrier(*args: Any, **kwargs: Any) -> None:
        return None

    return monitored_barrier


def _group_monitored_barrier(original: Callable[..., Any]) -> Callable[..., Any]:
    def monitored_barrier(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    return monitored_barrier


C10D_FUNCTIONS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "init_process_group": _init_process_group,
    "new_group": lambda f: _fake_backend(f, backend_at=2),
    "split_group": lambda f: _fake_backend(f, backend_at=5),
    "new_subgroups": lambda f: _fake_backend(f, backend_at=3),
    "broadcast_object_list": _broadcast_object_list,
    "all_gather_object": _all_gather_object,
    "gather_object": _gather_object,
    "scatter_object_list": _scatter_object_list,
    "recv_object_list": _recv_object_list,
    "monitored_barrier": _monitored_barrier,
}


def patch_c10d(module: ModuleType) -> None:
    """``torch.distributed.distributed_c10d``, before ``torch.distributed`` re-exports its names."""
    for name, make in C10D_FUNCTIONS.items():
        replace(module, name, make)
    group = getattr(module, "ProcessGroup", None)
    if isinstance(group, type):
        replace(group, "monitored_barrier", _group_monitored_barrier)
    top = sys.modules.get("torch.distributed")
    if top is not None:  # already loaded (the patch came late): its copies of the names too
        for name in C10D_FUNCTIONS:
            if hasattr(top, name):
                setattr(top, name, getattr(module, name))


def patch_distribute_tensor(module: ModuleType) -> None:
    """``torch.distributed.tensor._api``: ``distribute_tensor`` cuts this rank's shard from its own full tensor
    (``src_data_rank=None``) instead of receiving it by a scatter from rank 0, which the fake group never
    delivers: rank 3 of 4 got uninitialised memory for its shard.  Tensor parallelism distributes every
    weight this way, and accelerate's FSDP2 loading (``cpu_ram_efficient_loading``) every parameter."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def distribute_tensor(*args: Any, **kwargs: Any) -> Any:
            kwargs["src_data_rank"] = None
            return original(*args, **kwargs)

        return distribute_tensor

    replace(module, "distribute_tensor", make)


def _partition_rank(init: Any, param: Any) -> int:
    """This rank's place in the group the parameter is partitioned over, as ``_partition_param`` takes it:
    ``Init._partition_rank(param)`` in DeepSpeed 0.19.8, ``Init.get_partition_rank()`` in 0.18.9 (which
    axolotl 0.19.0 pins)."""
    by_param = getattr(init, "_partition_rank", None)
    return int(by_param(param) if by_param is not None else init.get_partition_rank())


def patch_zero3_partitions(module: ModuleType) -> None:
    """``deepspeed.runtime.zero.partition_parameters``: each partition's padding zeroed once the
    parameter is partitioned, so that a fake all-gather spreads finite values."""
    init = getattr(module, "Init", None)
    if init is None:
        return

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def _partition_param(self: Any, param: Any, *args: Any, **kwargs: Any) -> Any:
            done = original(self, param, *args, **kwargs)
            part = getattr(param, "ds_tensor", None)
            size = int(getattr(part, "ds_numel", 0) or 0)
            if part is not None and part.numel() == size > 0:  # not swapped out to NVMe
                held = max(0, min(size, int(param.ds_numel) - size * _partition_rank(self, param)))
                if held < size:
                    import torch

                    with torch.no_grad():
                        part.narrow(0, held, size - held).zero_()
            return done

        return _partition_param

    replace(init, "_partition_param", make)


# -- DDP ---------------------------------------------------------------------------------------


def _bucket_as_it_is(bucket: Any) -> Any:
    import torch

    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def patch_ddp(module: ModuleType) -> None:
    """``torch.nn.parallel.distributed``: a DDP that the script gave no comm hook reduces its buckets
    through one that returns each bucket as it is, what an all-reduce through the fake group leaves."""
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None:
        return

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def _lazy_init(self: Any) -> None:
            original(self)
            if not getattr(self, "_comm_hooks", ()) and not self._get_ddp_logging_data().get("comm_hook"):
                # Unannotated on purpose: DDP checks a hook's annotations against its own types.
                self.register_comm_hook(None, lambda state, bucket: _bucket_as_it_is(bucket))

        return _lazy_init

    replace(ddp, "_lazy_init", make)


# -- launchers ---------------------------------------------------------------------------------


def patch_torchrun(module: ModuleType) -> None:
    """``torch.distributed.run.run``: one node of one process, a rendezvous of its own on this host."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(args: Any) -> Any:
            args.standalone = True
            args.nnodes = "1"
            args.nproc_per_node = "1"
            args.node_rank = 0
            if hasattr(args, "max_restarts"):
                args.max_restarts = 0
            return original(args)

        return run

    replace(module, "run", make)


def patch_deepspeed_runner(module: ModuleType) -> None:
    """``deepspeed.launcher.runner``: one process on this host, whatever the hostfile and flags say."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def parse_args(*args: Any, **kwargs: Any) -> Any:
            parsed = original(*args, **kwargs)
            parsed.hostfile = "/nonexistent/shardtop-rehearsal-hostfile"
            parsed.include = parsed.exclude = ""
            parsed.num_nodes = 1
            parsed.num_gpus = 1
            parsed.force_multi = False
            return parsed

        return parse_args

    replace(module, "parse_args", make)


def patch_deepspeed_checks(module: ModuleType) -> None:
    """``deepspeed.runtime.zero.utils``: ZeRO-3's checks that every rank agrees on a list broadcast from
    rank 0 (trace orders, bucket contents) pass; no peer's list exists to agree with.  Patched before the
    modules that import these names load."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def agreed(*args: Any, **kwargs: Any) -> None:
            return None

        return agreed

    replace(module, "assert_ints_same_as_other_ranks", make)
    replace(module, "assert_lst_len_same_as_other_ranks", make)


def patch_deepspeed_engine(module: ModuleType) -> None:
    """``deepspeed.runtime.engine``: the duplicate-parameter check, the same assertion in one pass."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def _check_for_duplicates(self: Any, optimizer: Any) -> None:
            seen = Counter(id(p) for group in optimizer.param_groups for p in group["params"])
            for name, param in self.module.named_parameters():
                assert seen[id(param)] <= 1, (
                    f"Parameter with name: {name} occurs multiple times in optimizer.param_groups. "
                    "Make sure it only appears once to prevent undefined behavior."
                )

        return _check_for_duplicates

    replace(module.DeepSpeedEngine, "_check_for_duplicates", make)


# -- Lightning ---------------------------------------------------------------------------------


def one_device_per_node(kwargs: dict[str, object], world_size: int) -> dict[str, object]:
    """A Trainer's (or Fabric's) arguments for rank R as the only process of node R."""
    kwargs = dict(kwargs)
    asked_devices, asked_nodes = kwargs.get("devices", "auto"), kwargs.get("num_nodes", 1)
    strategy: Any = kwargs.get("strategy")
    if type(strategy).__name__ == "ModelParallelStrategy":  # its "auto" mesh follows devices and nodes
        per_node = asked_devices if isinstance(asked_devices, int) and asked_devices > 0 else world_size
        if getattr(strategy, "_data_parallel_size", None) == "auto":
            strategy._data_parallel_size = asked_nodes if isinstance(asked_nodes, int) else 1
        if getattr(strategy, "_tensor_parallel_size", None) == "auto":
            strategy._tensor_parallel_size = per_node
    kwargs["devices"] = 1
    kwargs["num_nodes"] = world_size
    return kwargs


def _one_device_init(cls: type) -> None:
    original = cls.__dict__["__init__"]
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **one_device_per_node(kwargs, _rehearsed().world_size))

    cls.__init__ = once(__init__)  # type: ignore[misc]


def patch_trainer(module: ModuleType) -> None:
    _one_device_init(module.Trainer)


def patch_fabric(module: ModuleType) -> None:
    _one_device_init(module.Fabric)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "torch.distributed.distributed_c10d": patch_c10d,
    "torch.distributed.run": patch_torchrun,
    "torch.nn.parallel.distributed": patch_ddp,
    "torch.distributed.tensor._api": patch_distribute_tensor,
    "deepspeed.launcher.runner": patch_deepspeed_runner,
    "deepspeed.runtime.zero.utils": patch_deepspeed_checks,
    "deepspeed.runtime.engine": patch_deepspeed_engine,
    "deepspeed.runtime.zero.partition_parameters": patch_zero3_partitions,
    "lightning.pytorch.trainer.trainer": patch_trainer,
    "lightning.fabric.fabric": patch_fabric,
    **CLIENT_PATCHES,
}
"""Module name -> what a rehearsal changes in it once it loaded."""


def install() -> None:
    """Patch the modules of ``PATCHES`` as they load (and those already loaded, now).

    For a process that is not started through the bootstrap: the preset runner.
    """
    from shardtop.inject.import_hook import PostImportHook

    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    if not any(isinstance(f, PostImportHook) and f.patches == PATCHES for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportHook(PATCHES))
