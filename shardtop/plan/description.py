"""What a plan knows about a model: its module tree, its parameters, its activations.

Torch-free on purpose: a description is made once per model (on the meta
device, in ``describe.py``) and then every plan of every strategy is plain
arithmetic on it, cheap enough to redo on each keystroke of a launch prompt.
It is a msgspec struct, so it can also be cached or handed over as JSON.

Rows are the model's modules in pre-order (a parent before its children), as
in the ``Tree`` event: the subtree of row ``r`` is rows ``r .. end[r] - 1``,
so a sum over any subtree is one subtraction of prefix sums.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec

from shardtop.units import ceil_div


class Elements(NamedTuple):
    """Elements of parameters (of ``ModelDescription.dtype_bytes``): those an engine stores, casts and gathers in
    the dtype it computes in, and the packed 4-bit weights, which every engine holds as they are stored."""

    plain: int
    packed: int = 0

    def bytes(self, plain_bytes: int, stored_bytes: int) -> int:
        """Bytes with each plain element at ``plain_bytes`` and each packed one at ``stored_bytes``."""
        return self.plain * plain_bytes + self.packed * stored_bytes

    def share_bytes(self, ranks: int, plain_bytes: int, stored_bytes: int) -> int:
        """Bytes of one rank's part when every parameter is split flat over ``ranks`` (ZeRO-3): one flat count
        where all elements are alike, else the plain and the packed each split."""
        if plain_bytes == stored_bytes or not self.packed:
            return ceil_div(self.plain + self.packed, ranks) * plain_bytes
        return ceil_div(self.plain, ranks) * plain_bytes + ceil_div(self.packed, ranks) * stored_bytes


class Convolution(msgspec.Struct, frozen=True, kw_only=True):
    """One shape of convolution the model's forward ran (a ``Conv*d`` or ``ConvTranspose*d`` call).

    cuDNN picks an algorithm for each shape on the GPU, and its workspace with it: the plan looks the
    shape up among measured ones (``workspaces.py``).
    """

    type: str
    """``Conv2d``, ``ConvTranspose2d``..."""
    input: tuple[int, ...]
    """The input's shape, batch first."""
    out_channels: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    dtype_bytes: int
    rows: tuple[int, ...]
    """The rows of the modules that ran it."""


class ModelDescription(msgspec.Struct, frozen=True, kw_only=True, weakref=True):
    """A model's structure, parameter sizes and one forward pass's saved activations.

    Per-row quantities are stored as running totals over the rows (``*_upto``,
    one longer than the rows): the sum over the subtree of ``r`` is
    ``upto[end[r]] - upto[r]``, and a row's own value ``upto[r + 1] - upto[r]``.
    """

    name: str
    """What was built, e.g. ``SequentialLinear(n_layers=18000, width=512)``."""
    names: list[str]
    """Last path segment of each row; the root's is ``""``."""
    parents: list[int]
    end: list[int]
    """One past the last row of each row's subtree."""
    types: list[str]
    numel_upto: list[int]
    """Running total of the elements of each module's *own* parameters, in elements of ``dtype_bytes``: a
    parameter stored in another dtype counts the elements of that size its storage fills (``describe.py``)."""
    small_upto: list[int]
    """Running total of the elements in parameters smaller than ``small_threshold`` elements each."""
    small_threshold: int
    largest_param: int
    """Elements of the largest single parameter."""
    dtype_bytes: int
    """Bytes per element of the parameters as built (4 for fp32)."""
    buffer_bytes: int
    """Buffers (BatchNorm statistics and the like), whole on every rank."""
    repeated_blocks: list[int]
    """Rows of the repeated siblings a type-based auto-wrap policy would make units."""
    saved_float_upto: list[int]
    """Running total of the floating-point elements each row's module saved for backward in one forward."""
    saved_other_upto: list[int]
    """Running total of the bytes of non-floating saved tensors (indices, masks)."""
    saved_autocast_upto: list[int] = []
    """Running total of the bytes of the floating-point tensors each row's module saved in one forward run as
    under CUDA's autocast to a 2-byte dtype, each in the dtype it was saved in: half for what matmuls,
    convolutions and attention save, fp32 for what LayerNorm, softmax or a loss saves and for what was fp32
    already (``trace/autocast.py``).  Empty where the forward was not traced so."""
    largest_output: int
    """Elements of the largest tensor a module returned: the transient of forward and backward."""
    input_bytes: int
    """Bytes of one batch as it reaches the model."""
    batch_size: int
    convolutions: tuple[Convolution, ...] = ()
    """Each shape of convolution one forward ran, in the order first run."""
    trainable: int | None = None
    """Elements of the parameters that require gradients (LoRA: the adapters); None where not known
    (every parameter is then taken as trained)."""
    checkpointed: int = 0
    """Checkpointed regions one forward ran (``torch.utils.checkpoint``: a decoder layer each under
    transformers' gradient checkpointing); each saved its inputs only, counted in the rows."""
    recomputed_float: int = 0
    """Floating-point elements the largest checkpointed region saves when it is not checkpointed: the
    backward recomputes it and holds all of them while it makes the region's gradients."""
    recomputed_other: int = 0
    """Bytes of the non-floating tensors it saves so (indices, masks)."""
    recomputed_output: int = 0
    """Elements of the largest output of a module inside that region: with its gradient, the transient of
    the region's backward."""
    after_checkpointed_float: int = 0
    """Floating-point elements saved (outside any region) after the last checkpointed region: the head and
    the loss, freed by the backward before it reaches a region."""
    after_checkpointed_other: int = 0
    param_numels: tuple[int, ...] = ()
    """Elements of each parameter, in the order ``named_parameters`` gives them (a shared one once): what
    ZeRO-3's persistence thresholds are applied to (``persistent``); empty in older descriptions."""
    logical_params: int | None = None
    """Elements the parameters stand for, each counted in its own dtype and a bitsandbytes 4-bit weight by its
    ``quant_state.shape``; None in older descriptions, whose ``params`` are that count."""
    quant_state_bytes: int = 0
    """Bytes of the tensors the 4-bit weights are dequantized with (their ``quant_state``: the blocks' scales
    and the code): no parameter, so whole on every rank under every engine."""
    packed_upto: list[int] = []
    """Running total of the elements (as in ``numel_upto``) of each row's own bitsandbytes 4-bit weights: packed
    storage that every strategy holds at its stored bytes (never cast to a compute dtype, never trained); empty
    where the model has none."""
    param_packed: tuple[bool, ...] = ()
    """Which parameters of ``param_numels`` are packed 4-bit weights; empty where none is."""

    @property
    def trained(self) -> int:
        """Elements that get gradients and optimizer state: the trainable ones, else all."""
        return self.params if self.trainable is None else min(self.trainable, self.params)

    @property
    def trained_share(self) -> float:
        return self.trained / self.params if self.params else 1.0

    @property
    def packed(self) -> int:
        """Elements of the packed 4-bit weights (as in ``params``)."""
        return self.packed_upto[-1] if self.packed_upto else 0

    @property
    def elements(self) -> Elements:
        """Every parameter's elements, plain and packed."""
        return Elements(self.params - self.packed, self.packed)

    def elements_in(self, rows: Iterable[int]) -> dict[int, Elements]:
        """Each row's units (``units``) as plain and packed elements."""
        rows = tuple(rows)
        numel = self.units(self.numel_upto, rows)
        packed = self.units(self.packed_upto, rows) if self.packed_upto else dict.fromkeys(numel, 0)
        return {row: Elements(numel[row] - packed[row], packed[row]) for row in numel}

    def elements_outside(self, rows: Iterable[int]) -> Elements:
        """The rows in no unit of ``rows``, as plain and packed elements."""
        rows = tuple(rows)
        numel = self.outside(self.numel_upto, rows)
        packed = self.outside(self.packed_upto, rows) if self.packed_upto else 0
        return Elements(numel - packed, packed)

    def largest_param_bytes(self, plain_bytes: int) -> int:
        """Bytes of the largest parameter, plain ones at ``plain_bytes`` and packed ones as stored."""
        if not self.param_packed:
            return self.largest_param * plain_bytes
        return max((n * (self.dtype_bytes if packed else plain_bytes)
                    for n, packed in zip(self.param_numels, self.param_packed, strict=True)), default=0)

    def persistent(self, threshold: int, model_threshold: int) -> Elements:
        """Elements of the parameters ZeRO-3 keeps whole on every rank, plain and packed, as DeepSpeed picks them:
        in order, each of at most ``threshold`` elements while their sum stays within ``model_threshold``
        (``stage3_param_persistence_threshold``, ``stage3_model_persistence_threshold``).  An older
        description knows only the parameters under DeepSpeed's default threshold (``small_upto``)."""
        if not self.param_numels:
            return Elements(self.small_upto[-1])
        kept = packed = 0
        flags = self.param_packed or (False,) * len(self.param_numels)
        for numel, is_packed in zip(self.param_numels, flags, strict=True):
            if numel <= threshold and kept + numel <= model_threshold:
                kept += numel
                packed += numel if is_packed else 0
        return Elements(kept - packed, packed)

    @property
    def rows(self) -> int:
        return len(self.names)

    @property
    def params(self) -> int:
        return self.numel_upto[-1]

    @property
    def param_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def param_elements(self) -> int:
        """The parameters as their user counts them: the elements they stand for (``params`` counts a
        parameter stored in another dtype by the elements of ``dtype_bytes`` its storage fills)."""
        return self.params if self.logical_params is None else self.logical_params

    def subtree(self, upto: Sequence[int], row: int) -> int:
        """Sum over the subtree of ``row`` of a running-total field (e.g. ``self.numel_upto``)."""
        return upto[self.end[row]] - upto[row]

    def units(self, upto: Sequence[int], roots: Iterable[int]) -> dict[int, int]:
        """A running-total field summed per unit: each root's subtree minus the units nested in it.

        Kept per description, field and units: a plan asks the same question many times over.
        """
        roots = tuple(roots)
        key = (id(self), id(upto), roots)
        found = _UNITS.get(key)
        if found is None:
            if not any(k[0] == id(self) for k in _UNITS):
                weakref.finalize(self, _forget, id(self))
            found = _UNITS[key] = self._units(upto, roots)
        return found

    def _units(self, upto: Sequence[int], roots: tuple[int, ...]) -> dict[int, int]:
        ordered = sorted(set(roots))
        members = frozenset(ordered)
        totals = {r: self.subtree(upto, r) for r in ordered}
        for r in ordered:
            p = self.parents[r]
            while p >= 0 and p not in members:
                p = self.parents[p]
            if p >= 0:
                totals[p] -= self.subtree(upto, r)
        return totals

    def outside(self, upto: Sequence[int], roots: Iterable[int]) -> int:
        """A running-total field summed over the rows in no unit of ``roots``."""
        return upto[-1] - sum(self.units(upto, roots).values())

    def path(self, row: int) -> str:
        parts: list[str] = []
        while row > 0:
            parts.append(self.names[row])
            row = self.parents[row]
        return ".".join(reversed(parts))

    def row_of(self, path: str) -> int | None:
        """The row of a dotted module path, or None."""
        row = 0
        for part in filter(None, path.split(".")):
            child, found = row + 1, None
            while child < self.end[row]:
                if self.names[child] == part:
                    found = child
                    break
                child = self.end[child]
            if found is None:
                return None
            row = found
        return row


_UNITS: dict[tuple[int, int, tuple[int, ...]], dict[int, int]] = {}
"""``ModelDescription.units`` answers, by (description, field, roots); dropped with the description."""


def _forget(desc_id: int) -> None:
    for key in [k for k in _UNITS if k[0] == desc_id]:
        del _UNITS[key]
