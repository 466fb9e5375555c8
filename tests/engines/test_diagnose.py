"""The diagnosis: every rule on a real CPU run that shows it and on one that does not,
read back through ``shardtop report --format json``; the GPU-only evidence (NVML, the
allocator) on event streams shaped like the probe's; and the small pure pieces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shardtop.diagnose import RULES, Evidence, Finding, Rule, diagnose, severity_key
from shardtop.diagnose.memory import OPTIM_STATE_RATIO
from shardtop.diagnose.placement import (
    IMBALANCE_RATIO,
    MEMORY_IMBALANCE_MIN_BYTES,
    _uneven,
)
from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.read.run_state import RunState
from shardtop.read.shard_model import subtree_sums
from shardtop.read.tree_facts import covering_rows, find_block
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Event, Exit, Hello, Memory, Oom, Phase, Shards, Tree, Unit, tree_paths
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.words import list_names
from tests.diagnose_scripts.real_runs import codes, report_json, runs_base, story
from tests.support.recorded import zero3_oom_run
from tests.support.rule_cases import GROWTH_RULE_CASES, MORE_GPU_ONLY, MORE_RULE_CASES, STALL_RULE_CASES

GiB = 1 << 30
MiB = 1 << 20

# -- real runs, through the CLI ------------------------------------------------------------------

EXPECTED: dict[str, list[str]] = {
    "fsdp-not-sharding": ["fsdp-manual-wrap-ignored", "precision-mismatch", "cpu-offload-not-applied"],
    "fsdp-auto-wrap": [],
    "zero3-linear": ["zero3-not-partitioned-at-init", "optimizer-state-dominates"],
    "zero3-linear-fixed": ["optimizer-state-dominates"],
    "fsdp2-mlp": ["optimizer-state-dominates"],
    "ddp-baseline": [],
    "manual-placement": [],
    "zero3-one-rank-capped": ["oom", "zero3-not-partitioned-at-init", "zero3-single-rank"],
    "fsdp1-no-wrap-policy": ["fsdp-single-unit"],
    "fsdp2-default-mesh": ["fsdp2-no-data-parallel"],
    "pipeline-split": ["placement-imbalance"],
    "zero3-built-whole": ["zero3-not-partitioned-at-init"],
    "killed-before-probe": ["nothing-recorded"],
}
"""Exactly the findings of each real run, in order: each rule appears on a run that shows it
and is absent from the runs that do not."""

RULE_CASES = {
    "fsdp-single-unit": ("fsdp1-no-wrap-policy", ["fsdp-auto-wrap", "fsdp-not-sharding"]),
    "fsdp-manual-wrap-ignored": ("fsdp-not-sharding", ["fsdp-auto-wrap", "fsdp1-no-wrap-policy"]),
    "zero3-not-partitioned-at-init": ("zero3-built-whole", ["zero3-linear-fixed"]),
    "fsdp2-no-data-parallel": ("fsdp2-default-mesh", ["fsdp2-mlp"]),
    "precision-mismatch": ("fsdp-not-sharding", ["fsdp-auto-wrap"]),
    "placement-imbalance": ("pipeline-split", ["ddp-baseline", "manual-placement", "fsdp-not-sharding"]),
    "optimizer-state-dominates": ("fsdp2-mlp", ["ddp-baseline", "fsdp-auto-wrap"]),
    "zero3-single-rank": ("zero3-one-rank-capped", ["zero3-linear"]),
    "oom": ("zero3-one-rank-capped", ["zero3-built-whole"]),
    "cpu-offload-not-applied": ("fsdp-not-sharding", ["fsdp-auto-wrap"]),
    "nothing-recorded": ("killed-before-probe", ["zero3-one-rank-capped", "fsdp2-mlp"]),
}


AT_THE_SAME_TIME = 2
"""Real runs made at once: each rank spends much of its life importing torch and waiting on its peer."""


@pytest.fixture(scope="module")
def reports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``shardtop report --format json`` of a real run, by story name (each run made once).

    The runs the selected ``test_each_real_run_shows_exactly_its_findings`` cases name start at
    once, ``AT_THE_SAME_TIME`` together, in that test's order; any other is made when first asked for.
    """
    base = runs_base(tmp_path_factory)
    pool = ThreadPoolExecutor(max_workers=AT_THE_SAME_TIME)
    made: dict[str, Future[dict[str, Any]]] = {}

    def start(name: str) -> Future[dict[str, Any]]:
        if name not in made:
            made[name] = pool.submit(lambda: report_json(story(base, name)))
        return made[name]

    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.function is test_each_real_run_shows_exactly_its_findings:
            start(item.callspec.params["name"])
    yield lambda name: start(name).result()
    pool.shutdown(wait=True, cancel_futures=True)


def finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["code"] == code]
    assert len(found) == 1, (code, codes(report))
    return found[0]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_real_run_shows_exactly_its_findings(reports: Any, name: str) -> None:
    report = reports(name)
    assert codes(report) == EXPECTED[name], (name, [(f["code"], f["title"]) for f in report["findings"]])
    severities = [f["severity"] for f in report["findings"]]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


@pytest.mark.parametrize("code", list(RULE_CASES))
def test_each_rule_has_a_run_showing_it_and_runs_that_do_not(reports: Any, code: str) -> None:
    shows, clean = RULE_CASES[code]
    assert code in codes(reports(shows))
    for name in clean:
        assert code not in codes(reports(name)), name


GPU_ONLY = {
    "cuda-context-on-wrong-gpu": "NVML's process list of two GPUs: shown on an event stream shaped like story 1's "
    "(test_story_1_on_gpus_gpu_0_fills_and_rank_1_uses_it); gpu/scenarios/wrong_gpu.py records it on two GPUs",
    "probe-fault": "shown by a real shard reader failure in tests/engines/test_reliability.py; "
    "absent from every run here",
    "plan-missed": "needs an allocator's peak (CPU processes have none): shown on the H200 recording of "
    "manual-placement, with its plan, in tests/engines/test_plan_after_run.py",
    "engine-not-as-asked": "needs accelerate's launcher: its FSDP2 plugin on CPU trains with DDP in "
    "tests/engines/test_rehearse_clients.py, whose ZeRO-3 plugin's run does not show it",
    "fsdp-single-rank": "shown on the one-H200 recordings of fsdp-not-sharding, fsdp-auto-wrap and fsdp2-mlp "
    "(RECORDED below)",
    "sharding-transient-at-setup": "needs a memory cap inside fully_shard's window: shown by a capped fsdp2-mlp "
    "run and the recording of the issue's run in tests/engines/test_setup_transient.py, whose run capped just "
    "above that window does not show it",
}
"""Rules whose run that shows them lives elsewhere: GPU recordings, or a fault test."""


def test_every_rule_is_covered_by_a_real_run() -> None:
    covered = {r.code for r in RULES} | {"oom"}
    elsewhere = set(MORE_RULE_CASES) | set(GROWTH_RULE_CASES) | set(STALL_RULE_CASES)
    assert covered - set(GPU_ONLY) - set(MORE_GPU_ONLY) == set(RULE_CASES) | elsewhere


def test_story_1_hand_wrapped_layers_are_outside_every_unit(reports: Any) -> None:
    report = reports("fsdp-not-sharding")
    f = finding(report, "fsdp-manual-wrap-ignored")
    assert f["modules"] == ["conv1", "bn1", "conv2", "bn2", "conv_out", "out_layer"]
    unmanaged = report["info"]["unmanaged_bytes"]
    assert f["evidence"]["stray_bytes"] == unmanaged > 0
    assert len(f["evidence"]["unit_modules"]) == 4 and f["evidence"]["stray_devices"] == ["cpu"]
    assert f["saving_bytes"] == unmanaged // 2
    conv2 = next(m for m in report["modules"] if m["path"] == "conv2")
    assert [(r["bytes"], r["state"]) for r in conv2["ranks"]] == [(conv2["bytes"], "unsharded")] * 2
    assert "configure_sharded_model" in f["detail"] and "whole" in f["detail"]
    assert "Delete configure_sharded_model" in f["fix"] and "ModuleWrapPolicy({TransformerBlock})" in f["fix"]
    p = finding(report, "precision-mismatch")
    assert p["evidence"] == {
        "param_dtype": "float16", "reduce_dtype": "float16", "precision": "32-true", "lightning": True
    }
    assert 'precision="16-mixed"' in p["fix"] and "bf16" in p["fix"]
    assert finding(report, "cpu-offload-not-applied")["severity"] == "info"


def test_ranks_killed_before_the_probe_leave_a_run_that_says_so(reports: Any) -> None:
    report = reports("killed-before-probe")
    assert report["events"]["read"] == 0 and report["run"]["status"] == "failed"
    f = finding(report, "nothing-recorded")
    assert f["severity"] == "error" and "before shardtop's probe came up" in f["detail"]
    assert "No findings" not in f["detail"]


def test_fsdp_without_a_policy_names_the_repeated_block(reports: Any) -> None:
    report = reports("fsdp1-no-wrap-policy")
    f = finding(report, "fsdp-single-unit")
    ev = f["evidence"]
    assert (ev["block_type"], ev["block_count"], ev["units"]) == ("Block", 6, 1)
    assert ev["unit_bytes"] == ev["model_bytes"] == report["model"]["bytes"]
    assert f["saving_bytes"] == ev["unit_bytes"] - ev["largest_block_bytes"] > 0
    assert f["modules"] == [""]
    assert "ModuleWrapPolicy({Block})" in f["fix"]


def test_story_2_whole_model_at_init_with_and_without_an_oom(reports: Any) -> None:
    plain = reports("zero3-linear")
    f = finding(plain, "zero3-not-partitioned-at-init")
    model = plain["model"]["bytes"]
    assert f["severity"] == "warning" and f["saving_bytes"] == model // 2
    assert f["evidence"]["whole_ranks"] == 2 and f["evidence"]["whole_bytes"] == model
    assert "splits every tensor" in f["detail"]
    assert "pipeline" not in f["detail"], "the aside about layers placed by hand needs layers placed by hand"
    assert "deepspeed.zero.Init" in f["fix"]

    crashed = reports("zero3-built-whole")
    f = finding(crashed, "zero3-not-partitioned-at-init")
    assert f["severity"] == "error"
    assert f["evidence"]["oom"]["engine_step"] == "DeepSpeedEngine._configure_distributed_model"
    assert f["modules"] == [crashed["oom"]["module"]] == ["net.0"]
    assert crashed["oom"]["requested_bytes"] == 3072 * 3072 * 2  # one layer's bf16 copy
    # explained: no separate "oom" finding
    assert "oom" not in codes(crashed)


def test_fsdp2_default_mesh_shards_nothing(reports: Any) -> None:
    report = reports("fsdp2-default-mesh")
    f = finding(report, "fsdp2-no-data-parallel")
    assert (f["evidence"]["mesh_shape"], f["evidence"]["world_size"]) == ("1x2", 2)
    assert "ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)" in f["fix"]
    held = [r["param_bytes"] for r in report["ranks"]]
    assert held == [report["model"]["bytes"]] * 2 and f["saving_bytes"] == held[0] // 2


def test_hand_split_pipeline_is_uneven(reports: Any) -> None:
    report = reports("pipeline-split")
    f = finding(report, "placement-imbalance")
    ev = f["evidence"]["main"]
    assert (ev["kind"], ev["heavy"], ev["light"]) == ("ranks", "rank 0", "rank 1")
    assert ev["heavy_bytes"] >= IMBALANCE_RATIO * ev["light_bytes"]
    assert [ev["heavy_bytes"], ev["light_bytes"]] == [r["param_bytes"] for r in report["ranks"]]
    assert f["modules"] == ["embed", "layers.0", "layers.1"]
    assert "Split by bytes" in f["fix"]


def test_adam_state_outweighs_sharded_parameters_and_gradients(reports: Any) -> None:
    f = finding(reports("fsdp2-mlp"), "optimizer-state-dominates")
    ev = f["evidence"]
    assert f["severity"] == "info" and ev["engine"] == "fsdp2" and ev["data_parallel_size"] == 2
    assert ev["optimizer_bytes"] >= OPTIM_STATE_RATIO * (ev["param_bytes"] + ev["grad_bytes"])


def test_one_rank_zero3_and_its_unexplained_oom(reports: Any) -> None:
    report = reports("zero3-one-rank-capped")
    single = finding(report, "zero3-single-rank")
    assert single["severity"] == "warning" and single["saving_bytes"] == report["model"]["bytes"] // 2
    oom = finding(report, "oom")
    assert oom["severity"] == "error"
    assert oom["evidence"]["oom"]["engine_step"] == "DeepSpeedEngine._configure_zero_optimizer"
    assert oom["evidence"]["oom"]["requested_bytes"] == report["oom"]["requested_bytes"] == 2_000_000_000
    assert "reduce_bucket_size" in oom["fix"]


# -- recorded runs: the presets on one H200, story 2 on 6 CPU ranks (tests/fixtures/runs) ---------------

FIXTURES = Path(__file__).parents[1] / "fixtures" / "runs"

RECORDED: dict[tuple[str, str], list[str]] = {
    ("h200", "zero3-linear"): ["zero3-not-partitioned-at-init", "zero3-single-rank"],
    ("h200", "zero3-linear-fixed"): ["zero3-single-rank"],
    ("h200", "fsdp-not-sharding"): ["fsdp-single-rank", "fsdp-manual-wrap-ignored", "precision-mismatch"],
    ("h200", "fsdp-auto-wrap"): ["fsdp-single-rank"],
    ("h200", "ddp-baseline"): [],
    ("h200", "manual-placement"): [],
    ("h200", "fsdp2-mlp"): ["fsdp-single-rank", "optimizer-state-dominates"],
    ("cpu-6ranks", "zero3-linear"): ["zero3-not-partitioned-at-init", "optimizer-state-dominates"],
    ("cpu-6ranks", "zero3-linear-fixed"): ["optimizer-state-dominates"],
}


def recorded(machine: str, preset: str) -> RunModel:
    found = [
        p
        for p in (FIXTURES / machine).glob(f"*-{preset}-*")
        if re.fullmatch(rf"\d{{8}}-\d{{6}}-{preset}-[0-9a-f]{{4}}", p.name)
    ]
    assert len(found) == 1, f"expected one recorded {preset} run under {FIXTURES / machine}, found {found}"
    events, skipped = read_all(found[0] / "events")
    return RunModel.of(fold(events, skipped))


@pytest.mark.parametrize(("machine", "preset"), list(RECORDED))
def test_recorded_runs_show_exactly_their_findings(machine: str, preset: str) -> None:
    assert [f.code for f in diagnose(recorded(machine, preset))] == RECORDED[machine, preset]


def test_story_2_on_one_h200_the_whole_model_does_not_fit_one_gpu() -> None:
    moved, single = diagnose(recorded("h200", "zero3-linear"))
    # The story's answer first: moved whole before partitioning; then why one GPU cannot help.
    assert moved.code == "zero3-not-partitioned-at-init" and moved.severity == "error"
    assert moved.modules == ("model.net.15330",) and "configure_model()" in moved.fix
    assert "in DeepSpeedEngine._configure_distributed_model, converting `model.net.15330`" in moved.detail
    assert single.code == "zero3-single-rank" and single.severity == "error"
    assert "is larger than the 15 GiB the rank may use" in single.detail
    (fixed,) = diagnose(recorded("h200", "zero3-linear-fixed"))
    assert fixed.severity == "error" and "Init._partition_param" in fixed.detail
    assert "2 or more GPUs" in fixed.fix


def test_story_1_on_one_h200_units_offloaded_strays_on_the_gpu() -> None:
    wrap = next(f for f in diagnose(recorded("h200", "fsdp-not-sharding")) if f.code == "fsdp-manual-wrap-ignored")
    assert (wrap.evidence.stray_devices, wrap.evidence.unit_devices) == (("cuda:0",), ("cpu",))  # type: ignore[attr-defined]
    assert wrap.modules == ("conv1", "bn1", "conv2", "bn2", "conv_out", "out_layer")


def test_story_2_on_six_cpu_ranks() -> None:
    run = recorded("cpu-6ranks", "zero3-linear")
    f = diagnose(run)[0]
    model = run.full_bytes
    assert f.code == "zero3-not-partitioned-at-init" and f.evidence.whole_ranks == 6  # type: ignore[attr-defined]
    assert f.saving_bytes == model * 5 // 6 and "1/6" in f.detail


# -- GPU-only evidence, on event streams shaped like the probe's ---------------------------------------

PIDS = (4_194_401, 4_194_402)


_clock = [1_800_000_000.0]


def _stamp(event: Event, rank: int, host: str = "gpu-box") -> Event:
    """``event`` as rank ``rank`` on ``host`` wrote it, a tenth of a second after the previous one."""
    _clock[0] += 0.1
    return msgspec.structs.replace(event, rank=rank, host=host, t=_clock[0])


def story1_gpu_state(foreign_pid: bool = True, oom: bool = True) -> RunModel:
    """Story 1 on 2 GPUs: hand-wrapped stacks sharded on cuda, stray layers on cpu, GPU 0 full."""
    blk = 100 * MiB
    tree = Tree(
        tree_id=0,
        names=["", "conv1", "transformer_0", "0", "1", "transformer_1", "0", "1", "out_layer"],
        parents=[-1, 0, 0, 2, 2, 0, 5, 5, 0],
        types=[0, 1, 2, 3, 3, 2, 3, 3, 1],
        type_names=["Seg", "Conv2d", "Sequential", "TransformerBlock"],
        params=[0, 10_000_000, 0, blk // 4, blk // 4, 0, blk // 4, blk // 4, 100_000],
        bytes=[0, 40_000_000, 0, blk, blk, 0, blk, blk, 400_000],
    )
    events: list[Event] = [_stamp(tree, 0)]
    for rank in (0, 1):
        events.append(
            _stamp(
                Hello(
                    pid=PIDS[rank],
                    world_size=2,
                    local_rank=rank,
                    device=f"cuda:{rank}",
                    engine="fsdp1",
                    strategy="FSDPStrategy",
                ),
                rank,
            )
        )
        events.append(
            _stamp(
                Shards(
                    tree_id=0,
                    engine="fsdp1",
                    stage="engine",
                    devices=[f"cuda:{rank}", "cpu"],
                    states=["sharded", "unsharded"],
                    bytes=[0, 40_000_000, 0, blk // 2, blk // 2, 0, blk // 2, blk // 2, 400_000],
                    device=[-1, 1, -1, 0, 0, -1, 0, 0, 1],
                    state=[-1, 1, -1, 0, 0, -1, 0, 0, 1],
                    unit=[-1, -1, 0, 0, 0, 1, 1, 1, -1],
                    units=[
                        Unit(module=2, kind="fsdp1", numel=blk // 2, local_numel=blk // 4, params=8),
                        Unit(module=5, kind="fsdp1", numel=blk // 2, local_numel=blk // 4, params=8),
                    ],
                    info={
                        "fsdp_units": 2,
                        "root_wrapped": False,
                        "unmanaged_bytes": 40_400_000,
                        "param_dtype": "float16",
                        "precision": "32-true",
                        "loss_scaling": False,
                        "driver": "Lightning FSDPStrategy",
                    },
                ),
                rank,
            )
        )
    gpus = [
        GpuMemory(index=0, used=14 * GiB, total=16 * GiB, pids=list(PIDS) if foreign_pid else [PIDS[0]]),
        GpuMemory(index=1, used=3 * MiB, total=16 * GiB, pids=[] if foreign_pid else [PIDS[1]]),
    ]
    for rank in (0, 1):
        events.append(_stamp(Phase(phase="forward", step=1), rank))
    events.append(_stamp(Memory(device="cuda:1", allocated=100 * MiB, peak=200 * MiB), 1))
    events.append(_stamp(Memory(device="cuda:0", allocated=13 * GiB, peak=14 * GiB, gpus=gpus), 0))
    if oom:
        events.append(
            _stamp(
                Oom(
                    phase="forward",
                    step=1,
                    module="transformer_1.0",
                    module_type="TransformerBlock",
                    attributed_by="forward-frame",
                    requested_bytes=512 * MiB,
                    device="cuda:0",
                    allocated=15 * GiB,
                    gpus=gpus,
                ),
                0,
            )
        )
    return RunModel.of(fold(events))


def test_story_1_on_gpus_gpu_0_fills_and_rank_1_uses_it() -> None:
    findings = diagnose(story1_gpu_state())
    assert [f.code for f in findings] == [
        "placement-imbalance",
        "fsdp-manual-wrap-ignored",  # warnings, the one with a saving first
        "cuda-context-on-wrong-gpu",
        "precision-mismatch",
    ]
    place = findings[0]
    assert place.severity == "error"  # the OOM struck the full GPU
    main = place.evidence.main  # type: ignore[attr-defined]
    assert (main.kind, main.heavy, main.sample) == ("gpus", "GPU 0", "step 1, forward")
    context = findings[2]
    assert context.saving_bytes is None  # nothing measured what a context costs
    assert "rank 1's process (pid 4194402)" in context.detail and "set_device" in context.fix
    wrap = findings[1]
    assert "on cpu, while the units' shards are on cuda:0" in wrap.detail
    assert wrap.modules == ("conv1", "out_layer") and wrap.saving_bytes == 40_400_000 // 2
    assert wrap.fix.startswith("Delete configure_sharded_model") and "Without Lightning" not in wrap.fix


def test_gpu_imbalance_without_an_oom_is_a_warning_and_even_gpus_are_not_found() -> None:
    (place,) = [f for f in diagnose(story1_gpu_state(oom=False)) if f.code == "placement-imbalance"]
    assert place.severity == "warning"
    even = story1_gpu_state(foreign_pid=False, oom=False)
    gpus = (
        GpuMemory(index=0, used=14 * GiB, total=16 * GiB, pids=[PIDS[0]]),
        GpuMemory(index=1, used=13 * GiB, total=16 * GiB, pids=[PIDS[1]]),
    )
    samples = {h: tuple(replace(x, gpus=gpus) for x in xs) for h, xs in even.state.gpu_samples.items()}
    memory = {r: replace(rs, phase_samples=()) for r, rs in even.state.ranks.items()}
    even = RunModel.of(replace(even.state, gpu_samples=samples, ranks=memory))
    codes_even = [f.code for f in diagnose(even)]
    assert "placement-imbalance" not in codes_even and "cuda-context-on-wrong-gpu" not in codes_even


def test_story_2_recorded_on_gpus_is_explained_by_one_error(tmp_path: Path) -> None:
    path = zero3_oom_run(tmp_path, n_layers=200, culprit=150)
    run = RunModel.of(fold(read_all(path / "events")[0]))
    findings = diagnose(run)
    assert [f.code for f in findings] == ["zero3-not-partitioned-at-init"]
    f = findings[0]
    assert f.severity == "error" and f.title.startswith("DeepSpeed moved the whole model to every GPU")
    assert f.modules == ("net.150",) and f.saving_bytes == run.full_bytes // 2
    assert "configure_model()" in f.fix and "zero.Init" in f.fix  # driver unknown: both ways


def test_allocator_peaks_far_apart_are_an_imbalance() -> None:
    events: list[Event] = []
    for rank, peak in ((0, 30 * GiB), (1, 6 * GiB)):
        events.append(_stamp(Hello(pid=PIDS[rank], world_size=2, device=f"cuda:{rank}", engine="ddp"), rank))
        events.append(_stamp(Phase(phase="backward", step=2), rank))
        events.append(_stamp(Memory(device=f"cuda:{rank}", allocated=peak // 2, peak=peak), rank))
    (f,) = diagnose(RunModel.of(fold(events)))
    main = f.evidence.main  # type: ignore[attr-defined]
    assert (f.code, main.kind, main.heavy, main.sample) == (
        "placement-imbalance", "allocator", "rank 0", "step 2, backward"
    )
    assert f.saving_bytes == 30 * GiB - 18 * GiB


def test_memory_is_compared_only_while_every_rank_runs_the_same_step() -> None:
    """Two balanced ranks; rank 1 leaves first, and rank 0's last samples (teardown, GPU 1 empty) are lopsided.

    This is how two H200 runs of fsdp-not-sharding and zero3-linear-fixed were once told "GPU 0 holds
    5.42 GiB, GPU 1 only 2.42 GiB": nvidia-smi read 4935 vs 4453 MiB during training.
    """
    events: list[Event] = []
    for rank in (0, 1):
        events.append(_stamp(Hello(pid=PIDS[rank], world_size=2, device=f"cuda:{rank}", engine="zero3"), rank))
    for step in (1, 2, 3):
        for rank in (0, 1):
            events.append(_stamp(Phase(phase="backward", step=step), rank))
            gpus = [
                GpuMemory(index=0, used=4935 * MiB, total=140 * GiB, pids=[PIDS[0]]),
                GpuMemory(index=1, used=4453 * MiB, total=140 * GiB, pids=[PIDS[1]]),
            ]
            memory = Memory(device=f"cuda:{rank}", allocated=3 * GiB, peak=4 * GiB, gpus=gpus if rank == 0 else None)
            events.append(_stamp(memory, rank))
    events.append(_stamp(Exit(code=0, status="ok"), 1))
    events.append(_stamp(Phase(phase="teardown", step=3), 0))
    late = [
        GpuMemory(index=0, used=int(5.42 * GiB), total=140 * GiB, pids=[PIDS[0]]),
        GpuMemory(index=1, used=int(0.42 * GiB), total=140 * GiB, pids=[]),
    ]
    events.append(_stamp(Memory(device="cuda:0", allocated=5 * GiB, peak=int(5.4 * GiB), gpus=late), 0))
    run = RunModel.of(fold(events))
    assert run.comparable_memory is not None and run.comparable_memory.step == 3
    sample = run.comparable_gpus("gpu-box")
    assert sample is not None and [g.used for g in sample.gpus] == [4935 * MiB, 4453 * MiB]
    assert "placement-imbalance" not in [f.code for f in diagnose(run)]


def test_manual_placement_on_two_gpus_by_module_count() -> None:
    tree = Tree(
        tree_id=0,
        names=["", "a", "b"],
        parents=[-1, 0, 0],
        types=[0, 1, 1],
        type_names=["M", "Linear"],
        params=[0, GiB // 4, MiB // 4],
        bytes=[0, GiB, MiB],
    )
    shards = Shards(
        tree_id=0,
        engine="manual",
        stage="engine",
        devices=["cuda:0", "cuda:1"],
        states=["unsharded"],
        bytes=[0, GiB, MiB],
        device=[-1, 0, 1],
        state=[-1, 0, 0],
        unit=[-1, -1, -1],
    )
    (f,) = diagnose(RunModel.of(fold(
        [_stamp(tree, 0), _stamp(Hello(pid=1, world_size=1, device="cuda:0"), 0), _stamp(shards, 0)]
    )))
    main = f.evidence.main  # type: ignore[attr-defined]
    assert (f.code, main.kind, main.heavy, f.modules) == (
        "placement-imbalance",
        "devices",
        "cuda:0",
        ("a",),
    )


# -- pure pieces -------------------------------------------------------------------------------------


def test_covering_rows_names_the_outermost_fully_selected_modules() -> None:
    #        0
    #      /   \
    #     1     4
    #    / \
    #   2   3
    parents = [-1, 0, 1, 1, 0]
    has = [False, False, True, True, True]
    assert covering_rows([False, True, True, True, False], has, parents) == [1]
    assert covering_rows([False, False, True, False, True], has, parents) == [2, 4]
    assert covering_rows([True] * 5, has, parents) == [0]
    assert covering_rows([False] * 5, has, parents) == []


def _tree(names: list[str], parents: list[int], types: list[str], nbytes: list[int]) -> Tree:
    type_names = list(dict.fromkeys(types))
    return Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=[type_names.index(t) for t in types],
        type_names=type_names,
        params=[b // 4 for b in nbytes],
        bytes=nbytes,
    )


def test_find_block_prefers_the_repeated_parent_over_its_leaves() -> None:
    # MLP: embed, 3 x Block(fc1, fc2), head: Linear outnumbers Block, but Block holds the model.
    names = ["", "embed", "blocks", "0", "fc1", "fc2", "1", "fc1", "fc2", "2", "fc1", "fc2", "head"]
    parents = [-1, 0, 0, 2, 3, 3, 2, 6, 6, 2, 9, 9, 0]
    types = [
        "MLP",
        "Linear",
        "ModuleList",
        "Block",
        "Linear",
        "Linear",
        "Block",
        "Linear",
        "Linear",
        "Block",
        "Linear",
        "Linear",
        "Linear",
    ]
    nbytes = [0, 100, 0, 0, 400, 400, 0, 400, 400, 0, 400, 400, 100]
    tree = _tree(names, parents, types, nbytes)
    block = find_block(tree, tree_paths(names, parents), subtree_sums(nbytes, parents))
    assert block is not None
    assert (block.type_name, block.count, block.largest_bytes, block.container) == ("Block", 3, 800, "blocks")


def test_find_block_falls_back_to_the_repeated_leaf_and_to_none() -> None:
    names, parents = ["", "net", "0", "1", "2"], [-1, 0, 1, 1, 1]
    tree = _tree(names, parents, ["Stack", "Sequential", "Linear", "Linear", "Linear"], [0, 0, 10, 10, 10])
    block = find_block(tree, tree_paths(names, parents), subtree_sums(tree.bytes, parents))
    assert block is not None and (block.type_name, block.count, block.container) == ("Linear", 3, "net")
    lone = _tree(["", "a"], [-1, 0], ["M", "Linear"], [0, 10])
    assert find_block(lone, ["", "a"], [10, 10]) is None


def test_uneven_needs_both_the_ratio_and_the_gap() -> None:
    gap = MEMORY_IMBALANCE_MIN_BYTES
    assert _uneven({"a": 3 * gap, "b": gap}, gap) == ("a", 3 * gap, "b", gap, 2 * gap)
    assert _uneven({"a": int(1.9 * gap) + gap, "b": gap + gap // 2}, gap) is None  # under 2x
    assert _uneven({"a": gap // 2, "b": 0}, gap) is None  # 2x but a small gap
    assert _uneven({"a": gap}, gap) is None


def test_list_names_stays_one_sentence() -> None:
    assert list_names([""]) == "(root)"
    assert list_names(["a", "b"]) == "a and b"
    assert list_names(["a", "b", "c"]) == "a, b and c"
    assert list_names([str(i) for i in range(9)], limit=3) == "0, 1, 2 and 6 more"


def test_findings_sort_by_severity_then_saving() -> None:
    seen = Evidence()
    f = [
        Finding("a", "", "", "", seen, "info", 10),
        Finding("b", "", "", "", seen, "warning", 1),
        Finding("c", "", "", "", seen, "warning", 5),
        Finding("d", "", "", "", seen, "error"),
    ]
    assert [x.code for x in sorted(f, key=severity_key)] == ["d", "c", "b", "a"]


def test_no_events_no_findings_and_a_broken_rule_does_not_hide_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    assert diagnose(RunModel.of(RunState())) == []
    import shardtop.diagnose as d

    def broken(model: RunModel) -> Evidence | None:
        raise KeyError("missing")

    monkeypatch.setattr(d, "RULES", (Rule("broken-rule", broken, lambda e: None), *d.RULES))
    findings = d.diagnose(story1_gpu_state())
    assert findings[-1].code == "diagnose-rule-failed" and "broken-rule" in findings[-1].title
    assert "placement-imbalance" in [f.code for f in findings]


def test_engine_is_read_past_a_setup_snapshot() -> None:
    tree = _tree(["", "a"], [-1, 0], ["M", "Linear"], [0, 40])
    setup = Shards(
        tree_id=0,
        engine="plain",
        stage="setup",
        devices=["cpu"],
        states=["unsharded"],
        bytes=[0, 40],
        device=[-1, 0],
        state=[-1, 0],
        unit=[-1, -1],
    )
    hello = Hello(pid=1, world_size=2, engine="zero3")
    run = RunModel.of(fold([tree, hello, setup]))
    assert run.engine == "zero3", "a set-up snapshot (plain) must not hide the engine the rank announced"
    assert run.held_as == "plain at setup"
    assert run.ranks[0].shards is None and run.ranks[0].setup is setup


@pytest.mark.parametrize(
    ("info", "fires"),
    [
        ({"param_dtype": "float16", "precision": "32-true", "loss_scaling": False}, True),
        ({"param_dtype": "float16", "loss_scaling": False}, True),
        ({"param_dtype": "float16", "precision": "16-mixed", "loss_scaling": True}, False),
        ({"param_dtype": "bfloat16", "precision": "32-true", "loss_scaling": False}, False),
        ({"param_dtype": "float16"}, False),  # raw FSDP: whether a scaler runs is not known
    ],
)
def test_precision_mismatch_needs_fp16_and_no_scaler(info: dict[str, Any], fires: bool) -> None:
    tree = _tree(["", "a"], [-1, 0], ["M", "Linear"], [0, 40])
    shards = Shards(
        tree_id=0,
        engine="fsdp1",
        stage="engine",
        devices=["cpu"],
        states=["sharded"],
        bytes=[0, 20],
        device=[-1, 0],
        state=[-1, 0],
        unit=[0, 0],
        units=[Unit(module=0, kind="fsdp1", numel=10, local_numel=5)],
        info={"root_wrapped": True, **info},
    )
    found = [f.code for f in diagnose(RunModel.of(fold([tree, Hello(pid=1, world_size=2), shards])))]
    assert ("precision-mismatch" in found) is fires
