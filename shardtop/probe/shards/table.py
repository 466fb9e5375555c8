"""Per-row accounting shared by every reader, and its conversion into events.

A reader calls ``ShardTable.add`` once per original parameter with the
parameter's full size and what this rank stores of it; the table sums per
module and keeps, per module, the device and state of its largest parameter
(a module whose parameters sit in two places is rare, and one label per row is
what the tree can show).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from shardtop.probe.shards.tree import ModuleTree
from shardtop.rundir.events import Scalar, Shards, SnapshotStage, Tree, Unit

SHARDED = "sharded"
"""Split across ranks by the engine; this rank stores its part."""
REPLICATED = "replicated"
"""Whole on this rank and on every other rank of its group, kept in step by the engine."""
UNSHARDED = "unsharded"
"""Whole on this rank and managed by no engine: a plain module, or one left out of every unit."""
OFFLOADED = "offloaded"
"""Moved to host memory (or NVMe) by the engine's offload policy; sharded or not, see the unit."""
META = "meta"
"""On the meta device: nothing is stored yet (deferred initialisation)."""
PERSISTENT = "persistent"
"""Kept whole on every rank by the engine although it shards the rest (ZeRO-3's
``stage3_param_persistence_threshold``): what the rank holds once the engine is done."""
GATHERED = "gathered"
"""Whole on this rank at the snapshot, gathered by the engine for compute (an FSDP2 unit between
forward and backward, a ZeRO-3 parameter in use) and released to its shard later."""

STATES = (SHARDED, REPLICATED, UNSHARDED, OFFLOADED, PERSISTENT, GATHERED, META)


class ShardTable:
    """Columns aligned with the tree rows, filled parameter by parameter."""

    def __init__(self, tree: ModuleTree) -> None:
        n = len(tree)
        self.tree = tree
        self.params = [0] * n
        self.full_bytes = [0] * n
        self.local_bytes = [0] * n
        self.device = [-1] * n
        self.state = [-1] * n
        self.unit = [-1] * n
        self._weight = [-1] * n
        self.devices: list[str] = []
        self.states: list[str] = []
        self._device_index: dict[Any, int] = {}
        self._state_index: dict[str, int] = {}
        self.units: list[Unit] = []
        self._unit_roots: dict[int, int] = {}
        self.grad_bytes: list[int] | None = None
        self.optim_bytes: list[int] | None = None
        self.offloaded_grad_bytes: list[int] | None = None
        """Of ``grad_bytes``, what an offload policy holds in host memory (or on NVMe); None: nothing."""
        self.offloaded_optim_bytes: list[int] | None = None
        """Of ``optim_bytes``, what an offload policy holds in host memory (or on NVMe); None: nothing."""
        self.act_bytes: list[int] | None = None
        self.info: dict[str, Scalar] = {}
        self.claimed: set[int] = set()
        """``id`` of every tensor an engine reader took as the model's own (sharded, flat or
        registered while gathered), besides the registered parameters."""
        self.param_numels: Counter[int] | None = None
        """Full element count of every original parameter added, for telling the model's own
        tensors among an optimizer's (``stale_optim.py``); counted only when set to a Counter
        (``read_shards`` does when given an optimizer)."""

    # -- filling -------------------------------------------------------------

    def device_id(self, device: Any) -> int:
        """Index of a device (a ``torch.device`` or a name such as ``nvme``) in ``devices``."""
        found = self._device_index.get(device)
        if found is None:
            name = str(device)
            found = self._device_index.get(name)
            if found is None:
                found = len(self.devices)
                self.devices.append(name)
                self._device_index[name] = found
            self._device_index[device] = found
        return found

    def state_id(self, state: str) -> int:
        found = self._state_index.get(state)
        if found is None:
            found = self._state_index[state] = len(self.states)
            self.states.append(state)
        return found

    def add(
        self,
        row: int,
        numel: int,
        local_numel: int,
        itemsize: int,
        device: int,
        state: int,
        unit: int = -1,
        elements: int | None = None,
    ) -> None:
        """One original parameter of ``row``: ``numel`` in full, ``local_numel`` stored here.

        ``elements``: what the parameter counts as where its storage is not the weight it stands for (a 4-bit
        weight packs two elements to a byte, ``quantized.py``); its bytes are still ``numel * itemsize``.
        """
        full = numel * itemsize
        numels = self.param_numels
        if numels is not None:
            numels[numel] += 1
        self.params[row] += numel if elements is None else elements
        self.full_bytes[row] += full
        self.local_bytes[row] += local_numel * itemsize
        if full > self._weight[row]:
            self._weight[row] = full
            self.device[row] = device
            self.state[row] = state
            self.unit[row] = unit

    def add_unit(self, unit: Unit) -> int:
        """Register a unit; its root row and the rows below it without parameters belong to it."""
        index = len(self.units)
        self.units.append(unit)
        self._unit_roots.setdefault(unit.module, index)
        return index

    def add_grad(self, row: int, nbytes: int, offloaded: bool | None = None) -> None:
        """Gradient bytes of ``row``; ``offloaded``: held in host memory by the engine's offload policy
        (None: where the row's parameters are, ``row_offloaded``)."""
        self.grad_bytes = self._added(self.grad_bytes, row, nbytes)
        if offloaded or (offloaded is None and self.row_offloaded(row)):
            self.offloaded_grad_bytes = self._added(self.offloaded_grad_bytes, row, nbytes)

    def add_optim(self, row: int, nbytes: int, offloaded: bool | None = None) -> None:
        """Optimizer-state bytes of ``row``; ``offloaded`` as for ``add_grad``."""
        self.optim_bytes = self._added(self.optim_bytes, row, nbytes)
        if offloaded or (offloaded is None and self.row_offloaded(row)):
            self.offloaded_optim_bytes = self._added(self.offloaded_optim_bytes, row, nbytes)

    def _added(self, column: list[int] | None, row: int, nbytes: int) -> list[int]:
        """``column`` (made of zeros, one per row, where there is none yet) with ``nbytes`` more on ``row``."""
        if column is None:
            column = [0] * len(self.params)
        column[row] += nbytes
        return column

    def row_offloaded(self, row: int) -> bool:
        """The row's parameters are held ``offloaded``: a torch optimizer keeps its state, and the engine
        its gradients, where the parameter is (FSDP1 ``CPUOffload``, FSDP2 ``CPUOffloadPolicy``)."""
        state = self.state[row]
        return 0 <= state < len(self.states) and self.states[state] == OFFLOADED

    def add_activations(self, by_module: dict[int, int]) -> None:
        """Saved-for-backward bytes per module object; modules outside the tree are left out."""
        self.act_bytes = [0] * len(self.params)
        row_of = self.tree.row_of
        for module, nbytes in by_module.items():
            row = row_of.get(module, -1)
            if row >= 0:
                self.act_bytes[row] += nbytes

    # -- output --------------------------------------------------------------

    def finish_units(self) -> None:
        """Give each module without parameters the innermost unit rooted at it or above it.

        So a container inside an FSDP unit reads as inside it, and one outside
        every unit reads -1, which is what tells a hand-wrapped model apart.
        """
        roots = self._unit_roots
        if not roots:
            return
        parents = self.tree.parents
        enclosing = [-1] * len(parents)
        for row, parent in enumerate(parents):
            inherited = enclosing[parent] if parent >= 0 else -1
            enclosing[row] = roots.get(row, inherited)
            if self._weight[row] < 0:
                self.unit[row] = enclosing[row]

    def tree_event(self, tree_id: int) -> Tree:
        tree = self.tree
        return Tree(
            tree_id=tree_id,
            names=tree.names,
            parents=tree.parents,
            types=tree.types,
            type_names=tree.type_names,
            params=self.params,
            bytes=self.full_bytes,
        )

    def shards_event(self, tree_id: int, engine: str, stage: SnapshotStage) -> Shards:
        self.finish_units()
        return Shards(
            tree_id=tree_id,
            engine=engine,
            stage=stage,
            devices=self.devices,
            states=self.states,
            bytes=self.local_bytes,
            device=self.device,
            state=self.state,
            unit=self.unit,
            units=self.units,
            grad_bytes=self.grad_bytes,
            optim_bytes=self.optim_bytes,
            offloaded_grad_bytes=self.offloaded_grad_bytes,
            offloaded_optim_bytes=self.offloaded_optim_bytes,
            act_bytes=self.act_bytes,
            info=self.info,
        )


def local_tensor(param: Any) -> Any:
    """What this rank stores of a tensor: a DTensor's local shard, or the tensor itself."""
    local = getattr(param, "_local_tensor", None)
    if local is not None:
        return local
    if hasattr(param, "to_local"):
        return param.to_local()
    return param


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``float32``: short enough for the tree, still unambiguous."""
    return str(dtype).removeprefix("torch.")
