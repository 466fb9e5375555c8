"""Run directories: private, sortable, findable, refusing what is not ours."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RunDirectory, RunError, find_run, list_runs, runs_root
from shardtop.rundir.run_meta import RunMeta
from shardtop.rundir.run_status import PeersStopped, RankExit


def test_created_private_with_meta(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = RunDirectory.create(root, "zero3-linear", RunMeta(preset="zero3-linear", config=RunConfig(world_size=2)))
    for p in (root, run.path, run.events_dir, run.logs_dir):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert stat.S_IMODE(run.meta_path.stat().st_mode) == 0o600
    meta = run.read_meta()
    assert meta.preset == "zero3-linear" and meta.config.world_size == 2
    assert "zero3-linear" in run.id


def test_ids_sort_by_start_and_find_by_part(tmp_path: Path) -> None:
    a = RunDirectory.create(tmp_path, "fsdp2-mlp", RunMeta(preset="fsdp2-mlp"))
    b = RunDirectory.create(tmp_path, "zero3-linear", RunMeta(preset="zero3-linear"))
    assert [r.id for r in list_runs(tmp_path)] == [a.id, b.id]
    assert find_run(tmp_path, None).id == b.id
    assert find_run(tmp_path, b.id[-4:]).id == b.id
    assert find_run(tmp_path, str(a.path)).id == a.id
    with pytest.raises(RunError, match="no run"):
        find_run(tmp_path, "nothing-like-it")


def test_status_without_exit_record_or_process_is_lost(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p", pid=2**22 - 7))
    assert run.status().state == "lost"
    run.write_exit(0, ending="finished")
    assert run.status().state == "finished"


def test_status_running_while_our_process_lives(tmp_path: Path) -> None:
    from shardtop.rundir.liveness import process_start_time

    ours = RunMeta(preset="p", pid=os.getpid(), pid_started=process_start_time(os.getpid()))
    run = RunDirectory.create(tmp_path, "p", ours)
    assert run.status().state == "running"
    run.update_meta(pid_started=1.0)  # same pid, another process's start time: pid reuse
    assert run.status().state == "lost"


def test_failed_status_names_code_and_signal(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    run.write_exit(134, signal=6, ending="failed")
    assert run.status().describe() == "failed (SIGABRT)"


def test_env_and_flag_choose_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDTOP_RUNS_DIR", str(tmp_path / "env"))
    assert runs_root(None) == tmp_path / "env"
    assert runs_root(tmp_path / "flag") == tmp_path / "flag"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory owned by someone else")
def test_someone_elses_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, 12345, 12345)
    with pytest.raises(RunError, match="belongs to user"):
        RunDirectory.create(root, "p", RunMeta(preset="p"))


def test_find_by_any_unique_part_of_the_id(tmp_path: Path) -> None:
    a = RunDirectory.create(tmp_path, "fsdp2-mlp", RunMeta(preset="fsdp2-mlp"))
    b = RunDirectory.create(tmp_path, "zero3-linear", RunMeta(preset="zero3-linear"))
    assert find_run(tmp_path, "zero3-lin").id == b.id  # the middle: neither prefix nor suffix
    assert find_run(tmp_path, "2-mlp-").id == a.id
    with pytest.raises(RunError, match="matches 2 runs"):
        find_run(tmp_path, "-")


def test_exit_record_keeps_every_rank_and_the_first_writer_wins(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    ranks = (RankExit(0, 137, signal=9, stopped=True), RankExit(1, 137, signal=9))
    assert run.write_exit(
        137, signal=9, reason="rank 1 failed", ranks=ranks, peers_stopped=PeersStopped(1, 5.0, True), ending="failed"
    )
    later = run.write_exit(143, signal=15, reason="stopped", ending="stopped")
    assert not later, "a later record never replaces the first"
    record = run.read_exit()
    assert record is not None and record.reason == "rank 1 failed"
    assert record.ranks == ranks and record.peers_stopped == PeersStopped(1, 5.0, killed=True)
    assert stat.S_IMODE(run.exit_path.stat().st_mode) == 0o600
    assert [p.name for p in run.path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_garbled_or_older_exit_record_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    run.exit_path.write_text('{"code": 1, "signal": null, "reason": "supervisor ended", "ranks": [{"rank": "x"}, 3]}')
    record = run.read_exit()
    assert record is not None and record.code == 1 and record.ranks == () and record.peers_stopped is None
    run.exit_path.write_text("[1, 2")
    assert run.read_exit() is None and run.status().state == "lost"


def test_the_state_is_read_from_the_ending_not_from_the_words(tmp_path: Path) -> None:
    stopped = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    stopped.write_exit(143, signal=15, reason="rank 3 ended", ending="stopped")
    assert stopped.status().state == "stopped"
    failed = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    failed.write_exit(1, reason="stopped", ending="failed")
    assert failed.status().state == "failed"
    by_signal = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    by_signal.write_exit(143, signal=15, reason="rank 0 failed", ending="failed")
    assert by_signal.status().describe() == "interrupted (SIGTERM)"


@pytest.mark.parametrize(
    ("record", "state"),
    [
        ({"code": 143, "signal": 15, "reason": "stopped"}, "stopped"),
        ({"code": 130, "signal": 2, "reason": "rank 0: interrupted"}, "interrupted"),
        ({"code": 1, "signal": None, "reason": "rank 0 failed"}, "failed"),
        ({"code": 0, "signal": None, "reason": "finished on 2 hosts"}, "finished"),
        ({"code": 1, "signal": None, "reason": "rank 0: oom", "ending": ["stopped"]}, "failed"),
    ],
)
def test_a_record_without_a_valid_ending_reads_by_its_code_and_signal(
    tmp_path: Path, record: dict[str, object], state: str
) -> None:
    run = RunDirectory.create(tmp_path, "p", RunMeta(preset="p"))
    run.exit_path.write_text(json.dumps(record))
    assert run.status().state == state
