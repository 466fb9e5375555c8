"""Activations: the tensors autograd holds for backward, live, and which module made them.

Nothing is hooked into autograd: pushing ``saved_tensors_hooks`` would change
what the job's own code sees (a custom ``autograd.Function`` would get a new
plain tensor back from ``ctx.saved_tensors`` instead of its saved parameter,
and ``torch.func`` transforms would refuse to run).  Instead, while a step is
explained, global module hooks note the autograd sequence number at each
module call's start and end (``saved_graph.ModuleSpans``, about 1 µs a call),
and a census reads the graph as it stands (``saved_graph.py``): every tensor a
node still holds, counted once per storage, attributed to the innermost
module running when the node was made.  Parameters and their views are not
activations and are left out, and so are storages a census already counted
as parameters.

Where the graph is: whatever the caller hands over (the loss Lightning is
about to backpropagate, the tensors on an OOM's stack), the node autograd
is running (a census taken from inside backward), and the outputs of the
model's outermost calls since ``start`` (held weakly: they never keep a graph
alive).  What the script computed from those outputs outside any module (a
loss) is reachable from none of them; where nodes were made after the model's
last call and no backward has run since, the process's tensors that carry a
graph made since ``start`` are looked for once (``gc.get_objects()``, 20 to
40 ms for 320 000 objects on a 2-core machine) and held weakly in turn.  Every
generation is searched: a tensor made before the step can be given its graph
in place (``total += loss``), one way earlier graphs are kept alive.
A read keeps no storage it found (``HeldStorage``): the backward frees each
activation as it would alone.

What the loss made of the model's output is told apart from the activations
(``loss``): the tensors of nodes made outside the model's modules from an
output of its latest forward (an fp32 copy of the logits on the failing stack,
the log-softmax a negative log-likelihood saved), never the output itself,
which the census counts as such, nor what the loss took from elsewhere (the
labels).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from shardtop.probe.allocator_timeline import block_bytes
from shardtop.probe.eager import compiling
from shardtop.probe.saved_graph import (
    ModuleSpans,
    nodes_from,
    of_a_parameter,
    readable,
    saved_by,
    saved_results,
    sequence_number,
)

MAX_OUTPUTS = 64
"""Outputs of outermost calls held (weakly) as the graph's roots, the latest kept."""


class HeldStorage(NamedTuple):
    """A storage the graph held when it was read: where, how large, on which device.  Not the storage itself:
    holding that would keep an activation alive after the backward released it."""

    address: int
    nbytes: int
    device: torch.device

    @classmethod
    def of(cls, storage: Any) -> HeldStorage:
        return cls(storage.data_ptr(), storage.nbytes(), storage.device)


def tensor_types() -> frozenset[type]:
    """``torch.Tensor`` and every subclass of it defined now (``Parameter``, ``DTensor``, a library's own): a
    set to look an object's type up in, which is faster than ``issubclass`` over every object of a process."""
    found: set[type] = {torch.Tensor}
    todo: list[type] = [torch.Tensor]
    while todo:
        subclasses: list[type] = todo.pop().__subclasses__()
        for sub in subclasses:
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return frozenset(found)

class SavedActivations:
    """Tensors autograd holds for backward in this process, per storage, with the module that made each."""

    def __init__(self) -> None:
        self.spans = ModuleSpans()
        self._handles: list[Any] = []
        self._outputs: list[weakref.ref[torch.Tensor]] = []
        self.roots: list[Any] = []
        """Tensors or nodes the next read starts from as well (set by the caller, cleared after the read)."""
        self._looked = False
        """The process was searched for graphs since ``start``, or a backward ran: no search needed."""
        self._model_done: int | None = None
        """The sequence number when the model's last outermost call returned."""
        self.saved = 0
        """Saved tensors seen by the last read (a count, for the cost figures)."""
        self.last: list[tuple[HeldStorage, int]] = []
        """What the last read found (``live_storages``)."""
        self.forward_began: int | None = None
        """The sequence number when the forward before the latest began (``note_forward``, every forward): a
        graph made before it belongs to an earlier forward, kept alive by what holds its outputs.  Not the
        latest's: a step may run two forwards before one backward (a contrastive loss), and a loop's own
        variable holds the last output until the next forward returns."""
        self._latest_forward: int | None = None
        self._model_outputs: list[weakref.ref[torch.Tensor]] = []
        """The tensors the outermost calls of the latest forward returned (the model's output: the logits of a
        language model), held weakly."""
        self.kept: list[HeldStorage] = []
        """Storages the last read found held by graphs of earlier forwards, and those graphs' outputs on the
        roots it was given: kept with their graphs, not this forward's activations."""
        self.loss: list[HeldStorage] = []
        """Storages the last read found made of the model's output outside its modules (``_OutputDescent``):
        what the loss made of the logits, saved for its backward or held by a root."""
        self.failed: str | None = readable()
        """Why saved tensors cannot be read on this torch (None: they can)."""

    # -- the forward's module calls -------------------------------------------------

    def _enter(self, module: nn.Module, args: Any) -> None:
        if not compiling():  # inside a compiled graph: the module called eagerly made its nodes
            self.spans.enter(module)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if compiling() or not self.spans.leave(module):
            return
        self._model_done = sequence_number()
        if self.spans.enclosing:  # the model, whose call began before the spans: its modules' outputs were not its
            self._model_outputs = []
        for tensor in _tensors_in(output):
            if tensor.grad_fn is not None:
                self._outputs.append(weakref.ref(tensor))
            if len(self._model_outputs) < MAX_OUTPUTS:
                self._model_outputs.append(weakref.ref(tensor))
        del self._outputs[:-MAX_OUTPUTS]

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def note_forward(self) -> None:
        """A forward begins (every forward, not only explained ones: one number read)."""
        self._model_outputs = []
        if sequence_number is not None:
            self.forward_began, self._latest_forward = self._latest_forward, sequence_number()

    def start(self) -> bool:
        """Note the module calls from now on (on this thread's sequence numbers); False if this torch
        cannot tell what the graph holds."""
        if self.failed is not None:
            return False
        if self._handles:
            return True
        self.spans.begin()
        self._outputs = []
        self._looked = False
        self._model_done = None
        register = nn.modules.module
        self._handles = [
            register.register_module_forward_pre_hook(self._enter),
            register.register_module_forward_hook(self._leave, always_call=True),
        ]
        return True

    def stop(self) -> None:
        """Stop noting module calls; what was noted still attributes the graph's nodes."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def clear(self) -> None:
        """Forget the roots of the last forward."""
        self._outputs = []
        self.roots = []

    # -- what is saved now ----------------------------------------------------------

    def _roots(self) -> list[Any]:
        roots: list[Any] = list(self.roots)
        node = torch._C._current_autograd_node()
        if node is not None:
            roots.append(node)
            self._looked = True  # a backward runs: what the script made after the model ran first
        outputs = [t for ref in self._outputs if (t := ref()) is not None]
        if not roots and not self._looked and self._made_after_model():
            self._looked = True
            outputs = self._graphs_in_process()
            self._outputs = [weakref.ref(t) for t in outputs]
        return roots + outputs

    def _made_after_model(self) -> bool:
        done = self._model_done
        return done is not None and sequence_number is not None and sequence_number() > done

    def _graphs_in_process(self) -> list[torch.Tensor]:
        """Tensors anywhere in the process whose graph was made since ``start``, the latest made first (a
        loss before the tensors it was computed from), at most ``MAX_OUTPUTS``."""
        first = self.spans.first
        if first is None:
            return []
        found: list[tuple[int, torch.Tensor]] = []
        kinds = tensor_types()  # by its type: ``isinstance`` reads ``__class__``, which some module-level
        for obj in [o for o in gc.get_objects() if type(o) in kinds]:  # proxies answer with a warning
            node = obj.grad_fn
            if node is not None and (number := node._sequence_nr()) >= first:
                found.append((number, obj))
        found.sort(key=lambda pair: -pair[0])
        return [t for _, t in found[:MAX_OUTPUTS]]

    def model_outputs(self) -> list[torch.Tensor]:
        """The tensors the latest forward's outermost calls returned, those still alive."""
        return [t for ref in self._model_outputs if (t := ref()) is not None]

    def live_storages(self) -> list[tuple[HeldStorage, int]]:
        """(storage, module id) of every storage the graph holds for backward now (0: no module); those of
        graphs an earlier forward made go to ``kept`` instead, and those the loss made of the model's output
        (saved for its backward, or roots themselves) to ``loss``."""
        if self.failed is not None:
            return []
        roots = self._roots()
        self.roots = []
        found: dict[int, tuple[HeldStorage, int]] = {}
        kept: dict[int, HeldStorage] = {}
        made = _OutputDescent(self.model_outputs(), self.spans)
        saved = 0
        owner = self.spans.owner
        began = self.forward_began
        numbered = sorted((node._sequence_nr(), i, node) for i, node in enumerate(nodes_from(roots)))
        for sequence, _, node in numbered:  # in the order they were made: a storage is its first saver's
            earlier = began is not None and sequence < began
            of_loss = not earlier and made.visit(sequence, node)
            for tensor in saved_by(node):
                if of_a_parameter(tensor):
                    continue
                saved += 1
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key == 0 or key in found or key in kept or key in made.loss:
                    continue
                held = HeldStorage(key, storage.nbytes(), storage.device)
                if earlier:
                    kept[key] = held
                elif of_loss and made.of_loss(tensor, key):
                    made.loss[key] = held
                else:
                    found[key] = (held, owner(sequence))
        for root in roots:  # what the loss made of the output and holds as a tensor (an fp32 copy of the logits)
            if isinstance(root, torch.Tensor) and made.made(root.grad_fn):
                storage = root.untyped_storage()
                key = storage.data_ptr()
                if key and key not in found and key not in kept and key not in made.outputs:
                    made.loss.setdefault(key, HeldStorage.of(storage))
        if began is not None:  # the roots themselves, where an earlier forward made them (a list of outputs)
            for root in roots:
                node = getattr(root, "grad_fn", None)
                if isinstance(root, torch.Tensor) and node is not None and node._sequence_nr() < began:
                    storage = root.untyped_storage()
                    if storage.data_ptr() and storage.data_ptr() not in found:
                        kept.setdefault(storage.data_ptr(), HeldStorage.of(storage))
        self.saved = saved
        self.last = list(found.values())
        self.kept = list(kept.values())
        self.loss = list(made.loss.values())
        return self.last

    def by_module(
        self, device: torch.device, skip: Iterable[int] = (), found: list[tuple[HeldStorage, int]] | None = None
    ) -> dict[int, int]:
        """Bytes saved and alive per module id (on ``device``), storages in ``skip`` excluded: now, or in
        ``found`` (a read just made)."""
        skipped = set(skip)
        out: dict[int, int] = {}
        cuda = device.type == "cuda"
        for storage, module in self.live_storages() if found is None else found:
            if storage.device != device:
                continue
            key, nbytes = storage.address, storage.nbytes
            if nbytes == 0 or key in skipped:
                continue
            skipped.add(key)
            out[module] = out.get(module, 0) + block_bytes(nbytes, cuda)
        return out


class _OutputDescent:
    """Which autograd nodes the loss made of the model's output: a node made outside the model's modules (the
    script's code after the model returned, or the model's own ``forward`` around its modules) that takes an
    output of the model's latest forward, or such a node's result, as an input.  Nodes are visited in the
    order they were made, so a node's inputs are settled before it."""

    def __init__(self, outputs: list[torch.Tensor], spans: ModuleSpans) -> None:
        self.nodes = {node._sequence_nr() for tensor in outputs if (node := tensor.grad_fn) is not None}
        self.outputs = {tensor.untyped_storage().data_ptr() for tensor in outputs}
        """The output's storages: counted as the output (or as what a node saved), never as the loss's."""
        self.first = min(self.nodes, default=None)
        self.spans = spans
        self.of_output: set[int] = set()
        """Sequence numbers of the nodes the loss made of the output."""
        self.loss: dict[int, HeldStorage] = {}
        """Storages found made of the output, by address."""
        self._results: set[int] = set()

    def visit(self, sequence: int, node: Any) -> bool:
        """Is ``node`` (numbered ``sequence``) the loss's?  Noted for the nodes made after it."""
        if self.first is None or sequence <= self.first or sequence in self.nodes:
            return False
        if not self.spans.outside_modules(sequence):
            return False
        inputs = (child._sequence_nr() for child, _ in node.next_functions if child is not None)
        if not any(number in self.nodes or number in self.of_output for number in inputs):
            return False
        self.of_output.add(sequence)
        self._results = {t.untyped_storage().data_ptr() for t in saved_results(node)}
        return True

    def made(self, node: Any) -> bool:
        """``node`` is one the loss made of the output."""
        return node is not None and node._sequence_nr() in self.of_output

    def of_loss(self, tensor: torch.Tensor, key: int) -> bool:
        """A tensor the node just visited saved is the loss's: its own result, or the result of a node the loss
        made of the output (the log-softmax a negative log-likelihood saved); never the output itself, nor
        what the loss took from elsewhere (the labels, a constant)."""
        return key not in self.outputs and (key in self._results or self.made(tensor.grad_fn))


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors of a module's output: a tensor, or those in a tuple, list or dict (HF outputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []
