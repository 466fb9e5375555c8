"""Memory by kind on CPU, in one process: the census, saved activations, the probe's explained steps.

Sizes are known from the model: a Linear(F, H) stores F*H + H floats, Adam keeps two
moments of every parameter and a 4-byte step per tensor, a Linear saves its input for
backward (batch x F x 4 bytes), a ReLU its output.  Real engines on gloo are checked
in ``test_shards.py`` (their workers read the same sources).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from shardtop.probe.activations import SavedActivations
from shardtop.probe.memory_explain import REQUEST_FILE, MemoryExplainer, MemoryOptions
from shardtop.probe.memory_kinds import MemoryCensus
from shardtop.probe.saved_graph import nodes_from, of_a_parameter, saved_by
from shardtop.probe.session import Probe
from shardtop.rundir.event_files import read_all
from shardtop.rundir.event_lines import decode, encode
from shardtop.rundir.events import Memory, Oom, Shards, tree_paths
from shardtop.rundir.memory_figures import MemoryKinds, MemorySplit, OtherParts
from tests.support.shard_workers import TinyNet

B, F, H, OUT = 8, 16, 32, 4


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(F, H), nn.ReLU(), nn.Linear(H, OUT))


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_census_counts_parameters_gradients_and_adams_two_moments() -> None:
    model = nn.Sequential(nn.Linear(F, H), nn.BatchNorm1d(H), nn.ReLU(), nn.Linear(H, OUT))
    optimizer = torch.optim.Adam(model.parameters())
    census = MemoryCensus("cpu")
    census.set_target(model, optimizer)
    before = census.count()
    assert before is not None
    weights = param_bytes(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # running mean/var, a batch count
    assert before.kinds == MemoryKinds(params=weights, grads=0, optimizer=0, other=buffers)
    model(torch.randn(B, F)).sum().backward()
    optimizer.step()
    after = census.count()
    assert after is not None
    tensors = len(list(model.parameters()))
    assert after.kinds == MemoryKinds(params=weights, grads=weights, optimizer=2 * weights + 4 * tensors, other=buffers)
    # Every storage was found once, where it lives.
    assert {p.untyped_storage().data_ptr() for p in model.parameters()} <= set(after.addresses)
    assert after.total == 2 * weights + 2 * weights + 4 * tensors + buffers


def test_tied_and_viewed_storages_count_once() -> None:
    model = TinyNet()  # the head's weight is the embedding's
    census = MemoryCensus("cpu")
    census.set_target(model)
    count = census.count()
    assert count is not None
    assert count.kinds.params == param_bytes(model) == 239 * 4
    flat = torch.zeros(10)
    model.embed.weight.grad = flat[:6].view(1, 6).expand(11, 6)  # a view into a buffer holding more
    count = census.count()
    assert count is not None and count.kinds.grads == 40  # the whole storage, once


def test_saved_activations_of_a_known_shape_per_module() -> None:
    model = mlp()
    tracker = SavedActivations()
    assert tracker.start()
    out = model(torch.randn(B, F))
    tracker.stop()
    by_module = tracker.by_module(torch.device("cpu"))
    # Linear 0 saved its input; the ReLU its output, which Linear 2 saved again (counted once, at the ReLU).
    assert by_module == {id(model[0]): B * F * 4, id(model[1]): B * H * 4}
    assert sum(storage.nbytes for storage, _ in tracker.live_storages()) == B * F * 4 + B * H * 4
    out.sum().backward()
    assert tracker.live_storages() == []  # released as each node's backward ran


def test_an_explained_steps_census_leaves_the_backward_free_to_release_the_activations() -> None:
    model = mlp()
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=1))
    explainer.set_target(model)
    explainer.on_phase("forward", 0)
    x = torch.randn(B, F)
    loss = model(x).pow(2).mean()
    saved = {(s := t.untyped_storage()).data_ptr(): s for node in nodes_from([loss]) for t in saved_by(node)
             if not of_a_parameter(t)}
    made = [StorageWeakRef(s) for address, s in saved.items() if address != x.data_ptr()]  # the batch is the test's
    assert len(made) == 2  # the ReLU's output (saved by it and by the second Linear) and the model's output
    del saved
    explainer.on_phase("backward", 0)  # the census of the forward's end reads every saved storage
    assert explainer.act_by_module == {id(model[0]): B * F * 4, id(model[1]): B * H * 4, 0: B * OUT * 4}
    loss.backward()
    assert [ref.expired() for ref in made] == [True, True]  # nothing the census read holds them


def _probe(tmp_path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> Probe:
    probe = Probe(tmp_path / "run", 0, 1)
    probe.hello(device="cpu", engine="plain")
    probe.snapshot(model, stage="engine", optimizer=optimizer)
    probe.start_memory(interval=60.0)  # one background sample now; the phase samples are what is checked
    return probe


def _steps(probe: Probe, model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        probe.phase("forward", step)
        loss = model(torch.randn(B, F)).pow(2).mean()
        probe.phase("backward")
        loss.backward()
        probe.phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.step(step)
        if step == 1:
            probe.snapshot(model, stage="step", optimizer=optimizer)


def _splits(tmp_path: Path) -> dict[tuple[int | None, str], MemorySplit]:
    events, skipped = read_all(tmp_path / "run" / "events")
    assert sum(skipped.values()) == 0
    return {
        (e.split.step, e.split.phase): e.split for e in events if isinstance(e, Memory) and e.split and e.split.phase
    }


def test_probe_explains_the_first_steps(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    probe = _probe(tmp_path, model, optimizer)
    _steps(probe, model, optimizer, range(1, 5))
    probe.exit(0)
    probe.close()
    weights = param_bytes(model)
    saved = B * F * 4 + B * H * 4 + B * OUT * 4  # and the model's output, saved by pow() outside any module
    splits = _splits(tmp_path)
    # other: the loss itself (one fp32 value the script holds), what the loss made of the model's output
    assert splits[(1, "backward")].by_kind == MemoryKinds(params=weights, grads=0, optimizer=0, activations=saved,
                                                           other=4)
    assert splits[(1, "backward")].other_parts == OtherParts(loss=4)
    assert splits[(1, "optimizer")].by_kind == MemoryKinds(params=weights, grads=weights, optimizer=0, activations=0,
                                                            other=0)
    moments = 2 * weights + 4 * 4
    assert splits[(2, "backward")].by_kind.activations == saved
    assert splits[(2, "step")].by_kind == MemoryKinds(params=weights, grads=0, optimizer=moments, activations=0,
                                                       other=0)
    # Explained steps (2 by default) follow saved tensors; later splits cannot say what is saved.
    assert all(split.by_kind.activations is None for (step, _), split in splits.items() if step and step > 2)
    assert all(split.allocated is None and split.unexplained is None for split in splits.values())  # CPU

    events, _ = read_all(tmp_path / "run" / "events")
    [step_shards] = [e for e in events if isinstance(e, Shards) and e.stage == "step"]
    tree = next(e for e in events if getattr(e, "tree_id", None) == step_shards.tree_id and not isinstance(e, Shards))
    rows = dict(zip(tree_paths(tree.names, tree.parents), range(len(tree.names)), strict=True))
    act, grads = step_shards.act_bytes, step_shards.grad_bytes
    assert act is not None and grads is not None
    assert [act[rows[p]] for p in ("", "0", "1", "2")] == [0, B * F * 4, B * H * 4, 0]
    # The loop zeroes gradients after the step: the snapshot reports them as held before it.
    assert [grads[rows[p]] for p in ("0", "1", "2")] == [(F * H + H) * 4, 0, (H * OUT + OUT) * 4]


def test_detail_always_follows_activations_in_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDTOP_MEMORY_DETAIL", "always")
    monkeypatch.setenv("SHARDTOP_EXPLAIN_STEPS", "1")
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = _probe(tmp_path, model, optimizer)
    explainer = probe.memory()
    assert explainer.options == MemoryOptions(explain_steps=1, always=True)
    _steps(probe, model, optimizer, range(1, 4))
    time.sleep(max(0.0, explainer.next_census - time.monotonic()))  # the census's budget: due again
    probe.phase("forward", 4)
    out = model(torch.randn(B, F)).pow(2).mean()
    count = explainer.census.count(explainer.activations)
    probe.close()
    assert count is not None and count.kinds.activations == B * F * 4 + B * H * 4 + B * OUT * 4
    split = _splits(tmp_path)[(4, "forward")]
    assert split.by_kind.activations == 0  # measured (followed), and nothing saved yet
    del out


def test_a_request_explains_the_next_step(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = _probe(tmp_path, model, optimizer)
    _steps(probe, model, optimizer, range(1, 4))
    request = tmp_path / "run" / REQUEST_FILE
    request.parent.mkdir(parents=True, exist_ok=True)
    request.write_text("")
    probe.memory().sample(Memory(), None, fresh=True)  # the sampler thread finds the request
    assert not request.exists()
    _steps(probe, model, optimizer, range(4, 6))
    probe.close()
    explained = {step for (step, _), split in _splits(tmp_path).items() if split.by_kind.activations is not None}
    assert explained == {1, 2, 4, 5}  # two at the start, two more asked for (SHARDTOP_EXPLAIN_STEPS's default)


def test_the_census_keeps_to_its_time_budget(tmp_path: Path) -> None:
    """Outside explained steps a census runs at a phase change, as often as its budget allows."""
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(1000)))  # 2000 tensors: a census of a few ms
    explainer = MemoryExplainer("cpu", MemoryOptions(explain_steps=0))
    explainer.set_target(model)

    def phase_sample() -> Memory:
        explainer.on_phase("backward", 7)
        return explainer.sample(Memory(), None, fresh=False)  # the training thread's sample at that phase change

    first, second = phase_sample(), phase_sample()
    assert first.split is not None and second.split is None
    assert (first.split.phase, first.split.step, first.split.by_kind.activations) == ("backward", 7, None)
    assert explainer.next_census > time.monotonic()
    time.sleep(max(0.0, explainer.next_census - time.monotonic()))
    third = phase_sample()
    assert third.split is not None and third.split.by_kind.params == param_bytes(model)
    sampled = explainer.sample(Memory(), None, fresh=True)  # the sampler thread never reads tensors
    assert sampled.split is None
    assert first.peak_split is None  # no allocator on CPU: no peak to split


def test_old_and_new_recordings_decode() -> None:
    old_memory = b'{"kind":"memory","v":1,"rank":0,"host":"h","t":1.0,"device":"cuda:0","allocated":5,"reserved":8}'
    old_oom = b'{"kind":"oom","v":1,"phase":"forward","message":"CUDA out of memory"}'
    old_shards = (b'{"kind":"shards","v":1,"tree_id":0,"engine":"plain","stage":"setup","devices":["cpu"],'
                  b'"states":["unsharded"],"bytes":[4],"device":[0],"state":[0],"unit":[-1]}')
    memory, oom, shards = (decode(line) for line in (old_memory, old_oom, old_shards))
    assert isinstance(memory, Memory) and memory.split is None and memory.peak_split is None
    assert isinstance(oom, Oom) and oom.memory is None and oom.peak is None and oom.allocator is None
    assert isinstance(shards, Shards) and shards.act_bytes is None
    split = MemorySplit(
        allocated=100, by_kind=MemoryKinds(params=60, grads=None), unexplained=40, source="allocator-trace"
    )
    again = decode(encode(Oom(phase="optimizer", peak=120, memory=split)))
    assert isinstance(again, Oom) and again.memory == split and again.peak == 120
    assert msgspec.to_builtins(split) == {"allocated": 100, "by_kind": {"params": 60}, "unexplained": 40,
                                          "source": "allocator-trace"}
