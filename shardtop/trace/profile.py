"""Saved activations of one forward pass on the meta device, per module.

What a training step keeps between forward and backward is what autograd
saves: ``torch.autograd.graph.saved_tensors_hooks`` sees every such tensor.
Each is counted once per storage (a view saved twice is one allocation) and
attributed to the innermost module running when it was saved; parameters and
their views are not activations and are not counted.

Meta kernels run in Python (about 0.5 ms per ``addmm``), so a forward over
18 000 layers would take seconds.  Modules that are built alike (same type,
same settings, same parameter shapes, same children) and called alike (same
input shapes and dtypes) save alike: the first call of each kind runs and is
recorded, the others replay the record - the same counts at their own rows,
outputs of the recorded shapes - without running any kernel.

A checkpointed region (``torch.utils.checkpoint``, as transformers'
gradient checkpointing and torch's ``checkpoint_wrapper`` call it) keeps only
its inputs; its own saves go to checkpoint's hooks, not to the rows.  While
tracing, those saves are counted too, per region (``_checkpoints_measured``):
what the region saves when it is not checkpointed is what the backward
recomputes and holds while it makes the region's gradients.

Traced as under autocast (``autocast.py``), the floating-point tensors are
counted in bytes, each in the dtype it was saved in, and autocast's copies
of the parameters are left out with the parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd
from torch.utils._pytree import tree_flatten, tree_unflatten

from shardtop.plan.description import Convolution
from shardtop.trace.autocast import CUDA_AUTOCAST, Autocast, AutocastPolicy
from shardtop.trace.checkpoints import Recomputed, Saved, checkpoints_measured, unpacked

Signature = tuple[Any, ...]

_SCALARS = frozenset({int, float, bool, str, type(None)})

_TENSOR = object()
"""The output spec of a call that returned one tensor (no pytree needed)."""


@dataclass(frozen=True)
class SavedCounts:
    """Per row: floating elements and other bytes saved for backward; the largest output; the shapes of
    convolution the forward ran; the checkpointed regions it ran and the largest of them."""

    saved_float: list[int]
    saved_other: list[int]
    largest_output: int
    convolutions: tuple[Convolution, ...] = ()
    checkpointed: int = 0
    largest_recomputed: Recomputed = Recomputed()
    saved_after_regions: Saved = Saved()
    """Saved outside the regions after the last one closed (a model's head, its loss): freed by the backward
    before it recomputes a region."""


@dataclass
class _Region:
    """A checkpointed region being traced: what it saves, each storage once."""

    counted: set[int]
    """Storages it does not hold itself: its inputs (kept by the checkpoint) and what it saved so far."""
    floats: int = 0
    other: int = 0
    largest_output: int = 0


@dataclass(frozen=True)
class _Saved:
    """One saved storage during a recorded call, relative to the call's module row."""

    offset: int
    kind: str
    """new (allocated inside the call), in (an input's storage), out (an output's storage), region (a
    checkpointed region ran)."""
    index: int
    """Which input or output (flattened), for ``in`` and ``out``."""
    floating: bool
    amount: int
    """Elements if floating, else bytes; for ``new`` only."""
    region: Recomputed | None = None
    """For ``region``."""


@dataclass(frozen=True)
class _Record:
    spec: Any
    leaves: tuple[Any, ...]
    """Per output leaf: ("tensor", shape, dtype, requires_grad), ("input", index) or ("value", v)."""
    saved: tuple[_Saved, ...]
    largest_output: int


@dataclass
class _Recording:
    row: int
    inputs: dict[int, int]
    """Storage id -> flattened input index."""
    depth: int = 0
    """The checkpointed regions open when the call began: its events are the saves at that depth."""
    events: list[tuple[int, int | None, bool, int] | Recomputed] = field(default_factory=list)
    """(row, storage id or None for a replayed allocation, floating, amount), or a checkpointed region that
    closed, in the order they came."""
    inputs_saved: set[int] = field(default_factory=set)


class _Profiler:
    def __init__(
        self, rows: dict[int, int], repeated: set[int], signatures: dict[int, int], ends: Sequence[int],
        floats_in_bytes: bool = False,
    ) -> None:
        n = len(ends)
        self.floats_in_bytes = floats_in_bytes
        """Count floating-point tensors in bytes, not elements: under autocast their dtypes differ."""
        self.rows = rows
        self.repeated = repeated
        self.signatures = signatures
        self.ends = ends
        self.saved_float = [0] * n
        self.saved_other = [0] * n
        self.largest_output = 0
        self.convolutions: dict[tuple[Any, ...], list[int]] = {}
        """A convolution's shape (``Convolution``'s fields but rows) -> the rows that ran it."""
        self.counted: set[int] = set()
        self.parameters: set[int] = set()
        """The parameters' storages."""
        self.keep: list[torch.Tensor] = []
        self.stack: list[int] = [0]
        self.recordings: list[_Recording] = []
        self.memo: dict[Signature, _Record | None] = {}
        self.regions: list[_Region] = []
        """The checkpointed regions open now, innermost last: what is saved inside goes to the innermost."""
        self.checkpointed = 0
        self.largest_recomputed = Recomputed()
        self.after_regions = Saved()

    # -- counting -------------------------------------------------------------

    def _add(self, row: int, sid: int | None, floating: bool, amount: int) -> None:
        depth = len(self.regions)
        if depth:
            region = self.regions[-1]
            if floating:
                region.floats += amount
            else:
                region.other += amount
        else:
            (self.saved_float if floating else self.saved_other)[row] += amount
            if self.checkpointed:
                self.after_regions = self.after_regions.plus(floating, amount)
        for rec in self.recordings:
            if rec.depth == depth and (sid is None or sid not in rec.inputs):
                rec.events.append((row, sid, floating, amount))

    def _count_tensor(self, row: int, t: torch.Tensor) -> None:
        """Count a saved tensor's storage once; tell every recording whose input it is, counted or not.

        An input saved by a recorded call may already be counted where it was
        recorded (saved earlier by the caller) and not where it is replayed,
        so the record keeps the fact and each replay decides afresh.
        """
        storage = t.untyped_storage()
        sid = id(storage)
        floating = t.is_floating_point()
        depth = len(self.regions)
        for rec in self.recordings:
            if rec.depth == depth and sid in rec.inputs and sid not in rec.inputs_saved:
                rec.inputs_saved.add(sid)
                rec.events.append((row, sid, floating, 0))
        if sid in self.counted:
            return
        counted = self.regions[-1].counted if depth else self.counted
        if sid in counted:
            return
        counted.add(sid)
        self.keep.append(t)
        nbytes = storage.nbytes()
        self._add(row, sid, floating, nbytes // t.element_size() if floating and not self.floats_in_bytes else nbytes)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self._count_tensor(self.stack[-1], t)
        return t

    def parameter_cast(self, source: torch.Tensor, copy: torch.Tensor) -> None:
        """Autocast's copy of a parameter (or of one of its views) is not an activation: the plan counts it
        with the parameters."""
        if id(source.untyped_storage()) in self.parameters:
            self.counted.add(id(copy.untyped_storage()))
            self.keep.append(copy)

    # -- checkpointed regions -------------------------------------------------------

    def open_region(self, held: Sequence[Any] = ()) -> None:
        """A checkpointed region begins; ``held``: its inputs, kept by the checkpoint whatever it saves."""
        self.regions.append(_Region({id(t.untyped_storage()) for t in held if isinstance(t, torch.Tensor)}))

    def close_region(self) -> None:
        region = self.regions.pop()
        self._region_ran(Recomputed(region.floats, region.other, region.largest_output))

    def _region_ran(self, region: Recomputed) -> None:
        """A region closed (or was replayed): counted where no other region holds it, and told to the
        recordings of its depth.  A region inside another is recomputed as a checkpoint again when the outer
        one is, so only the outermost are held whole in the backward."""
        depth = len(self.regions)
        if depth == 0:
            self.checkpointed += 1
            self.after_regions = Saved()
            if region.size > self.largest_recomputed.size:
                self.largest_recomputed = region
        else:
            self._output_in_region(region.largest_output)
        for rec in self.recordings:
            if rec.depth == depth:
                rec.events.append(region)

    def _output_in_region(self, numel: int) -> None:
        if self.regions:
            region = self.regions[-1]
            region.largest_output = max(region.largest_output, numel)

    # -- module calls -----------------------------------------------------------

    def call(
        self, original: Callable[..., Any], module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> Any:
        row = self.rows.get(id(module))
        if row is None:
            return original(module, *args, **kwargs)
        if isinstance(module, _ConvNd) and args and isinstance(args[0], torch.Tensor):
            self._convolution(module, args[0], row)
        flat = (
            list(args)
            if not kwargs and all(isinstance(a, torch.Tensor) for a in args)
            else tree_flatten((args, kwargs))[0]
        )
        key = self._key(module, flat) if id(module) in self.repeated else None
        if key is not None:
            record = self.memo.get(key)
            if record is not None:
                return self._replay(record, row, flat)
        recording = None
        if key is not None:
            recording = _Recording(
                row, {id(t.untyped_storage()): i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)},
                depth=len(self.regions),
            )
            self.recordings.append(recording)
        self.stack.append(row)
        try:
            out = original(module, *args, **kwargs)
        finally:
            self.stack.pop()
            if recording is not None:
                self.recordings.remove(recording)
        leaves, spec = ([out], _TENSOR) if isinstance(out, torch.Tensor) else tree_flatten(out)
        largest = max((t.numel() for t in leaves if isinstance(t, torch.Tensor)), default=0)
        self.largest_output = max(self.largest_output, largest)
        self._output_in_region(largest)
        if key is not None and recording is not None:
            self.memo[key] = self._record(recording, flat, leaves, spec, largest)
        return out

    def _convolution(self, conv: _ConvNd, x: torch.Tensor, row: int) -> None:
        key = (type(conv).__name__, tuple(x.shape), conv.out_channels, tuple(conv.kernel_size), tuple(conv.stride),
               _ints(conv.padding), tuple(conv.dilation), conv.groups, x.element_size())
        rows = self.convolutions.setdefault(key, [])
        if not (self.regions and row in rows):  # a reentrant checkpoint's region runs twice while traced
            rows.append(row)

    def convolution_shapes(self) -> tuple[Convolution, ...]:
        return tuple(
            Convolution(type=k[0], input=k[1], out_channels=k[2], kernel=k[3], stride=k[4], padding=k[5],
                        dilation=k[6], groups=k[7], dtype_bytes=k[8], rows=tuple(rows))
            for k, rows in self.convolutions.items()
        )

    def _key(self, module: nn.Module, flat: list[Any]) -> Signature:
        parts: list[Any] = [self.signatures[id(module)], module.training, torch.is_grad_enabled()]
        for leaf in flat:
            if isinstance(leaf, torch.Tensor):
                parts.append((tuple(leaf.shape), leaf.dtype, leaf.requires_grad))
            elif isinstance(leaf, (int, float, bool, str, type(None))):
                parts.append(leaf)
            else:
                parts.append(type(leaf).__qualname__)
        return tuple(parts)

    def _record(self, rec: _Recording, flat: list[Any], leaves: list[Any], spec: Any, largest: int) -> _Record | None:
        """What a replay needs, or None when the outputs are not plain tensors and values."""
        outputs = {id(t.untyped_storage()): i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}
        inputs_by_id = {id(t): i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        out_leaves: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if id(leaf) in inputs_by_id:
                    out_leaves.append(("input", inputs_by_id[id(leaf)]))
                elif leaf.layout != torch.strided or (
                    type(leaf) is not torch.Tensor and not isinstance(leaf, nn.Parameter)
                ):
                    return None
                else:
                    out_leaves.append(("tensor", tuple(leaf.shape), leaf.dtype, leaf.requires_grad))
            elif isinstance(leaf, (int, float, bool, str, type(None))):
                out_leaves.append(("value", leaf))
            else:
                return None
        saved: list[_Saved] = []
        for event in rec.events:
            if isinstance(event, Recomputed):
                saved.append(_Saved(0, "region", 0, False, 0, event))
                continue
            row, sid, floating, amount = event
            offset = row - rec.row
            if sid is not None and sid in rec.inputs:
                saved.append(_Saved(offset, "in", rec.inputs[sid], floating, 0))
            elif sid is not None and sid in outputs:
                saved.append(_Saved(offset, "out", outputs[sid], floating, 0))
            else:
                saved.append(_Saved(offset, "new", 0, floating, amount))
        return _Record(spec, tuple(out_leaves), tuple(saved), largest)

    def _replay(self, record: _Record, row: int, flat: list[Any]) -> Any:
        leaves: list[Any] = []
        for leaf in record.leaves:
            if leaf[0] == "tensor":
                _, shape, dtype, requires_grad = leaf
                t = torch.empty(shape, dtype=dtype, device="meta")
                leaves.append(t.requires_grad_() if requires_grad else t)
            elif leaf[0] == "input":
                leaves.append(flat[leaf[1]])
            else:
                leaves.append(leaf[1])
        for s in record.saved:
            target = row + s.offset
            if s.region is not None:
                self._region_ran(s.region)
            elif s.kind == "new":
                self._add(target, None, s.floating, s.amount)
            else:
                t = (flat if s.kind == "in" else leaves)[s.index]
                if isinstance(t, torch.Tensor):
                    self._count_tensor(target, t)
        self.largest_output = max(self.largest_output, record.largest_output)
        self._output_in_region(record.largest_output)
        return leaves[0] if record.spec is _TENSOR else tree_unflatten(leaves, record.spec)


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """``scaled_dot_product_attention`` saves what the fused kernels save, as on GPUs and CPUs.

    On the meta device SDPA always takes the math path, which saves the whole
    attention matrix (batch x heads x length x length, twice); the flash and
    memory-efficient kernels that CUDA and CPU pick save the inputs, the
    output and one row statistic.  The CPU flash kernel has a meta
    implementation and saves exactly that, so it stands in here.
    """
    original = F.scaled_dot_product_attention

    def fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              **kwargs: Any) -> torch.Tensor:
        if query.device.type != "meta" or kwargs or query.dim() != 4:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)
        try:
            # The op returns (output, logsumexp); the output is what SDPA returns.
            output: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
            return output
        except (RuntimeError, TypeError, AttributeError):
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)

    F.scaled_dot_product_attention = fused  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@contextlib.contextmanager
def _calls_through(profiler: _Profiler) -> Iterator[None]:
    """Every ``module(...)`` goes through the profiler while inside."""
    original = nn.Module.__call__

    def profiled_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return profiler.call(original, module, args, kwargs)

    nn.Module.__call__ = profiled_call  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__call__ = original  # type: ignore[method-assign]


def saved_activations(
    model: nn.Module,
    modules: Sequence[nn.Module],
    ends: Sequence[int],
    signatures: dict[int, int],
    forward_loss: Callable[[nn.Module], torch.Tensor],
    autocast: torch.dtype | None = None,
    policy: AutocastPolicy = CUDA_AUTOCAST,
) -> SavedCounts:
    """Run ``forward_loss(model)`` on meta tensors and count what autograd saves, per row.

    ``modules`` are the rows in pre-order; ``signatures`` maps ``id(module)`` to
    a number equal for modules built alike (see ``module_signatures``).
    ``autocast``: run the forward as under autocast to that dtype, with ``policy``'s lists (CUDA's:
    ``autocast.py``), and count floating-point tensors in bytes, each in the dtype it was saved in.
    """
    rows = {id(m): i for i, m in enumerate(modules)}
    counts: dict[int, int] = {}
    for sig in signatures.values():
        counts[sig] = counts.get(sig, 0) + 1
    repeated = {mid for mid, sig in signatures.items() if counts[sig] > 1}
    profiler = _Profiler(rows, repeated, signatures, ends, floats_in_bytes=autocast is not None)
    # held while tracing, so that no other storage takes one of their ids
    storages = [p.untyped_storage() for m in modules for p in m._parameters.values() if p is not None]
    profiler.parameters.update(id(s) for s in storages)
    profiler.counted.update(profiler.parameters)
    model.train()
    casts = (Autocast(autocast, policy, on_cast=profiler.parameter_cast) if autocast is not None
             else contextlib.nullcontext())
    with (
        fused_attention(),
        _calls_through(profiler),
        checkpoints_measured(profiler),
        torch.autograd.graph.saved_tensors_hooks(profiler.pack, unpacked),
        casts,
    ):
        loss = forward_loss(model)
    profiler.largest_output = max(profiler.largest_output, loss.numel())
    return SavedCounts(profiler.saved_float, profiler.saved_other, profiler.largest_output,
                       profiler.convolution_shapes(), profiler.checkpointed, profiler.largest_recomputed,
                       profiler.after_regions)


def _ints(padding: Any) -> tuple[int, ...]:
    """A convolution's padding as numbers (``padding="same"`` is -1 in each dimension)."""
    if isinstance(padding, str):
        return (-1,)
    return tuple(int(p) for p in padding)


def module_signatures(modules: Sequence[nn.Module], parents: Sequence[int], names: Sequence[str]) -> dict[int, int]:
    """``id(module)`` -> a number shared by modules built alike: type, settings, parameter shapes, children.

    Settings are the scalar attributes of the module (``in_features``,
    ``num_heads``, ``stride``...), so two attention layers with different head
    counts never share a number.  ``modules`` are in pre-order, so walking them
    backwards meets every child before its parent.
    """
    children: list[list[tuple[str, int]]] = [[] for _ in modules]
    interned: dict[Signature, int] = {}
    sig_of_row = [0] * len(modules)
    for i in range(len(modules) - 1, -1, -1):
        m = modules[i]
        settings = tuple((k, v) for k, v in m.__dict__.items() if k[0] != "_" and type(v) in _SCALARS)
        own = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m._parameters.items() if p is not None)
        bufs = tuple((n, tuple(b.shape), b.dtype) for n, b in m._buffers.items() if b is not None)
        sig = (type(m), settings, own, bufs, tuple(reversed(children[i])))
        sig_of_row[i] = interned.setdefault(sig, len(interned))
        if parents[i] >= 0:
            children[parents[i]].append((names[i], sig_of_row[i]))
    return {id(m): sig_of_row[i] for i, m in enumerate(modules)}
