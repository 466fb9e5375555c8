"""The rules that read what a rank keeps once the engine is done, each on a real CPU run that
shows it and on one that does not, read back through ``shardtop report --format json``; the two
that need a GPU (the allocator's fragmentation at an OOM, memory outside PyTorch) on the H200
recordings, where they must stay silent, and on event streams shaped like the probe's.

The runs come from three scripts that run several scenarios in one set of processes, each into
a run directory of its own (``tests/diagnose_scripts/more_*.py``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from shardtop.diagnose import diagnose
from shardtop.diagnose.allocator import (
    FRAGMENTED_MIN_SHARE,
    OUTSIDE_MIN_BYTES,
    TYPICAL_OUTSIDE_BYTES,
    find_fragmented,
    outside_samples,
)
from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Event, Hello, Memory, Oom, Phase
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_directory import RunDirectory
from tests.diagnose_scripts.cgroup import entering, memory_cgroup, remove
from tests.diagnose_scripts.real_runs import codes, report_json, runs_base, scenario_runs
from tests.support.rule_cases import MORE_GPU_ONLY, MORE_RULE_CASES

GiB = 1 << 30
MiB = 1 << 20

FSDP = (
    "fsdp2-layers-own-roots",
    "fsdp2-root-forward",
    "fsdp2-optimizer-before-wrap",
    "fsdp2-hybrid-2x1",
    "fsdp2-hybrid-1x2",
    "fsdp1-optimizer-before-wrap",
    "fsdp1-lora-one-unit",
    "fsdp1-lora-split",
    "ddp-optimizer-before-wrap",
    "fsdp2-oom-in-unit",
    "fsdp2-one-big-layer",
)
ZERO = ("zero3-small-layers", "zero3-no-persistence", "zero2-frozen-backbone", "zero2-full-finetune")
HOST = ("fsdp2-whole-on-every-rank", "fsdp2-meta-init")

HOST_LIMIT = 5 * GiB // 2
"""The memory cgroup the host scenarios run in; their model is 384 MiB per rank (six 4096 x 4096
layers), so two whole copies are 30 % of it."""
HOST_MODEL_MIB = 384

EXPECTED: dict[str, list[str]] = {
    "fsdp2-layers-own-roots": ["fsdp2-not-resharded"],
    "fsdp2-root-forward": [],
    "fsdp2-optimizer-before-wrap": ["optimizer-before-wrap"],
    "fsdp2-hybrid-2x1": ["fsdp-hybrid-shard"],
    "fsdp2-hybrid-1x2": [],
    "fsdp1-optimizer-before-wrap": ["optimizer-before-wrap"],
    "fsdp1-lora-one-unit": ["fsdp-frozen-and-trainable-in-one-unit"],
    "fsdp1-lora-split": [],
    "ddp-optimizer-before-wrap": [],
    "fsdp2-oom-in-unit": ["oom"],
    "fsdp2-one-big-layer": ["fsdp-single-unit"],  # said, with no fix: one layer cannot be split over units
    "zero3-small-layers": ["zero3-persistence-threshold"],
    "zero3-no-persistence": [],
    "zero2-frozen-backbone": ["zero12-replicated-params"],
    "zero2-full-finetune": ["optimizer-state-dominates"],  # Adam: fp32 partition and two moments, 1.5x the parameters
    "fsdp2-whole-on-every-rank": ["host-memory-whole-model-per-rank"],
    "fsdp2-meta-init": [],
}
"""Exactly the findings of each scenario's run."""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``shardtop report --format json`` of a scenario's run; each script runs once, all its scenarios."""
    base = runs_base(tmp_path_factory)
    cache: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            cache[name] = report_json(_run(base, name))
        return cache[name]

    return get


def _run(base: Path, name: str) -> Any:
    if name in FSDP:
        return scenario_runs(base, "more_fsdp.py", 2, FSDP)[name]
    if name in ZERO:
        return scenario_runs(base, "more_zero.py", 2, ZERO)[name]
    cgroup, why = memory_cgroup("shardtop-host-test", HOST_LIMIT)
    if cgroup is None:
        pytest.skip(f"the host-memory scenarios run in a memory cgroup of their own: {why}")
    try:
        runs = scenario_runs(base, "more_host.py", 2, HOST, "--mib", str(HOST_MODEL_MIB), preexec=entering(cgroup))
    finally:
        remove(cgroup)
    return runs[name]


def finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["code"] == code]
    assert len(found) == 1, (code, codes(report))
    return found[0]


def module(report: dict[str, Any], path: str) -> dict[str, Any]:
    return next(m for m in report["modules"] if m["path"] == path)


# -- every run, exactly its findings -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_scenario_shows_exactly_its_findings(reports: Any, name: str) -> None:
    report = reports(name)
    assert codes(report) == EXPECTED[name], (name, [(f["code"], f["title"]) for f in report["findings"]])


@pytest.mark.parametrize("code", list(MORE_RULE_CASES))
def test_each_rule_has_a_run_showing_it_and_runs_that_do_not(reports: Any, code: str) -> None:
    shows, clean = MORE_RULE_CASES[code]
    assert code in codes(reports(shows))
    for name in clean:
        assert code not in codes(reports(name)), name


# -- what each finding says, against what the run recorded ---------------------------------------------


def test_one_layer_that_is_most_of_the_model_and_its_own_unit_gets_no_fix_it_already_has(reports: Any) -> None:
    f = finding(reports("fsdp2-one-big-layer"), "fsdp-single-unit")
    assert f["fix"] == "" and f["severity"] == "info"
    assert f["modules"] == ["2"] and "`2` (Linear)" in f["detail"]
    assert "Wrapping cannot split one layer" in f["detail"]
    assert "auto_wrap_policy" not in f["detail"] and "fully_shard(block)" not in f["detail"]


def test_layers_that_are_their_own_roots_hold_the_model_gathered_after_forward(reports: Any) -> None:
    report = reports("fsdp2-layers-own-roots")
    f = finding(report, "fsdp2-not-resharded")
    ev = f["evidence"]
    model = report["model"]["bytes"]
    assert (ev["units"], ev["own_roots"], ev["shard_group_size"]) == (8, 8, 2)
    assert ev["kept_bytes"] == model and f["saving_bytes"] == model - model // 2
    assert f["modules"] == [str(i) for i in range(8)]
    # the snapshot after the forward: every rank holds every block whole, gathered
    assert [r["param_bytes"] for r in report["ranks"]] == [model, model] == [ev["gathered_bytes"]] * 2
    assert {r["state"] for r in module(report, "0.up")["ranks"]} == {"gathered"}
    assert "root of their own" in f["detail"] and "`model(x)`" in f["fix"]
    assert f["severity"] == "warning"
    # trained through the model's forward, the same snapshot finds the blocks resharded
    fixed = reports("fsdp2-root-forward")
    assert [r["param_bytes"] for r in fixed["ranks"]] == [model // 2] * 2
    assert {r["state"] for r in module(fixed, "0.up")["ranks"]} == {"sharded"}


def test_an_optimizer_built_before_wrapping_holds_the_whole_model(reports: Any) -> None:
    for name, engine in (("fsdp2-optimizer-before-wrap", "fsdp2"), ("fsdp1-optimizer-before-wrap", "fsdp1")):
        report = reports(name)
        f = finding(report, "optimizer-before-wrap")
        ev = f["evidence"]
        assert ev["engine"] == engine
        assert ev["stale_params"] == ev["optimizer_params"] == 48  # 8 blocks x 3 modules x (weight, bias)
        assert ev["stale_numel"] * 4 == ev["stale_bytes"] == report["model"]["bytes"] == f["saving_bytes"]
        assert "not trained at all" in f["detail"]
        assert ("after fully_shard" if engine == "fsdp2" else "after wrapping") in f["fix"]
    ddp = reports("ddp-optimizer-before-wrap")
    assert (ddp["info"]["optimizer_params"], ddp["info"]["stale_optimizer_params"]) == (48, 0)


def test_lora_adapters_in_the_frozen_units_get_gradients_for_everything(reports: Any) -> None:
    report = reports("fsdp1-lora-one-unit")
    f = finding(report, "fsdp-frozen-and-trainable-in-one-unit")
    ev = f["evidence"]
    assert (ev["units"], ev["ranks"], ev["itemsize"], ev["use_orig_params"]) == (3, 2, 4, True)
    assert ev["frozen_numel"] == 3 * 2 * (1024 * 1024 + 1024) and ev["trainable_numel"] == 3 * 2 * 2 * 1024 * 8
    assert ev["grad_numel"] == ev["frozen_numel"] + ev["trainable_numel"]  # the whole flat shards
    assert f["saving_bytes"] == ev["frozen_numel"] * 4 // 2
    assert "ModuleWrapPolicy({LoraBlock, YourAdapter})" in f["fix"]
    # the ranks' gradient bytes count the flat gradient, frozen elements included
    assert sum(r["grad_bytes"] for r in report["ranks"]) == ev["grad_numel"] * 4
    split = reports("fsdp1-lora-split")
    assert sum(r["grad_bytes"] for r in split["ranks"]) == ev["trainable_numel"] * 4


def test_a_rehearsed_rank_alone_still_shows_its_gradients_for_frozen_parameters(
    reports: Any, tmp_path: Path
) -> None:
    """Rank 1 of the real run alone, read as a rehearsal of rank 1 of 2: it holds what it held, so the
    finding stays, per rank the same; read as a real run missing rank 0, nothing is said."""
    source = Path(reports("fsdp1-lora-one-unit")["run"]["path"])
    run = tmp_path / source.name
    shutil.copytree(source, run)
    (run / "events" / "rank-0.jsonl").unlink()
    real = read_run(RunDirectory(run))
    assert "fsdp-frozen-and-trainable-in-one-unit" not in [f.code for f in diagnose(real)]
    meta = json.loads((run / "run.json").read_text())
    meta["config"]["rehearsal"] = {"world_size": 2, "ranks": [1], "on": "CPU"}
    (run / "run.json").write_text(json.dumps(meta))
    (f,) = [f for f in diagnose(read_run(RunDirectory(run))) if f.code == "fsdp-frozen-and-trainable-in-one-unit"]
    both = finding(reports("fsdp1-lora-one-unit"), "fsdp-frozen-and-trainable-in-one-unit")
    assert f.evidence.ranks == 1 and f.evidence.rehearsed  # type: ignore[attr-defined]
    assert f.saving_bytes == both["saving_bytes"] and "The 1 rehearsed rank(s) hold gradient for" in f.detail


def test_hybrid_shard_with_groups_of_one_shards_nothing(reports: Any) -> None:
    report = reports("fsdp2-hybrid-2x1")
    f = finding(report, "fsdp-hybrid-shard")
    ev = f["evidence"]
    model = report["model"]["bytes"]
    assert (ev["shard_group_size"], ev["replicate_group_size"], ev["world_size"]) == (1, 2, 2)
    assert ev["rank_param_bytes"] == model and f["saving_bytes"] == model // 2
    assert f["severity"] == "warning" and "nothing is sharded" in f["detail"]
    assert "init_device_mesh(device_type, (2,))" in f["fix"]
    assert reports("fsdp2-hybrid-1x2")["info"]["replicate_group_size"] == 1


def test_zero3_keeps_tensors_under_the_persistence_threshold_whole(reports: Any) -> None:
    report = reports("zero3-small-layers")
    f = finding(report, "zero3-persistence-threshold")
    ev = f["evidence"]
    model = report["model"]["bytes"]
    assert (ev["threshold"], ev["persistent_params"], ev["params"]) == (100_000, 128, 128)
    assert ev["persistent_bytes"] == model and f["saving_bytes"] == model  # the whole copy goes
    # what each rank keeps: its half of the partitions and the whole model beside them
    assert [r["param_bytes"] for r in report["ranks"]] == [model // 2 + model] * 2
    assert {r["state"] for r in module(report, "0")["ranks"]} == {"persistent"}
    assert '"stage3_param_persistence_threshold": 0' in f["fix"]
    fixed = reports("zero3-no-persistence")
    assert fixed["info"]["persistent_bytes"] == 0 and fixed["info"]["persistence_threshold"] == 0
    assert [r["param_bytes"] for r in fixed["ranks"]] == [model // 2] * 2
    assert {r["state"] for r in module(fixed, "0")["ranks"]} == {"sharded"}


def test_zero2_on_a_frozen_backbone_splits_almost_nothing(reports: Any) -> None:
    report = reports("zero2-frozen-backbone")
    f = finding(report, "zero12-replicated-params")
    ev = f["evidence"]
    backbone = 6 * (1024 * 1024 + 1024) * 4
    assert ev["frozen_bytes"] == backbone and ev["param_bytes"] == report["model"]["bytes"]
    assert ev["param_bytes"] > ev["optimizer_bytes"] + ev["grad_bytes"]
    assert f["severity"] == "info" and '"stage": 3' in f["fix"]
    full = reports("zero2-full-finetune")
    rank = full["ranks"][0]
    assert rank["optim_bytes"] > rank["param_bytes"]  # Adam: fp32 master and two moments, split in two


def test_whole_copies_in_host_memory_are_weighed_against_the_cgroup_limit(reports: Any) -> None:
    report = reports("fsdp2-whole-on-every-rank")
    f = finding(report, "host-memory-whole-model-per-rank")
    ev = f["evidence"]
    model = report["model"]["bytes"]
    assert (ev["ranks"], ev["memory_limit"], ev["held_bytes"]) == (2, HOST_LIMIT, 2 * model)
    assert ev["host_memory"] > HOST_LIMIT and ev["peak_rss"] >= 2 * model
    assert f["severity"] == "info" and "30%" in f["title"]
    assert "meta" in f["fix"] and "fully_shard" in f["fix"]
    meta = reports("fsdp2-meta-init")
    assert "host-memory-whole-model-per-rank" not in codes(meta)


def test_the_oom_in_an_fsdp2_unit_names_the_users_class(reports: Any) -> None:
    report = reports("fsdp2-oom-in-unit")
    events, _ = read_all(Path(report["run"]["path"]) / "events")
    ooms = [e for e in events if isinstance(e, Oom)]
    assert ooms and {(o.module, o.module_type, o.attributed_by) for o in ooms} == {("2", "Block", "forward-frame")}
    assert ooms[0].requested_bytes == 1 << 44


# -- the GPU-only rules: silent on the H200 recordings, and their logic on probe-shaped events ---------

FIXTURES = Path(__file__).parents[1] / "fixtures" / "runs"


def recordings() -> list[Path]:
    return sorted(p for machine in ("h200", "h200x2") for p in (FIXTURES / machine).glob("2026*") if p.is_dir())


@pytest.mark.parametrize("path", recordings(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gpu_only_rules_are_silent_on_the_h200_recordings(path: Path) -> None:
    run = RunModel.of(fold(read_all(path / "events")[0]))
    assert not set(MORE_GPU_ONLY) & {f.code for f in diagnose(run)}
    for story in run.ooms:  # the recorded OOMs: a full allocator, nothing cached free
        o = story.oom
        assert o.reserved is not None and o.allocated is not None and o.reserved - o.allocated < 1 * MiB
    for sample, _ in outside_samples(run, min_bytes=0):
        assert GiB < sample.outside < TYPICAL_OUTSIDE_BYTES + GiB // 8  # context + cuBLAS (+ NCCL): 1.35-2.03 GiB


_clock = [1_900_000_000.0]


E = TypeVar("E", bound=Event)


def _at(event: E, rank: int = 0, host: str = "gpu-box") -> E:
    _clock[0] += 0.1
    return msgspec.structs.replace(event, rank=rank, host=host, t=_clock[0])


def gpu_run(
    *, reserved: int, allocated: int, requested: int, used: int, alloc_conf: str | None = None,
    others: tuple[int, ...] = (),
) -> RunModel:
    """One rank on cuda:0 with a 40 GiB cap: a training sample, then an OOM, as the probe writes them
    (``others``: pids of other processes NVML lists on the GPU)."""
    pid = 4_194_401
    gpus = [GpuMemory(index=0, used=used, total=80 * GiB, pids=[pid, *others])]
    return RunModel.of(fold([
        _at(Hello(pid=pid, world_size=1, device="cuda:0", engine="plain", alloc_conf=alloc_conf)),
        _at(Phase(phase="forward", step=3)),
        _at(Memory(device="cuda:0", allocated=allocated, reserved=reserved, limit=40 * GiB, gpus=gpus)),
        _at(Oom(phase="forward", step=3, device="cuda:0", allocated=allocated, reserved=reserved, limit=40 * GiB,
                total=80 * GiB, requested_bytes=requested, gpus=gpus)),
    ]))


def test_fragmentation_at_an_oom_is_the_error_when_the_request_fit_in_the_cached_free_memory() -> None:
    run = gpu_run(reserved=39 * GiB, allocated=30 * GiB, requested=2 * GiB, used=41 * GiB)
    f = next(f for f in diagnose(run) if f.code == "allocator-fragmentation")
    assert f.severity == "error" and f.saving_bytes == 9 * GiB
    assert "expandable_segments:True" in f.fix and "fixed shapes" in f.fix  # a training phase
    assert "oom" not in [x.code for x in diagnose(run)]  # explained
    larger = gpu_run(reserved=39 * GiB, allocated=30 * GiB, requested=12 * GiB, used=41 * GiB)
    assert next(f for f in diagnose(larger) if f.code == "allocator-fragmentation").severity == "warning"
    on = gpu_run(reserved=39 * GiB, allocated=30 * GiB, requested=2 * GiB, used=41 * GiB,
                 alloc_conf="expandable_segments:True")
    assert "already on" in next(f for f in diagnose(on) if f.code == "allocator-fragmentation").fix
    slack = int(FRAGMENTED_MIN_SHARE * 40 * GiB) - MiB
    assert find_fragmented(
        gpu_run(reserved=30 * GiB + slack, allocated=30 * GiB, requested=2 * GiB, used=33 * GiB)
    ) is None


def test_memory_outside_pytorch_is_nvml_used_minus_reserved_of_the_same_moment() -> None:
    run = gpu_run(reserved=20 * GiB, allocated=19 * GiB, requested=8 * GiB, used=31 * GiB)
    f = next(f for f in diagnose(run) if f.code == "memory-outside-pytorch")
    ev = f.evidence
    assert ev.worst.outside == 11 * GiB and ev.worst.when == "at its OOM"  # type: ignore[attr-defined]
    assert f.severity == "error" and f.saving_bytes == 11 * GiB - TYPICAL_OUTSIDE_BYTES
    usual = gpu_run(reserved=20 * GiB, allocated=19 * GiB, requested=8 * GiB, used=20 * GiB + OUTSIDE_MIN_BYTES - MiB)
    assert "memory-outside-pytorch" not in [x.code for x in diagnose(usual)]
    # a GPU that also lists another process: its memory is not the rank's, so nothing is said
    shared = gpu_run(reserved=20 * GiB, allocated=19 * GiB, requested=8 * GiB, used=31 * GiB, others=(99,))
    assert "memory-outside-pytorch" not in [x.code for x in diagnose(shared)]


def test_every_rule_of_this_file_is_registered() -> None:
    from shardtop.diagnose import RULES

    assert set(MORE_RULE_CASES) | set(MORE_GPU_ONLY) <= {r.code for r in RULES}


def test_the_json_report_carries_the_new_evidence_whole(reports: Any) -> None:
    f = finding(reports("zero3-small-layers"), "zero3-persistence-threshold")
    assert set(f["evidence"]) == {
        "world_size", "data_parallel_size", "threshold", "persistent_params", "params", "persistent_bytes",
        "model_bytes", "modules", "driver",
    }
    json.dumps(f["evidence"])
    assert re.search(r"\d+ of the \d+ parameter tensors", f["detail"])
