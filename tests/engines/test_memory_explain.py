"""The explained steps' trace path, with the one missing piece of hardware (the CUDA allocator) replaced.

``RecordedAllocator`` stands in for ``allocator.AllocatorHistory`` only: it writes
entries in torch's documented trace format when the probe places a marker and when
the test says a block was allocated or freed.  Everything else is real: the census
of a real model, the markers' pairing, the window closing, the split of the trace's
peak on the background thread, and the sample that carries it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from shardtop.probe.allocating_code import MARKER_FUNCTION
from shardtop.probe.memory_explain import MemoryExplainer, MemoryOptions
from shardtop.probe.split_figures import unexplained, with_lasting_workspaces
from shardtop.rundir.events import Memory, Oom
from shardtop.rundir.memory_figures import MemoryKinds

MiB = 1 << 20
SAVED_IN_FORWARD = [{"filename": "/x/torch/nn/modules/linear.py", "name": "forward", "line": 1}]


class RecordedAllocator:
    """A CUDA allocator's recorded history, written by hand (CPU has none)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.live: dict[int, int] = {}
        self.ours = False
        self.stopped = 0

    @property
    def recording(self) -> bool:
        return self.ours

    def start(self) -> bool:
        self.ours = True
        return True

    def stop(self) -> None:
        self.ours = False
        self.stopped += 1

    def mark(self) -> bool:
        address = 0x10
        self.entries += [{"action": "alloc", "addr": address, "size": 512, "frames": [{"name": MARKER_FUNCTION}]},
                         {"action": "free_requested", "addr": address, "size": 512, "frames": []}]
        return True

    def alloc(self, address: int, size: int, frames: list[dict[str, Any]] | None = None) -> None:
        self.entries.append({"action": "alloc", "addr": address, "size": size, "frames": frames or []})
        self.live[address] = size

    def free(self, address: int) -> None:
        self.entries.append({"action": "free_requested", "addr": address, "size": self.live.pop(address), "frames": []})

    def snapshot(self) -> dict[str, Any]:
        blocks = [{"address": a, "size": s, "state": "active_allocated", "frames": []} for a, s in self.live.items()]
        return {"segments": [{"device": 0, "blocks": blocks}], "device_traces": [list(self.entries)]}


def test_the_first_steps_peak_is_split_from_the_trace_and_sampled() -> None:
    model = nn.Linear(64, 64)
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=1))
    recorded = RecordedAllocator()
    explainer.history = recorded  # type: ignore[assignment]
    explainer.set_target(model)
    explainer.start()
    assert recorded.ours  # set-up is recorded too
    recorded.live[0x7000000] = 5 * MiB  # allocated before anything was recorded: no source names it
    weight = model.weight.untyped_storage().data_ptr()
    recorded.alloc(weight, 16 * 1024)  # the parameters, made during set-up

    explainer.on_phase("forward", 1)
    x = torch.randn(32, 64, requires_grad=True)
    recorded.alloc(x.untyped_storage().data_ptr(), 32 * 64 * 4, SAVED_IN_FORWARD)
    recorded.alloc(0x1000, MiB, SAVED_IN_FORWARD)  # made in a forward, never saved: a census would have seen it
    out = model(x)
    explainer.on_phase("backward", 1)
    recorded.alloc(0x9000000, 2 * MiB)  # autograd's own temporary: no Python frame, in the backward
    recorded.free(0x9000000)
    out.sum().backward()
    recorded.free(0x1000)
    recorded.free(x.untyped_storage().data_ptr())
    explainer.on_phase("optimizer", 1)
    explainer.on_step(1)
    assert recorded.stopped == 1 and not explainer._explaining

    deadline = time.monotonic() + 5
    while explainer.trace_seconds is None and time.monotonic() < deadline:
        time.sleep(0.01)
    sample = explainer.sample(Memory(), None, fresh=True)
    split = sample.peak_split
    assert split is not None
    assert split.source == "allocator-trace"
    assert split.allocated == 5 * MiB + 16 * 1024 + 32 * 64 * 4 + MiB + 2 * MiB
    kinds = split.by_kind
    assert (kinds.params, kinds.activations, kinds.other) == (16 * 1024, 32 * 64 * 4, 3 * MiB)
    assert split.unexplained == 5 * MiB
    assert (split.phase, split.step) == ("backward", 1)  # the temporary came after the backward's marker
    again = explainer.sample(Memory(), None, fresh=True)
    assert again.peak_split is None  # written once, when it changes


def test_a_workspace_the_trace_saw_is_named_by_later_censuses() -> None:
    """cuBLAS's workspace, made in the first step's backward (autograd's thread, no Python frame) and kept:
    the trace names it; a census after the window sees no tensor behind it, and names it from the trace."""
    workspace = 32 * MiB
    model = nn.Linear(64, 64)
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=1))
    recorded = RecordedAllocator()
    explainer.history = recorded  # type: ignore[assignment]
    explainer._workspaces = frozenset({workspace})  # what library_workspaces reads off a GPU
    explainer.set_target(model)
    explainer.start()
    recorded.alloc(model.weight.untyped_storage().data_ptr(), 16 * 1024)
    explainer.on_phase("forward", 1)
    explainer.on_phase("backward", 1)
    recorded.alloc(0x9000000, workspace)  # never freed
    explainer.on_phase("optimizer", 1)
    explainer.on_step(1)
    deadline = time.monotonic() + 5
    while explainer.trace_seconds is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert explainer.workspace_alive == workspace

    census = MemoryKinds(params=16 * 1024, grads=16 * 1024, optimizer=32 * 1024)
    named = with_lasting_workspaces(census, 64 * 1024 + workspace + MiB, explainer.workspace_alive)
    assert named.workspace == workspace and unexplained(64 * 1024 + workspace + MiB, named) == MiB
    freed = with_lasting_workspaces(census, 64 * 1024 + MiB, explainer.workspace_alive)
    assert freed.workspace == MiB, "never more than the census left unexplained"
    assert with_lasting_workspaces(census, 64 * 1024, workspace) == census
    assert with_lasting_workspaces(census, None, workspace) == census, "no allocator reading (CPU): nothing said"


def test_the_models_output_and_the_backwards_gradients_are_named_parts_of_other() -> None:
    """The census after the forward sees the tensor the model returned, which the script still holds (a
    language model's logits); autograd's temporary in the backward has no Python frame: both are other, told
    apart in the peak's split, and the output is in the census's own split too."""
    model = nn.Linear(64, 256)
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=1))
    recorded = RecordedAllocator()
    explainer.history = recorded  # type: ignore[assignment]
    explainer.set_target(model)
    explainer.start()
    recorded.alloc(model.weight.untyped_storage().data_ptr(), 64 * 256 * 4)

    explainer.on_phase("forward", 1)
    x = torch.randn(32, 64)
    logits = model(x)
    output = logits.untyped_storage()
    recorded.alloc(output.data_ptr(), output.nbytes(), SAVED_IN_FORWARD)
    explainer.on_phase("backward", 1)
    census = explainer._pending
    assert census is not None and census.other_parts is not None
    assert census.other_parts.output == output.nbytes() and census.by_kind.other == output.nbytes()
    recorded.alloc(0x9000000, 2 * MiB)  # the gradient of the logits, made on autograd's thread
    logits.sum().backward()
    recorded.free(0x9000000)
    explainer.on_phase("optimizer", 1)
    explainer.on_step(1)

    deadline = time.monotonic() + 5
    while explainer.trace_seconds is None and time.monotonic() < deadline:
        time.sleep(0.01)
    split = explainer.sample(Memory(), None, fresh=True).peak_split
    assert split is not None and split.source == "allocator-trace"
    assert split.other_parts is not None
    assert (split.other_parts.output, split.other_parts.backward) == (output.nbytes(), 2 * MiB)
    assert split.by_kind.other == output.nbytes() + 2 * MiB and split.unexplained == 0
    places = [(site.part, site.where) for site in split.other_at]
    assert places == [("backward", ""), ("output", "linear.py:1 in forward")]


def _raise_out_of_memory(input: torch.Tensor) -> None:
    """A loss function that runs out of memory holding its input (as ``cross_entropy`` holds the fp32 copy)."""
    raise torch.OutOfMemoryError("out of memory")


def test_what_the_loss_made_of_the_models_output_is_a_part_of_other_of_its_own() -> None:
    """A census handed the loss (as Lightning hands it before the backward) reads what the loss saved for its
    backward: the log-softmax of the logits' fp32 copy is the loss's, beside the logits the model returned;
    the labels it took and a tensor of the script's own that the loss also used are not.  At an OOM, the fp32
    copy a loss function holds on the failing stack is the loss's too."""
    tokens, vocab = 32, 512
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, vocab)).to(torch.bfloat16)
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=1))
    explainer.set_target(model)
    explainer.on_phase("forward", 1)
    logits = model(torch.randn(tokens, 64, dtype=torch.bfloat16))
    labels = torch.randint(0, vocab, (tokens,))
    own = torch.randn(tokens, vocab, requires_grad=True)  # the script's own, through no loss function
    loss = nn.functional.cross_entropy(logits.float(), labels) + (own * own).mean()
    explainer.on_phase("backward", 1, graph=loss)
    census = explainer._pending
    assert census is not None and census.other_parts is not None
    # the log-softmax (fp32) and the loss itself (its 4 bytes); the logits, as the model's output
    assert (census.other_parts.loss, census.other_parts.output) == (tokens * vocab * 4 + 4, tokens * vocab * 2)
    assert census.by_kind.other == tokens * vocab * 6 + 4
    saved_by_model = tokens * 64 * 2 * 2  # the first Linear's input and the ReLU's output, bf16
    assert census.by_kind.activations == saved_by_model + tokens * 8 + tokens * vocab * 4 + 4  # labels, own, weight

    try:
        _raise_out_of_memory(logits.float())
    except torch.OutOfMemoryError as error:
        event = explainer.on_oom(Oom(phase="backward", step=1), error)
    assert event.memory is not None and event.memory.other_parts is not None
    assert event.memory.other_parts.loss == tokens * vocab * 4 + 4 + tokens * vocab * 4  # and the copy
    del loss
