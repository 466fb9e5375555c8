"""Many hosts, one run: two hosts on one machine, each running ``shardtop run --run-dir SHARED -- torchrun …``.

Each "host" is a UTS namespace with a host name of its own (``unshare --uts``,
which needs root); torchrun's c10d rendezvous joins them over loopback, as a
job over two machines with a shared file system.  A login node without torch
then reads the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Hello
from shardtop.rundir.run_directory import RunDirectory
from tests.support.own_job_runs import user_env
from tests.support.two_hosts import HOSTS, run_two_hosts, unshare_refused

LOGIN_NODE = r"""
import sys
class NoTrainingLibraries:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "lightning", "deepspeed", "pytorch_lightning"):
            raise ImportError(f"{name} is not installed on this login node")
sys.meta_path.insert(0, NoTrainingLibraries())
from shardtop.cli import main
code = main(sys.argv[1:])
assert not any(m.split(".")[0] in ("torch", "lightning", "deepspeed") for m in sys.modules)
raise SystemExit(code)
"""


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunDirectory, list[str], list[int]]:
    refused = unshare_refused()
    if refused:
        pytest.skip(refused)
    shared = tmp_path_factory.mktemp("shared-fs") / "job"
    outputs, codes = run_two_hosts(shared)
    return RunDirectory(shared), outputs, codes


def test_two_hosts_make_one_run(two_hosts: tuple[RunDirectory, list[str], list[int]]) -> None:
    run, outputs, codes = two_hosts
    assert codes == [0, 0], "\n".join(outputs)
    said = "\n".join(outputs)
    assert "started a new run on" in said and "joined the run on" in said  # one made it, the other joined
    events, _ = read_all(run.events_dir)
    hellos = {e.rank: e for e in events if isinstance(e, Hello)}
    assert sorted(hellos) == [0, 1, 2, 3], said
    by_host: dict[str, list[int]] = {}
    for hello in hellos.values():
        by_host.setdefault(hello.host, []).append(hello.local_rank)
    assert {h: sorted(v) for h, v in by_host.items()} == {"node-a": [0, 1], "node-b": [0, 1]}  # a local rank 0 each
    assert {(h.slurm_job_id, h.slurm_step_id) for h in hellos.values()} == {("4242", "0")}
    assert {h.slurm_node for h in hellos.values()} == set(HOSTS)
    status = run.status()
    assert (status.state, status.exit.reason if status.exit else "") == ("finished", "finished on 2 hosts")
    assert sorted(p.name for p in run.logs_dir.iterdir()) == ["command-node-a.log", "command-node-b.log"]


def _login_node(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``shardtop ARGS`` where torch, Lightning and DeepSpeed cannot be imported."""
    env = {k: v for k, v in user_env().items() if not k.startswith("SLURM")}
    return subprocess.run([sys.executable, "-c", LOGIN_NODE, *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd, check=False)


def test_a_login_node_without_torch_reads_the_run(two_hosts: tuple[RunDirectory, list[str], list[int]]) -> None:
    run = two_hosts[0]
    report = _login_node("report", str(run.path), cwd=run.path.parent)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "4 rank(s) on 2 hosts" in report.stdout
    assert "node-a: ranks " in report.stdout and "node-b: ranks " in report.stdout
    assert "slurm:      job 4242 step 0" in report.stdout
    assert "status:     finished" in report.stdout
    as_json = json.loads(_login_node("report", str(run.path), "--format", "json", cwd=run.path.parent).stdout)
    assert {h: len(r) for h, r in as_json["ranks_by_host"].items()} == {"node-a": 2, "node-b": 2}
    assert as_json["slurm"] == [{"job_id": "4242", "step_id": "0"}]
    listing = _login_node("runs", "--runs-dir", str(run.path.parent), cwd=run.path.parent)
    assert listing.returncode == 0 and "job" in listing.stdout and "finished" in listing.stdout, listing.stderr
    attached = _login_node("attach", str(run.path), cwd=run.path.parent)  # no terminal: milestones, then the end
    assert attached.returncode == 0 and "4 rank(s) up" in attached.stdout, attached.stdout + attached.stderr


def test_a_login_node_without_torch_is_told_how_to_get_the_presets(tmp_path: Path) -> None:
    done = _login_node("--runs-dir", str(tmp_path / "runs"), "launch", "preset=fsdp2-mlp", "--headless", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'shardtop[engines]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
