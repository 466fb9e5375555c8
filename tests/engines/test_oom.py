"""OOM attribution: pure pieces, the tracker, and real CPU OOMs in their own processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shardtop.probe.names import module_names
from shardtop.probe.oom import (
    ObservedOom,
    StackFrame,
    attribute,
    format_stack,
    observation_matches,
    pick_culprit,
    pick_engine_step,
    resolve_paths,
    short_file,
    unique_paths,
)
from shardtop.probe.oom_errors import is_out_of_memory, parse_requested_bytes
from shardtop.probe.tracker import ModuleTracker, tracked_modules
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Exit, Oom, Shards, Tree, tree_paths
from shardtop.rundir.memory_figures import MemoryKinds
from tests.support.distributed import run_ranks
from tests.support.oom_workers import BATCH, D, Net

GiB = 1 << 30
CPU_MESSAGE = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 134217728 bytes. Error code 12 (Cannot allocate memory)"
)
CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 3.50 GiB memory in use."
)

# -- pure pieces --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (CPU_MESSAGE, 134217728),
        (CUDA_MESSAGE, int(1.96 * GiB)),
        ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 ...", 20 << 20),
        ("CUDA out of memory. Tried to allocate 512.00 KiB.", 512 << 10),
        ("CUDA out of memory. Tried to allocate 256 bytes.", 256),
        ("MPS backend out of memory. Tried to allocate 1.50 GiB on private pool.", int(1.5 * GiB)),
        ("Expected all tensors to be on the same device", None),
    ],
)
def test_parse_requested_bytes(message: str, expected: int | None) -> None:
    assert parse_requested_bytes(message) == expected


def _raised(
    error: BaseException, cause: BaseException | None = None, context: BaseException | None = None
) -> BaseException:
    """``error`` as it looks once raised (with a traceback and the given chain)."""
    try:
        if context is not None:
            try:
                raise context
            except BaseException:  # noqa: BLE001
                raise error  # noqa: B904 - implicit __context__ is the point
        raise error from cause
    except BaseException as e:  # noqa: BLE001
        return e


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.OutOfMemoryError(CUDA_MESSAGE), True),
        (RuntimeError(CPU_MESSAGE), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("Expected all tensors to be on the same device, but found cpu and cuda:0"), False),
        (ValueError("out of patience"), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_is_out_of_memory(error: BaseException, expected: bool) -> None:
    assert is_out_of_memory(_raised(error)) is expected


def test_is_out_of_memory_sees_a_wrapped_oom() -> None:
    oom = torch.OutOfMemoryError(CUDA_MESSAGE)
    assert is_out_of_memory(_raised(RuntimeError("step failed"), cause=oom))
    assert is_out_of_memory(_raised(RuntimeError("cleanup failed"), context=MemoryError()))
    assert not is_out_of_memory(_raised(RuntimeError("step failed"), cause=ValueError("bad batch")))


def test_pick_culprit_takes_the_innermost_module_frame() -> None:
    root, block, linear = nn.Sequential(), nn.Sequential(), nn.Linear(1, 1)
    frames: list[tuple[str, object | None]] = [
        ("training_step", root),  # a module's own method, not a module call
        ("_wrapped_call_impl", root),
        ("forward", block),
        ("_call_impl", linear),
        ("forward", linear),
        ("linear", None),
    ]
    culprit = pick_culprit(frames)
    assert culprit is not None and culprit.index == 4 and culprit.attributed_by == "forward-frame"


def test_pick_culprit_apply_frames_and_no_module() -> None:
    root, linear = nn.Sequential(), nn.Linear(1, 1)
    frames: list[tuple[str, object | None]] = [("to", root), ("_apply", root), ("_apply", linear), ("convert", None)]
    culprit = pick_culprit(frames)
    assert culprit is not None and culprit.index == 2 and culprit.attributed_by == "apply-frame"
    # LightningModule.backward(self, loss) is a module's frame but no module call: never the culprit.
    assert pick_culprit([("backward", root), ("backward", None), ("_engine_run_backward", None)]) is None
    assert pick_culprit([("forward", None)]) is None


DS = "/venv/site-packages/deepspeed/runtime/engine.py"
ZERO3 = "/venv/site-packages/deepspeed/runtime/zero/stage3.py"
TORCH_MODULE = "/venv/site-packages/torch/nn/modules/module.py"
FSDP_RUNTIME = "/venv/site-packages/torch/distributed/fsdp/_runtime_utils.py"
FSDP_HANDLE = "/venv/site-packages/torch/distributed/fsdp/_flat_param.py"
FSDP_API = "/venv/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py"


def test_pick_engine_step_story_2_move() -> None:
    frames = [
        ("main", "/home/u/train.py"),
        ("initialize", "/venv/site-packages/deepspeed/__init__.py"),
        ("DeepSpeedEngine.__init__", DS),
        ("DeepSpeedEngine._configure_distributed_model", DS),
        ("Module.to", TORCH_MODULE),
        ("Module._apply", TORCH_MODULE),
    ]
    assert pick_engine_step(frames) == "DeepSpeedEngine._configure_distributed_model"


def test_pick_engine_step_prefers_engine_level_over_internals() -> None:
    frames = [
        ("DeepSpeedEngine.__init__", DS),
        ("DeepSpeedEngine._configure_optimizer", DS),
        ("DeepSpeedEngine._configure_zero_optimizer", DS),
        ("DeepSpeedZeroOptimizer_Stage3.__init__", ZERO3),
        ("DeepSpeedZeroOptimizer_Stage3._create_fp16_partitions_with_defragmentation", ZERO3),
    ]
    assert pick_engine_step(frames) == "DeepSpeedEngine._configure_zero_optimizer"
    assert pick_engine_step(frames[3:]) == "DeepSpeedZeroOptimizer_Stage3.__init__"


def test_pick_engine_step_fsdp_and_fallbacks() -> None:
    unshard = [
        ("FullyShardedDataParallel.forward", FSDP_API),
        ("_pre_forward", FSDP_RUNTIME),
        ("_pre_forward_unshard", FSDP_RUNTIME),
        ("_unshard", FSDP_RUNTIME),
        ("FlatParamHandle.unshard", FSDP_HANDLE),
        ("FlatParamHandle._alloc_padded_unsharded_flat_param", FSDP_HANDLE),
    ]
    assert pick_engine_step(unshard) == "FlatParamHandle.unshard"
    # Only a wrapper's forward on the stack: a module call, not an engine step.
    assert pick_engine_step([("FullyShardedDataParallel.forward", FSDP_API), ("Linear.forward", TORCH_MODULE)]) is None
    # An unknown engine frame still says something; decorators do not.
    assert pick_engine_step(
        [("Foo.bar", DS), ("wrapped_fn", "/venv/site-packages/deepspeed/utils/nvtx.py")]
    ) == "Foo.bar"
    assert pick_engine_step([("main", "/home/u/train.py")]) is None


def test_format_stack_keeps_both_ends() -> None:
    frames = [StackFrame(f"/venv/site-packages/pkg/m{i}.py", i, "f", f"f{i}") for i in range(100)]
    lines = format_stack(frames, limit=40)
    assert len(lines) == 40
    assert lines[0] == "pkg/m0.py:0 in f0"
    assert lines[-1] == "pkg/m99.py:99 in f99"
    assert lines[5] == "… 61 frames …"  # 5 + marker + 34 lines stand for 100 frames
    assert short_file("/home/u/project/src/train.py") == "project/src/train.py"


def test_unique_paths() -> None:
    assert unique_paths(["", "", "a", None, "a", "a.b"]) == ["", "a", "a.b"]


def test_resolve_paths_guesses_what_names_lack() -> None:
    model = Net(wide=8)
    fc1 = model.blocks[2].mlp.fc1
    names = module_names(model)
    assert resolve_paths([model, model.blocks[2], fc1], names) == ["", "blocks.2", "blocks.2.mlp.fc1"]
    # Names learnt for part of the model only: the rest is found under the nearest known module.
    partial = {id(model.blocks[2]): "blocks.2"}
    assert resolve_paths([model, model.blocks[2], fc1], partial) == ["", "blocks.2", "blocks.2.mlp.fc1"]
    # Nothing learnt: paths relative to the outermost module on the stack.
    assert resolve_paths([model, fc1], {}) == ["", "blocks.2.mlp.fc1"]


def test_observation_matches() -> None:
    seen = ObservedOom(
        device=0, requested=2_101_346_304, device_total=80 * GiB, device_free=GiB, gpus=None,
        autograd_node=None, monotonic=100.0,
    )
    parsed = parse_requested_bytes(CUDA_MESSAGE)
    assert observation_matches(seen, 0, parsed, now=101.0)
    assert observation_matches(seen, 0, None, now=101.0)
    assert not observation_matches(seen, 1, parsed, now=101.0)
    assert not observation_matches(seen, 0, 20 << 20, now=101.0)
    assert not observation_matches(seen, 0, parsed, now=1000.0)
    assert not observation_matches(None, 0, parsed, now=101.0)


# -- attribute() in this process: real frames raising a real MemoryError -----------------------------


class Hungry(nn.Module):
    """Stands for a module whose allocation fails: Python's own MemoryError from its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise MemoryError("no room for the activations")


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(2, 2), Hungry())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def _catch(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("no error")


def test_attribute_forward_frame_in_process() -> None:
    model = Model()
    exc = _catch(lambda: model(torch.zeros(1, 2)))
    tb, message = exc.__traceback__, str(exc)
    event = attribute(exc, names=module_names(model), phase="forward", step=3, device="cpu")
    assert (event.module, event.module_type, event.attributed_by) == ("encoder.1", "Hungry", "forward-frame")
    assert event.module_stack == ["", "encoder", "encoder.1"]
    assert event.step == 3 and event.phase == "forward"
    assert event.message == "no room for the activations"
    assert event.traceback[-1].endswith("in Hungry.forward")
    assert event.gpus is None  # no NVIDIA driver here
    assert exc.__traceback__ is tb and str(exc) == message  # read, never changed


def test_attribute_follows_the_chain_to_the_wrapped_oom() -> None:
    model = Model()

    def step() -> None:
        try:
            model(torch.zeros(1, 2))
        except MemoryError as e:
            raise RuntimeError("training step failed") from e

    event = attribute(_catch(step), names=module_names(model), phase="forward", step=0, device="cpu")
    assert event.module == "encoder.1"
    assert event.message == "no room for the activations"
    assert any(
        "in test_attribute_follows_the_chain_to_the_wrapped_oom.<locals>.step" in line for line in event.traceback
    )


class Lit(nn.Module):
    """A root whose own method runs backward, like ``LightningModule.backward(self, loss)``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise MemoryError("out of host memory in the root's own code")


def test_a_backward_tracker_answer_beats_the_root_frame() -> None:
    model = Lit()
    tracker = ModuleTracker(model, module_names(model), hooks=True)
    tracker.install()
    loss = model.head(torch.ones(1, 2, requires_grad=True)).sum()
    seen: list[str | None] = []
    loss.grad_fn.register_prehook(lambda grads: seen.append(tracker.current_backward))
    loss.backward()
    assert tracker.current_backward == "head"
    exc = _catch(lambda: model(torch.zeros(1, 2)))
    names = module_names(model)
    event = attribute(exc, names=names, phase="backward", step=0, device="cpu", tracker=tracker)
    assert (event.module, event.attributed_by, event.module_type) == ("head", "tracker", "Linear")
    # In forward the root's frame is the honest answer.
    event = attribute(exc, names=names, phase="forward", step=0, device="cpu", tracker=tracker)
    assert (event.module, event.attributed_by) == ("", "forward-frame")


# -- the tracker -------------------------------------------------------------------------------


def test_tracker_hooks_only_modules_owning_parameters() -> None:
    model = Net(wide=8)
    owners = {module_names(model)[id(m)] for m in tracked_modules(model)}
    assert "blocks.2.mlp.fc1" in owners and "blocks.2.norm" in owners
    assert not owners & {"", "blocks", "blocks.2", "blocks.2.mlp", "blocks.2.mlp.act"}
    assert ModuleTracker(model, module_names(model)).install() == 0  # no hooks unless asked
    tracker = ModuleTracker(model, module_names(model), hooks=True)
    assert tracker.install() == len(owners) == tracker.install()  # idempotent
    tracker.remove()
    assert not any(m._forward_hooks for m in model.modules())


def test_tracker_follows_backward_and_forgets_at_the_next_forward() -> None:
    torch.manual_seed(0)
    model = Net(wide=8)
    tracker = ModuleTracker(model, module_names(model), hooks=True)
    tracker.install()
    seen: list[str | None] = []
    mlp = model.blocks[2].mlp
    # A parameter's hook runs right after the node that computed its gradient.
    mlp.fc2.weight.register_hook(lambda g: seen.append(tracker.current_backward))
    mlp.fc1.weight.register_hook(lambda g: seen.append(tracker.current_backward))
    model(torch.randn(4, 32)).sum().backward()
    assert seen == ["blocks.2.mlp.fc2", "blocks.2.mlp.fc1"]
    assert tracker.current_backward == "embed"  # backward ends at the first layer
    assert tracker.current_module("forward") is None
    model(torch.randn(4, 32))
    assert tracker.current_backward is None  # a new forward: the old answer is stale
    with torch.no_grad():
        model(torch.randn(4, 32))
    tracker.remove()


def test_module_of_node_names_the_node_the_observer_would_see() -> None:
    """CUDA's observer records the running autograd node; without hooks the tracker maps it to a module."""
    torch.manual_seed(0)
    model = Net(wide=8)
    tracker = ModuleTracker(model, module_names(model))  # not installed: no per-step cost
    running: list[Any] = []
    out = model.blocks[2].mlp.fc2(torch.randn(4, 8, requires_grad=True))
    out.grad_fn.register_prehook(lambda g: running.append(torch._C._current_autograd_node()))
    out.sum().backward()
    assert running and running[0] is not None
    found = tracker.module_of_node(running[0])
    assert found is not None and (found.path, found.type_name) == ("blocks.2.mlp.fc2", "Linear")


# -- real CPU OOMs, each in its own process ---------------------------------------------------------------------------


def _oom_of(out_dir: Path) -> tuple[Oom, Exit]:
    events, skipped = read_all(out_dir / "run" / "events")
    assert skipped == {"bad": 0, "unknown": 0, "newer": 0, "torn": 0}
    ooms = [e for e in events if isinstance(e, Oom)]
    exits = [e for e in events if isinstance(e, Exit)]
    assert len(ooms) == 1 and len(exits) == 1
    return ooms[0], exits[0]


def _propagated_unchanged(result: dict[str, Any]) -> None:
    assert result["same_object"] and result["traceback_intact"]
    assert result["type"] == "RuntimeError"
    assert "DefaultCPUAllocator: can't allocate memory" in result["message"]


def test_real_forward_oom_names_the_linear(tmp_path: Path) -> None:
    [result] = run_ranks("tests.support.oom_workers:forward_oom", 1, tmp_path)
    _propagated_unchanged(result)
    oom, exit_ = _oom_of(tmp_path)
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc1", "Linear", "forward-frame")
    assert oom.module_stack == ["", "blocks.2", "blocks.2.mlp", "blocks.2.mlp.fc1"]
    assert oom.requested_bytes == 512 * 65536 * 4
    assert (oom.phase, oom.step, oom.device, oom.engine_step) == ("forward", 1, "cpu", None)
    assert oom.traceback[-1].startswith("torch/nn/modules/linear.py:") and oom.traceback[-1].endswith("Linear.forward")
    assert exit_.status == "oom"
    # What filled memory at the OOM (the first step is explained: activations are followed).
    x, hidden = BATCH * D * 4, BATCH * 64 * 4
    norm = x + 2 * BATCH * 4  # a LayerNorm saves its input, a mean and a reciprocal deviation per row
    block = norm + x + 2 * hidden  # then fc1 its input, the GELU its input, fc2 its input
    saved = x + 2 * block + norm  # embed's input, blocks 0 and 1, blocks.2's LayerNorm; fc1 then failed
    weights = sum(p.numel() * 4 for p in Net().parameters())
    assert oom.memory is not None
    assert oom.memory.by_kind == MemoryKinds(params=weights, grads=0, activations=saved, other=0)
    assert (oom.memory.phase, oom.memory.step, oom.memory.source) == ("forward", 1, "tensors")
    # CPU: no caching allocator, so no allocated figure, no peak, no stats.
    assert oom.memory.allocated is None and oom.memory.unexplained is None
    assert oom.peak is None and oom.allocator is None


def test_real_setup_oom_names_the_linear_being_converted(tmp_path: Path) -> None:
    [result] = run_ranks("tests.support.oom_workers:setup_oom", 1, tmp_path)
    _propagated_unchanged(result)
    oom, _ = _oom_of(tmp_path)
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc1", "Linear", "apply-frame")
    assert oom.module_stack == ["", "blocks", "blocks.2", "blocks.2.mlp", "blocks.2.mlp.fc1"]
    assert oom.requested_bytes == 32 * 65536 * 8
    assert oom.phase == "setup"
    # How far the conversion got: a snapshot of the model as the OOM left it.
    events, _ = read_all(tmp_path / "run" / "events")
    [tree] = [e for e in events if isinstance(e, Tree)]
    [at_oom] = [e for e in events if isinstance(e, Shards) and e.stage == "oom"]
    assert events.index(at_oom) > events.index(oom)  # the OOM event comes first, flushed
    paths = tree_paths(tree.names, tree.parents)
    converted = ("embed", "blocks.0.", "blocks.1.", "blocks.2.norm")  # children first, as Module._apply goes
    for path, full, held in zip(paths, tree.bytes, at_oom.bytes, strict=True):
        if full:
            assert held == (2 * full if path.startswith(converted) else full), path
    assert oom.memory is not None and oom.memory.by_kind.params == sum(at_oom.bytes)


def test_real_setup_oom_before_names_were_learnt(tmp_path: Path) -> None:
    run_ranks("tests.support.oom_workers:setup_oom", 1, tmp_path, learn_names=False)
    oom, _ = _oom_of(tmp_path)
    assert (oom.module, oom.attributed_by) == ("blocks.2.mlp.fc1", "apply-frame")


@pytest.mark.parametrize("track", ["graph", "hooks"])
def test_real_backward_oom_named_by_the_tracker(tmp_path: Path, track: str) -> None:
    [result] = run_ranks("tests.support.oom_workers:backward_oom", 1, tmp_path, track=track)
    _propagated_unchanged(result)
    oom, _ = _oom_of(tmp_path)
    # fc2's backward computes the 128 MiB gradient of the wide activations.
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc2", "Linear", "tracker")
    assert oom.phase == "backward" and oom.module_stack == []
    assert oom.traceback[-1].endswith("in _engine_run_backward")


def test_real_backward_oom_without_tracker_says_only_the_phase(tmp_path: Path) -> None:
    run_ranks("tests.support.oom_workers:backward_oom", 1, tmp_path, track="none")
    oom, _ = _oom_of(tmp_path)
    assert (oom.module, oom.attributed_by, oom.phase) == (None, "phase", "backward")
    assert oom.requested_bytes == 512 * 65536 * 4


@pytest.mark.parametrize("learn_names", [True, False])
def test_real_fsdp1_oom_maps_to_the_users_path(tmp_path: Path, learn_names: bool) -> None:
    [result] = run_ranks("tests.support.oom_workers:fsdp1_forward_oom", 1, tmp_path, learn_names=learn_names)
    _propagated_unchanged(result)
    assert result["wrapped_paths"] == []
    oom, _ = _oom_of(tmp_path)
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc1", "Linear", "forward-frame")
    assert oom.module_stack == ["", "blocks.2", "blocks.2.mlp", "blocks.2.mlp.fc1"]
    assert oom.engine_step is None  # FSDP's forward is a module call, not an engine step
    assert any("FullyShardedDataParallel.forward" in line for line in oom.traceback)


@pytest.mark.parametrize("learn_names", [True, False])
def test_real_deepspeed_init_oom_names_the_parameter_being_cast(tmp_path: Path, learn_names: bool) -> None:
    [result] = run_ranks("tests.support.oom_workers:deepspeed_setup_oom", 1, tmp_path, timeout=120,
                         learn_names=learn_names)
    _propagated_unchanged(result)
    oom, _ = _oom_of(tmp_path)
    assert oom.engine_step == "DeepSpeedEngine._configure_distributed_model"
    # No module frame: the parameter DeepSpeed was casting names the module.
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc1", "Linear", "apply-frame")
    assert oom.traceback[-1].endswith("DeepSpeedEngine._cast_module_mixed_precision")


# -- reading a failed backward's graph (real graphs, a real failure mid-backward) ---------------------------------


def _fail(grads: Any) -> None:
    raise MemoryError("no room for this gradient")


def _failed_backward(model: Net, fail_at: Any, retain_graph: bool = False) -> tuple[torch.Tensor, BaseException]:
    """Run backward until the node of ``fail_at(model, loss)`` is about to run, and fail there."""
    loss = model(torch.randn(4, 32)).square().mean()
    fail_at(model, loss).register_prehook(_fail)
    return loss, _catch(lambda: loss.backward(retain_graph=retain_graph))


def _graph_answer(model: Net, loss: torch.Tensor) -> Any:
    return ModuleTracker(model, module_names(model)).module_of_graph([loss])


def _node_of(module: nn.Module) -> Any:
    """The autograd node computing ``module``'s output (its forward hook catches it)."""
    nodes: list[Any] = []
    module.register_forward_hook(lambda m, a, out: nodes.append(out.grad_fn))
    return lambda model, loss: nodes[-1]


@pytest.mark.parametrize("layer", ["embed", "blocks.1.mlp.fc1", "blocks.2.mlp.fc2", "blocks.3.norm", "head"])
def test_graph_names_the_module_whose_node_failed(layer: str) -> None:
    torch.manual_seed(0)
    model = Net(wide=8)
    loss, _ = _failed_backward(model, _node_of(model.get_submodule(layer)))
    found = _graph_answer(model, loss)
    assert found is not None and found.path == layer


def test_graph_names_the_common_module_around_a_parameterless_op() -> None:
    torch.manual_seed(0)
    model = Net(wide=8)
    act: list[Any] = []
    model.blocks[1].mlp.act.register_forward_hook(lambda m, a, out: act.append(out.grad_fn))
    loss, _ = _failed_backward(model, lambda m, loss: act[-1])
    found = _graph_answer(model, loss)
    assert found is not None and (found.path, found.type_name) == ("blocks.1.mlp", "Mlp")


def test_graph_says_nothing_when_nothing_was_released() -> None:
    torch.manual_seed(0)
    model = Net(wide=8)
    # retain_graph=True: autograd keeps every saved tensor, so the graph cannot tell what ran.
    loss, _ = _failed_backward(model, _node_of(model.blocks[2].mlp.fc2), retain_graph=True)
    assert _graph_answer(model, loss) is None
    # The loss's own node failed: nothing ran before it.
    model = Net(wide=8)
    loss, _ = _failed_backward(model, lambda m, loss: loss.grad_fn.next_functions[0][0])
    assert _graph_answer(model, loss) is None


class Trainee(Net):
    """Like a LightningModule: its own ``backward(self, loss)`` method is on the stack."""

    def backward(self, loss: torch.Tensor) -> None:  # type: ignore[override]
        loss.backward()


def test_attribute_reads_the_failed_graph_without_a_tracker() -> None:
    torch.manual_seed(0)
    model = Trainee(wide=8)
    fc1: list[Any] = []
    model.blocks[1].mlp.fc1.register_forward_hook(lambda m, a, out: fc1.append(out.grad_fn))
    loss = model(torch.randn(4, 32)).square().mean()
    fc1[-1].register_prehook(_fail)
    exc = _catch(lambda: model.backward(loss))
    # The phase says forward (a manual backward inside a step): the stack says backward.
    event = attribute(exc, names=module_names(model), phase="forward", step=0, device="cpu")
    assert (event.module, event.module_type, event.attributed_by) == ("blocks.1.mlp.fc1", "Linear", "tracker")
    assert event.module_stack == []


def test_real_fsdp1_backward_oom_names_the_leaf_inside_the_flat_parameter(tmp_path: Path) -> None:
    [result] = run_ranks("tests.support.oom_workers:fsdp1_backward_oom", 1, tmp_path)
    _propagated_unchanged(result)
    oom, _ = _oom_of(tmp_path)
    # FSDP1 flattened blocks.2's parameters into one; the split of that flat parameter says which leaf.
    assert (oom.module, oom.module_type, oom.attributed_by) == ("blocks.2.mlp.fc2", "Linear", "tracker")


ENGINE_SOURCE = '''
class DeepSpeedEngine:
    def __init__(self):
        self._configure_optimizer()

    def _configure_optimizer(self):
        self._configure_zero_optimizer()

    def _configure_zero_optimizer(self):
        raise MemoryError("no room for the 1.96 GiB flat buffer")
'''


def test_attribute_engine_step_alone() -> None:
    """An OOM in an engine's own code with no module in hand: the engine step is the answer."""
    namespace: dict[str, Any] = {}
    exec(compile(ENGINE_SOURCE, "/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", "exec"), namespace)
    exc = _catch(namespace["DeepSpeedEngine"])
    event = attribute(exc, names={}, phase="setup", step=0, device="cpu")
    assert (event.module, event.attributed_by) == (None, "engine-step")
    assert event.engine_step == "DeepSpeedEngine._configure_zero_optimizer"
    assert event.traceback[-1] == "deepspeed/runtime/engine.py:10 in DeepSpeedEngine._configure_zero_optimizer"


@pytest.mark.parametrize(("headroom_mib", "failing"), [(24, "partition"), (8, "weight")])
def test_real_oom_while_zero_init_builds_names_the_type_being_built(
    tmp_path: Path, headroom_mib: int, failing: str
) -> None:
    [result] = run_ranks("tests.support.oom_workers:zero_init_oom", 1, tmp_path, headroom_mib=headroom_mib)
    _propagated_unchanged(result)
    oom, _ = _oom_of(tmp_path)
    # Under construction the layer is in no tree yet: its type is all there is to name.
    assert (oom.module, oom.module_type, oom.attributed_by) == (None, "Linear", "init-frame")
    events, _ = read_all(tmp_path / "run" / "events")
    assert not [e for e in events if isinstance(e, (Tree, Shards))], "the wrapper held no parameter: no tree"
    if failing == "partition":
        assert oom.engine_step is not None and oom.engine_step.startswith("Init.")
    else:  # the layer's own weight, allocated in Linear.__init__ inside zero.Init's wrapper
        assert any(line.endswith("in Linear.__init__") for line in oom.traceback)
