"""The bootstrap in every Python process of a ``shardtop run`` command: quiet and cheap where it is no rank.

Each check runs a real interpreter with the environment the supervisor gives
the command (``shardtop.inject.command_env``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardtop.inject import command_env
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Hello, Step
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from tests.support.own_job_runs import SCRIPTS, run_own, user_env

LOADED = (
    "import sys, json; "
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'shardtop'))))"
)


def _python(
    code: str, run_dir: Path, *, python: str = sys.executable, **extra: str
) -> subprocess.CompletedProcess[str]:
    run_dir.mkdir(exist_ok=True)
    env = command_env(user_env(**extra), run_dir)
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_python_process_that_is_no_rank_loads_neither_torch_nor_the_probe(tmp_path: Path) -> None:
    done = _python(LOADED, tmp_path / "run")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    loaded = json.loads(done.stdout)
    assert "torch" not in loaded and "shardtop.probe" not in loaded
    assert "shardtop.inject.bootstrap" in loaded  # the bootstrap did run
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["bootstrap"]  # and wrote nothing


def test_a_launcher_that_imports_torch_writes_nothing(tmp_path: Path) -> None:
    code = "import torch, torch.distributed.run, deepspeed; " + LOADED
    done = _python(code, tmp_path / "run", DS_ACCELERATOR="cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "shardtop.probe" not in json.loads(done.stdout.strip().splitlines()[-1])
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["bootstrap"]


def test_where_a_process_is_no_rank_the_bootstrap_adds_only_its_own_modules(tmp_path: Path) -> None:
    """What a launcher or any helper script of the job pays is the bootstrap's own small modules: beside the
    same interpreter without it, nothing of a third party and nothing else of shardtop is loaded (what that
    costs in milliseconds: ``bench/bench_costs.py``)."""
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    with_it = set(json.loads(_python(code, tmp_path / "run").stdout))
    without = set(json.loads(_python(code, tmp_path / "off", SHARDTOP_DISABLE="1").stdout))
    added = sorted(with_it - without)
    assert "shardtop.inject.bootstrap" in added
    own = [m for m in added if m in ("shardtop", "shardtop.inject") or m.startswith("shardtop.inject.")]
    assert [m for m in added if m not in own and m.split(".")[0] not in sys.stdlib_module_names] == []


def test_the_environments_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    code = (
        "import builtins, sys; "
        "print(getattr(builtins, 'THEIRS_RAN', False), 'shardtop.inject.bootstrap' in sys.modules)"
    )
    done = _python(code, tmp_path / "run", PYTHONPATH=str(theirs))
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_disabled_means_not_even_the_bootstrap(tmp_path: Path) -> None:
    done = _python(LOADED, tmp_path / "run", SHARDTOP_DISABLE="1")
    assert [m for m in json.loads(done.stdout) if m.startswith("shardtop")] == []


@pytest.mark.skipif(shutil.which("python3", path="/usr/bin") is None, reason="no system Python at /usr/bin/python3")
def test_a_python_without_shardtop_installed_finds_the_bootstrap(tmp_path: Path) -> None:
    """The command's own interpreter need not have shardtop: the bootstrap comes from where shardtop is."""
    code = "import sys; print('shardtop.inject.bootstrap' in sys.modules)"
    done = _python(code, tmp_path / "run", python="/usr/bin/python3", PYTHONPATH="")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_pythonpath_alone_carries_the_probe_to_another_host(tmp_path: Path) -> None:
    """A rank that a launcher started on another host with only PYTHONPATH passed on (as the deepspeed
    launcher over a hostfile does): the bootstrap knows its run from where it lies."""
    run, _ = RunDirectory.create_or_join(tmp_path / "shared" / "run", RunMeta(own_job=True))
    bootstrap = command_env({}, run.path)["PYTHONPATH"]
    env = {**user_env(), "PYTHONPATH": os.pathsep.join([bootstrap, user_env()["PYTHONPATH"]])}
    assert not [k for k in env if k.startswith("SHARDTOP_")]
    done = subprocess.run([sys.executable, str(SCRIPTS / "oom_in_module.py"), "--ask", "4"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    hellos = [e for e in read_all(run.events_dir)[0] if isinstance(e, Hello)]
    assert [(h.rank, h.engine) for h in hellos] == [(0, "plain")]


def test_dataloader_workers_stay_quiet(tmp_path: Path) -> None:
    """Workers started by fork and by spawn call a module (their transform): only the training process is a rank."""
    ran = run_own(tmp_path / "runs", "python", str(SCRIPTS / "dataloader_train.py"))
    assert ran.code == 0, ran.describe()
    trained_in = int(re.search(r"trained in process (\d+)", ran.command_log()).group(1))  # type: ignore[union-attr]
    assert sorted(p.name for p in ran.run.events_dir.iterdir()) == ["rank-0.jsonl"]
    hellos = [e for e in ran.events() if isinstance(e, Hello)]
    assert [(h.rank, h.pid, h.engine) for h in hellos] == [(0, trained_in, "plain")]
    assert [e.step for e in ran.events() if isinstance(e, Step)] == [1, 2, 3, 4]
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "shardtop", "report", str(ran.run.path), "--format", "json"],
            capture_output=True, text=True, env=user_env(), timeout=120, check=False,
        ).stdout
    )
    assert [m["path"] for m in report["modules"]] == ["", "0", "1", "2"]  # the model, not the workers' transform
    assert RunDirectory(ran.run.path).status().state == "finished"
