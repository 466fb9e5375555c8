"""The worker-side readers: run feed, log tail, run catalog, GPU feed, process lookups."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from shardtop.gpus import GpuProcessUse, HostProbe
from shardtop.rundir.event_files import event_file
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Hello, Oom, Step
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from shardtop.tui.watch.gpu_feed import GpuFeed
from shardtop.tui.watch.log_tail import LogTail
from shardtop.tui.watch.run_catalog import RunCatalog
from shardtop.tui.watch.run_feed import RunFeed
from tests.support.recorded import (
    H200_HOST,
    RecordedGpus,
    RecordedHost,
    copy_runs,
    eight_h200s,
    nvml_samples,
    recorded_h200,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def append(run: Path, rank: int, event: object) -> None:
    with open(event_file(run / "events", rank), "ab") as f:
        f.write(encode(event))  # type: ignore[arg-type]


def test_run_feed_posts_changes_urgent_ones_at_once(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "cpu/fsdp2-mlp")["cpu/fsdp2-mlp"]
    (path / "exit.json").unlink()  # as if it were still running
    clock = Clock()
    feed = RunFeed(RunDirectory(path), refresh=1.0, clock=clock)
    first = feed.poll()
    assert first is not None and first.serial == 1
    assert first.tree is not None and first.tree.ranks == (0, 1)
    assert first.model.step == 3 and first.meta.title == "fsdp2-mlp"
    assert any("max_steps=3" in line.text for line in first.new_log)
    assert feed.poll() is None, "nothing changed: no snapshot"
    t = first.state.last_t

    append(path, 0, Step(step=4, rank=0, host="vm", t=t + 1))
    clock.now += 0.3
    assert feed.poll() is None, "a step waits for the refresh interval"
    clock.now += 1.0
    later = feed.poll()
    assert later is not None and later.model.step == 4 and later.tree is first.tree

    append(path, 1, Oom(phase="forward", module="model.blocks.3.fc1", rank=1, host="vm", t=t + 2))
    clock.now += 0.01
    urgent = feed.poll()
    assert urgent is not None, "an OOM is shown at once"
    assert [s.module for s in urgent.model.ooms] == ["model.blocks.3.fc1"]


def test_run_feed_survives_a_torn_line_and_garbage(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "h200/zero3-linear-fixed")["h200/zero3-linear-fixed"]
    with open(event_file(path / "events", 0), "ab") as f:
        f.write(b'not json at all\n{"kind": "step", "step"')
    snap = RunFeed(RunDirectory(path)).poll()
    assert snap is not None and snap.state.skipped == 1 and snap.status.state == "failed"
    assert snap.model.ooms and snap.tree is None, "the OOM came before any module tree"


def test_run_feed_says_when_the_diagnosis_fails(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "h200/zero3-linear-fixed")["h200/zero3-linear-fixed"]

    def broken(state: object) -> list[object]:
        raise KeyError("rule")

    snap = RunFeed(RunDirectory(path), findings=broken).poll()  # type: ignore[arg-type]
    assert snap is not None and [f.code for f in snap.findings] == ["diagnose-rule-failed"]
    assert "KeyError" in snap.findings[0].detail


def test_the_feeds_only_read_a_run_whose_supervisor_vanished(tmp_path: Path) -> None:
    """No exit record and no process: the feeds say so and write nothing into the run directory."""
    path = copy_runs(tmp_path, "cpu/fsdp2-mlp")["cpu/fsdp2-mlp"]
    (path / "exit.json").unlink()
    before = sorted((p.relative_to(path), p.stat().st_mtime_ns) for p in path.rglob("*"))
    snap = RunFeed(RunDirectory(path)).poll()
    assert snap is not None and snap.status.state == "lost"
    assert RunCatalog(tmp_path).poll() is not None
    assert sorted((p.relative_to(path), p.stat().st_mtime_ns) for p in path.rglob("*")) == before


def test_log_tail_returns_complete_lines_only(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    log = run.rank_log(0)
    log.write_text("one\ntw")
    tail = LogTail(run)
    assert tail.read_new() == ["    r0 │ one"]
    with open(log, "a") as f:
        f.write("o\nprogress 10%\rprogress 100%\n")
    assert tail.read_new() == ["    r0 │ two", "    r0 │ progress 100%"]
    assert tail.read_new() == []


def test_catalog_names_the_rank_behind_a_pid(tmp_path: Path) -> None:
    copy_runs(tmp_path, "cpu/fsdp2-mlp")
    live = RunDirectory.create(
        tmp_path, "zero3-linear",
        RunMeta(preset="zero3-linear", pid=os.getpid(), pid_started=process_start_time(os.getpid())),
    )
    append(live.path, 1, Hello(pid=4242, world_size=2, rank=1, host="gpu-box", t=time.time()))
    append(live.path, 0, Hello(pid=4243, world_size=2, rank=0, host="gpu-box-2", t=time.time()))
    catalog = RunCatalog(tmp_path, here="gpu-box")
    snap = catalog.poll()
    assert snap is not None
    assert [r.live for r in snap.rows] == [True, False]
    assert snap.owners[4242].run_id == live.id and snap.owners[4242].rank == 1
    assert 4243 not in snap.owners, "pid 4243 is on another host: a process here with that pid is someone else"
    assert catalog.poll() is None, "nothing changed"
    assert {p.name for p in snap.presets} >= {"fsdp2-mlp"}


def test_gpu_feed_keeps_history_and_says_when_there_is_no_driver() -> None:
    recorded = recorded_h200(ramp=True)
    feed = GpuFeed(source=recorded, host=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    snaps = [feed.poll() for _ in recorded.samples]
    snap = [s for s in snaps if s is not None][-1]
    assert snap is not None and len(snap.gpus) == 1 and snap.gpus[0].name == "NVIDIA H200"
    assert len(snap.history[0]) == len(recorded.samples), "every sample on the way to story 2's OOM"
    assert [p.visibility for p in snap.processes] == ["not-visible"], "psutil was not told about pid 644"
    opener = lambda: (None, "no NVIDIA driver: NVML Shared Library Not Found")  # noqa: E731
    none = GpuFeed(host=RecordedHost(H200_HOST), opener=opener)  # type: ignore[arg-type]
    snap = none.poll()
    assert snap is not None and snap.gpus == () and snap.unavailable and "driver" in snap.unavailable


def test_host_probe_never_raises_on_strange_pids() -> None:
    probe = HostProbe()
    rows = probe.describe(
        [GpuProcessUse(0, os.getpid(), 2**30), GpuProcessUse(1, os.getpid(), 2**30), GpuProcessUse(0, 4_194_999, None)]
    )
    mine = next(r for r in rows if r.pid == os.getpid())
    assert mine.visibility == "own" and mine.gpus == (0, 1) and mine.gpu_memory == 2**31
    assert mine.host_rss and "python" in mine.command.lower() or "pytest" in mine.command
    ghost = next(r for r in rows if r.pid == 4_194_999)
    assert ghost.visibility == "not-visible" and ghost.command == ""
    stranger = HostProbe(user="somebody-else")
    assert stranger.describe([GpuProcessUse(0, os.getpid(), None)])[0].visibility == "other-user"
    assert probe.host().memory_total > 0


def test_samples_are_compared_at_the_precision_shown() -> None:
    from shardtop.gpus import GpuProcessInfo, HostSample
    from shardtop.tui.watch.gpu_feed import as_shown

    recorded = nvml_samples()[-1]
    jittered = [msgspec.structs.replace(g, used=g.used + 4096, power_w=(g.power_w or 0) - 0.3) for g in recorded]
    proc = GpuProcessInfo(1, (0,), 2**30, "own", "me", "python", 12.4, 2**29)
    host = HostSample(cpu_percent=12.4, cores=4, memory_used=2**33, memory_total=2**35)
    jitter = (
        GpuProcessInfo(1, (0,), 2**30 + 100, "own", "me", "python", 11.6, 2**29 + 100),
        HostSample(cpu_percent=11.8, cores=4, memory_used=2**33 + 4096, memory_total=2**35),
    )
    assert as_shown(recorded, [proc], host) == as_shown(jittered, [jitter[0]], jitter[1])
    shown = as_shown(recorded, [], host)[0][0]
    assert abs(shown.used - recorded[0].used) <= 2 * 2**20


def test_psutil_is_asked_once_a_second_unless_processes_change() -> None:
    class Counting(RecordedHost):
        looks = 0

        def describe(self, uses):  # type: ignore[no-untyped-def]
            Counting.looks += 1
            return super().describe(uses)

    clock = Clock()
    eight = eight_h200s().samples[-1]
    one, two = eight[:1], eight[:2]
    feed = GpuFeed(source=RecordedGpus([one, one, one, two]), host=Counting(H200_HOST), clock=clock)  # type: ignore[arg-type]
    for _ in range(3):
        feed.poll()
        clock.now += 0.1
    assert Counting.looks == 1, "three NVML samples within a second: one look through psutil"
    feed.poll()
    assert Counting.looks == 2, "a new process on a GPU is looked at at once"
    clock.now += 1.0
    feed.poll()
    assert Counting.looks == 3
