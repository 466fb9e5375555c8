"""``shardtop fit``'s wall time beside the plan's, and beside a doubling search that rehearses every step.

For each case: ``shardtop plan`` of it (the plan alone, nothing rehearsed); ``shardtop fit`` (the plan,
then the search from the plan's batch to the boundary); and the search a user without a plan would run —
batch 1, 2, 4, … rehearsed until one runs out of memory, then the bracket halved to the boundary — with
fit's own rehearsals (same ranks, same cap, same early stop), so only the batches differ.  Printed per
case: each one's wall time and rehearsals, the boundary each found, and the rehearsals the plan saved.

    python bench/bench_fit.py [--case preset] [--case script] [--case hf]

On CPU (no GPU here): each rehearsed rank is a CPU process capped at the case's size.  Run it alone:
two jobs on two cores measure each other.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardtop.config import parse_size  # noqa: E402
from shardtop.fit.configuration import Configuration  # noqa: E402
from shardtop.fit.measure import Trial  # noqa: E402
from shardtop.fit.search import MAX_BATCH  # noqa: E402
from shardtop.fit.stacks import CommandStack, PresetStack  # noqa: E402
from shardtop.fit.trial import Rehearser  # noqa: E402

HF_OUT = tempfile.mkdtemp(prefix="bench-fit-hf-")


@dataclass(frozen=True)
class Case:
    preset: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    gpu: str = ""

    @property
    def settings(self) -> list[str]:
        return [*self.preset, "devices=2", f"gpu={self.gpu}"]


CASES = {
    "preset": Case(preset=("fsdp-auto-wrap", "model.image=128"), gpu="128MiB"),
    "script": Case(command=("torchrun", "--nproc_per_node", "2", "tests/own_scripts/fit_fsdp2.py", "--batch-size",
                            "4", "--seq", "256", "--steps", "2"), gpu="200MiB"),
    "hf": Case(command=("torchrun", "--nproc_per_node", "2", "tests/own_scripts/fit_hf_trainer.py", "--use_cpu",
                        "--report_to", "none", "--save_strategy", "no", "--vocab", "8192", "--seq", "128",
                        "--output_dir", HF_OUT, "--per_device_train_batch_size", "4", "--max_steps", "2"),
               gpu="200MiB"),
}
ENV = {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
       "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
"""CPU processes, one thread a rank as fit gives a rank of two on two cores; ``torchrun`` of this Python."""


def timed(args: list[str], runs: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardtop", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **ENV, "SHARDTOP_RUNS_DIR": runs})
    if done.returncode not in (0, 1):
        raise SystemExit(f"shardtop {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def doubling(rehearse: Callable[[int], Trial]) -> tuple[int | None, int]:
    """Batch 1, 2, 4, … until one runs out of memory, then the bracket halved: (the boundary, rehearsals)."""
    rehearsals, fits, batch, over = 0, 0, 1, None
    while batch <= MAX_BATCH:
        rehearsals += 1
        if rehearse(batch).outcome != "fits":
            over = batch
            break
        fits, batch = batch, batch * 2
    while over is not None and over - fits > 1:
        mid = (fits + over) // 2
        rehearsals += 1
        fits, over = (mid, over) if rehearse(mid).outcome == "fits" else (fits, mid)
    return (fits or None), rehearsals


def trials_of(case: Case, rehearser: Rehearser) -> Callable[[Configuration, int], Trial]:
    """A set-up at a batch rehearsed as fit rehearses it."""
    if case.preset:
        preset = PresetStack.of(case.preset, {"batch_size": 0}, "")
        return lambda conf, batch: rehearser.preset(preset, conf, batch)
    command = CommandStack.of(list(case.command), ROOT)
    return lambda conf, batch: rehearser.command(command, conf, batch)


def run_case(name: str, case: Case) -> None:
    runs = tempfile.mkdtemp(prefix=f"bench-fit-{name}-")
    plan_args = ["plan", *case.preset, "devices=2", f"gpu_mem_limit={case.gpu}"] if case.preset else [
        "plan", "devices=2", "--", *case.command]
    plan_s, _ = timed(plan_args, runs)
    fit_args = ["fit", "--format", "json", *case.settings, *(["--", *case.command] if case.command else [])]
    fit_s, out = timed(fit_args, runs)
    data = json.loads(out)
    cap = parse_size(case.gpu)
    rehearser = Rehearser(devices=2, cap=cap, runs_dir=runs, directory=Path(tempfile.mkdtemp()), env=ENV)
    searched = []
    rehearse = trials_of(case, rehearser)
    for setup in data["configurations"]:
        conf = Configuration(checkpointing=setup["activation_checkpointing"], as_given=setup["as_given"])
        started = time.perf_counter()
        found, count = doubling(functools.partial(rehearse, conf))
        searched.append((setup, found, count, time.perf_counter() - started))
    doubling_s = sum(s for *_, s in searched)
    doubling_n = sum(n for _, _, n, _ in searched)
    print(f"{name}: {' '.join(fit_args[3:])}")
    print(f"  plan alone           {plan_s:7.1f} s")
    print(f"  fit                  {fit_s:7.1f} s  {data['rehearsals']:3d} rehearsals")
    print(f"  doubling from 1      {doubling_s:7.1f} s  {doubling_n:3d} rehearsals  ({doubling_n - data['rehearsals']} "
          "more than fit)")
    for setup, found, count, seconds in searched:
        print(f"    {setup['configuration']}: plan {setup['plan']['largest_batch']}, fit {setup['largest_batch']} "
              f"in {len(setup['trials'])} rehearsals; doubling {found} in {count} ({seconds:.1f} s)")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    args = parser.parse_args()
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cores")
    os.chdir(ROOT)  # the commands name their scripts from the repository, as the tests run them
    for name in args.case or ["preset", "script"]:
        run_case(name, CASES[name])


if __name__ == "__main__":
    main()
