"""First frames, many times, alternating: ``shardtop attach``, ``shardtop`` (home) and nvitop.

    python bench/first_frames.py [--times 10] [--nvml auto|real|recorded] [--also DIR ...]

One start of a program gives a first frame that moves by a tenth of a second
from start to start on a busy machine.  This starts each program ``--times``
times in turn, in a 120x40 pseudo-terminal (as ``bench_ssh.py`` does: the same
needles, the same run, the same stand-ins for the ranks), and prints each
program's first frames and their median.  ``--also DIR`` times the shardtop of
another checkout too (its directory first on ``PYTHONPATH``), in the same
rotation: a change's cost side by side with the code before it.  Every program
starts in an empty directory: ``python -m`` puts the working directory first on
``sys.path``, and a checkout's own directory there would shadow ``--also``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench.bench_ssh import RUN, nvml_kind, programs, start_ranks  # noqa: E402
from bench.recorded_nvml import write_samples  # noqa: E402
from bench.terminal import Terminal  # noqa: E402
from tests.support.recorded import copy_runs  # noqa: E402


def checkout_env(env: dict[str, str], tree: Path, cwd: str) -> dict[str, str]:
    """``env`` with ``tree``'s shardtop first on ``PYTHONPATH``; exits if a program started in ``cwd`` would
    import another."""
    path = os.pathsep.join(filter(None, [str(tree), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**env, "PYTHONPATH": path}
    where = subprocess.run([sys.executable, "-c", "import shardtop; print(shardtop.__path__[0])"],
                           env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, check=True)
    if Path(where.stdout.strip()) != tree / "shardtop":
        sys.exit(f"a program started in {cwd} would import the shardtop of {where.stdout.strip()}, not {tree}'s")
    return env


def first_frame(argv: list[str], needles: tuple[bytes, ...], env: dict[str, str], cwd: str) -> float:
    term = Terminal(argv, size=(120, 40), env=env, cwd=cwd)
    try:
        return term.wait_for(*(n for n in needles if n), timeout=60)
    finally:
        term.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--nvml", choices=("auto", "real", "recorded"), default="auto")
    parser.add_argument("--also", type=lambda p: Path(p).resolve(), nargs="*", default=[],
                        help="other checkouts' shardtop, timed alongside")
    args = parser.parse_args()
    nvml = nvml_kind(args.nvml)
    ranks = start_ranks(nvml, 3600)
    times: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = Path(tmp) / "runs"
            run = copy_runs(runs, RUN)[RUN]
            samples = write_samples(Path(tmp) / "nvml.json", [r.pid for r in ranks])
            rotation = []
            for tree in [ROOT, *args.also]:
                for p in programs(1.0, nvml, samples, runs, run, ranks[0].pid):
                    if p.name == "nvitop" and tree != ROOT:
                        continue
                    name = p.name if tree == ROOT else f"{p.name} ({tree})"
                    env = checkout_env(p.env, tree, tmp) if p.name != "nvitop" else p.env
                    rotation.append((name, p.argv, p.needles, env))
            for _ in range(args.times):
                for name, argv, needles, env in rotation:
                    times.setdefault(name, []).append(first_frame(argv, needles, env, tmp))
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    print(f"first frames, 120x40 pty, {args.times} starts each in rotation, {os.cpu_count()} cores, NVML {nvml}")
    for name, values in times.items():
        print(f"  {name:<40} median {statistics.median(values):.3f} s   " + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
