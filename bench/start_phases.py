"""Where ``shardtop attach``'s first frame spends its time: Python's start, imports, reading, the tree, the lines.

    python bench/start_phases.py [--times 8] [--also DIR ...]

Each start is a fresh interpreter that does what ``shardtop attach RUN`` does
before its plain first frame (``cli.main`` → ``_open_tui`` → ``run_frame``),
step by step, and reports when each step ended; the run is story 2 as recorded
on two H200s (``bench_ssh.py``'s).  Beside it, in the same rotation: a bare
``python -c pass``, and a fresh interpreter importing nvitop's command line and
curses (nvitop's imports before it asks NVML anything), where nvitop is
installed.  ``--also DIR`` runs the same steps with another checkout's shardtop
first on ``PYTHONPATH``.  Prints each step's median over ``--times`` starts, in
milliseconds from the moment the parent started the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench.bench_ssh import RUN  # noqa: E402
from bench.first_frames import checkout_env  # noqa: E402
from tests.support.recorded import copy_runs  # noqa: E402

ATTACH = """
import json, sys, time
marks = [("python started", time.time())]
def mark(what): marks.append((what, time.time()))
import shardtop.cli
mark("import shardtop.cli")
from shardtop.config import ConfigError
from shardtop.rundir.run_directory import RunError, find_run, runs_root
mark("import config, run_directory")
from shardtop.tui.first_frame import painted
from shardtop.read.follower import RunFollower
mark("import the follower")
from shardtop.tui.run_frame import run_frame_lines
mark("import run_frame")
root = runs_root(sys.argv[2])
follower = RunFollower(find_run(root, sys.argv[1]))
model = follower.read_first()
mark("read the head of the events")
from shardtop.read.shard_model import ShardModel
tree = ShardModel.of(model.state)
mark("the shard model")
lines = run_frame_lines(model, tree, follower.run, 120, 40, follower.unread_bytes)
mark("the frame's lines")
print(json.dumps(marks))
"""

BARE = """
import json, time
print(json.dumps([("python started", time.time())]))
"""

NVITOP = """
import json, time
marks = [("python started", time.time())]
import curses
import nvitop.cli
marks.append(("import nvitop.cli, curses", time.time()))
print(json.dumps(marks))
"""


def start(code: str, args: list[str], env: dict[str, str], cwd: str) -> list[tuple[str, float]]:
    """Run ``code`` in a fresh interpreter in ``cwd``; each mark's time, in ms since the process was started.

    ``cwd`` holds no checkout: ``python -c`` puts it first on ``sys.path``, ahead of ``PYTHONPATH``.
    """
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True, cwd=cwd
    )
    end = time.time()
    marks = [(what, (t - t0) * 1000) for what, t in json.loads(out.stdout.strip().splitlines()[-1])]
    return [*marks, ("exited", (end - t0) * 1000)]


def has_nvitop() -> bool:
    return subprocess.run([sys.executable, "-c", "import nvitop.cli"], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--times", type=int, default=8)
    parser.add_argument("--also", type=lambda p: Path(p).resolve(), nargs="*", default=[],
                        help="other checkouts' shardtop, timed alongside")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        run = copy_runs(runs, RUN)[RUN]
        rotation: list[tuple[str, str, list[str], dict[str, str]]] = [("python -c pass", BARE, [], dict(os.environ))]
        for tree in [ROOT, *args.also]:
            name = "shardtop attach" if tree == ROOT else f"shardtop attach ({tree})"
            env = checkout_env(dict(os.environ), tree, tmp)
            rotation.append((name, ATTACH, [str(run), str(runs)], env))
        if has_nvitop():
            rotation.append(("nvitop's imports", NVITOP, [], dict(os.environ)))
        for _ in range(args.times):
            for name, code, argv, env in rotation:
                for what, ms in start(code, argv, env, tmp):
                    results.setdefault(name, {}).setdefault(what, []).append(ms)
    print(f"starts in rotation, {args.times} each, {os.cpu_count()} cores, Python {sys.version.split()[0]};"
          " median ms since the process was started (range)")
    for name, steps in results.items():
        print(f"  {name}")
        for what, values in steps.items():
            print(f"    {what:<36} {statistics.median(values):7.1f}   ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
