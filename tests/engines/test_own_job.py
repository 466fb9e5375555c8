"""``shardtop run -- CMD``: a user's own script, unchanged, becomes a run with its tree, steps, OOM and findings.

Real processes and real engines on CPU: ``torchrun`` with FSDP2, the
``deepspeed`` launcher with raw ZeRO-3, a Lightning script without any
callback, a plain loop that runs out of memory in a named module.  The
scripts (``tests/own_scripts/``) import nothing of shardtop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtop.rundir.events import Exit, Hello, Shards, Step
from shardtop.tui.watch.log_tail import LogTail
from tests.support.distributed import free_port
from tests.support.own_job_runs import GLOO_TEARDOWN_ABORT, SCRIPTS, cli, command_pid, run_own


@pytest.fixture(scope="module")
def runs_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("own-job")


def test_fsdp2_script_under_torchrun(runs_base: Path) -> None:
    runs_dir = runs_base / "fsdp2"
    ran = run_own(runs_dir, "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"))
    status = ran.run.status()
    # The command's own exit code comes back, and the run records that same code.
    assert status.exit is not None and ran.code == status.exit.code, ran.describe()
    if ran.code != 0:  # gloo's teardown abort, with or without shardtop: not what this test is about
        assert GLOO_TEARDOWN_ABORT in ran.command_log(), ran.describe()
    else:
        assert status.state == "finished"

    events = ran.events()
    hellos = [e for e in events if isinstance(e, Hello)]
    assert sorted(h.rank for h in hellos) == [0, 1], ran.describe()  # one hello per rank, nothing from torchrun's agent
    assert {h.engine for h in hellos} == {"fsdp2"} and {h.world_size for h in hellos} == {2}
    assert command_pid(ran) not in {h.pid for h in hellos}
    assert sorted(p.name for p in ran.run.events_dir.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert sorted(e.step for e in events if isinstance(e, Step) and e.rank == 0) == [1, 2]

    report = ran.report(runs_dir)
    assert report["engine"] == "fsdp2" and report["world_size"] == 2
    rows = {m["path"]: m for m in report["modules"]}
    block = rows["blocks.0.fc"]
    assert [r["state"] for r in block["ranks"]] == ["sharded", "sharded"]
    assert sum(r["bytes"] for r in block["ranks"]) == block["bytes"]  # each rank holds its half
    assert rows["blocks.0"]["unit"] == "fsdp2"
    assert {r["snapshot"] for r in report["ranks"]} == {"step"}  # re-read after the first step, with the optimizer

    listing = cli("runs", runs_dir=runs_dir)
    assert ran.run.id in listing.stdout and status.describe() in listing.stdout


def test_fsdp2_applied_as_torchtitan_applies_it(runs_base: Path) -> None:
    """Checkpoint-wrapped blocks, ``fully_shard([norm, output])`` and a root without parameters of its own."""
    runs_dir = runs_base / "titan"
    ran = run_own(runs_dir, "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_from_meta.py"))
    if ran.code != 0:  # gloo's teardown abort, with or without shardtop: not what this test is about
        assert GLOO_TEARDOWN_ABORT in ran.command_log(), ran.describe()
    report = ran.report(runs_dir)
    assert report["engine"] == "fsdp2" and report["info"]["fsdp_units"] == 6, ran.describe()
    assert report["info"]["root_wrapped"] is True
    rows = {m["path"]: m for m in report["modules"]}
    assert {path for path, m in rows.items() if m.get("unit") == "fsdp2"} == {
        "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"}
    for path in ("layers.0.feed_forward.0", "output"):
        assert sum(r["bytes"] for r in rows[path]["ranks"]) == rows[path]["bytes"]  # each rank its half


def test_raw_zero3_script_under_the_deepspeed_launcher(runs_base: Path) -> None:
    runs_dir = runs_base / "zero3"
    ran = run_own(
        runs_dir, "deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), str(SCRIPTS / "zero3_train.py"),
    )
    hellos = [e for e in ran.events() if isinstance(e, Hello)]
    assert sorted(h.rank for h in hellos) == [0, 1], ran.describe()  # the runner and launch.py stay quiet
    assert {h.strategy for h in hellos} == {"deepspeed_stage_3"}
    setup = [e for e in ran.events() if isinstance(e, Shards) and e.stage == "setup"]
    assert sorted(s.rank for s in setup) == [0, 1]  # read before deepspeed.initialize touched the model
    assert {s.states[i] for s in setup for i in s.state if i >= 0} == {"unsharded"}

    report = ran.report(runs_dir)
    assert report["engine"] == "zero3"
    codes = [f["code"] for f in report["findings"]]
    assert "zero3-not-partitioned-at-init" in codes, ran.describe()
    finding = next(f for f in report["findings"] if f["code"] == "zero3-not-partitioned-at-init")
    assert "deepspeed.zero.Init" in finding["fix"]  # the raw script's fix, not Lightning's configure_model


def test_lightning_script_without_a_callback(runs_base: Path) -> None:
    runs_dir = runs_base / "lightning"
    ran = run_own(runs_dir, "python", str(SCRIPTS / "lightning_train.py"))
    assert ran.code == 0, ran.describe()
    events = ran.events()
    hellos = [e for e in events if isinstance(e, Hello)]
    # Lightning started rank 1 itself; both got the callback the bootstrap added to their Trainer.
    assert sorted(h.rank for h in hellos) == [0, 1], ran.describe()
    assert {(h.engine, h.strategy) for h in hellos} == {("ddp", "DDPStrategy")}
    assert sorted(e.step for e in events if isinstance(e, Step) and e.rank == 0) == [1, 2]
    assert {e.rank for e in events if isinstance(e, Exit) and e.status == "ok"} == {0, 1}
    assert ran.run.status().state == "finished"
    report = ran.report(runs_dir)
    assert report["driver"] == "Lightning DDPStrategy"


def test_oom_in_a_named_module_is_attributed_and_the_exit_code_comes_back(runs_base: Path) -> None:
    runs_dir = runs_base / "oom"
    ran = run_own(runs_dir, "python", str(SCRIPTS / "oom_in_module.py"))
    assert ran.code == 1, ran.describe()  # Python's own exit code for an uncaught error
    assert "Rank 0 ran out of memory on cpu during forward (step 1) in decoder.1 (Expand)" in ran.output
    assert "exit 1" in ran.run.status().describe()
    report = ran.report(runs_dir)
    oom = report["oom"]
    assert (oom["module"], oom["module_type"], oom["phase"]) == ("decoder.1", "Expand", "forward")
    assert oom["attributed_by"] == "forward-frame" and oom["requested_bytes"] == 64 << 40
    exits = [e for e in ran.events() if isinstance(e, Exit)]
    assert [(e.rank, e.status) for e in exits] == [(0, "oom")]
    shown = LogTail(ran.run).read_new()  # the TUI's log pane shows the command's own output
    assert any("DefaultCPUAllocator: can't allocate memory" in line for line in shown)


def test_shardtop_run_dir_naming_a_new_directory(runs_base: Path) -> None:
    target = runs_base / "mine" / "first-try"
    ran = run_own(runs_base / "unused", "python", str(SCRIPTS / "oom_in_module.py"), "--ask", "4",
                  env={"SHARDTOP_RUN_DIR": str(target)})
    assert ran.code == 0, ran.describe()
    assert ran.run.path == target and ran.run.read_meta().id == "first-try"
    assert (target.stat().st_mode & 0o777) == 0o700
    assert not (runs_base / "unused").exists()
    report = cli("report", str(target), runs_dir=runs_base / "unused")
    assert report.returncode == 0 and "status:     finished" in report.stdout, report.stdout + report.stderr
    listing = cli("runs", "--runs-dir", str(target.parent), runs_dir=runs_base / "unused")
    assert "first-try" in listing.stdout and "finished" in listing.stdout
    attached = cli("attach", str(target), runs_dir=runs_base / "unused")  # no terminal: milestones, then the code
    assert attached.returncode == 0 and "exit 0: finished" in attached.stdout, attached.stdout + attached.stderr


def test_disabled_injection_runs_the_command_untouched(runs_base: Path) -> None:
    runs_dir = runs_base / "disabled"
    ran = run_own(runs_dir, "python", str(SCRIPTS / "oom_in_module.py"), "--ask", "4", env={"SHARDTOP_DISABLE": "1"})
    assert ran.code == 0, ran.describe()
    assert list(ran.run.events_dir.iterdir()) == []
    assert ran.run.status().state == "finished"
