"""Reading the CUDA allocator's recorded history, on snapshots built by hand in torch's documented format.

``torch.cuda.memory._snapshot()`` returns ``{"segments": [...], "device_traces": [[...]]}``
(``torch/cuda/memory.py`` documents every field; frames are innermost first).  CPU
cannot record one, so these snapshots are written out the way torch 2.11-2.14 writes
them: an ``alloc`` then ``free_requested`` then ``free_completed`` per block, a
``segment_alloc`` before the first block of a segment, and ``active_allocated``
blocks with the frames of their allocation.
"""

from __future__ import annotations

from typing import Any

from shardtop.probe.allocating_code import MARKER_FUNCTION, kind_of_frames, loss_made
from shardtop.probe.allocator import allocator_stats, cublas_workspace_size, cublaslt_workspace_size
from shardtop.probe.allocator_timeline import block_bytes, largest_free_block, timeline
from shardtop.probe.allocator_trace import MAX_WORKSPACE_BLOCKS, current_split, peak_split, traced_splits
from shardtop.rundir.memory_figures import AllocatorStats, OtherParts

MiB = 1 << 20


def frame(filename: str, name: str, line: int = 1) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


USER_LOOP = frame("/home/u/train.py", "main")
LINEAR_FORWARD = [frame("/venv/site-packages/torch/nn/modules/linear.py", "forward"), USER_LOOP]
ADAM_STATE = [frame("/venv/site-packages/torch/optim/adam.py", "_init_group"),
              frame("/venv/site-packages/torch/optim/adam.py", "step"), USER_LOOP]
ADAM_TEMP = [frame("/venv/site-packages/torch/optim/adam.py", "_multi_tensor_adam"),
             frame("/venv/site-packages/torch/optim/adam.py", "step"), USER_LOOP]
FSDP_UNSHARD = [frame("/venv/site-packages/torch/distributed/fsdp/_flat_param.py",
                      "_alloc_padded_unsharded_flat_param"),
                frame("/venv/site-packages/torch/distributed/fsdp/_flat_param.py", "unshard"),
                frame("/venv/site-packages/torch/distributed/fsdp/_runtime_utils.py", "_unshard"),
                frame("/venv/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", "forward"),
                *LINEAR_FORWARD]
MARKER = [frame("/venv/site-packages/shardtop/probe/allocator.py", MARKER_FUNCTION),
          frame("/venv/site-packages/shardtop/probe/allocator.py", "mark")]


class Trace:
    """A device trace written as torch records it, with the blocks still allocated at the end."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        self.next_address = 0x7F0000000000

    def alloc(self, size: int, frames: list[dict[str, Any]]) -> int:
        address = self.next_address
        self.next_address += block_bytes(size, True)
        self.entries.append({"action": "alloc", "addr": address, "size": block_bytes(size, True), "stream": 0,
                             "frames": frames, "time_us": len(self.entries)})
        self.live[address] = (block_bytes(size, True), frames)
        return address

    def free(self, address: int, *, requested: bool = True) -> None:
        size, _ = self.live.pop(address)
        actions = ("free_requested", "free_completed") if requested else ("free_completed",)
        for action in actions:
            self.entries.append({"action": action, "addr": address, "size": size, "stream": 0, "frames": [],
                                 "time_us": len(self.entries)})

    def mark(self) -> None:
        self.free(self.alloc(4, MARKER))

    def snapshot(self, inactive: int = 0) -> dict[str, Any]:
        blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": f}
                  for a, (s, f) in sorted(self.live.items())]
        if inactive:
            blocks.append({"address": self.next_address, "size": inactive, "requested_size": 0, "state": "inactive",
                           "frames": []})
        total = sum(b["size"] for b in blocks)
        segment = {"device": 0, "address": 0x7F0000000000, "total_size": total, "stream": 0, "segment_type": "large",
                   "allocated_size": total - inactive, "active_size": total - inactive, "blocks": blocks}
        return {"segments": [segment], "device_traces": [self.entries]}


def test_block_bytes_rounds_like_the_caching_allocator() -> None:
    assert [block_bytes(n, True) for n in (0, 1, 512, 513, 3 * MiB + 1)] == [0, 512, 512, 1024, 3 * MiB + 512]
    assert block_bytes(513, False) == 513


def test_frames_name_the_kind_innermost_first() -> None:
    assert kind_of_frames(ADAM_STATE) == "optimizer"
    assert kind_of_frames(ADAM_TEMP) == "other"
    assert kind_of_frames(LINEAR_FORWARD) == "activations"
    assert kind_of_frames(FSDP_UNSHARD) == "params"  # the gather, although a forward is further out
    assert kind_of_frames(
        [frame("/x/torch/distributed/fsdp/_runtime_utils.py", "_reduce_grad"), *LINEAR_FORWARD]
    ) == "grads"
    assert kind_of_frames([frame("/x/torch/nn/modules/module.py", "_apply"),
                           frame("/x/torch/nn/modules/module.py", "to"), USER_LOOP]) == "params"
    assert kind_of_frames([frame("/x/torch/nn/modules/linear.py", "reset_parameters"),
                           frame("/x/torch/nn/modules/linear.py", "__init__"), USER_LOOP]) == "params"
    assert kind_of_frames([frame("/x/deepspeed/runtime/zero/stage_1_and_2.py", "average_tensor")]) == "comm"
    assert kind_of_frames([frame("/x/deepspeed/runtime/zero/partition_parameters.py", "_all_gather_dtype")]) == "params"
    assert kind_of_frames([frame("/x/torch/nn/parallel/distributed.py", "_ddp_init_helper")]) == "comm"
    # An engine's forward is a wrapper, not an activation: what its frames say decides, else nothing.
    assert kind_of_frames([frame("/x/torch/distributed/fsdp/fully_sharded_data_parallel.py", "forward")]) is None
    assert kind_of_frames([USER_LOOP]) is None
    assert kind_of_frames([]) is None


def _one_step(trace: Trace, weights: int, temporary: int) -> dict[str, Any]:
    """A forward saving two activations, a backward making gradients (no Python frames: the autograd
    thread), Adam's first step making its state and a temporary; censuses at each phase boundary."""
    censuses: dict[str, dict[int, str]] = {}
    trace.mark()
    censuses["forward"] = {}
    act1 = trace.alloc(8 * MiB, LINEAR_FORWARD)
    act2 = trace.alloc(8 * MiB, LINEAR_FORWARD)
    trace.mark()
    censuses["backward"] = {act1: "activations", act2: "activations"}
    grad = trace.alloc(weights, [])
    temp = trace.alloc(temporary, [])  # a gradient of an activation, freed within the backward
    trace.free(temp)
    trace.free(act2)
    trace.free(act1)
    trace.mark()
    censuses["optimizer"] = {grad: "grads"}
    exp_avg = trace.alloc(weights, ADAM_STATE)
    exp_avg_sq = trace.alloc(weights, ADAM_STATE)
    scratch = trace.alloc(weights, ADAM_TEMP)
    trace.free(scratch)
    trace.free(grad)  # zero_grad(set_to_none=True)
    trace.mark()
    censuses["step"] = {exp_avg: "optimizer", exp_avg_sq: "optimizer"}
    return censuses


def test_peak_of_a_step_split_by_kind() -> None:
    trace = Trace()
    weights = 10 * MiB
    params = trace.alloc(weights, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    censuses = _one_step(trace, weights, temporary=4 * MiB)
    labels = [("forward", 1), ("backward", 1), ("optimizer", 1), ("step", 1)]
    ordered = [{params: "params", **censuses[label]} for label, _ in labels]
    found = peak_split(trace.snapshot(), 0, ordered, labels)
    assert found is not None
    split, line = found
    # Peak: params + grad + two Adam moments + the step's scratch = 50 MiB (the backward peaked at 42 MiB).
    assert split.allocated == line.peak == 5 * weights
    assert split.by_kind.params == weights
    assert split.by_kind.grads == weights  # no frames: named by the census taken while it lived
    assert split.by_kind.optimizer == 2 * weights  # named by the census after the step, and by _init_group
    assert split.by_kind.other == weights  # the foreach scratch: no census saw it, torch/optim made it
    assert split.by_kind.activations == 0
    assert split.unexplained == 0
    assert (split.source, split.phase, split.step) == ("allocator-trace", "optimizer", 1)


def test_the_backward_peak_names_autograds_temporary() -> None:
    trace = Trace()
    weights = MiB
    params = trace.alloc(weights, [])  # allocated before anything the frames could name
    censuses = _one_step(trace, weights, temporary=16 * MiB)
    labels = [("forward", 1), ("backward", 1), ("optimizer", 1), ("step", 1)]
    ordered = [{params: "params", **censuses[label]} for label, _ in labels]
    found = peak_split(trace.snapshot(), 0, ordered, labels)
    assert found is not None
    split, _ = found
    # Peak in the backward: params + two activations + grad + the 16 MiB temporary.
    assert split.allocated == weights + 16 * MiB + weights + 16 * MiB
    assert split.by_kind.activations == 16 * MiB
    assert split.by_kind.grads == weights and split.by_kind.params == weights
    assert split.by_kind.other == 16 * MiB  # made on autograd's thread in the backward, seen by no census
    assert split.unexplained == 0
    assert split.phase == "backward"


def test_the_losss_backward_before_the_models_first_backward_hook_is_the_backwards_temporary() -> None:
    """A plain loop's loss over a large vocabulary: ``loss.backward()`` differentiates the cross-entropy on
    autograd's thread (no Python frame) before the model's first module backward marks the phase, so the
    trace still reads "forward" there. Those blocks are the backward's temporaries, not unexplained; the
    fp32 copy the script made of the logits stays the script's."""
    trace = Trace()
    weights = trace.alloc(8 * MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    trace.mark()  # forward
    logits = trace.alloc(64 * MiB, LINEAR_FORWARD)
    upcast = trace.alloc(128 * MiB, [frame("/home/u/train.py", "main", 67)])
    grad_of_log_softmax = trace.alloc(128 * MiB, [])
    trace.free(grad_of_log_softmax)
    trace.mark()  # the first module backward marks the phase
    labels = [("forward", 1), ("backward", 1)]
    censuses = [{weights: "params"}, {weights: "params", logits: "activations"}]
    found = peak_split(trace.snapshot(), 0, censuses, labels)
    assert found is not None
    split, _ = found
    # the peak's phase: the backward, autograd's engine having allocated since the forward's marker
    assert (split.phase, split.allocated) == ("backward", 8 * MiB + 64 * MiB + 2 * 128 * MiB)
    assert split.by_kind.other == 128 * MiB and split.by_kind.script == 128 * MiB
    assert split.unexplained == 0 and split.by_kind.params == 8 * MiB
    assert upcast


def test_a_forward_block_no_census_saw_saved_is_other_when_saved_tensors_were_followed() -> None:
    trace = Trace()
    trace.mark()
    saved = trace.alloc(4 * MiB, LINEAR_FORWARD)
    trace.alloc(MiB, LINEAR_FORWARD)  # e.g. a library's workspace, made in the first forward
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}, {saved: "activations"}], [("forward", 1), ("backward", 1)])
    assert found is not None
    split, _ = found
    assert (split.by_kind.activations, split.by_kind.other, split.unexplained) == (4 * MiB, MiB, 0)
    unfollowed = peak_split(trace.snapshot(), 0, [{}, {}], [("forward", 1), ("backward", 1)])
    assert unfollowed is not None and unfollowed[0].by_kind.activations == 5 * MiB  # frames alone: both


WORKSPACE = 32 * MiB  # cuBLAS's on an H200 (torch._C._cuda_getCublasWorkspaceSize)


def _steps_keeping_logits(trace: Trace, steps: int, logits: int) -> tuple[list[dict[int, str]], list[tuple[str, int]]]:
    """A loop that appends each step's logits to a list: the first forward's matmul makes cuBLAS's
    workspace (kept for the process's life, no tensor behind it) and the backward's its own."""
    censuses: list[dict[int, str]] = []
    labels: list[tuple[str, int]] = []
    for step in range(steps):
        trace.mark()
        censuses.append({})
        labels.append(("forward", step))
        if step == 0:
            trace.alloc(WORKSPACE, LINEAR_FORWARD)
        trace.alloc(logits, LINEAR_FORWARD)  # appended to the list: never freed
        trace.mark()
        censuses.append({})
        labels.append(("backward", step))
        if step == 0:
            trace.alloc(WORKSPACE, [])  # autograd's thread: its own handle, its own workspace
        temp = trace.alloc(logits, [])
        trace.free(temp)
    return censuses, labels


def test_library_workspaces_and_tensors_kept_from_earlier_steps_are_kinds_of_their_own() -> None:
    trace = Trace()
    logits = 244 * MiB
    censuses, labels = _steps_keeping_logits(trace, 4, logits)
    found = peak_split(trace.snapshot(), 0, censuses, labels, frozenset({WORKSPACE}))
    assert found is not None
    split, _ = found
    assert split.phase == "backward" and split.step == 3
    assert split.by_kind.workspace == 2 * WORKSPACE
    assert split.by_kind.kept == 3 * logits  # steps 0 to 2; step 3's own logits are its activations
    assert split.by_kind.activations == logits
    assert split.by_kind.other == logits  # the backward's temporary, live at the peak
    assert split.unexplained == 0
    assert [(s.where, s.bytes) for s in split.kept_at] == [("train.py:1 in main", 3 * logits)]


def test_a_block_of_a_workspaces_size_is_no_workspace_if_freed_or_made_after_the_first_step() -> None:
    trace = Trace()
    trace.mark()
    trace.alloc(WORKSPACE, LINEAR_FORWARD)  # the workspace
    passing = trace.alloc(WORKSPACE, LINEAR_FORWARD)  # an activation of the same size, freed later
    trace.mark()
    trace.free(passing)
    trace.mark()
    trace.alloc(WORKSPACE, LINEAR_FORWARD)  # step 1: a kept output of that size, not a workspace
    trace.mark()
    labels = [("forward", 0), ("backward", 0), ("forward", 1), ("step", 1)]
    found = peak_split(trace.snapshot(), 0, [{}, {}, {}, {}], labels, frozenset({WORKSPACE}))
    assert found is not None
    split, _ = found
    assert split.by_kind.workspace == WORKSPACE
    assert split.by_kind.activations == WORKSPACE  # step 1's, alive in step 1
    assert split.by_kind.kept == 0
    no_sizes = peak_split(trace.snapshot(), 0, [{}, {}, {}, {}], labels)
    assert no_sizes is not None and no_sizes[0].by_kind.workspace == 0, "no size known, no workspace named"


def test_state_made_in_an_earlier_step_is_not_kept() -> None:
    trace = Trace()
    trace.mark()
    exp_avg = trace.alloc(8 * MiB, ADAM_STATE)  # Adam's moments at the first step
    grad = trace.alloc(8 * MiB, [])  # a gradient, seen by the census
    trace.mark()
    trace.alloc(MiB, LINEAR_FORWARD)  # step 1's activation
    trace.mark()
    labels = [("optimizer", 0), ("forward", 1), ("backward", 1)]
    found = peak_split(trace.snapshot(), 0, [{}, {grad: "grads"}, {grad: "grads", exp_avg: "optimizer"}], labels)
    assert found is not None
    split, _ = found
    assert (split.by_kind.optimizer, split.by_kind.grads, split.by_kind.kept) == (8 * MiB, 8 * MiB, 0)


def test_blocks_from_before_the_trace_and_a_trace_that_lost_its_start() -> None:
    """A ring buffer keeps the last entries: blocks freed without their alloc were allocated before;
    blocks alive at the end without one too; censuses pair with the markers from the end."""
    trace = Trace()
    old = trace.alloc(3 * MiB, LINEAR_FORWARD)
    kept = trace.alloc(5 * MiB, [])
    trace.mark()
    lost = len(trace.entries)
    trace.mark()
    trace.free(old)
    big = trace.alloc(20 * MiB, [])
    trace.mark()
    trace.free(big)
    snapshot = trace.snapshot()
    snapshot["device_traces"][0] = snapshot["device_traces"][0][lost:]  # the oldest entries were overwritten
    censuses = [{kept: "params"}, {kept: "params", old: "activations"}, {kept: "params", big: "comm"}]
    found = peak_split(snapshot, 0, censuses, [("setup", 0), ("forward", 1), ("backward", 1)])
    assert found is not None
    split, line = found
    assert line.peak == split.allocated == 25 * MiB  # kept + big
    assert split.by_kind.params == 5 * MiB and split.by_kind.comm == 20 * MiB
    assert split.phase == "forward"  # a marker starts the phase it is labelled with
    # Before the trace's first entry, old and kept were allocated.
    assert sum(b.size for b in line.alive_at(-1)) == 8 * MiB


def test_a_trace_without_free_requested_frees_at_free_completed() -> None:
    trace = Trace()
    a = trace.alloc(2 * MiB, [])
    trace.free(a, requested=False)
    b = trace.alloc(MiB, [])
    line = timeline(trace.entries, [(b, MiB, [])])
    assert line.peak == 2 * MiB and [x.size for x in line.alive_at(line.peak_position)] == [2 * MiB]


def test_the_blocks_allocated_now_split_by_census_and_frames() -> None:
    trace = Trace()
    weight = trace.alloc(4 * MiB, [])
    saved = trace.alloc(2 * MiB, LINEAR_FORWARD)
    trace.alloc(MiB, [])
    snapshot = trace.snapshot(inactive=6 * MiB)
    split = current_split(snapshot, 0, {weight: "params"})
    assert split.kinds["params"] == 4 * MiB and split.kinds["activations"] == 2 * MiB
    assert split.unexplained == MiB and split.total == 7 * MiB
    assert saved in trace.live
    assert largest_free_block(snapshot["segments"], 0) == 6 * MiB


def test_the_unexplained_bytes_and_the_scripts_own_say_where_they_were_allocated() -> None:
    """A block no source names keeps the place that allocated it: the innermost frame outside torch.  One the
    training script's own code made, outside a module's forward and the backward, is the script's."""
    trace = Trace()
    helper = [frame("/venv/lib/python3.12/site-packages/torch/_tensor.py", "new_empty", 30),
              frame("/venv/lib/python3.12/site-packages/deepspeed/runtime/utils.py", "pad_buffer", 812),
              USER_LOOP]
    trace.alloc(3 * MiB, helper)
    trace.alloc(3 * MiB, helper)
    trace.alloc(MiB, [frame("/home/u/train.py", "make_mask", 40), USER_LOOP])
    trace.alloc(2 * MiB, [frame("/venv/lib/python3.12/site-packages/torch/functional.py", "zeros", 7),
                          frame("/home/u/train.py", "main", 52)])
    trace.alloc(MiB // 2, [])
    trace.alloc(MiB // 4, [frame("/usr/lib/python3.12/copy.py", "deepcopy", 3), USER_LOOP])  # the standard library's
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}], [("setup", 0)])
    assert found is not None
    split, _ = found
    assert split.unexplained == 6 * MiB + MiB // 2 + MiB // 4
    assert [(s.where, s.bytes) for s in split.unexplained_at] == [
        ("deepspeed/runtime/utils.py:812 in pad_buffer", 6 * MiB),
        ("", MiB // 2),
        ("copy.py:3 in deepcopy", MiB // 4),
    ]
    assert split.by_kind.script == 3 * MiB
    assert [(s.where, s.bytes) for s in split.script_at] == [("train.py:52 in main", 2 * MiB),
                                                              ("train.py:40 in make_mask", MiB)]


def test_a_virtualenv_in_a_torch_folder_is_not_torchs_own_code() -> None:
    """A virtualenv in ``/opt/torch/`` (as on the H200) holds Lightning's files too: the place of a block is
    Lightning's line, not the first frame outside every path with a ``torch`` folder in it."""
    venv = "/opt/torch/.venv/lib/python3.12/site-packages"
    frames = [frame(f"{venv}/torch/nn/modules/module.py", "_call_impl", 1784),
              frame(f"{venv}/lightning/pytorch/loops/fit_loop.py", "run", 217),
              frame("/home/u/shardtop/runner/lightning_run.py", "fit_module", 59)]
    trace = Trace()
    trace.alloc(MiB, frames)
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}], [("setup", 0)])
    assert found is not None
    split, _ = found
    assert split.by_kind.script == 0, "Lightning's loop made it, not the script"
    assert [(s.where, s.bytes) for s in split.unexplained_at] == [
        ("lightning/pytorch/loops/fit_loop.py:217 in run", MiB)
    ]


def test_what_the_script_calls_in_the_backward_is_not_the_scripts() -> None:
    """``loss.backward()`` is the script's line, but what autograd makes under it is the backward's, not the
    script's tensors: it stays unexplained, with its place."""
    trace = Trace()
    trace.mark()
    trace.alloc(4 * MiB, [frame("/home/u/train.py", "main", 60)])  # the backward, called from the loop
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}, {}], [("backward", 1), ("optimizer", 1)])
    assert found is not None
    split, _ = found
    assert split.by_kind.script == 0 and split.unexplained == 4 * MiB
    assert [s.where for s in split.unexplained_at] == ["train.py:60 in main"]


def test_a_workspace_made_in_the_first_steps_backward_after_a_set_up_census() -> None:
    """The backward thread's cuBLAS handle gets its own workspace in the first step; a census at set-up
    (step 0) does not make that step a later one."""
    trace = Trace()
    weights = trace.alloc(4 * MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    trace.mark()  # set-up, step 0
    trace.mark()  # forward of step 1
    trace.mark()  # backward of step 1
    trace.alloc(WORKSPACE, [])  # autograd's thread, alive to the end
    trace.mark()  # the optimizer of step 1
    trace.alloc(MiB, ADAM_STATE)
    labels = [("setup", 0), ("forward", 1), ("backward", 1), ("optimizer", 1)]
    census = {weights: "params"}
    found = peak_split(trace.snapshot(), 0, [census] * 4, labels, frozenset({WORKSPACE}))
    assert found is not None
    split, _ = found
    assert split.by_kind.workspace == WORKSPACE and split.unexplained == 0


def test_an_oom_census_taken_without_a_marker_does_not_shift_the_others() -> None:
    """At an OOM the probe counts what is alive without placing a marker: the census at each marker
    still names that marker's blocks, so the first step's gradients, made by autograd's thread with no
    Python frame and freed by ``zero_grad``, are gradients at the peak, and the peak is the backward's."""
    trace = Trace()
    weights = trace.alloc(32 * MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    trace.mark()  # forward of step 1
    trace.alloc(WORKSPACE, LINEAR_FORWARD)  # cuBLAS's, for the training thread's handle
    trace.mark()  # backward of step 1
    trace.alloc(WORKSPACE, [])  # for autograd's thread's handle
    grads = trace.alloc(32 * MiB, [])
    trace.mark()  # optimizer of step 1
    trace.mark()  # step 1
    trace.free(grads)
    trace.mark()  # forward of step 2, where the OOM comes
    labels = [("forward", 1), ("backward", 1), ("optimizer", 1), ("step", 1), ("forward", 2)]
    censuses = [{weights: "params"}, {weights: "params"}, {weights: "params", grads: "grads"},
                {weights: "params"}, {weights: "params"}]
    found = traced_splits(trace.snapshot(), 0, censuses, labels, frozenset({WORKSPACE}), now={weights: "params"})
    assert found is not None
    peak, at_oom = found.peak, found.at_end
    assert peak.by_kind.grads == 32 * MiB and peak.by_kind.workspace == 2 * WORKSPACE and peak.unexplained == 0
    assert (peak.phase, peak.step) == ("backward", 1)
    assert at_oom.kinds["workspace"] == 2 * WORKSPACE and at_oom.kinds["params"] == 32 * MiB
    assert at_oom.unexplained == 0 and at_oom.total == 32 * MiB + 2 * WORKSPACE


def test_outputs_an_evaluation_loop_keeps_from_earlier_forwards_are_kept_not_activations() -> None:
    """An evaluation under ``torch.no_grad()`` appends each batch's logits to a list and runs out in the
    third forward: nothing is saved for backward, so no census sees activations; the logits of the first
    two forwards are kept by the loop, and only what the third forward made so far is its own work.
    Without the markers of the forwards after the first (a probe that placed none), all of it would be
    taken for activations."""
    trace = Trace()
    weights = trace.alloc(32 * MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    kept: list[int] = []
    for _ in range(2):
        trace.mark()  # a forward begins
        hidden = trace.alloc(16 * MiB, LINEAR_FORWARD)
        kept.append(trace.alloc(64 * MiB, LINEAR_FORWARD))  # the logits, appended to the loop's list
        trace.free(hidden)
    trace.mark()  # the third forward, where the OOM comes
    trace.alloc(16 * MiB, LINEAR_FORWARD)
    labels = [("forward", 0)] * 3
    censuses = [{weights: "params"}, {}, {}]  # the forwards after the first place a marker alone
    found = traced_splits(trace.snapshot(), 0, censuses, labels, now={weights: "params"})
    assert found is not None
    at_oom = found.at_end
    assert at_oom.kinds["kept"] == 2 * 64 * MiB
    assert at_oom.kinds["activations"] == 16 * MiB
    assert at_oom.kinds["params"] == 32 * MiB and at_oom.unexplained == 0

    one_label = traced_splits(trace.snapshot(), 0, censuses[:1], labels[:1], now={weights: "params"})
    assert one_label is not None and one_label.at_end.kinds.get("kept", 0) == 0  # every forward is the same one


def test_what_an_autograd_functions_backward_makes_is_a_temporary_of_the_backward() -> None:
    """DeepSpeed ZeRO-3 runs linear layers through its own autograd Function, whose Python backward makes
    the gradients of input and weight; a user's helper called in the backward is not named."""
    zero3_linear = [frame("/venv/lib/python3.12/site-packages/torch/_tensor.py", "matmul", 9),
                    frame("/venv/lib/python3.12/site-packages/deepspeed/runtime/zero/linear.py", "backward", 137)]
    trace = Trace()
    trace.mark()  # forward
    trace.mark()  # backward
    trace.alloc(8 * MiB, zero3_linear)
    trace.alloc(MiB, [frame("/home/u/train.py", "clip_hook", 12), *zero3_linear])
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}, {}, {}], [("forward", 1), ("backward", 1), ("backward", 1)])
    assert found is not None
    split, _ = found
    assert split.by_kind.other == 8 * MiB
    assert split.unexplained == MiB
    assert [s.where for s in split.unexplained_at] == ["train.py:12 in clip_hook"]


def test_no_trace_no_peak_split() -> None:
    assert peak_split({"segments": [], "device_traces": []}, 0, []) is None
    assert peak_split({"segments": [], "device_traces": [[]]}, 0, []) is None


def test_allocator_stats_nested_and_flat() -> None:
    nested = {
        "allocated_bytes": {"all": {"current": 10, "peak": 15}},
        "reserved_bytes": {"all": {"current": 20, "peak": 22}},
        "active_bytes": {"all": {"current": 11, "peak": 16}},
        "inactive_split_bytes": {"all": {"current": 3, "peak": 4}},
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    flat = {f"{k}.all.{w}": v["all"][w] for k, v in nested.items() if isinstance(v, dict) for w in ("current", "peak")}
    flat.update(num_alloc_retries=2, num_ooms=1)
    expected = AllocatorStats(allocated=10, reserved=20, active=11, inactive_split=3, peak_allocated=15,
                              peak_reserved=22, num_alloc_retries=2, num_ooms=1)
    assert allocator_stats(nested) == allocator_stats(flat) == expected
    assert allocator_stats({}) is None


def test_the_workspaces_are_sized_as_torch_sizes_them() -> None:
    """Without torch's getters: ``CUBLAS_WORKSPACE_CONFIG`` and ``CUBLASLT_WORKSPACE_SIZE``, else the defaults
    (on an H200 with torch 2.11 the trace showed a 32 MiB block per cuBLAS handle and one of 1 MiB for
    cuBLASLt)."""
    assert cublas_workspace_size(":4096:8", 9) == cublas_workspace_size(None, 9) == 32 * MiB
    assert cublas_workspace_size(":4096:2:16:8", 8) == cublas_workspace_size(None, 8) == 8 * MiB + 128 * 1024
    assert cublas_workspace_size(":16:8", 9) == 128 * 1024
    assert cublaslt_workspace_size(None) == cublaslt_workspace_size("not a size") == MiB
    assert cublaslt_workspace_size("4096") == 4 * MiB


def test_a_models_weights_of_a_workspaces_size_are_parameters_not_workspaces() -> None:
    """Story 2 fixed: under zero.Init each 512 × 512 float32 weight is a 1 MiB block made in set-up and kept,
    the size of cuBLASLt's workspace. Made in a module's constructor, they are parameters; without frames,
    so many blocks of one size are no library's workspaces either."""
    lt = MiB
    layer_init = [frame("/venv/site-packages/torch/nn/modules/linear.py", "__init__"), USER_LOOP]
    for frames in (layer_init, []):
        trace = Trace()
        trace.mark()
        for _ in range(MAX_WORKSPACE_BLOCKS + 1):
            trace.alloc(lt, frames)
        trace.mark()
        found = peak_split(trace.snapshot(), 0, [{}, {}], [("setup", 0), ("setup", 0)], frozenset({lt}))
        assert found is not None
        split, _ = found
        assert split.by_kind.workspace == 0, frames
        if frames:
            assert split.by_kind.params == (MAX_WORKSPACE_BLOCKS + 1) * lt

    trace = Trace()  # the one real workspace of that size, made in the first step, is still named
    trace.mark()
    trace.alloc(lt, LINEAR_FORWARD)
    trace.mark()
    found = peak_split(trace.snapshot(), 0, [{}, {}], [("forward", 1), ("backward", 1)], frozenset({lt}))
    assert found is not None and found[0].by_kind.workspace == lt


def test_other_is_told_by_part_the_backwards_gradients_the_models_output_a_forwards_temporary() -> None:
    """A plain loop's step over a large vocabulary, its peak in the loss's backward (the trace still reads
    "forward"): what fills ``other`` is told apart: the gradients autograd made with no Python frame, the
    logits (the model's output, which the census after the forward saw as such), a forward's tensor saved for
    no backward, and a module buffer."""
    trace = Trace()
    weights = trace.alloc(8 * MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    buffer = trace.alloc(MiB, [frame("/x/torch/nn/modules/module.py", "_apply"), USER_LOOP])
    trace.mark()  # forward
    saved = trace.alloc(4 * MiB, LINEAR_FORWARD)
    trace.alloc(2 * MiB, LINEAR_FORWARD)  # a mask the forward keeps on the module, saved for nothing
    logits = trace.alloc(64 * MiB, LINEAR_FORWARD)
    trace.alloc(128 * MiB, [frame("/home/u/train.py", "main", 67)])  # the loss's fp32 copy
    trace.alloc(128 * MiB, [])  # the loss's backward, on autograd's thread: the gradient of the log-softmax
    trace.mark()  # the model's first module backward
    labels = [("forward", 1), ("backward", 1)]
    held = {weights: "params", buffer: "other"}
    censuses = [held, {**held, saved: "activations", logits: "output"}]
    found = peak_split(trace.snapshot(), 0, censuses, labels)
    assert found is not None
    split, _ = found
    assert split.by_kind.other == 128 * MiB + 64 * MiB + 2 * MiB + MiB and split.unexplained == 0
    assert split.other_parts == OtherParts(backward=128 * MiB, output=64 * MiB, forward=2 * MiB, buffers=MiB)
    assert [(s.part, s.where, s.bytes) for s in split.other_at] == [
        ("backward", "", 128 * MiB),
        ("output", "train.py:1 in main", 64 * MiB),
        ("forward", "train.py:1 in main", 2 * MiB),
    ]
    assert split.by_kind.activations == 4 * MiB and split.by_kind.script == 128 * MiB

    trace.alloc(MiB, ADAM_TEMP)  # the optimizer step's scratch, at the trace's end
    trace.mark()
    end = traced_splits(trace.snapshot(), 0, [*censuses, held], [*labels, ("optimizer", 1)])
    assert end is not None and end.at_end.parts().optimizer == MiB


def test_the_models_output_from_an_earlier_step_is_kept() -> None:
    """A loop's variable holds the last step's logits until the next forward returns: seen as the model's
    output by a census of the step that made them, they are kept from it in the next."""
    trace = Trace()
    trace.mark()  # forward, step 1
    logits = trace.alloc(64 * MiB, LINEAR_FORWARD)
    trace.mark()  # backward, step 1
    trace.mark()  # forward, step 2
    trace.alloc(64 * MiB, LINEAR_FORWARD)
    labels = [("forward", 1), ("backward", 1), ("forward", 2)]
    found = traced_splits(trace.snapshot(), 0, [{}, {logits: "output"}, {logits: "output"}], labels)
    assert found is not None
    assert found.at_end.kinds["kept"] == 64 * MiB and found.at_end.other_parts["output"] == 0


TORCH_F = "/venv/site-packages/torch/nn/functional.py"
CROSS_ENTROPY = [frame(TORCH_F, "cross_entropy", 3504), frame("/home/u/train.py", "main", 67)]
HF_CAUSAL_LM_LOSS = [frame(TORCH_F, "cross_entropy"),
                     frame("/venv/site-packages/transformers/loss/loss_utils.py", "fixed_cross_entropy"),
                     frame("/venv/site-packages/transformers/loss/loss_utils.py", "ForCausalLMLoss"),
                     frame("/venv/site-packages/transformers/models/llama/modeling_llama.py", "forward"),
                     frame("/venv/site-packages/torch/nn/modules/module.py", "_call_impl"), USER_LOOP]
"""transformers computes a causal LM's loss inside the model's ``forward``."""
LOSS_MODULE = [frame("/venv/site-packages/torch/nn/modules/loss.py", "forward"),
               frame("/venv/site-packages/torch/nn/modules/module.py", "_call_impl"), USER_LOOP]
SCRIPTS_LOG_SOFTMAX = [frame(TORCH_F, "log_softmax"), frame("/home/u/train.py", "main", 66)]
ATTENTION_SOFTMAX = [frame(TORCH_F, "softmax"), frame("/home/u/model.py", "forward", 12),
                     frame("/venv/site-packages/torch/nn/modules/module.py", "_call_impl"), USER_LOOP]


def test_a_loss_functions_frames_tell_what_the_loss_made() -> None:
    assert loss_made(CROSS_ENTROPY) and loss_made(HF_CAUSAL_LM_LOSS) and loss_made(LOSS_MODULE)
    assert loss_made(SCRIPTS_LOG_SOFTMAX)  # a log-softmax the script called itself, after the model
    assert not loss_made(ATTENTION_SOFTMAX)  # a module's forward called it: the attention's
    assert not loss_made(LINEAR_FORWARD) and not loss_made([USER_LOOP]) and not loss_made([])


def test_what_the_loss_made_of_the_logits_is_other_and_the_scripts_own_tensors_stay_the_scripts() -> None:
    """A plain loop over a large vocabulary, split at an OOM after the loss began: the logits the model
    returned, what loss functions allocated (a log-softmax, transformers' and a loss module's, the script's
    own log-softmax call) and the fp32 copy the census at the OOM saw made of the logits are other's parts
    ``output`` and ``loss``; a tensor the script made in the same window through no loss, and the copy where
    no census saw it (``logits.float()`` is the script's line, no loss's frame), stay the script's."""
    trace = Trace()
    trace.mark()  # forward
    logits = trace.alloc(64 * MiB, LINEAR_FORWARD)
    upcast = trace.alloc(128 * MiB, [frame("/home/u/train.py", "main", 66)])  # logits.float()
    trace.alloc(128 * MiB, CROSS_ENTROPY)  # its log-softmax
    trace.alloc(32 * MiB, HF_CAUSAL_LM_LOSS)
    trace.alloc(8 * MiB, LOSS_MODULE)
    trace.alloc(4 * MiB, SCRIPTS_LOG_SOFTMAX)
    trace.alloc(16 * MiB, [frame("/home/u/train.py", "main", 70)])  # the script's own, through no loss
    attention = trace.alloc(2 * MiB, ATTENTION_SOFTMAX)
    labels = [("forward", 1)]
    made = 128 * MiB + 32 * MiB + 8 * MiB + 4 * MiB
    found = traced_splits(trace.snapshot(), 0, [{}], labels, now={logits: "output", attention: "activations"})
    assert found is not None
    unseen = found.at_end
    assert unseen.parts() == OtherParts(output=64 * MiB, loss=made)
    assert unseen.kinds["script"] == 128 * MiB + 16 * MiB and unseen.kinds["activations"] == 2 * MiB
    assert [s.where for s in unseen.largest("script")] == ["train.py:66 in main", "train.py:70 in main"]
    assert [(s.part, s.where) for s in unseen.largest("other")] == [
        ("loss", "train.py:67 in main"), ("output", "train.py:1 in main"),
        ("loss", "transformers/loss/loss_utils.py:1 in fixed_cross_entropy"),
    ]

    seen = traced_splits(trace.snapshot(), 0, [{}], labels, now={logits: "output", upcast: "loss"})
    assert seen is not None
    assert seen.at_end.parts() == OtherParts(output=64 * MiB, loss=made + 128 * MiB)
    assert seen.at_end.kinds["script"] == 16 * MiB


def test_what_the_loss_made_in_an_earlier_forward_is_kept_and_in_a_backward_is_not_the_losss() -> None:
    trace = Trace()
    trace.mark()  # forward, step 1
    kept = trace.alloc(8 * MiB, CROSS_ENTROPY)  # a loss an evaluation keeps with its graph
    trace.mark()  # the next forward
    trace.mark()  # its backward
    trace.alloc(4 * MiB, CROSS_ENTROPY)  # a frame of the loss, in a backward: not the loss's tensor
    found = traced_splits(trace.snapshot(), 0, [{}, {}, {}], [("forward", 1), ("forward", 1), ("backward", 1)],
                          now={kept: "loss"})
    assert found is not None
    assert found.at_end.kinds["kept"] == 8 * MiB and found.at_end.parts().loss == 0
