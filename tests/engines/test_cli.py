"""What users type on the command line, right or wrong: an answer or a message (exit 2), never a traceback.

No training here except one short run: these are the command's own faults.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardtop import cli
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.rundir.run_meta import RunMeta
from tests.support.cli import ROOT, shardtop


def finished_run(root: Path, preset: str = "fsdp2-mlp") -> RunDirectory:
    run = RunDirectory.create(root, preset, RunMeta(preset=preset, config=RunConfig(world_size=2)))
    run.write_exit(0, reason="finished", ending="finished")
    return run


def refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, a one-message answer naming ``words``, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.stderr.startswith(("shardtop: error:", "usage:")), r.stderr
    for word in words:
        assert word in r.stderr, (word, r.stderr)


def test_global_options_work_before_or_after_the_command(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    run = finished_run(mine)
    decoy = finished_run(other, "zero3-linear")
    for args in (("--runs-dir", str(mine), "runs"), ("runs", "--runs-dir", str(mine))):
        out = shardtop(*args, runs_dir=other).stdout  # $SHARDTOP_RUNS_DIR points at the other directory
        assert run.id in out and decoy.id not in out, (args, out)
    r = shardtop("--read-only", "stop", run.id, runs_dir=mine)
    refused(r, "--read-only forbids stopping")


def test_read_only_and_interval_reach_the_tui_from_either_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TUI itself is tested with the flag set; here: the flag gets there, wherever it was typed."""
    import shardtop.tui.app

    run = finished_run(tmp_path)
    opened: list[dict[str, object]] = []
    monkeypatch.setattr(shardtop.tui.app, "run_app", lambda **kw: opened.append(kw) or 0)
    monkeypatch.setattr(cli, "on_a_terminal", lambda: True)
    monkeypatch.setenv("SHARDTOP_RUNS_DIR", str(tmp_path / "elsewhere"))
    root = ["--runs-dir", str(tmp_path)]
    assert cli.main(["--read-only", "--interval", "2.5", *root, "attach", run.id]) == 0
    assert cli.main(["attach", run.id, "--read-only", "--interval", "0.5", *root]) == 0
    assert cli.main([*root, "attach", run.id]) == 0
    assert [(o["read_only"], o["refresh"], o["runs_root"]) for o in opened] == [
        (True, 2.5, tmp_path), (True, 0.5, tmp_path), (False, None, tmp_path)
    ]  # None: $SHARDTOP_REFRESH or 1 s, read by run_app


def test_run_on_a_terminal_opens_the_runs_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``shardtop run -- CMD`` without --headless: the command runs and its view opens."""
    import shardtop.tui.app

    opened: list[dict[str, object]] = []
    monkeypatch.setattr(shardtop.tui.app, "run_app", lambda **kw: opened.append(kw) or 0)
    monkeypatch.setattr(cli, "on_a_terminal", lambda: True)
    assert cli.main(["run", "--runs-dir", str(tmp_path), "--", sys.executable, "-c", "pass"]) == 0
    [run] = list_runs(tmp_path)
    assert [o["run"] for o in opened] == [str(run.path)]
    deadline = time.monotonic() + 60
    while run.status().state == "running" and time.monotonic() < deadline:  # the command's own short life
        time.sleep(0.1)
    assert run.status().state == "finished", run.status().describe()


def test_interval_out_of_range_is_refused(tmp_path: Path) -> None:
    for value in ("0", "-1", "nan", "soon", "1e9"):
        refused(shardtop("--interval", value, "runs", runs_dir=tmp_path), "--interval", "between 0.05 and 60")


def test_runs_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``shardtop runs | head -1``: head leaves after one line, shardtop must not print a traceback."""
    for _ in range(1200):  # well past a pipe's 64 KiB buffer
        RunDirectory.create(tmp_path, "fsdp2-mlp", RunMeta(preset="fsdp2-mlp"))
    env = {**os.environ, "SHARDTOP_RUNS_DIR": str(tmp_path)}
    runs = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "runs", "--limit", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )
    assert runs.stdout is not None and runs.stderr is not None
    head = subprocess.run(["head", "-1"], stdin=runs.stdout, capture_output=True, text=True, timeout=120)
    runs.stdout.close()
    err = runs.stderr.read().decode()
    assert runs.wait(timeout=120) == 128 + signal.SIGPIPE, err
    assert err == "", err
    assert head.stdout.split() == ["RUN", "STATUS", "RANKS", "STEP", "STARTED", "NOTE"]


def test_a_run_is_found_by_any_unique_part_of_its_id(tmp_path: Path) -> None:
    a = finished_run(tmp_path, "fsdp2-mlp")
    b = finished_run(tmp_path, "zero3-linear")
    r = shardtop("stop", "zero3-lin", runs_dir=tmp_path)  # neither a prefix nor a suffix
    assert r.returncode == 0 and b.id in r.stdout and a.id not in r.stdout, r.stdout + r.stderr
    refused(shardtop("stop", "-", runs_dir=tmp_path), "matches 2 runs", a.id, b.id)
    refused(shardtop("stop", "no-such-part", runs_dir=tmp_path), "no run 'no-such-part'")


def test_a_runs_dir_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("not a directory")
    for where in (afile / "runs", afile):
        r = shardtop("--runs-dir", str(where), "launch", "fsdp2-mlp", "--headless", runs_dir=tmp_path)
        refused(r, str(where), "--runs-dir DIR")
    refused(shardtop("--runs-dir", str(afile / "runs"), "launch", "fsdp2-mlp", runs_dir=tmp_path), "is a file")
    assert afile.read_text() == "not a directory"


def test_a_read_only_runs_dir_is_refused(tmp_path: Path) -> None:
    """A real read-only file system: a tmpfs mounted ro in a mount namespace of the command's own.

    (Tests run as root, where chmod 0500 does not stop writes.)
    """
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a read-only tmpfs in a private mount namespace")
    mount = tmp_path / "ro"
    mount.mkdir()
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o ro,size=1m none {mount}"],
        capture_output=True, text=True, timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for where in (mount, mount / "runs"):
        script = (
            f"mount -t tmpfs -o ro,size=1m none {mount} && "
            f"exec {sys.executable} -m shardtop --runs-dir {where} launch fsdp2-mlp --headless max_steps=1"
        )
        r = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
        )
        refused(r, "read-only file system", "--runs-dir DIR")
    assert not any(mount.iterdir()), "outside the namespace nothing was mounted, nothing written"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_someone_elses_runs_are_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    finished_run(theirs)
    os.chown(theirs, 12345, 12345)
    refused(shardtop("--runs-dir", str(theirs), "launch", "fsdp2-mlp", runs_dir=tmp_path), "belongs to user")
    mine = tmp_path / "mine"
    run = finished_run(mine)
    os.chown(run.path, 12345, 12345)
    for command in ("stop", "report", "attach"):
        refused(shardtop(command, run.id, runs_dir=mine), "belongs to user", "--runs-dir DIR")


def test_wrong_settings_get_a_message_and_create_nothing(tmp_path: Path) -> None:
    cases = [
        (("presets/fsdp2-mlp.yaml",), "not a preset name", "type its name: fsdp2-mlp"),
        ((str(ROOT / "presets" / "fsdp2-mlp"),), "not a preset name", "type its name: fsdp2-mlp"),
        (("../fsdp2-mlp",), "not a preset name"),
        (("fsdp2-mlp", "max_steps=" + "9" * 5000), "too large", "(5000 characters)"),
        (("fsdp2-mlp", "seed=" + "9" * 30), "too large"),
        (("fsdp2-mlp", "gpu_mem_limit=" + "9" * 400), "more than any GPU or machine has"),
        (("fsdp2-mlp", "gpu_mem_limit=2PiB"), "more than any GPU or machine has"),
        (("fsdp2-mlp", "gpu_mem_limit=0"), "0 bytes", "null for no limit"),
        (("fsdp2-mlp", "on_cpu.model.hidden=8"), "cannot be overridden"),
    ]
    for args, *words in cases:
        refused(shardtop("launch", *args, "--headless", runs_dir=tmp_path), *words)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_more_cpu_ranks_than_the_machine_holds_are_refused(tmp_path: Path) -> None:
    from shardtop.launch import cpu_room

    room = cpu_room()
    r = shardtop("launch", "zero3-linear", "--headless", "devices=999", "max_steps=1", runs_dir=tmp_path,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    refused(r, "devices=999 on CPU", f"{room.cores} CPU core(s)", f"Use devices={room.ranks} or fewer")
    assert list_runs(tmp_path) == [], "no run directory, no rank started"


def test_more_devices_than_the_machine_has_offer_the_rehearsal_to_type(tmp_path: Path) -> None:
    """The refusal ends with the rehearsal of the same settings, the preset's name first, exit 2."""
    r = shardtop("launch", "preset=fsdp2-mlp", "devices=999", "max_steps=1", "--headless", runs_dir=tmp_path,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    refused(r, "devices=999 on CPU", "Use devices=")
    last = r.stderr.strip().splitlines()[-1]
    assert last == (
        "Or rehearse the 999-rank job as one CPU process at a time: shardtop rehearse fsdp2-mlp devices=999 max_steps=1"
    )
    assert list_runs(tmp_path) == []


def test_the_rehearsal_offered_on_gpus_keeps_every_setting() -> None:
    from shardtop.config import resolve
    from shardtop.launch import TooManyDevices, resolve_devices

    settings = ["zero3-linear", "devices=8", "gpu_mem_limit=15GiB", "model.n_layers=4000"]
    with pytest.raises(TooManyDevices) as refused:
        resolve_devices(resolve("zero3-linear", [("devices", "8")]), lambda: 1)
    assert refused.value.offer(settings) == (
        "devices=8, but this machine has 1 GPU(s). Use devices=1 or fewer.\n"
        "Or rehearse the 8-GPU job on this machine's first GPU, one rank at a time: "
        "shardtop rehearse zero3-linear devices=8 gpu_mem_limit=15GiB model.n_layers=4000"
    )
    with pytest.raises(TooManyDevices) as whole:  # one process drives every GPU: no rank to rehearse
        resolve_devices(resolve("manual-placement", [("devices", "8")]), lambda: 1)
    assert whole.value.offer(["manual-placement", "devices=8"]) == str(whole.value)


def test_the_largest_memory_limit_accepted_runs(tmp_path: Path) -> None:
    """1 PiB is accepted and reaches the rank's RLIMIT_DATA without overflowing (it used to, past 2**63)."""
    r = shardtop("launch", "ddp-baseline", "--headless", "max_steps=1", "gpu_mem_limit=1PiB", runs_dir=tmp_path,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = list_runs(tmp_path)
    assert "gpu_mem_limit on CPU: at most 1125899906842624 more bytes" in run.rank_log(0).read_text()
