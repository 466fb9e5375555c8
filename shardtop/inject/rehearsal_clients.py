"""What a rehearsal changes in the Hugging Face clients (accelerate, and the ``Trainer`` that runs on it).

``CLIENT_PATCHES`` joins ``rehearsal.PATCHES``; like every rehearsal patch it
is installed only in a process that rehearses, the moment its module loads.

- accelerate's ``DataLoaderDispatcher`` (what ``prepare`` makes of a loader
  over an ``IterableDataset``, a streamed ``datasets`` one included, or any
  loader with ``dispatch_batches=True``): process 0 reads the batches of all
  processes, concatenates them and broadcasts the result; every other process
  makes empty tensors of the shape rank 0 sent (an object broadcast) and
  receives the values into them (a tensor broadcast).  Through the fake group
  neither arrives, and a rehearsed rank other than 0 failed at its first
  batch ("Unsupported types (<class 'NoneType'>) passed to
  `_gpu_broadcast_one`").  Such a rank now reads the batches itself, as
  process 0 would, and keeps them: it holds the same whole batch on its device
  as in the job, then takes its own slice of it.
- accelerate's FSDP2 loading (``cpu_ram_efficient_loading``,
  ``fsdp2_load_full_state_dict``): rank 0 broadcasts every parameter and the
  other ranks receive it into ``torch.empty``; through the fake group they
  kept that memory as it was.  A rehearsed rank holds the full state dict
  itself (it is its node's local rank 0, which loads the weights), so it
  distributes them as process 0 does, each rank cutting its own shard.
- transformers under ZeRO-3: a model built from its config (``from_config``,
  under ``deepspeed.zero.Init``) or loaded (``from_pretrained``) is filled on
  rank 0 alone, inside ``GatheredParameters(modifier_rank=0)``, and every other
  rank relies on the broadcast from rank 0 when the context ends.  Through the
  fake group that broadcast brings nothing: a rehearsed rank other than 0 kept
  the ``torch.empty`` its parameters were made with (values of 1e37 and NaN),
  its gradients overflowed, every optimizer step was skipped and it showed a
  third of the real rank's optimizer bytes.  While transformers fills the
  parameters (``initialize_weights_zero3``, ``_load_state_dict_into_zero3_model``),
  the rank of the default group reads 0 on every rehearsed rank: each
  initialises (or loads) the weights as rank 0 does, then keeps its own
  partition of them.  The ranks of explicit groups, which DeepSpeed partitions
  by, stay the real ones.

Nothing here imports accelerate, transformers or torch: the patches run inside
their own imports.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from shardtop.inject.patching import replace

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

AS_RANK_ZERO = "__shardtop_as_rank_zero__"


# -- accelerate ---------------------------------------------------------------------------


class _AsProcessZero:
    """A view of accelerate's ``PartialState`` (or its ``Accelerator``) in which this process is process 0."""

    process_index = 0
    is_main_process = True

    def __init__(self, state: Any) -> None:
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _ReadHere:
    """The batch this rank read for itself, where process 0 would have sent only its shape."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


def _fetch_batches(original: Callable[..., Any]) -> Callable[..., Any]:
    def fetch_batches(self: Any, iterator: Any) -> tuple[Any, list[Any]]:
        state = self.state
        if state.process_index == 0:
            result: tuple[Any, list[Any]] = original(self, iterator)
            return result
        self.state = _AsProcessZero(state)
        try:
            batch, info = original(self, iterator)
        finally:
            self.state = state
        if info[0] is not None:
            info = [_ReadHere(batch), *info[1:]]
        return batch, info

    return fetch_batches


def _initialize_tensors(original: Callable[..., Any]) -> Callable[..., Any]:
    def initialize_tensors(data_structure: Any) -> Any:
        if isinstance(data_structure, _ReadHere):
            return data_structure.batch
        return original(data_structure)

    return initialize_tensors


def patch_accelerate_data_loader(module: ModuleType) -> None:
    """``accelerate.data_loader``: a dispatching loader's batches read on every rehearsed rank."""
    dispatcher = getattr(module, "DataLoaderDispatcher", None)
    if dispatcher is None or not hasattr(module, "initialize_tensors"):
        return
    replace(dispatcher, "_fetch_batches", _fetch_batches)
    replace(module, "initialize_tensors", _initialize_tensors)


def _load_as_process_zero(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_full_state_dict(accelerator: Any, model: Any, full_sd: dict[str, object], *args: Any,
                             **kwargs: Any) -> Any:
        whole = bool(full_sd) and all((device := getattr(v, "device", None)) is not None and device.type != "meta"
                                      for v in full_sd.values())
        if whole and not accelerator.is_main_process:
            accelerator = _AsProcessZero(accelerator)
        return original(accelerator, model, full_sd, *args, **kwargs)

    return load_full_state_dict


def patch_accelerate_fsdp(module: ModuleType) -> None:
    """``accelerate.utils.fsdp_utils``: FSDP2's full state dict distributed on every rehearsed rank, as process 0
    distributes it.  Patched before ``fsdp2_prepare_model`` (same module) and ``accelerate.utils`` call it."""
    replace(module, "fsdp2_load_full_state_dict", _load_as_process_zero)


# -- transformers -------------------------------------------------------------------------


@contextlib.contextmanager
def _default_group_rank_zero() -> Iterator[None]:
    """``torch.distributed.get_rank()`` (the default group's rank, asked without a group) reads 0."""
    import torch.distributed as dist

    real = dist.get_rank
    if getattr(real, AS_RANK_ZERO, False) or not dist.is_initialized() or real() == 0:
        yield
        return

    def get_rank(group: Any = None) -> int:
        return 0 if group is None else int(real(group))

    setattr(get_rank, AS_RANK_ZERO, True)
    dist.get_rank = get_rank
    try:
        yield
    finally:
        dist.get_rank = real


def _as_rank_zero(original: Callable[..., Any]) -> Callable[..., Any]:
    def fill(*args: Any, **kwargs: Any) -> Any:
        with _default_group_rank_zero():
            return original(*args, **kwargs)

    return fill


def patch_transformers_deepspeed(module: ModuleType) -> None:
    """``transformers.integrations.deepspeed``: ZeRO-3 parameters filled on every rehearsed rank, as on rank 0.
    Patched before ``modeling_utils`` imports these names."""
    replace(module, "initialize_weights_zero3", _as_rank_zero)
    replace(module, "_load_state_dict_into_zero3_model", _as_rank_zero)


CLIENT_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "accelerate.data_loader": patch_accelerate_data_loader,
    "accelerate.utils.fsdp_utils": patch_accelerate_fsdp,
    "transformers.integrations.deepspeed": patch_transformers_deepspeed,
}
"""Module name -> what a rehearsal changes in it once it loaded (merged into ``rehearsal.PATCHES``)."""
