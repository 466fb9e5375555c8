"""A census of one rank's device memory by kind: the tensors and engine buffers it holds now.

``MemoryCensus.count()`` visits every place ``engine_buffers.py`` lists
(parameters and their shards and gathered copies, the tensors of a quantized
weight's ``quant_state``, gradients and gradient partitions, optimizer state
and master partitions, reduce buckets and all-gather buffers, module
buffers) and the activations still saved
(``activations.py``, while it runs), and adds up the storages on the rank's
device, each once, under the first kind that holds it (``KINDS``' order).  On
CUDA a storage counts as its allocator block, so the sum is comparable with
``allocated``; what it does not reach (temporaries, the batch, anything
unrecorded) is left to ``unexplained``.

It also returns where it found each storage (address -> kind): the
allocator trace's blocks are classified by it (``allocator_trace.py``).

Reading from the sampler thread while the training thread runs is safe in
the ways that matter: each attribute read is atomic under the GIL, and a
container changing size mid-read raises, which ``count`` reports as no
census this time.  Parameters are listed once per model (``set_target``), at
the first count after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from shardtop.collector import collector_paused
from shardtop.probe.activations import HeldStorage, SavedActivations
from shardtop.probe.allocator_timeline import BLOCK, block_bytes
from shardtop.probe.allocator_trace import KINDS, LOSS, OUTPUT
from shardtop.probe.engine_buffers import (
    FLAT_PARAM_TENSORS,
    FSDP2_COMM_CONTEXT,
    FSDP2_GROUP_TENSORS,
    FSDP2_PARAM_TENSORS,
    MASTER_PARTITIONS,
    ZERO_TENSORS,
    EngineHolders,
    gather_holders,
    tensors_in,
)
from shardtop.probe.shards import resolve_target
from shardtop.probe.shards.quantized import module_quant_state, quant_state, quant_state_tensors
from shardtop.probe.shards.table import local_tensor
from shardtop.rundir.memory_figures import MemoryKinds, OtherParts
from shardtop.units import ceil_div

_PLAIN = (torch.Tensor, torch.nn.Parameter)


@dataclass(frozen=True)
class KindCount:
    """One census: bytes per kind (None: not measured), and where each storage was found."""

    kinds: MemoryKinds
    addresses: dict[int, str]
    seconds: float
    """What the census cost, for the sampler's budget."""
    other_parts: OtherParts | None = None
    """``kinds.other`` by part: module buffers, the model's output (``OUTPUT``, while it is followed) and what
    the loss made of it (``LOSS``)."""

    @property
    def total(self) -> int:
        return sum(getattr(self.kinds, kind) or 0 for kind in KINDS)


class _Tally:
    """Storages counted so far: each address once, under the first kind that reached it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.index = device.index if self.cuda and device.index is not None else -1
        """``Tensor.get_device()`` of the rank's device: an int compare, cheaper than a device compare."""
        self.addresses: dict[int, str] = {}
        self.bytes = dict.fromkeys((*KINDS, OUTPUT, LOSS), 0)

    def add(self, kind: str, tensor: Any) -> None:
        if tensor is None:
            return
        if type(tensor) not in _PLAIN:
            tensor = local_tensor(tensor)  # a DTensor's shard
            if not isinstance(tensor, torch.Tensor):
                return
        if tensor.get_device() != self.index or (not self.cuda and tensor.is_meta):
            return
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address == 0 or address in self.addresses:
            return
        nbytes = storage.nbytes()
        if nbytes:
            self.addresses[address] = kind
            self.bytes[kind] += ceil_div(nbytes, BLOCK) * BLOCK if self.cuda else nbytes

    def add_all(self, kind: str, value: Any) -> None:
        for tensor in tensors_in(value):
            self.add(kind, tensor)

    def add_address(self, kind: str, address: int, nbytes: int) -> None:
        """A storage known by its address and size (a followed one, whose tensor the census cannot reach)."""
        if address and nbytes and address not in self.addresses:
            self.addresses[address] = kind
            self.bytes[kind] += block_bytes(nbytes, self.cuda)

    def add_storage(self, kind: str, storage: HeldStorage) -> None:
        if storage.device != self.device:
            return
        address, nbytes = storage.address, storage.nbytes
        if address and nbytes and address not in self.addresses:
            self.addresses[address] = kind
            self.bytes[kind] += block_bytes(nbytes, self.cuda)


class MemoryCensus:
    """Counts what a rank holds on its device, by kind, from the model and optimizer it was given."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = resolve_device(device)
        self.kept: Callable[[], list[tuple[int, int, int]] | None] | None = None
        """(address, bytes, device) of tensors kept from earlier steps (``kept.py``), when followed."""
        self._target: Any = None
        self._optimizer: Any = None
        self._holders: EngineHolders | None = None

    def set_target(self, target: Any, optimizer: Any = None) -> None:
        """The model (or wrapper, or engine) and optimizer to read; listed again at the next count."""
        self._target = target
        if optimizer is not None:  # an optimizer stays the model's across its wrappers
            self._optimizer = optimizer
        self._holders = None

    @property
    def has_target(self) -> bool:
        return self._target is not None

    def count(self, activations: SavedActivations | None = None, also: list[Any] | None = None) -> KindCount | None:
        """Bytes per kind now; None without a model, or when a container changed under the read.

        ``also``: engine objects found elsewhere (at an OOM, the ZeRO optimizer being built on the
        failing stack, before any engine holds it); read this once.  The garbage collector is paused meanwhile
        (``collector.py``).
        """
        if self._target is None and not also:
            return None
        started = time.perf_counter()
        with collector_paused():
            return self._read(activations, also, started)

    def _read(self, activations: SavedActivations | None, also: list[Any] | None, started: float) -> KindCount | None:
        try:
            holders = self._holders
            if holders is None:
                target = _wrapped_model(self._target) if self._target is not None else None
                holders = gather_holders(target, self._optimizer)
                if self._target is not None:
                    self._holders = holders
            if also:
                holders = holders.with_optimizers(also)
            tally = _Tally(self.device)
            _count(tally, holders, activations)
            kept = self.kept() if self.kept is not None else None
        except RuntimeError:  # "dictionary changed size during iteration": the next census will do
            return None
        measured = {"params", "grads", "other"}
        if kept is not None:
            for address, nbytes, device in kept:
                if device == tally.index:
                    tally.add_address("kept", address, nbytes)
            measured.add("kept")
        if holders.optimizers or holders.zero_optimizers:
            measured.add("optimizer")
        if holders.engine:
            measured.add("comm")
        if activations is not None and activations.failed is None:  # passed only while they are followed
            measured.add("activations")
            if activations.kept:
                measured.add("kept")
        figures = dict(tally.bytes)
        output, loss = figures.pop(OUTPUT), figures.pop(LOSS)
        parts = OtherParts(buffers=figures["other"], output=output, loss=loss)
        figures["other"] += output + loss  # the model's output and the loss's are shares of other, not kinds
        kinds = MemoryKinds(**{k: (v if k in measured else None) for k, v in figures.items()})
        return KindCount(kinds, tally.addresses, time.perf_counter() - started, parts)


def _wrapped_model(target: Any) -> Any:
    """What a census reads for ``target`` (a LightningModule stands for its trainer's wrapped model).

    A module that answers a missing attribute with something other than an
    AttributeError makes the shard reader fail (and say so); the census reads
    the module itself then.
    """
    try:
        return resolve_target(target)
    except Exception:  # noqa: BLE001
        return target


def resolve_device(device: str | torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: tensors report their device with an index."""
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
        resolved = torch.device("cuda", index)
    return resolved


def _count(tally: _Tally, holders: EngineHolders, activations: SavedActivations | None) -> None:
    add, add_all = tally.add, tally.add_all
    # Parameters: what is registered (a quantized weight's quant_state with it), ZeRO-3 partitions, FSDP shards
    # and gathered copies.
    for param in holders.params:
        add("params", param)
    for param in holders.quantized:
        for tensor in quant_state_tensors(quant_state(param)):
            add("params", tensor)
    for layer in holders.quantized_layers:  # the same storages where the weight still has its own: counted once
        for tensor in quant_state_tensors(module_quant_state(layer)):
            add("params", tensor)
    for param in holders.zero3:
        add("params", getattr(param, "ds_tensor", None))
    for flat in holders.flat_params:
        add("params", flat)  # its shard at rest, the gathered whole between forward and backward
        for name in FLAT_PARAM_TENSORS["params"]:
            add("params", getattr(flat, name, None))
    for fsdp_param in holders.fsdp2_params:
        for name in FSDP2_PARAM_TENSORS["params"]:
            add_all("params", getattr(fsdp_param, name, None))
    for zero in holders.zero_optimizers:
        for name in ZERO_TENSORS["params"]:
            add_all("params", getattr(zero, name, None))
    # Gradients.
    for param in holders.params:
        add("grads", param.grad)
    for flat in holders.flat_params:
        for name in FLAT_PARAM_TENSORS["grads"]:
            add("grads", getattr(flat, name, None))
    for fsdp_param in holders.fsdp2_params:
        for name in ("sharded_param", "_unsharded_param"):
            add("grads", getattr(getattr(fsdp_param, name, None), "grad", None))
        for name in FSDP2_PARAM_TENSORS["grads"]:
            add_all("grads", getattr(fsdp_param, name, None))
    for group in holders.fsdp2_groups:
        for name in FSDP2_GROUP_TENSORS["grads"]:
            add_all("grads", getattr(group, name, None))
    for zero in holders.zero_optimizers:
        for name in ZERO_TENSORS["grads"]:
            add_all("grads", getattr(zero, name, None))
        for name in MASTER_PARTITIONS:
            for master in tensors_in(getattr(zero, name, None)):
                add("grads", master.grad)
    # Optimizer state.
    for zero in holders.zero_optimizers:
        for name in ZERO_TENSORS["optimizer"]:
            add_all("optimizer", getattr(zero, name, None))
    for optimizer in holders.optimizers:
        for state in list(optimizer.state.values()):
            if isinstance(state, dict):
                for value in list(state.values()):
                    if isinstance(value, torch.Tensor):
                        add("optimizer", value)
    # Communication buffers.
    for zero in holders.zero_optimizers:
        for name in ZERO_TENSORS["comm"]:
            add_all("comm", getattr(zero, name, None))
    for group in holders.fsdp2_groups:
        for name in FSDP2_GROUP_TENSORS["comm"]:
            add_all("comm", getattr(group, name, None))
        context = getattr(group, "comm_ctx", None)
        for name in FSDP2_COMM_CONTEXT:
            add_all("comm", getattr(context, name, None))
    for wrapper in holders.ddp:
        tally.bytes["comm"] += ddp_bucket_bytes(wrapper, tally)
    # Module buffers (BatchNorm saves its running statistics for backward: they are not activations).
    for buffer in holders.buffers:
        add("other", buffer)
    if activations is not None:
        for storage, _ in activations.live_storages():
            tally.add_storage("activations", storage)
        for storage in activations.kept:  # graphs of earlier forwards, and their outputs: kept with them
            tally.add_storage("kept", storage)
        for tensor in activations.model_outputs():  # what the loss is computed from (logits), while held
            tally.add(OUTPUT, tensor)
        for storage in activations.loss:  # what the loss made of them (an fp32 copy, a log-softmax)
            tally.add_storage(LOSS, storage)


def ddp_bucket_bytes(wrapper: Any, tally: _Tally) -> int:
    """DDP's gradient buckets on this device, from its logging data (the buckets live in C++).

    With ``gradient_as_bucket_view`` the gradients are views of the buckets and
    were counted as gradients already; only buckets no gradient points into yet
    (before the first backward) remain.
    """
    try:
        data = wrapper._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - not built yet, or a torch without it
        return 0
    sizes = [
        int(part) for part in str(data.get("bucket_sizes", "") or "").replace(" ", "").split(",") if part.isdigit()
    ]
    params = [p for p in wrapper.module.parameters() if p.requires_grad]
    if not params or params[0].device != tally.device:  # the buckets sit with the parameters
        return 0
    total = sum(block_bytes(size, tally.cuda) for size in sizes)
    if data.get("gradient_as_bucket_view"):
        grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        total = max(0, total - grads)
    return total
